"""Sampling in a lower precision than the trainer computes in (``rollout.dtype``)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from ml_collections import config_dict

from grpo_jax import models, objectives, sampling
from grpo_jax.training import batch as batch_lib, policy as policy_lib, rl
from tests import readme_metrics
from tests.training.training_setups import read_metrics, runlocal_config

PROMPTS = [[5, 6, 7], [8, 9], list(range(20, 30)), [41]]
ROW_KEYS = ("prompt_tokens", "prompt_mask", "tokens", "mask")


def _config(rollout_dtype, model_dtype="float32"):
    return config_dict.ConfigDict({"rollout": {"dtype": rollout_dtype},
                                   "model": {"dtype": model_dtype}})


def _policy(name="tiny"):
    graphdef, state = nnx.split(models.init_model(models.get_model_config(name), seed=1))
    return policy_lib.Policy(graphdef, state, tokenizer=None)


def _sample(policy, slots=0):
    tokens, mask = sampling.pad_prompts(PROMPTS, pad_id=0, buckets=(16,))
    return sampling.generate(policy.graphdef, policy.params, tokens, mask, rng=jax.random.key(3),
                             method=sampling.Temperature(1.0), group_size=4, max_new_tokens=20,
                             stop_tokens=[1], pad_id=0, slots=slots)


def _trainer_logp(policy, rollout):
    rows = {k: getattr(rollout, k) for k in ROW_KEYS}
    fn = jax.jit(lambda s, r: batch_lib.completion_logprobs(nnx.merge(policy.graphdef, s), r))
    return np.asarray(fn(policy.params, rows))


def _float_dtypes(params):
    return {str(x.dtype) for x in jax.tree.leaves(params) if jnp.issubdtype(x.dtype, jnp.floating)}


@pytest.mark.parametrize("dtype", ["float64", "bf16", "int8"])
def test_an_unknown_dtype_names_the_field(dtype):
    with pytest.raises(ValueError, match=r"rollout.dtype must be '' \(model.dtype\) or one of"):
        policy_lib.check_rollout_dtype(_config(dtype))


@pytest.mark.parametrize("dtype", ["", "float32"])
def test_the_trainers_dtype_samples_with_the_parameters_as_they_are(dtype):
    assert policy_lib.RolloutPrecision.of(_config(dtype), _policy()) is None


@pytest.mark.slow
def test_a_cast_to_the_trainers_own_dtype_samples_bit_identical_rollouts():
    """The cast and the rebuilt network change nothing when the dtype is the trainer's:
    every token and log-prob of the rollout is the same bits."""
    policy = _policy()
    same = policy_lib.RolloutPrecision("float32", policy_lib.computing_in(
        policy.graphdef, policy.params, "float32")).policy(policy)
    got, want = _sample(same), _sample(policy)
    for key in ("tokens", "logp", "lengths", "mask"):
        np.testing.assert_array_equal(np.asarray(getattr(got, key)),
                                      np.asarray(getattr(want, key)), err_msg=key)


@pytest.mark.slow
def test_a_bfloat16_sampler_holds_bf16_weights_and_its_gap_is_measured():
    """The sampler's weights and network are bf16, the trainer's stay float32; the
    sampler's log-probs differ from the trainer's recomputed ones by a nonzero amount,
    which `mismatch_metrics` reports (checked against numpy)."""
    policy = _policy()
    precision = policy_lib.RolloutPrecision.of(_config("bfloat16"), policy)
    sampler = precision.policy(policy)
    assert _float_dtypes(sampler.params) == {"bfloat16"}
    assert _float_dtypes(policy.params) == {"float32"}   # the trainer's copy is untouched
    assert nnx.merge(sampler.graphdef, sampler.params).cfg.dtype == "bfloat16"
    assert nnx.merge(policy.graphdef, policy.params).cfg.dtype == "float32"
    for slots in (0, 4):   # the static sampler and the continuous-batching engine
        rollout = _sample(sampler, slots)
        mask = np.asarray(rollout.mask, bool)
        trainer = _trainer_logp(policy, rollout)
        gap = np.abs(np.asarray(rollout.logp) - trainer)[mask]
        # bf16 keeps 8 bits of mantissa: a flat random model's log-probs (about -5.5)
        # move by ~1e-3 nats, where two float32 programs agree to ~1e-7.
        assert 1e-4 < gap.mean() < 2e-2, gap.mean()
        metrics = jax.jit(objectives.mismatch_metrics)(jnp.asarray(trainer), rollout.logp,
                                                        rollout.mask)
        np.testing.assert_allclose(metrics["abs_diff_mean"], gap.mean(), rtol=1e-5)
        np.testing.assert_allclose(metrics["abs_diff_max"], gap.max(), rtol=1e-6)
    # The float32 sampler's gap is float rounding only: the test tells the two apart.
    full = _sample(policy)
    assert np.abs(np.asarray(full.logp) - _trainer_logp(policy, full))[
        np.asarray(full.mask, bool)].max() < 2e-5


@pytest.mark.slow
def test_a_bfloat16_moe_sampler_records_its_experts():
    policy = _policy("tiny_moe")
    sampler = policy_lib.RolloutPrecision.of(_config("bfloat16"), policy).policy(policy)
    assert _float_dtypes(sampler.params) == {"bfloat16"}
    tokens, mask = sampling.pad_prompts(PROMPTS, pad_id=0, buckets=(16,))
    rollout = sampling.generate(sampler.graphdef, sampler.params, tokens, mask,
                                rng=jax.random.key(3), method=sampling.Temperature(1.0),
                                group_size=2, max_new_tokens=8, stop_tokens=[1], pad_id=0,
                                record_routing=True)
    cfg = nnx.merge(policy.graphdef, policy.params).cfg
    assert rollout.routing.shape[-1] == cfg.n_experts_per_tok
    assert 0 <= int(rollout.routing.min()) and int(rollout.routing.max()) < cfg.n_experts


@pytest.mark.slow
def test_a_bfloat16_rollout_run_logs_the_mismatch(data_dir, tmp_path):
    """configs/dapo.py:runlocal=True with bf16 rollouts, 2 steps, on split meshes (the cast
    parameters copied to the rollout mesh): the sampler/trainer gap is logged every step,
    above a float32 run's rounding."""
    config = runlocal_config("dapo", data_dir, **{
        "rollout.dtype": "bfloat16", "train.steps": 2, "rollout.mesh": "data=4"})
    assert rl.train(config, str(tmp_path)) == 2
    rows = read_metrics(tmp_path)
    assert readme_metrics.undocumented(set().union(*rows)) == []
    for row in rows:
        assert row["mismatch/abs_diff_mean"] > 1e-4, row
        assert np.isfinite(row["mismatch/k3_kl"]) and row["mismatch/k3_kl"] >= 0


def _numpy_quantised(x, dtype, block):
    """`policy.quantised_weights` of one leaf, in numpy with ml_dtypes' formats."""
    import ml_dtypes
    largest = {"float8_e4m3fn": 448.0, "float4_e2m1fn": 6.0}[dtype]
    blocks = x.reshape(x.shape[:-1] + (x.shape[-1] // block, block))
    scale = np.abs(blocks).max(axis=-1, keepdims=True) / largest
    scale = np.where(scale > 0, scale, 1.0)
    codes = (blocks / scale).astype(getattr(ml_dtypes, dtype)).astype(np.float32)
    return (codes * scale).reshape(x.shape).astype(ml_dtypes.bfloat16)


@pytest.mark.parametrize("dtype,block,relative", [("float8_e4m3fn", 128, 1 / 16),
                                                  ("float4_e2m1fn", 16, 1 / 4)])
def test_weight_only_formats_round_each_block_of_the_last_axis_to_its_own_scale(
        dtype, block, relative):
    """`quantised_weights` against numpy and ml_dtypes: blocks of `block` consecutive
    elements of the last axis (the whole axis where it does not divide) each scaled by
    amax / largest, rounded to the format, scaled back and held in bfloat16; a vector (a
    norm) only cast; an integer leaf and an all-zero matrix as they are."""
    import ml_dtypes
    rng = np.random.default_rng(0)
    blocked = (rng.normal(size=(3, 2, 2 * block)) *
               np.repeat([0.02, 30.0], block)).astype(np.float32)   # two blocks, two scales
    whole = rng.normal(size=(4, 24)).astype(np.float32)   # 24 does not divide into blocks
    vector = rng.normal(size=(5,)).astype(np.float32)
    state = {"w": jnp.asarray(blocked), "e": jnp.asarray(whole), "norm": jnp.asarray(vector),
             "q": jnp.arange(4, dtype=jnp.int8), "zero": jnp.zeros((2, 2), jnp.float32)}
    got = policy_lib.quantised_weights(state, dtype)
    assert got["w"].dtype == got["e"].dtype == got["norm"].dtype == jnp.bfloat16
    np.testing.assert_array_equal(np.asarray(got["w"]), _numpy_quantised(blocked, dtype, block))
    np.testing.assert_array_equal(np.asarray(got["e"]), _numpy_quantised(whole, dtype, 24))
    np.testing.assert_array_equal(np.asarray(got["norm"]), vector.astype(ml_dtypes.bfloat16))
    np.testing.assert_array_equal(np.asarray(got["q"]), np.arange(4, dtype=np.int8))
    np.testing.assert_array_equal(np.asarray(got["zero"]), np.zeros((2, 2)))
    # Each block's largest weight is exact (to bf16); the others within the format's step.
    w = np.asarray(got["w"], np.float32).reshape(3, 2, 2, block)
    want = blocked.reshape(3, 2, 2, block)
    np.testing.assert_allclose(np.abs(w).max(-1), np.abs(want).max(-1), rtol=1 / 128)
    assert np.all(np.abs(w - want) <= relative * np.abs(want).max(-1, keepdims=True) + 1e-12)


@pytest.mark.slow
def test_weight_only_samplers_move_further_from_the_trainer_as_the_format_narrows():
    """Weight-only FP8 and FP4 rollouts compute in bfloat16 over the rounded weights; the
    sampler/trainer gap grows with fewer mantissa bits: bf16 (7 stored) < FP8 E4M3 (3) <
    FP4 E2M1 (1), each several times the last."""
    policy = _policy()
    gaps = {}
    for dtype in ("bfloat16", "float8_e4m3fn", "float4_e2m1fn"):
        sampler = policy_lib.RolloutPrecision.of(_config(dtype), policy).policy(policy)
        assert _float_dtypes(sampler.params) == {"bfloat16"}
        assert nnx.merge(sampler.graphdef, sampler.params).cfg.dtype == "bfloat16"
        rollout = _sample(sampler)
        mask = np.asarray(rollout.mask, bool)
        gaps[dtype] = np.abs(np.asarray(rollout.logp) - _trainer_logp(policy, rollout))[mask].mean()
    assert 3 * gaps["bfloat16"] < gaps["float8_e4m3fn"] < gaps["float4_e2m1fn"] / 2, gaps
