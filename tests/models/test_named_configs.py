"""Named configs: each builds, has transformers' parameter count, and survives the HF config round trip."""

import dataclasses
import math

import jax
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
        """Our parameter count equals that of transformers' model of the same config (meta device)."""
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
        with pytest.raises(ValueError, match=r"n_heads \(4\) must be a multiple of n_kv_heads \(3\)"):
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
        assert float(jax.numpy.max(jax.numpy.abs(got - ref))) < 0.02 * float(jax.numpy.max(jax.numpy.abs(ref)))
