"""The splash-attention kernel (Pallas, interpreted on CPU) against XLA attention.

Splash expresses padding with segment ids and XLA attention with a mask, so they agree on
every real query (padding queries attend different slots; nothing reads them).
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from grpo_jax import models, parallel
from grpo_jax.models import layers, splash

B, S, N, K, H = 3, 200, 4, 2, 32   # S is not a multiple of the kernel's 128-token block


def padded_rows():
    """`[B, S]` token masks: no padding, 37 left pads, 50 right pads."""
    mask = np.ones((B, S), np.int32)
    mask[1, :37] = 0
    mask[2, -50:] = 0
    return mask


def qkv(seed=0):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((B, S, N, H), np.float32)
    k = rng.standard_normal((B, K, S, H), np.float32)
    v = rng.standard_normal((B, K, S, H), np.float32)
    return q, k, v


def xla_reference(q, k, v, token_mask):
    """`layers.grouped_attention` with the mask the decoder builds: causal & real key."""
    causal = np.tril(np.ones((S, S), bool))
    mask = causal[None] & token_mask.astype(bool)[:, None, :]
    return layers.grouped_attention(q, k.transpose(0, 1, 3, 2), v, mask, scale=H**-0.5)


class TestSplashAttention:
    def test_equals_xla_attention_on_real_queries(self):
        q, k, v = qkv()
        token_mask = padded_rows()
        got = jax.jit(lambda *a: splash.splash_attention(*a, scale=H**-0.5))(q, k, v, token_mask)
        want = jax.jit(xla_reference)(q, k, v, token_mask)
        real = token_mask.astype(bool)
        np.testing.assert_allclose(
            np.asarray(got)[real], np.asarray(want)[real], atol=2e-6, rtol=1e-5
        )

    def test_packed_segments_attend_only_their_own_sequence(self):
        q, k, v = qkv(4)
        segments = np.zeros((B, S), np.int32)   # packed rows: sequences end to end, then padding
        segments[0, :60], segments[0, 60:140], segments[0, 140:] = 1, 2, 3
        segments[1, :120], segments[1, 120:190] = 5, 7
        segments[2, :S - 1] = 4   # one sequence of S - 1 tokens
        causal = np.tril(np.ones((S, S), bool))
        mask = (
            causal[None] & (segments[:, :, None] == segments[:, None, :]) & (segments > 0)[:, None]
        )
        want = jax.jit(lambda q, k, v: layers.grouped_attention(
            q, k.transpose(0, 1, 3, 2), v, mask, scale=H**-0.5))(q, k, v)
        got = jax.jit(lambda *a: splash.splash_attention(*a, scale=H**-0.5))(q, k, v, segments)
        real = segments > 0
        np.testing.assert_allclose(
            np.asarray(got)[real], np.asarray(want)[real], atol=2e-6, rtol=1e-5
        )
        # the second sequence of row 0 alone gives the same outputs: nothing leaks across
        alone = jax.jit(lambda *a: splash.splash_attention(*a, scale=H**-0.5))(
            q[:1, 60:140], k[:1, :, 60:140], v[:1, :, 60:140], np.ones((1, 80), np.int32))
        np.testing.assert_allclose(
            np.asarray(got)[0, 60:140], np.asarray(alone)[0], atol=2e-6, rtol=1e-5
        )

    @pytest.mark.slow
    def test_gradients_equal_xla_attention(self):
        q, k, v = qkv(1)
        token_mask = padded_rows()
        real = jnp.asarray(token_mask, jnp.float32)[:, :, None, None]
        weights = jnp.asarray(np.random.default_rng(2).standard_normal((B, S, N, H)), jnp.float32)

        def loss(attention):
            return lambda q, k, v: jnp.sum(attention(q, k, v) * weights * real)

        kernel = lambda q, k, v: splash.splash_attention(q, k, v, token_mask, scale=H**-0.5)
        reference = lambda q, k, v: xla_reference(q, k, v, token_mask)
        got = jax.jit(jax.grad(loss(kernel), argnums=(0, 1, 2)))(q, k, v)
        want = jax.jit(jax.grad(loss(reference), argnums=(0, 1, 2)))(q, k, v)
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, atol=2e-5, rtol=1e-4)

    def test_block_size(self):
        assert [splash.block_size(n) for n in (1, 128, 200, 511, 8191, 8192)] == [
            128, 128, 256, 512, 512, 512,
        ]


def batch(vocab):
    tokens = np.random.default_rng(3).integers(0, vocab, (4, 24)).astype(np.int32)
    mask = np.ones_like(tokens)
    mask[1, :5] = 0     # left-padded prompt
    mask[2, -7:] = 0    # right-padded completion
    return tokens, mask


@pytest.mark.slow
@pytest.mark.parametrize("name", ["tiny", "tiny_moe"])
def test_model_logits_equal_xla_on_a_mesh(name):
    """The whole model with splash, sharded (rows over data, heads over tensor, the kernel
    under shard_map), equals the model with XLA attention on every real token."""
    cfg = models.get_model_config(name)
    mesh = parallel.make_mesh("data=2,fsdp=2,tensor=2")
    xla = models.init_model(cfg, seed=5, mesh=mesh, rules="fsdp_tp")
    kernel = models.init_model(dataclasses.replace(cfg, attention_impl="splash"), seed=5, mesh=mesh,
                               rules="fsdp_tp")
    tokens, mask = batch(cfg.vocab_size)
    forward = nnx.jit(lambda m, t, a: m(t, attention_mask=a))
    with jax.set_mesh(mesh):
        want, got = forward(xla, tokens, mask), forward(kernel, tokens, mask)
    real = mask.astype(bool)
    np.testing.assert_allclose(np.asarray(got)[real], np.asarray(want)[real], atol=1e-5, rtol=1e-5)


@pytest.mark.slow
def test_prefill_with_splash_equals_xla():
    """A prompt's prefill (fresh cache of S slots) runs the kernel; its logits and the
    cache's real slots equal XLA attention's, and so does the decode step after it."""
    cfg = models.get_model_config("tiny")
    xla = models.init_model(cfg, seed=6)
    kernel = models.init_model(dataclasses.replace(cfg, attention_impl="splash"), seed=6)
    tokens, mask = batch(cfg.vocab_size)
    tokens, mask = tokens[:2], mask[:2]   # left padding only, as the sampler's prompts

    def run(model):
        logits, cache = model.prefill(
            tokens, model.init_cache(2, tokens.shape[1]), attention_mask=mask
        )
        step, _ = model.decode_step(tokens[:, -1], cache.grow(tokens.shape[1] + 4))
        return logits, cache.k, step

    (want_logits, want_k, want_step), (logits, k, step) = nnx.jit(run)(xla), nnx.jit(run)(kernel)
    np.testing.assert_allclose(logits, want_logits, atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(step, want_step, atol=1e-5, rtol=1e-5)
    real = mask.astype(bool)[:, None, None, :]   # keys [B, K, H, L]
    for layer_k, layer_want in zip(k, want_k):
        np.testing.assert_allclose(np.where(real, layer_k, 0), np.where(real, layer_want, 0),
                                   atol=1e-5, rtol=1e-5)
