"""KV-cache decoding gives the logits of a full forward pass over the same tokens."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from grpo_jax import models

TINY = models.get_model_config("tiny")
CONFIGS = {
    "qwen3": TINY,
    "qwen3_moe": models.get_model_config("tiny_moe"),
    "llama": dataclasses.replace(
        TINY, model_type="llama", qk_norm=False, tie_embeddings=False, qkv_bias=True, o_bias=True,
        rope_scaling=models.Llama3RopeScaling(original_max_position_embeddings=16),
    ),
}
PROMPT, NEW = 7, 5
COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"


def batch(cfg):
    """Left-padded prompts (0, 2, 5 pads) followed by NEW sampled tokens."""
    tokens = (
        np.random.default_rng(1)
        .integers(0, cfg.vocab_size, size=(3, PROMPT + NEW))
        .astype(np.int32)
    )
    mask = np.ones_like(tokens)
    mask[1, :2] = 0
    mask[2, :5] = 0
    return tokens, mask


@pytest.fixture(scope="module", params=CONFIGS)
def setup(request):
    model = models.init_model(CONFIGS[request.param], seed=3)
    tokens, mask = batch(model.cfg)
    full = nnx.jit(lambda m, t, a: m(t, attention_mask=a))(model, tokens, mask)
    return model, tokens, mask, np.asarray(full)


def decode(graphdef, state, tokens, mask, max_len):
    """Prefill the prompts, then feed the remaining tokens one by one in a lax.fori_loop."""
    model = nnx.merge(graphdef, state)
    cache = model.init_cache(tokens.shape[0], max_len)
    first, cache = model.prefill(tokens[:, :PROMPT], cache, attention_mask=mask[:, :PROMPT])

    def body(j, carry):
        cache, out = carry
        step_logits, cache = nnx.merge(graphdef, state).decode_step(tokens[:, PROMPT + j], cache)
        return cache, out.at[j].set(step_logits)

    out = jnp.zeros((NEW,) + first.shape, first.dtype)
    cache, out = jax.lax.fori_loop(0, NEW, body, (cache, out))
    return first, out, cache


class TestKVCache:
    def test_prefill_then_decode_matches_full_forward(self, setup):
        model, tokens, mask, full = setup
        graphdef, state = nnx.split(model)
        first, steps, cache = jax.jit(decode, static_argnums=(0, 4))(
            graphdef, state, tokens, mask, 16
        )
        np.testing.assert_allclose(first, full[:, PROMPT - 1], rtol=1e-5, atol=1e-5)
        # steps[j] is the prediction after token PROMPT + j.
        np.testing.assert_allclose(steps, np.moveaxis(full[:, PROMPT:], 1, 0), rtol=1e-5, atol=1e-5)
        assert int(cache.index) == PROMPT + NEW
        np.testing.assert_array_equal(np.asarray(cache.valid)[:, : PROMPT + NEW], mask.astype(bool))

    @pytest.mark.slow
    def test_prefill_in_two_chunks_matches_one(self, setup):
        model, tokens, mask, full = setup
        prefill = nnx.jit(lambda m, t, c, a: m.prefill(t, c, attention_mask=a))
        cache = model.init_cache(3, 16)
        _, cache = prefill(model, tokens[:, :4], cache, mask[:, :4])
        last, _ = prefill(model, tokens[:, 4:PROMPT], cache, mask[:, 4:PROMPT])
        np.testing.assert_allclose(last, full[:, PROMPT - 1], rtol=1e-5, atol=1e-5)

    def test_shared_prefix_matches_full_forward(self, setup):
        """G = 2 continuations of each (left-padded) prompt, the prompt cached once per prompt."""
        model, tokens, mask, _ = setup
        group = 2
        conts = (
            np.random.default_rng(2)
            .integers(0, model.cfg.vocab_size, size=(3 * group, NEW))
            .astype(np.int32)
        )
        rows_tokens = np.concatenate([np.repeat(tokens[:, :PROMPT], group, 0), conts], axis=1)
        rows_mask = np.concatenate(
            [np.repeat(mask[:, :PROMPT], group, 0), np.ones_like(conts)], axis=1
        )
        full = np.asarray(
            nnx.jit(lambda m, t, a: m(t, attention_mask=a))(model, rows_tokens, rows_mask)
        )

        def run(graphdef, state):
            m = nnx.merge(graphdef, state)
            first, prompt_cache = m.prefill(
                tokens[:, :PROMPT], m.init_cache(3, PROMPT), attention_mask=mask[:, :PROMPT]
            )
            cache = m.init_cache(3 * group, NEW + 1, prefix=prompt_cache)
            steps = []
            for j in range(NEW):
                logits, cache = m.decode_step(conts[:, j], cache)
                steps.append(logits)
            return first, jnp.stack(steps, axis=1), cache

        first, steps, cache = jax.jit(run, static_argnums=0)(*nnx.split(model))
        np.testing.assert_allclose(
            np.repeat(first, group, 0), full[:, PROMPT - 1], rtol=1e-5, atol=1e-5
        )
        np.testing.assert_allclose(steps, full[:, PROMPT:], rtol=1e-5, atol=1e-5)
        # stored once per prompt
        assert cache.prefix.k[0].shape[0] == 3 and cache.k[0].shape[0] == 3 * group

    def test_new_values_do_not_recompile(self, setup):
        model, tokens, mask, _ = setup
        graphdef, state = nnx.split(model)

        @jax.jit
        def step(state, cache, tokens_b):
            return nnx.merge(graphdef, state).decode_step(tokens_b, cache)

        compiles = []

        def listen(event, *_, **__):
            if event == COMPILE_EVENT:
                compiles.append(event)

        # Committed to a device like the step's outputs, which it is fed next (an
        # uncommitted input would compile a second executable on this 8-device host).
        cache = jax.device_put(model.init_cache(3, 16), jax.devices()[0])
        jax.monitoring.register_event_duration_secs_listener(listen)
        try:
            _, cache = step(state, cache, jnp.asarray(tokens[:, 0]))
            assert compiles  # the listener sees compilations
            compiles.clear()
            for j in range(1, 4):  # new tokens, a new cache index, new cache contents
                _, cache = step(state, cache, jnp.asarray(tokens[:, j]))
        finally:
            jax.monitoring.unregister_event_duration_listener(listen)
        assert not compiles


def test_prefix_rows_must_divide_the_batch():
    model = models.init_model(TINY)
    with pytest.raises(ValueError, match="not a multiple of the prefix's 3 rows"):
        model.init_cache(4, 8, prefix=model.init_cache(3, 8))


def test_prefill_longer_than_cache_is_an_error():
    model = models.init_model(TINY)
    with pytest.raises(ValueError, match="raise max_len"):
        model.prefill(jnp.zeros((1, 9), jnp.int32), model.init_cache(1, 8))
