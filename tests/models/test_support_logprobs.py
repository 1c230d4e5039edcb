"""support_token_logprobs: the log-prob renormalised over a recorded support, from gathered
unembedding columns, equals a float64 numpy computation on the full logits (values and
gradients)."""


import jax
import jax.numpy as jnp
import numpy as np
import pytest

from grpo_jax import models
from grpo_jax.models import support_logprobs
from tests.doctest_numbers import run_examples

B, T, D, V, K = 3, 10, 16, 50, 6


def inputs(dtype=jnp.float32, seed=0):
    """Hidden states, unembedding, and per position a support of 1..K ids (padded with -1)
    that contains the token."""
    rng = np.random.default_rng(seed)
    hidden = rng.standard_normal((B, T, D)).astype(np.float32)
    w = rng.standard_normal((D, V)).astype(np.float32)
    ids = np.full((B, T, K), -1, np.int32)
    tokens = np.zeros((B, T), np.int32)
    for b in range(B):
        for t in range(T):
            size = rng.integers(1, K + 1)
            ids[b, t, :size] = rng.choice(V, size, replace=False)
            tokens[b, t] = ids[b, t, rng.integers(size)]
    return jnp.asarray(hidden, dtype), jnp.asarray(w, dtype), jnp.asarray(tokens), jnp.asarray(ids)


def reference(hidden, w, tokens, ids, temperature=1.0):
    """Full `[B, T, V]` logits in float64, -inf outside the support, log-softmax, gather."""
    z = (
        np.einsum("btd,dv->btv", np.asarray(hidden, np.float64), np.asarray(w, np.float64))
        / temperature
    )
    ids = np.asarray(ids)
    keep = np.zeros(z.shape, bool)
    b, t, k = np.nonzero(ids >= 0)
    keep[b, t, ids[b, t, k]] = True
    masked = np.where(keep, z, -np.inf)
    lse = np.log(np.sum(np.exp(masked - masked.max(-1, keepdims=True)), -1)) + masked.max(-1)
    return np.take_along_axis(z, np.asarray(tokens)[..., None], axis=-1)[..., 0] - lse


class TestSupportTokenLogprobs:
    @pytest.mark.parametrize("chunk_size", [7, 30, 1000])  # divides B*T or not, > B*T
    @pytest.mark.parametrize("temperature", [1.0, 0.7])
    def test_values_equal_the_full_logits_reference(self, chunk_size, temperature):
        hidden, w, tokens, ids = inputs()
        got = jax.jit(
            lambda *a: models.support_token_logprobs(
                *a, temperature=temperature, chunk_size=chunk_size
            )
        )(hidden, w, tokens, ids)
        np.testing.assert_allclose(
            got, reference(hidden, w, tokens, ids, temperature), rtol=1e-5, atol=1e-5
        )

    def test_the_whole_vocabulary_as_support_is_the_full_softmax(self):
        hidden, w, tokens, _ = inputs()
        everything = jnp.broadcast_to(jnp.arange(V, dtype=jnp.int32), (B, T, V))
        got = models.support_token_logprobs(
            hidden, w, tokens, everything, temperature=0.8, chunk_size=8
        )
        full = models.chunked_token_logprobs(hidden, w, tokens, temperature=0.8)
        np.testing.assert_allclose(got, full, rtol=1e-5, atol=1e-5)

    def test_a_one_token_support_or_none_gives_zero(self):
        hidden, w, tokens, _ = inputs()
        alone = jnp.concatenate([tokens[..., None], jnp.full((B, T, 2), -1, jnp.int32)], axis=-1)
        none = jnp.full((B, T, 3), -1, jnp.int32)
        for ids in (alone, none):
            got = models.support_token_logprobs(hidden, w, tokens, ids)
            np.testing.assert_allclose(got, 0.0, atol=1e-6)

    def test_bfloat16_hidden_states(self):
        hidden, w, tokens, ids = inputs(jnp.bfloat16)
        got = models.support_token_logprobs(hidden, w, tokens, ids, chunk_size=8)
        assert got.dtype == jnp.float32
        np.testing.assert_allclose(got, reference(hidden, w, tokens, ids), rtol=1e-5, atol=1e-4)

    def test_gradients_equal_the_full_logits_path(self):
        """The gradient of sum(A * logp) through gathered columns equals the one through
        full logits masked to the support (jax, float32)."""
        hidden, w, tokens, ids = inputs()
        weights = jax.random.normal(jax.random.key(1), (B, T))
        keep = (
            jnp.zeros((B, T, V), bool)
            .at[jnp.arange(B)[:, None, None], jnp.arange(T)[None, :, None], jnp.maximum(ids, 0)]
            .max(ids >= 0)
        )

        def full(h, w):
            z = jnp.where(keep, jnp.einsum("btd,dv->btv", h, w) / 0.7, -jnp.inf)
            return jnp.take_along_axis(jax.nn.log_softmax(z), tokens[..., None], axis=-1)[..., 0]

        def gathered(h, w):
            return models.support_token_logprobs(h, w, tokens, ids, temperature=0.7, chunk_size=7)

        def grads(fn):
            return jax.jit(jax.grad(lambda h, w: jnp.sum(weights * fn(h, w)), argnums=(0, 1)))(
                hidden, w
            )

        for got, want in zip(grads(gathered), grads(full)):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)

    def test_docstring_example(self):
        result = run_examples(support_logprobs, optionflags=0, extraglobs={"jnp": jnp})
        assert result.attempted > 0 and result.failed == 0
