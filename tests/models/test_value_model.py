"""The value model: the decoder's trunk with a scalar head; its HF export and import."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from grpo_jax import models, parallel
from tests.models.checkpoints import FAMILIES

TINY = models.get_model_config("tiny", vocab_size=64)


def _tokens(seed=0, batch=3, length=7, vocab=64):
    rng = np.random.default_rng(seed)
    tokens = rng.integers(1, vocab, (batch, length)).astype(np.int32)
    mask = np.ones((batch, length), np.int32)
    mask[1, :3] = 0   # a left-padded row
    return jnp.asarray(tokens), jnp.asarray(mask)


def _with_random_head(critic, seed=1):
    rng = np.random.default_rng(seed)
    critic.head[...] = jnp.asarray(rng.normal(0, 0.3, critic.head[...].shape), jnp.float32)
    critic.bias[...] = jnp.asarray([0.25], jnp.float32)
    return critic


def _flat(model):
    return {path: np.asarray(v.get_value()) for path, v in nnx.to_flat_state(nnx.state(model))}


def test_values_are_the_trunks_hidden_states_through_the_head():
    policy = models.init_model(TINY, seed=3)
    critic = _with_random_head(models.value_model_from(policy))
    tokens, mask = _tokens()
    values, aux = jax.jit(lambda t, m: critic(t, attention_mask=m))(tokens, mask)
    hidden, _ = nnx.jit(lambda m, t, a: m.hidden_states(t, attention_mask=a))(policy, tokens, mask)
    expected = np.asarray(hidden) @ np.asarray(critic.head[...]) + 0.25
    np.testing.assert_allclose(values, expected, rtol=1e-5, atol=1e-5)
    assert values.shape == (3, 7) and values.dtype == jnp.float32 and float(aux) == 0.0


def test_a_fresh_critic_predicts_zero_and_has_no_output_layer():
    policy = models.init_model(models.get_model_config("tiny", vocab_size=64, tie_embeddings=False))
    critic = models.value_model_from(policy)
    paths = set(_flat(critic))
    assert ("lm_head",) in _flat(policy) and not any("lm_head" in p for p in paths)
    assert paths == {("trunk", *p) for p in _flat(policy) if p != ("lm_head",)} | {
        ("head",), ("bias",),
    }
    np.testing.assert_array_equal(critic(_tokens()[0])[0], 0.0)


def test_trunk_and_head_are_sharded_by_the_same_rules_as_the_policy():
    mesh = parallel.make_mesh("data=2,fsdp=4,tensor=1")
    policy = models.init_model(TINY, seed=3, mesh=mesh, rules="fsdp")
    critic = models.value_model_from(policy, mesh=mesh, rules="fsdp")
    for path, variable in nnx.to_flat_state(nnx.state(policy)):
        twin = dict(nnx.to_flat_state(nnx.state(critic)))[("trunk", *path)]
        assert twin.get_value().sharding.spec == variable.get_value().sharding.spec, path
    assert critic.head[...].sharding.spec == jax.P("fsdp")   # ("embed",) under fsdp
    unsharded = _with_random_head(models.value_model_from(models.init_model(TINY, seed=3)))
    _with_random_head(critic)
    tokens, mask = _tokens()
    np.testing.assert_allclose(critic(tokens, attention_mask=mask)[0],
                               unsharded(tokens, attention_mask=mask)[0], rtol=1e-5, atol=1e-5)


def test_export_reads_back_with_its_head(tmp_path):
    critic = _with_random_head(models.value_model_from(models.init_model(TINY, seed=5)))
    models.save_value_model(critic, str(tmp_path))
    loaded = models.load_value_model(str(tmp_path))
    want, got = _flat(critic), _flat(loaded)
    assert want.keys() == got.keys()
    for path in want:
        np.testing.assert_array_equal(got[path], want[path], err_msg=str(path))


def test_a_language_model_checkpoint_gives_the_trunk_and_a_zero_head(tmp_path):
    policy = models.init_model(models.get_model_config("tiny", vocab_size=64, tie_embeddings=False),
                               seed=6)
    models.save_pretrained(policy, str(tmp_path))
    critic = models.load_value_model(str(tmp_path))
    np.testing.assert_array_equal(critic.head[...], 0.0)
    np.testing.assert_array_equal(critic.trunk.layers[1].mlp.up[...], policy.layers[1].mlp.up[...])
    np.testing.assert_array_equal(critic.trunk.embed[...], policy.embed[...])


def test_a_classifier_with_several_labels_is_refused(tmp_path):
    critic = models.value_model_from(models.init_model(TINY))
    models.save_value_model(critic, str(tmp_path))
    config = json.loads((tmp_path / "config.json").read_text())
    config["id2label"] = {"0": "a", "1": "b"}
    config["label2id"] = {"a": 0, "b": 1}
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"token classifier with 2 labels; a value model has one"):
        models.load_value_model(str(tmp_path))


@pytest.mark.parametrize("family", FAMILIES)
def test_transformers_reads_the_export_as_a_token_classifier(family, hf_checkpoint, tmp_path):
    """The export loads in transformers' `AutoModelForTokenClassification`, whose one logit
    per position equals our value (each family, from its tiny HF checkpoint)."""
    torch = pytest.importorskip("torch", reason="the transformers parity check needs torch (CPU)")
    import transformers
    path, _ = hf_checkpoint(family)
    critic = _with_random_head(models.load_value_model(path))
    models.save_value_model(critic, str(tmp_path))
    theirs = transformers.AutoModelForTokenClassification.from_pretrained(
        str(tmp_path), attn_implementation="eager").eval()
    assert type(theirs).__name__ == models.value.TOKEN_CLASSIFICATION[family]
    tokens, mask = _tokens(vocab=96)
    with torch.no_grad():
        logits = theirs(input_ids=torch.tensor(np.asarray(tokens), dtype=torch.long)).logits
    ours = critic(tokens)[0]
    np.testing.assert_allclose(ours, logits[..., 0].numpy(), rtol=2e-4, atol=2e-4)
