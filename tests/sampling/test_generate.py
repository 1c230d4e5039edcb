"""generate(): group layout, stop tokens, masks, truncation, log-probs, compilation, meshes."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from tests.sampling.toy_models import counting_compiles, lookup_model
from flax import nnx

from grpo_jax import models, sampling
from grpo_jax.objectives import token_logprobs
from grpo_jax.sampling import _generate

V = 16
STOPS = [13, 15]


def successor():
    """After token i the model puts (almost) all mass on i + 1 (mod V)."""
    return lookup_model(10.0 * np.roll(np.eye(V, dtype=np.float32), 1, axis=1))


def run(model, prompts, method=sampling.Greedy(), seed=0, **kwargs):
    tokens, mask = sampling.pad_prompts(prompts, pad_id=0)
    args = dict(group_size=1, max_new_tokens=8, stop_tokens=STOPS, pad_id=0) | kwargs
    rollout = sampling.generate(
        *model, tokens, mask, rng=jax.random.key(seed), method=method, **args
    )
    return sampling.to_host(rollout)


class TestStopsMasksTruncation:
    def test_first_token_stop_later_stop_and_never_stop(self):
        # Last prompt tokens 14, 9, 0: the first row samples 15 (a stop id) at once, the
        # second counts 10, 11, 12, 13 (stop), the third counts 1..8 and never stops.
        r = run(successor(), [[3, 14], [9], [2, 5, 0]], max_new_tokens=8)
        assert r.tokens.shape == (3, 16)  # the buffer is the power-of-two bucket of 8
        np.testing.assert_array_equal(r.tokens[:, :9], [
            [15, 0, 0, 0, 0, 0, 0, 0, 0],
            [10, 11, 12, 13, 0, 0, 0, 0, 0],
            [1, 2, 3, 4, 5, 6, 7, 8, 0],
        ])
        assert (r.tokens[:, 9:] == 0).all()
        np.testing.assert_array_equal(r.lengths, [1, 4, 8])
        np.testing.assert_array_equal(r.mask, np.arange(16)[None] < np.array([[1], [4], [8]]))
        np.testing.assert_array_equal(r.truncated, [False, False, True])
        np.testing.assert_array_equal(
            r.stop_reason, [sampling.STOP_TOKEN, sampling.STOP_TOKEN, sampling.MAX_NEW_TOKENS]
        )
        assert (r.logp[r.mask == 0] == 0).all() and (r.sample_logp == 0).all()  # greedy: log 1
        assert (r.logp[r.mask == 1] > -1e-3).all()

    def test_stop_on_the_last_allowed_token_is_not_truncated(self):
        r = run(successor(), [[9], [9], [9]], max_new_tokens=4)  # the shapes above: no new compile
        assert (r.lengths == 4).all() and not r.truncated.any()
        assert (r.stop_reason == sampling.STOP_TOKEN).all()

    def test_groups_are_consecutive_copies_of_their_prompt(self):
        r = run(successor(), [[14], [9]], group_size=3)
        np.testing.assert_array_equal(r.lengths, [1, 1, 1, 4, 4, 4])
        np.testing.assert_array_equal(r.prompt_tokens[:, -1], [14, 14, 14, 9, 9, 9])

    def test_sampled_rows_satisfy_the_invariants(self):
        logits = np.random.default_rng(0).normal(size=(V, V)).astype(np.float32)
        r = run(lookup_model(logits), [[1], [2, 3], [4]], method=sampling.Temperature(1.5),
                group_size=16, max_new_tokens=12)
        assert r.truncated.any() and (r.lengths < 12).any()  # both kinds occur
        for row in range(r.tokens.shape[0]):
            n = r.lengths[row]
            completion = r.tokens[row, :n]
            assert (r.mask[row] == (np.arange(16) < n)).all()
            assert (r.tokens[row, n:] == 0).all() and (r.logp[row, n:] == 0).all()
            assert not np.isin(completion[:-1], STOPS).any()
            assert r.truncated[row] == (not np.isin(completion[-1], STOPS))
            assert r.truncated[row] == (r.stop_reason[row] == sampling.MAX_NEW_TOKENS)
            if r.truncated[row]:
                assert n == 12
        assert len({tuple(t) for t in r.tokens[:16]}) > 1  # a group's samples differ

    def test_same_seed_same_tokens_new_seed_new_tokens(self):
        model = lookup_model(np.random.default_rng(1).normal(size=(V, V)).astype(np.float32))
        a, b, c = (run(model, [[1], [2, 3], [4]], sampling.Temperature(1.5), seed=s, group_size=16,
                       max_new_tokens=12) for s in (0, 0, 1))
        np.testing.assert_array_equal(a.tokens, b.tokens)
        assert not np.array_equal(a.tokens, c.tokens)


class TestScheduleFreeRandomness:
    """A completion's tokens are addressed by (rng, prompt id, completion index, position):
    the batch it is drawn in does not change them."""

    @pytest.mark.slow
    def test_reordered_subset_with_more_completions_draws_the_same_tokens(self, tiny_model):
        method = sampling.TopP(0.95, temperature=1.0)
        a, b, c = [5, 6, 7], [8, 9], list(range(20, 30))
        args = dict(max_new_tokens=20, stop_tokens=np.arange(0, 512, 16))
        base = run(tiny_model, [a, b, c], method, seed=4, group_size=2, **args)
        # C then A (ids 2 and 0), four completions each: the first two of each are base's.
        other = run(tiny_model, [c, a], method, seed=4, group_size=4, prompt_ids=[2, 0], **args)
        assert base.prompt_tokens.shape[1] == other.prompt_tokens.shape[1]   # one prompt bucket
        assert len(set(base.lengths)) > 2   # ragged rows: the schedule differs from row to row
        for got, want in ((0, 4), (1, 5), (4, 0), (5, 1)):   # (row of other, row of base)
            np.testing.assert_array_equal(other.tokens[got], base.tokens[want])
            np.testing.assert_allclose(other.logp[got], base.logp[want], rtol=1e-6, atol=1e-6)
        # the extra completions are new draws, and the same ids in a new order are not enough
        assert not np.array_equal(other.tokens[2], other.tokens[0])
        swapped = run(tiny_model, [c, a], method, seed=4, group_size=4, **args)   # ids 0, 1
        assert not np.array_equal(swapped.tokens[0], base.tokens[4])

    def test_prompt_ids_need_one_per_prompt(self):
        with pytest.raises(ValueError, match=r"prompt_ids has shape \(3,\); it must be \(2,\)"):
            run(successor(), [[1], [2]], prompt_ids=[0, 1, 2])


class TestArgumentErrors:
    def test_max_new_tokens_beyond_the_buffer(self):
        with pytest.raises(ValueError, match="max_len_bucket=8"):
            run(successor(), [[1]], max_new_tokens=9, max_len_bucket=8)

    def test_mask_shape(self):
        with pytest.raises(ValueError, match="prompt_mask"):
            sampling.generate(*successor(), np.ones((2, 4), np.int32), np.ones((2, 3), np.int32),
                              rng=jax.random.key(0), method=sampling.Greedy(), group_size=1,
                              max_new_tokens=4, stop_tokens=[1], pad_id=0)

    def test_rows_must_split_over_the_mesh(self):
        mesh = jax.make_mesh(
            (8, 1), ("data", "tensor"), axis_types=(jax.sharding.AxisType.Auto,) * 2
        )
        with jax.set_mesh(mesh), pytest.raises(ValueError, match="multiple of 8"):
            run(successor(), [[1]], group_size=3)

    def test_mesh_needs_the_axes_of_the_sampling_rules(self):
        mesh = jax.make_mesh((8,), ("data",), axis_types=(jax.sharding.AxisType.Auto,))
        with jax.set_mesh(mesh), pytest.raises(ValueError, match=r"\['tensor'\].*size 1 is fine"):
            run(successor(), [[1]], group_size=8)


def teacher_forced(graphdef, state, rollout, method):
    """Log-probs of the rollout's tokens from one forward pass over prompt + completion:
    under softmax(logits / temperature) (the behaviour log-prob) and under the method's
    cut distribution."""
    model = nnx.merge(graphdef, state)
    s = rollout.prompt_tokens.shape[1]
    tokens = jnp.concatenate([rollout.prompt_tokens, rollout.tokens], axis=1)
    mask = jnp.concatenate([rollout.prompt_mask, rollout.mask], axis=1)
    logits = model(tokens, attention_mask=mask)[:, s - 1 : -1]  # predicts each completion token
    b, n, v = logits.shape
    sample_logp = method.log_probs(logits.reshape(b * n, v)).reshape(b, n, v)
    picked = jnp.take_along_axis(sample_logp, rollout.tokens[..., None], axis=-1)[..., 0]
    temperature = getattr(method, "temperature", 1.0)
    return token_logprobs(logits, rollout.tokens, temperature=temperature), picked


def max_logp_error(model, rollout, method):
    logp, sample_logp = jax.jit(teacher_forced, static_argnums=0)(*model, rollout, method)
    m = np.asarray(rollout.mask, bool)
    return (np.abs(np.asarray(logp) - rollout.logp)[m].max(),
            np.abs(np.asarray(sample_logp) - rollout.sample_logp)[m].max())


class TestLogProbs:
    @pytest.mark.slow
    def test_equal_a_teacher_forced_forward_pass_in_float32(self, tiny_model):
        method = sampling.TopP(0.9, temperature=0.8)
        r = run(tiny_model, [[5, 6, 7], [8, 9], list(range(20, 40))], method, group_size=2,
                max_new_tokens=24, stop_tokens=np.arange(0, 512, 16))
        assert r.truncated.any() and (r.lengths < 24).any()
        logp_err, sample_err = max_logp_error(tiny_model, r, method)
        assert logp_err < 1e-4 and sample_err < 1e-4

    @pytest.mark.slow
    def test_equal_across_kv_cache_segments(self, tiny_model):
        """150 tokens cross the growth of the cache from 64 to 128 to 192 completion slots."""
        assert _generate._segment_ends(256) == [64, 128, 192, 256]
        # +1/4, multiples of 64
        assert _generate._segment_ends(512) == [64, 128, 192, 256, 320, 448, 512]
        method = sampling.Temperature(1.0)
        r = run(tiny_model, [[5, 6, 7]], method, group_size=2, max_new_tokens=150, stop_tokens=[])
        np.testing.assert_array_equal(r.lengths, [150, 150])
        logp_err, sample_err = max_logp_error(tiny_model, r, method)
        assert logp_err < 1e-4 and sample_err < 1e-4

    @pytest.mark.slow
    def test_bfloat16_difference_is_small(self):
        cfg = models.get_model_config("tiny", dtype="bfloat16")
        model = nnx.split(models.init_model(cfg, seed=0))
        r = run(
            model, [[5, 6, 7], [8, 9]], sampling.Temperature(1.0), group_size=4, max_new_tokens=32
        )
        logp_err, _ = max_logp_error(model, r, sampling.Temperature(1.0))
        assert logp_err < 1e-2  # measured (6.4e-4) and reported by experiments/bench_sampler.py


class TestCompilation:
    @pytest.mark.slow
    def test_new_values_do_not_recompile(self, tiny_model):
        keys = [jax.random.key(s) for s in range(3)]
        tokens, mask = sampling.pad_prompts([[1, 2, 3], [4]], pad_id=0)

        def call(method, key, max_new, stop, pad):
            return sampling.generate(
                *tiny_model, tokens, mask, rng=key, method=method, group_size=2,
                max_new_tokens=max_new, stop_tokens=[stop], pad_id=pad,
            )

        kinds = [
            [sampling.Temperature(0.7), sampling.Temperature(1.3), sampling.Temperature(1)],
            [sampling.TopP(0.9), sampling.TopP(0.5, temperature=0.6), sampling.TopP(1)],
            [sampling.TopK(5), sampling.TopK(40, temperature=2.0), sampling.TopK(1)],
            [sampling.MinP(0.1), sampling.MinP(0.0, temperature=0.5), sampling.MinP(1)],
        ]
        for first, *others in kinds:
            call(first, keys[0], 5, 1, 0)  # compiles this kind once
            with counting_compiles() as compiles:
                for i, method in enumerate(others):
                    jax.block_until_ready(call(method, keys[i + 1], 9 + 3 * i, 7 + i, 3))
            assert not compiles, type(first).__name__
        assert _generate._generate._cache_size() >= len(kinds)


class TestMesh:
    @pytest.mark.slow
    @pytest.mark.parametrize("shape", [(8, 1), (4, 2)], ids=["fsdp8", "fsdp4_tensor2"])
    def test_sharded_equals_unsharded(self, tiny_model, shape):
        """The trainer's fsdp-sharded weights, resharded on device to the sampling rules."""
        mesh = jax.make_mesh(
            shape, ("fsdp", "tensor"), axis_types=(jax.sharding.AxisType.Auto,) * 2
        )
        method = sampling.TopK(20, temperature=1.0)
        prompts = [[5, 6, 7], [8, 9], [1], [2, 3, 4, 5]]
        expected = run(tiny_model, prompts, method, seed=3, group_size=4, max_new_tokens=12,
                       stop_tokens=np.arange(0, 512, 32))
        sharded = nnx.split(models.init_model(models.get_model_config("tiny"), seed=0, mesh=mesh))
        with jax.set_mesh(mesh):
            tokens, mask = sampling.pad_prompts(prompts, pad_id=0)
            rollout = sampling.generate(
                *sharded, tokens, mask, rng=jax.random.key(3), method=method, group_size=4,
                max_new_tokens=12, stop_tokens=np.arange(0, 512, 32), pad_id=0,
            )
            assert rollout.tokens.sharding.spec[0] in ("fsdp", ("fsdp",))  # rows split 8 or 4 ways
            got = sampling.to_host(rollout)
        np.testing.assert_array_equal(got.tokens, expected.tokens)
        np.testing.assert_array_equal(got.lengths, expected.lengths)
        np.testing.assert_allclose(got.logp, expected.logp, atol=1e-5)

    @pytest.mark.slow
    def test_a_quantised_base_resharded_for_sampling_equals_unsharded(self):
        """QLoRA's int8 base (integers and per-channel scales) in the sampling layout,
        heads and MLP over "tensor", samples what it samples on one device."""
        cfg = dataclasses.replace(models.get_model_config("tiny"), lora=models.LoraSpec(
            rank=4, alpha=8.0, targets=("attn.q", "attn.o", "mlp.down"), quantize="int8"))
        mesh = jax.make_mesh(
            (4, 2), ("fsdp", "tensor"), axis_types=(jax.sharding.AxisType.Auto,) * 2
        )
        prompts = [[5, 6, 7], [8, 9], [1], [2, 3, 4, 5]]
        kwargs = dict(group_size=2, max_new_tokens=8, stop_tokens=[])
        expected = run(nnx.split(models.init_model(cfg, seed=0)), prompts, **kwargs)
        sharded = nnx.split(models.init_model(cfg, seed=0, mesh=mesh))
        with jax.set_mesh(mesh):
            tokens, mask = sampling.pad_prompts(prompts, pad_id=0)
            got = sampling.to_host(sampling.generate(*sharded, tokens, mask, rng=jax.random.key(0),
                                                     method=sampling.Greedy(), pad_id=0, **kwargs))
        np.testing.assert_array_equal(got.tokens, expected.tokens)
        np.testing.assert_allclose(got.logp, expected.logp, atol=1e-5)
