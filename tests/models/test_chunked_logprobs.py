"""The chunked log-prob path equals the naive one (values and gradients) and uses less memory."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from grpo_jax import models
from grpo_jax.models import logprobs
from grpo_jax.objectives import token_logprobs

B, T, D, V = 3, 10, 16, 50


def inputs(dtype=jnp.float32):
    kh, kw, kt = jax.random.split(jax.random.key(0), 3)
    hidden = jax.random.normal(kh, (B, T, D), dtype)
    w = jax.random.normal(kw, (D, V), dtype)
    tokens = jax.random.randint(kt, (B, T), 0, V)
    return hidden, w, tokens


def naive(hidden, w, tokens, temperature=1.0):
    return token_logprobs(logprobs.unembed(hidden, w), tokens, temperature=temperature)


class TestChunkedTokenLogprobs:
    @pytest.mark.parametrize("chunk_size", [7, 30, 1000])  # divides B*T or not, > B*T
    def test_values_equal_naive(self, chunk_size):
        hidden, w, tokens = inputs()
        chunked = jax.jit(
            lambda h, w, t: models.chunked_token_logprobs(h, w, t, chunk_size=chunk_size)
        )
        np.testing.assert_allclose(
            chunked(hidden, w, tokens), jax.jit(naive)(hidden, w, tokens), rtol=1e-6, atol=1e-5
        )

    def test_temperature(self):
        hidden, w, tokens = inputs()
        chunked = models.chunked_token_logprobs(hidden, w, tokens, temperature=0.7, chunk_size=8)
        np.testing.assert_allclose(
            chunked, naive(hidden, w, tokens, temperature=0.7), rtol=1e-6, atol=1e-5
        )

    def test_bfloat16_hidden_states(self):
        hidden, w, tokens = inputs(jnp.bfloat16)
        chunked = models.chunked_token_logprobs(hidden, w, tokens, chunk_size=8)
        assert chunked.dtype == jnp.float32
        np.testing.assert_allclose(chunked, naive(hidden, w, tokens), rtol=1e-6, atol=1e-5)

    def test_gradients_equal_naive(self):
        hidden, w, tokens = inputs()
        weights = jax.random.normal(jax.random.key(1), (B, T))  # a loss like sum(A * logp)

        def loss(fn):
            return jax.jit(
                jax.grad(lambda h, w: jnp.sum(weights * fn(h, w, tokens)), argnums=(0, 1))
            )

        chunked = loss(lambda h, w, t: models.chunked_token_logprobs(h, w, t, chunk_size=7))(
            hidden, w
        )
        ref = loss(naive)(hidden, w)
        for got, want in zip(chunked, ref):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)

    def test_peak_memory_does_not_grow_with_the_batch(self):
        """Compiled temp memory of value-and-grad at V=8192: naive holds all [N, V] logits,
        chunked (256 rows) a few chunks' worth whatever N."""
        d, v, chunk = 64, 8192, 256

        def temp_bytes(fn, n):
            args = (
                jax.ShapeDtypeStruct((1, n, d), jnp.float32),
                jax.ShapeDtypeStruct((d, v), jnp.float32), jax.ShapeDtypeStruct((1, n), jnp.int32),
            )
            grad = jax.grad(lambda h, w, t: jnp.sum(fn(h, w, t)), argnums=(0, 1))
            return jax.jit(grad).lower(*args).compile().memory_analysis().temp_size_in_bytes

        def chunked(h, w, t):
            return models.chunked_token_logprobs(h, w, t, chunk_size=chunk)

        for n in (2048, 4096):
            assert temp_bytes(naive, n) >= n * v * 4
            assert temp_bytes(chunked, n) <= 3 * chunk * v * 4


def test_model_token_logprobs_equal_logits_path():
    model = models.init_model(models.get_model_config("tiny"), seed=1)
    tokens = jax.random.randint(jax.random.key(2), (2, 9), 0, model.cfg.vocab_size)
    mask = jnp.ones_like(tokens).at[1, :3].set(0)
    targets = jnp.roll(tokens, -1, axis=1)
    chunked = nnx.jit(
        lambda m: m.token_logprobs(tokens, targets, attention_mask=mask, chunk_size=5)
    )(model)
    ref = nnx.jit(lambda m: token_logprobs(m(tokens, attention_mask=mask), targets))(model)
    np.testing.assert_allclose(chunked, ref, rtol=1e-5, atol=1e-6)
