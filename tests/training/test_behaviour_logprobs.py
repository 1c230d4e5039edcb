"""The trainer's log-probs of sampled tokens equal the sampler's: at the rollout temperature,
over the kept top-p support (keep sampling mask) and with the sampler's experts (keep routing).
"""

import dataclasses

import jax
import numpy as np
import pytest
from flax import nnx

from grpo_jax import models, sampling
from grpo_jax.training import batch as batch_lib

PROMPTS = [[5, 6, 7], [8, 9], list(range(20, 30)), [41]]


def _rollout(graphdef, state, method, **records):
    tokens, mask = sampling.pad_prompts(PROMPTS, pad_id=0, buckets=(16,))
    return sampling.generate(graphdef, state, tokens, mask, rng=jax.random.key(3), method=method,
                             group_size=4, max_new_tokens=20, stop_tokens=[1], pad_id=0,
                             **records)


def _rows(rollout):
    keys = ("prompt_tokens", "prompt_mask", "tokens", "mask", "support_ids", "support_size",
            "prompt_routing", "routing")
    return {k: getattr(rollout, k) for k in keys if getattr(rollout, k) is not None}


def _trainer_logp(graphdef, state, rows, temperature):
    fn = jax.jit(lambda s, r: batch_lib.completion_logprobs(nnx.merge(graphdef, s), r,
                                                            temperature=temperature))
    return np.asarray(fn(state, rows))


def _error(got, rollout, field="logp"):
    mask = np.asarray(rollout.mask, bool)
    return np.abs(got - np.asarray(getattr(rollout, field)))[mask]


@pytest.mark.slow
def test_trainer_logprobs_at_the_rollout_temperature_equal_the_samplers():
    graphdef, state = nnx.split(models.init_model(models.get_model_config("tiny"), seed=1))
    rollout = _rollout(graphdef, state, sampling.Temperature(0.7))
    assert _error(_trainer_logp(graphdef, state, _rows(rollout), 0.7), rollout).max() < 2e-5
    # At temperature 1 they are another distribution's: the test can tell the two apart.
    assert _error(_trainer_logp(graphdef, state, _rows(rollout), 1.0), rollout).max() > 0.05


@pytest.mark.slow
def test_keep_sampling_mask_renormalises_over_the_kept_top_p_set():
    # A random tiny model's logits are flat: at temperature 0.1 the 0.8 nucleus holds 1 to
    # ~50 tokens, within the 64 recorded candidates.
    graphdef, state = nnx.split(models.init_model(models.get_model_config("tiny"), seed=1))
    method = sampling.TopP(0.8, temperature=0.1)
    rollout = _rollout(graphdef, state, method, record_support=True)
    rows = _rows(rollout)
    mask = np.asarray(rollout.mask, bool)
    assert (np.asarray(rollout.support_size)[mask] <= rows["support_ids"].shape[-1]).all()
    kept = _trainer_logp(graphdef, state, rows, 0.1)
    # pi_old recomputed over the kept set is the probability the sampler drew the token with.
    assert _error(kept, rollout, "sample_logp").max() < 2e-5
    # Without the mask it is the uncut tempered distribution's: a different, lower number.
    full = _trainer_logp(graphdef, state, {k: v for k, v in rows.items()
                                           if not k.startswith("support")}, 0.1)
    assert (kept - full)[mask].min() > -1e-6 and (kept - full)[mask].max() > 0.01


@pytest.mark.slow
def test_a_nucleus_larger_than_the_candidates_falls_back_to_the_full_softmax():
    graphdef, state = nnx.split(models.init_model(models.get_model_config("tiny"), seed=1))
    rollout = _rollout(graphdef, state, sampling.TopP(0.8, temperature=0.7), record_support=True)
    rows = _rows(rollout)
    mask = np.asarray(rollout.mask, bool)
    assert (np.asarray(rollout.support_size)[mask] > rows["support_ids"].shape[-1]).all()
    # Not recorded (hundreds of tokens kept, 64 candidates): the uncut tempered log-prob.
    assert _error(_trainer_logp(graphdef, state, rows, 0.7), rollout, "logp").max() < 2e-5


@pytest.mark.slow
def test_keep_routing_replays_the_samplers_experts():
    """On tiny_moe, a bfloat16 sampler and a float32 trainer route some tokens to
    different experts; replaying the sampler's experts removes that part of the mismatch,
    and with equal numerics the replayed forward equals the sampler's log-probs."""
    cfg = models.get_model_config("tiny_moe")
    graphdef, state = nnx.split(models.init_model(cfg, seed=2))
    method = sampling.Temperature(1.0)
    rollout = _rollout(graphdef, state, method, record_routing=True)
    rows = _rows(rollout)
    assert rows["routing"].shape[2:] == (cfg.n_layers, cfg.n_experts_per_tok)
    assert _error(_trainer_logp(graphdef, state, rows, 1.0), rollout).max() < 2e-5

    bf16 = nnx.merge(
        *nnx.split(models.init_model(dataclasses.replace(cfg, dtype="bfloat16"), seed=2))
    )
    bf_graphdef, bf_state = nnx.split(bf16)
    sampled = _rollout(bf_graphdef, bf_state, method, record_routing=True)
    replayed = _error(_trainer_logp(graphdef, state, _rows(sampled), 1.0), sampled)
    own = _error(_trainer_logp(graphdef, state, {k: v for k, v in _rows(sampled).items()
                                                 if "routing" not in k}, 1.0), sampled)
    print(f"bf16 sampler vs f32 trainer |logp gap|: own routing mean {own.mean():.2e} max "
          f"{own.max():.2e}; replayed mean {replayed.mean():.2e} max {replayed.max():.2e}")
    assert replayed.mean() < own.mean() and replayed.max() < own.max()
