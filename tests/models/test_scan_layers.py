"""Scanned layers (`scan_layers=True`: stacked weights under `jax.lax.scan`) compute the same
network as one module per layer: logits, gradients under each remat policy, the KV cache,
MoE routing and its replay, and Hugging Face checkpoints in and out."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from grpo_jax import models, parallel, sampling
from grpo_jax.models import decoder

TINY_MOE = models.get_model_config("tiny_moe")
CONFIGS = {
    "dense": models.get_model_config("tiny"),
    "moe": TINY_MOE,
    # Runs of different kinds: MoE, dense, MoE, MoE (a dense layer among experts).
    "mixed": dataclasses.replace(TINY_MOE, n_layers=4, mlp_only_layers=(1,)),
}


def scanned(cfg):
    return dataclasses.replace(cfg, scan_layers=True)


def batch(vocab):
    tokens = np.random.default_rng(0).integers(0, vocab, (3, 12)).astype(np.int32)
    mask = np.ones_like(tokens)
    mask[1, :4] = 0
    return tokens, mask


def per_layer(cfg, flat_scanned):
    """A scanned model's flat `{path: array}` in the per-layer paths of the unscanned one."""
    _, state = models.abstract_model(dataclasses.replace(cfg, scan_layers=False))
    out = {}
    for path, _ in nnx.to_flat_state(state):
        stacked, position = decoder.scanned_path(cfg, path)
        value = flat_scanned[stacked]
        out[path] = value if position is None else value[position]
    return out


def flat_values(state):
    return {path: v.get_value() for path, v in nnx.to_flat_state(state)}


def test_layer_runs():
    assert CONFIGS["mixed"].layer_runs() == [(0, 1, True), (1, 1, False), (2, 2, True)]
    assert CONFIGS["dense"].layer_runs() == [(0, 3, False)]
    every_other = dataclasses.replace(TINY_MOE, n_layers=4, decoder_sparse_step=2)
    assert every_other.layer_runs() == [(0, 1, False), (1, 1, True), (2, 1, False), (3, 1, True)]


@pytest.mark.parametrize("name", CONFIGS)
def test_scanned_logits_equal_unscanned(name):
    cfg = CONFIGS[name]
    tokens, mask = batch(cfg.vocab_size)
    forward = nnx.jit(lambda m, t, a: m(t, attention_mask=a))
    want = forward(models.init_model(cfg, seed=1), tokens, mask)
    model = models.init_model(scanned(cfg), seed=1)
    assert len(model.stacks) == len(cfg.layer_runs())
    np.testing.assert_allclose(forward(model, tokens, mask), want, atol=1e-6, rtol=0)


def test_stacked_weights_keep_the_layer_axis_whole():
    mesh = parallel.make_mesh("data=2,fsdp=4,tensor=1")
    model = models.init_model(scanned(CONFIGS["dense"]), seed=1, mesh=mesh)
    q = model.stacks[0].attn.q
    assert q.get_metadata()["logical_axes"] == ("layers", "embed", "heads", "head_dim")
    assert q.get_value().shape == (3, 128, 4, 32)
    assert q.get_value().sharding.spec == jax.P(None, "fsdp", None, None)


def loss_and_grads(model, tokens, mask):
    """The loss (mean squared final hidden state plus the MoE aux loss) and its gradient."""
    graphdef, state = nnx.split(model)

    def loss(state):
        hidden, aux = nnx.merge(graphdef, state).hidden_states(tokens, attention_mask=mask)
        return jnp.mean(hidden.astype(jnp.float32) ** 2 * mask[..., None]) + aux

    return jax.jit(jax.value_and_grad(loss))(state)


@pytest.fixture(scope="module")
def unscanned_gradients():
    """The one-module-per-layer network's loss and gradients, remat off: what the scanned
    network must give under every remat policy, since remat changes what the backward
    pass keeps, not what it computes (one reference for all policies, compiled once)."""
    cfg = CONFIGS["mixed"]
    return loss_and_grads(models.init_model(cfg, seed=2), *batch(cfg.vocab_size))


@pytest.mark.slow
@pytest.mark.parametrize("remat", models.REMAT_POLICIES)
def test_gradients_equal_unscanned_under_each_remat_policy(remat, unscanned_gradients):
    cfg = dataclasses.replace(CONFIGS["mixed"], remat=remat)
    want_loss, want = unscanned_gradients
    got_loss, got = loss_and_grads(models.init_model(scanned(cfg), seed=2), *batch(cfg.vocab_size))
    np.testing.assert_allclose(got_loss, want_loss, rtol=1e-6)
    got = per_layer(cfg, flat_values(got))
    for path, value in flat_values(want).items():
        np.testing.assert_allclose(got[path], value, atol=1e-6, rtol=1e-5, err_msg=str(path))


@pytest.mark.slow
def test_stacked_kv_cache_decodes_as_the_full_forward():
    """Prefill then decode token by token through the stacked cache (grown between steps,
    as the sampler grows it) gives the logits of one full forward pass; routing recorded
    while decoding equals the unscanned model's."""
    cfg = CONFIGS["mixed"]
    tokens, mask = batch(cfg.vocab_size)
    prompt = 8
    full = nnx.jit(lambda m, t, a: m(t, attention_mask=a))(
        models.init_model(cfg, seed=3), tokens, mask
    )

    def decode(model):
        logits, cache, experts = model.prefill(tokens[:, :prompt], model.init_cache(3, prompt),
                                               attention_mask=mask[:, :prompt], with_routing=True)
        cache = cache.grow(tokens.shape[1])
        steps = []
        for j in range(prompt, tokens.shape[1]):
            step, cache = model.decode_step(tokens[:, j], cache)
            steps.append(step)
        return logits, jnp.stack(steps, 1), cache, experts

    model = models.init_model(scanned(cfg), seed=3)
    logits, steps, cache, experts = nnx.jit(decode)(model)
    np.testing.assert_allclose(logits, full[:, prompt - 1], atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(steps, full[:, prompt:], atol=1e-5, rtol=1e-5)
    assert [k.shape for k in cache.k] == [(n, 3, 2, 32, 12) for _, n, _ in cfg.layer_runs()]
    want_experts = nnx.jit(decode)(models.init_model(cfg, seed=3))[3]
    np.testing.assert_array_equal(experts, want_experts)


@pytest.mark.slow
def test_routing_replay_is_the_same_network():
    cfg = CONFIGS["mixed"]
    tokens, mask = batch(cfg.vocab_size)
    routing = np.random.default_rng(4).integers(0, cfg.n_experts, (3, 3, 12, 2)).astype(np.int32)
    routing[..., 1] = (routing[..., 0] + 1) % cfg.n_experts   # two distinct experts per token
    run = nnx.jit(lambda m: m.hidden_states(tokens, attention_mask=mask, routing=routing))
    want = run(models.init_model(cfg, seed=5))
    got = run(models.init_model(scanned(cfg), seed=5))
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, atol=1e-6, rtol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["dense", "mixed"])
def test_checkpoints_move_between_layouts(name, tmp_path):
    """save_pretrained of a scanned model loads unscanned (and back, sharded slice by slice
    on a mesh) with the same weights: the files are transformers' per-layer tensors."""
    cfg = CONFIGS[name]
    tokens, mask = batch(cfg.vocab_size)
    model = models.init_model(scanned(cfg), seed=6)
    models.save_pretrained(model, str(tmp_path / "scanned"))
    per_layer_model, _ = models.from_pretrained(str(tmp_path / "scanned"))
    assert "model.layers.0.self_attn.q_proj.weight" in _tensor_names(tmp_path / "scanned")
    mesh = parallel.make_mesh("data=1,fsdp=4,expert=2,tensor=1")
    models.save_pretrained(per_layer_model, str(tmp_path / "per_layer"))
    back, _ = models.from_pretrained(str(tmp_path / "per_layer"), mesh=mesh, rules="fsdp_expert",
                                     scan_layers=True)
    for path, value in flat_values(nnx.state(back)).items():
        np.testing.assert_array_equal(
            np.asarray(value), np.asarray(flat_values(nnx.state(model))[path])
        )
    forward = nnx.jit(lambda m, t, a: m(t, attention_mask=a))
    np.testing.assert_allclose(forward(per_layer_model, tokens, mask), forward(model, tokens, mask),
                               atol=1e-6, rtol=0)


def _tensor_names(path):
    from grpo_jax.models.safetensors_io import SafetensorsFile
    return set(SafetensorsFile(str(path / "model.safetensors")).keys())


@pytest.mark.slow
def test_value_model_with_a_scanned_trunk(tmp_path):
    """A critic of a scanned policy has the same values as one of the unscanned policy, and
    its export (per-layer tensors) loads into either layout."""
    cfg = CONFIGS["mixed"]
    tokens, mask = batch(cfg.vocab_size)
    policy = models.init_model(cfg, seed=4)
    critic = models.value_model_from(models.init_model(scanned(cfg), seed=4))
    critic.head[...] = jnp.asarray(
        np.random.default_rng(1).normal(0, 0.3, cfg.d_model), jnp.float32
    )
    models.save_value_model(critic, str(tmp_path))
    unscanned = models.load_value_model(str(tmp_path))
    hidden, _ = nnx.jit(lambda m, t, a: m.hidden_states(t, attention_mask=a))(policy, tokens, mask)
    expected = np.asarray(hidden) @ np.asarray(critic.head[...])
    for model in (critic, unscanned, models.load_value_model(str(tmp_path), scan_layers=True)):
        values, _ = nnx.jit(lambda m, t, a: m(t, attention_mask=a))(model, tokens, mask)
        np.testing.assert_allclose(values, expected, atol=1e-5, rtol=1e-5)
    assert "model.layers.2.mlp.experts.0.up_proj.weight" in _tensor_names(tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("slots", [0, 8])
def test_the_sampler_draws_what_the_unscanned_model_draws(slots):
    """`sampling.generate` on a scanned model, on an 8-device mesh (rows split 8 ways, the
    stacked cache's row axis after its layer axis), with a shared prompt cache (8 prompts, G = 3)
    and a completion long enough to grow the cache past its first 64-slot segment; the
    loop (`slots=0`) and the engine (`slots=8`): the same tokens and log-probs as the
    unscanned model with the same weights."""
    cfg = CONFIGS["dense"]
    prompts = np.random.default_rng(4).integers(1, cfg.vocab_size, (8, 6)).astype(np.int32)
    mesh = parallel.make_mesh("data=8,fsdp=1,tensor=1")

    def draw(cfg):
        graphdef, state = nnx.split(models.init_model(cfg, seed=2, mesh=mesh))
        with jax.set_mesh(mesh):
            return sampling.generate(graphdef, state, prompts, np.ones_like(prompts),
                                     rng=jax.random.key(1), method=sampling.Temperature(1.0),
                                     group_size=3, max_new_tokens=80, stop_tokens=[],
                                     pad_id=0, slots=slots)

    want, got = draw(cfg), draw(scanned(cfg))
    assert want.tokens.shape == (24, 128) and int(np.max(want.lengths)) == 80
    np.testing.assert_array_equal(got.tokens, want.tokens)
    np.testing.assert_allclose(got.logp, want.logp, atol=1e-5, rtol=0)
