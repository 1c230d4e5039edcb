"""Invariances every objective must keep: micro-batching, sharding, padding, masks, order."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

from grpo_jax import config_lib, objectives

LOSS_KINDS = ("pg", "ppo_clip", "gspo", "cispo", "sapo")
# bnpo is a micro-batch's own token mean on purpose (tests/objectives/test_trl_losses.py).
ADDITIVE_MODES = tuple(m for m in objectives.AGGREGATION_MODES
                       if m not in objectives.SPLIT_DEPENDENT_MODES)
G = 4


def _objective(kind, mode, **changes):
    config = config_lib.load_config("configs/base.py").objective
    config.group_size = G
    config.loss.kind = kind
    config.aggregation.mode = mode
    config.aggregation.allow_other_modes = True   # every loss under every mode
    config.loss.eps_low, config.loss.eps_high = (1.0, 0.3) if kind == "cispo" else (0.2, 0.28)
    return objectives.policy_objective(config_lib.apply_overrides(config, changes))


def _batch(seed, B=16, T=9):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(0, T + 1, size=B)
    lengths[0] = T
    mask = (np.arange(T)[None] < lengths[:, None]).astype(np.float32)
    old = np.log(rng.uniform(0.05, 0.95, (B, T))).astype(np.float32)
    logp = (old + rng.normal(0, 0.3, (B, T))).astype(np.float32)
    rewards = rng.integers(0, 2, size=B).astype(np.float32)
    batch = {"old_logp": old, "mask": mask, "rewards": rewards,
             "ref_logp": (old + rng.normal(0, 0.1, (B, T))).astype(np.float32),
             "truncated": rng.random(B) < 0.3}
    return jnp.asarray(logp), {k: jnp.asarray(v) for k, v in batch.items()}


def _split_value_and_grad(objective, logp, batch, pieces):
    """Losses, gradients and metrics of `pieces` equal row slices, each a separate call."""
    vg = jax.jit(jax.value_and_grad(objective, has_aux=True))
    rows = logp.shape[0] // pieces
    losses, grads, metrics = [], [], []
    for i in range(pieces):
        part = slice(i * rows, (i + 1) * rows)
        micro = {k: (v[part] if v.ndim else v) for k, v in batch.items()}
        (loss, metric), grad = vg(logp[part], micro)
        losses.append(loss)
        grads.append(grad)
        metrics.append(metric)
    total = {name: sum(m[name] for m in metrics) for name in metrics[0]}
    return sum(losses), np.concatenate(grads), total


def _value_and_grad(objective):
    return jax.jit(jax.value_and_grad(lambda lp, b: objective(lp, b)[0]))


class TestMicroBatching:
    """Global counts make micro-batch losses and gradients add up to the full batch."""

    @pytest.mark.slow
    @settings(max_examples=16, deadline=None)
    @given(kind=st.sampled_from(LOSS_KINDS), mode=st.sampled_from(ADDITIVE_MODES),
           pieces=st.sampled_from([2, 4]), seed=st.integers(0, 2**16),
           kl=st.sampled_from([None, "k3", "k3_unbiased"]), offpolicy_mask=st.booleans())
    def test_split_equals_full(self, kind, mode, pieces, seed, kl, offpolicy_mask):
        changes = {"offpolicy_mask.enabled": offpolicy_mask, "offpolicy_mask.delta": 0.02}
        if kl:
            changes.update({"kl.beta": 0.1, "kl.kind": kl})
        objective = _objective(kind, mode, **changes)
        logp, batch = _batch(seed)
        batch["advantages"] = objective.advantages(batch)   # once, over the full batch
        batch["num_tokens"] = jnp.sum(batch["mask"])
        batch["num_seqs"] = jnp.float32(logp.shape[0])
        (full_loss, full_metrics), full_grad = jax.jit(jax.value_and_grad(objective, has_aux=True))(
            logp, batch)
        loss, grad, metrics = _split_value_and_grad(objective, logp, batch, pieces)
        np.testing.assert_allclose(loss, full_loss, rtol=2e-5, atol=1e-6)
        np.testing.assert_allclose(grad, full_grad, rtol=2e-5, atol=1e-7)
        for name in full_metrics:
            np.testing.assert_allclose(metrics[name], full_metrics[name], rtol=2e-5, atol=1e-6)

    @pytest.mark.parametrize("kind", LOSS_KINDS)
    @pytest.mark.parametrize("mode", ADDITIVE_MODES)
    def test_overlong_mask_counts_from_loss_mask(self, kind, mode):
        """Counts from `loss_mask`: split = full call = the pure functions on the narrowed mask."""
        objective = _objective(kind, mode, **{"overlong.mode": "mask"})
        logp, batch = _batch(17)
        assert bool(jnp.any(batch["truncated"] & (batch["mask"].sum(-1) > 0)))
        batch["advantages"] = objective.advantages(batch)
        full_loss = objective(logp, batch)[0]
        kept = objectives.truncated_mask(batch["mask"], batch["truncated"])
        loss_fn, fields = objectives.POLICY_LOSSES[kind]
        per_token = loss_fn(logp, batch["old_logp"], batch["advantages"], kept,
                            **{f: getattr(objective.spec, f) for f in fields})[0]
        pure = objectives.aggregate(per_token, kept, mode=mode)
        np.testing.assert_allclose(full_loss, pure, rtol=1e-6, atol=1e-7)

        counted = {**batch, "num_tokens": jnp.sum(objective.loss_mask(batch)),
                   "num_seqs": jnp.float32(logp.shape[0])}
        split_loss, _, _ = _split_value_and_grad(objective, logp, counted, pieces=4)
        np.testing.assert_allclose(split_loss, pure, rtol=2e-5, atol=1e-6)
        if mode == "token-mean":   # the control: counting before narrowing shrinks the loss
            wrong = {**counted, "num_tokens": jnp.sum(batch["mask"])}
            wrong_loss, _, _ = _split_value_and_grad(objective, logp, wrong, pieces=4)
            assert abs(float(wrong_loss) - float(pure)) > 1e-3 * abs(float(pure))

    def test_local_counts_would_differ(self):
        """The control: without global counts, token-mean micro-batches do not add up."""
        objective = _objective("ppo_clip", "token-mean")
        logp, batch = _batch(3)
        batch["advantages"] = objective.advantages(batch)
        full = objective(logp, batch)[0]
        halves = [objective(logp[s], {k: v[s] for k, v in batch.items()})[0] / 2
                  for s in (slice(0, 8), slice(8, 16))]
        assert abs(float(sum(halves) - full)) > 1e-4


class TestMesh:

    @pytest.mark.parametrize("kind, mode", [("ppo_clip", "token-mean"),
                                            ("gspo", "seq-mean-token-mean"),
                                            ("cispo", "seq-mean-token-sum-norm")])
    def test_sharded_over_eight_devices_equals_single_device(self, kind, mode):
        assert jax.device_count() == 8, "tests/conftest.py forces 8 CPU devices"
        mesh = jax.make_mesh((8,), ("data",), axis_types=(AxisType.Auto,))
        objective = _objective(kind, mode, **{"kl.beta": 0.05})
        logp, batch = _batch(7, B=32)
        vg = _value_and_grad(objective)
        with jax.set_mesh(mesh):
            shard = lambda x: jax.device_put(x, NamedSharding(mesh, P("data")))
            sharded_batch = {k: shard(v) for k, v in batch.items()}
            sharded_loss, sharded_grad = vg(shard(logp), sharded_batch)
            assert sharded_grad.sharding.spec == P("data")
            sharded_metrics = jax.jit(objective)(shard(logp), sharded_batch)[1]
        single = jax.devices()[0]
        on_one = lambda x: jax.device_put(x, single)
        loss, grad = vg(on_one(logp), {k: on_one(v) for k, v in batch.items()})
        metrics = jax.jit(objective)(logp, batch)[1]
        np.testing.assert_allclose(sharded_loss, loss, rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(sharded_grad, grad, rtol=1e-6, atol=1e-8)
        for name in metrics:
            np.testing.assert_allclose(sharded_metrics[name], metrics[name], rtol=1e-5, atol=1e-7)


class TestPaddingAndMasks:

    @pytest.mark.parametrize("kind", LOSS_KINDS)
    @pytest.mark.parametrize("mode", objectives.AGGREGATION_MODES)
    def test_extra_padding_changes_nothing(self, kind, mode):
        objective = _objective(kind, mode, **{"aggregation.norm_len": 12})
        logp, batch = _batch(11)
        pad = 5
        garbage = jnp.full((logp.shape[0], pad), jnp.nan)
        padded_logp = jnp.concatenate([logp, garbage], axis=1)
        padded = dict(batch)
        for key in ("old_logp", "ref_logp"):
            padded[key] = jnp.concatenate([batch[key], -garbage], axis=1)
        padded["mask"] = jnp.concatenate([batch["mask"], jnp.zeros_like(garbage)], axis=1)
        vg = _value_and_grad(objective)
        loss, grad = vg(logp, batch)
        padded_loss, padded_grad = vg(padded_logp, padded)
        np.testing.assert_allclose(padded_loss, loss, rtol=1e-6)
        np.testing.assert_allclose(padded_grad[:, :-pad], grad, rtol=1e-6)
        np.testing.assert_array_equal(padded_grad[:, -pad:], 0.0)

    @pytest.mark.parametrize("kind", LOSS_KINDS)
    def test_masked_positions_get_exactly_zero_gradient(self, kind):
        objective = _objective(kind, "seq-mean-token-mean", **{"kl.beta": 0.1})
        logp, batch = _batch(5)
        grad = _value_and_grad(objective)(logp, batch)[1]
        masked = np.asarray(batch["mask"]) == 0
        assert masked.sum() > 10
        np.testing.assert_array_equal(np.asarray(grad)[masked], 0.0)
        assert np.count_nonzero(np.asarray(grad)[~masked]) > 0.5 * (~masked).sum()


class TestGroupPermutation:

    @pytest.mark.parametrize("estimator", ["group", "rloo", "gdpo", "reinforce_pp"])
    def test_permuting_groups_permutes_rows(self, estimator):
        objective = _objective("ppo_clip", "token-mean", **{"advantage.estimator": estimator})
        logp, batch = _batch(13)
        if estimator == "gdpo":
            rng = np.random.default_rng(0)
            batch["rewards"] = jnp.asarray(rng.integers(0, 3, (16, 2)).astype(np.float32))
        order = np.concatenate([np.arange(g * G, (g + 1) * G) for g in (2, 0, 3, 1)])
        permuted = {k: v[order] for k, v in batch.items()}
        adv = objective.advantages(batch)
        np.testing.assert_allclose(objective.advantages(permuted), adv[order], rtol=1e-6, atol=1e-7)
        per_row = lambda lp, b: objectives.ppo_clip_loss(lp, b["old_logp"], objective.advantages(b),
                                                         b["mask"])[0]
        np.testing.assert_allclose(per_row(logp[order], permuted), per_row(logp, batch)[order],
                                   rtol=1e-6, atol=1e-7)
