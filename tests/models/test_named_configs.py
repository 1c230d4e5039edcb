"""Named configs: each builds, has transformers' parameter count, survives the HF config trip."""

import dataclasses
import math

import jax
import numpy as np
import pytest
from flax import nnx

from grpo_jax import models
from grpo_jax.models import decoder


def n_params(cfg):
    _, state = decoder.abstract_model(cfg)
    return sum(math.prod(x.shape) for x in jax.tree.leaves(state))


@pytest.mark.parametrize("name", list(models.NAMED_CONFIGS))
class TestNamedConfigs:
    def test_hf_config_round_trip(self, name):
        cfg = models.get_model_config(name)
        assert models.from_hf_config(models.to_hf_config(cfg)) == cfg

    def test_parameter_count_equals_transformers(self, name):
        """Our parameter count is that of transformers' model of the same config (meta device)."""
        torch = pytest.importorskip("torch", reason="counting transformers' parameters needs torch")
        import transformers

        cfg = models.get_model_config(name)
        with torch.device("meta"):
            hf = transformers.AutoModelForCausalLM.from_config(models.to_hf_config(cfg))
        assert n_params(cfg) == sum(p.numel() for p in hf.parameters())


def test_tiny_configs_are_tiny():
    for name in ("tiny", "tiny_moe"):
        assert 1e5 < n_params(models.get_model_config(name)) < 5e6


def test_overrides():
    cfg = models.get_model_config("qwen3_0_6b", dtype="bfloat16", remat=True)
    assert (cfg.dtype, cfg.remat, cfg.d_model) == ("bfloat16", "full", 1024)


def test_unknown_name_lists_the_known_ones():
    with pytest.raises(ValueError, match=r"unknown model config 'qwen9'.*'qwen3_0_6b'"):
        models.get_model_config("qwen9")


class TestModelConfigChecks:
    def test_heads_not_a_multiple_of_kv_heads(self):
        with pytest.raises(
            ValueError, match=r"n_heads \(4\) must be a multiple of n_kv_heads \(3\)"
        ):
            dataclasses.replace(models.get_model_config("tiny"), n_kv_heads=3)

    def test_unsupported_model_type(self):
        with pytest.raises(ValueError, match="model_type must be one of"):
            dataclasses.replace(models.get_model_config("tiny"), model_type="gemma")


@pytest.fixture(scope="module")
def batch():
    tokens = jax.random.randint(jax.random.key(0), (2, 12), 0, 512)
    return tokens, jax.numpy.ones_like(tokens).at[0, :4].set(0)


class TestNumerics:
    """Remat and bf16 compute, on the tiny model."""

    @staticmethod
    def grads(cfg, tokens, mask):
        model = models.init_model(cfg, seed=4)
        graphdef, state = nnx.split(model)

        def loss(state):
            logits = nnx.merge(graphdef, state)(tokens, attention_mask=mask)
            return jax.numpy.mean(jax.nn.logsumexp(logits, -1) * mask)

        return jax.jit(jax.value_and_grad(loss))(state)

    @pytest.mark.slow
    def test_remat_gives_the_same_loss_and_gradients(self, batch):
        cfg = models.get_model_config("tiny")
        plain = self.grads(cfg, *batch)
        remat = self.grads(dataclasses.replace(cfg, remat=True), *batch)
        for a, b in zip(jax.tree.leaves(plain), jax.tree.leaves(remat)):
            assert jax.numpy.allclose(a, b, rtol=1e-5, atol=1e-7)

    @pytest.mark.slow
    def test_bfloat16_compute_is_close_to_float32(self, batch):
        cfg = models.get_model_config("tiny")
        model = models.init_model(cfg, seed=4)
        bf16 = models.init_model(dataclasses.replace(cfg, dtype="bfloat16"), seed=4)
        assert bf16.embed[...].dtype == jax.numpy.float32  # float32 master weights
        forward = nnx.jit(lambda m, t, a: m(t, attention_mask=a))
        ref, got = forward(model, *batch), forward(bf16, *batch)
        assert got.dtype == jax.numpy.float32
        assert float(jax.numpy.max(jax.numpy.abs(got - ref))) < 0.02 * float(
            jax.numpy.max(jax.numpy.abs(ref))
        )


@pytest.mark.parametrize("replay", [False, True])
def test_dense_experts_equal_ragged_experts_with_their_gradients(batch, replay):
    """moe_impl="dense" (every expert on every token, each token's k kept) is the network
    of moe_impl="ragged" (rows sorted by expert, ragged_dot): the same logits, load-balancing
    loss and gradient of every weight, with the model's own routing and with a replayed one."""
    tokens, mask = batch
    cfg = models.get_model_config("tiny_moe")
    k, n_moe = cfg.n_experts_per_tok, cfg.n_layers
    routing = (jax.random.randint(jax.random.key(3), (n_moe, *tokens.shape, k), 0, cfg.n_experts)
               if replay else None)
    results = {}
    for impl in models.MOE_IMPLS:
        graphdef, state = nnx.split(
            models.init_model(dataclasses.replace(cfg, moe_impl=impl), seed=4)
        )

        def loss(state):
            hidden, aux = nnx.merge(graphdef, state).hidden_states(
                tokens, attention_mask=mask, routing=routing)
            logits = nnx.merge(graphdef, state).logits(hidden)
            return jax.numpy.mean(jax.nn.logsumexp(logits, -1) * mask) + aux, (logits, aux)

        results[impl] = jax.jit(jax.value_and_grad(loss, has_aux=True))(state)
    (ragged_loss, (ragged_logits, ragged_aux)), ragged_grads = results["ragged"]
    (dense_loss, (dense_logits, dense_aux)), dense_grads = results["dense"]
    assert float(ragged_aux) > 0
    np.testing.assert_allclose(dense_logits, ragged_logits, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(dense_aux, ragged_aux, rtol=1e-6)
    np.testing.assert_allclose(dense_loss, ragged_loss, rtol=1e-6)
    flat_dense = dict(nnx.to_flat_state(dense_grads))
    for path, grad in nnx.to_flat_state(ragged_grads):
        want = np.asarray(grad.get_value())
        assert np.abs(want).max() > 0 or "router" not in str(path), path
        np.testing.assert_allclose(flat_dense[path].get_value(), want, rtol=1e-4, atol=1e-6,
                                   err_msg=str(path))
