"""Edge cases: degenerate groups, empty rows, and bad arguments with clear errors."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from grpo_jax import objectives


class TestDegenerateGroups:

    @pytest.mark.parametrize("value", [0.0, 1.0, 0.1, 0.3, -7.7, 1e-8])
    @pytest.mark.parametrize("scale", ["group", "batch", "none"])
    def test_all_equal_group_gets_exactly_zero(self, value, scale):
        rewards = jnp.concatenate([jnp.full(8, value, jnp.float32), jnp.arange(8.0)])
        adv = jax.jit(functools.partial(objectives.group_advantages, group_size=8, scale=scale))(
            rewards
        )
        np.testing.assert_array_equal(np.asarray(adv[:8]), 0.0)
        assert np.all(np.asarray(adv[8:]) != 0)

    def test_float32_residue_is_removed(self):
        """0.1 summed 8 times in float32 is not 0.8: the mean leaves a residue."""
        r = np.full(8, 0.1, np.float32)
        naive = jnp.asarray(r) - jnp.mean(jnp.asarray(r))
        assert float(jnp.max(jnp.abs(naive))) > 0, "the residue this test guards against"
        for fn in (functools.partial(objectives.group_advantages, group_size=8),
                   functools.partial(objectives.rloo_advantages, group_size=8)):
            np.testing.assert_array_equal(np.asarray(jax.jit(fn)(jnp.asarray(r))), 0.0)

    def test_gdpo_all_equal_column_contributes_zero(self):
        rewards = jnp.array([[1.0, 0.3], [0.0, 0.3], [1.0, 0.3], [1.0, 0.3]])
        adv = jax.jit(functools.partial(objectives.gdpo_advantages, group_size=2))(rewards)
        only_first = jax.jit(functools.partial(objectives.gdpo_advantages, group_size=2))(
            rewards[:, :1]
        )
        np.testing.assert_allclose(adv, only_first, rtol=1e-6)

    @pytest.mark.parametrize("delta", [1e-12, 1e-30, 1e-38])
    def test_near_zero_std_is_finite(self, delta):
        rewards = jnp.array([1.0, 1.0 + delta, 1.0, 1.0], jnp.float32)
        for fn in (functools.partial(objectives.group_advantages, group_size=4),
                   functools.partial(objectives.group_advantages, group_size=4, eps=0.0),
                   functools.partial(objectives.gdpo_advantages, group_size=2)):
            r = rewards[:, None] if fn.func is objectives.gdpo_advantages else rewards
            assert np.all(np.isfinite(np.asarray(jax.jit(fn)(r))))

    def test_group_has_signal(self):
        got = jax.jit(functools.partial(objectives.group_has_signal, group_size=3))(
            jnp.array([1.0, 1, 1, 0, 0, 1, 0.1, 0.1, 0.1]))
        np.testing.assert_array_equal(np.asarray(got), [False, True, False])


class TestEmptyRows:

    @pytest.mark.parametrize("mode", objectives.AGGREGATION_MODES)
    @pytest.mark.parametrize(
        "loss_fn",
        [
            objectives.pg_loss, objectives.ppo_clip_loss, objectives.gspo_loss,
            functools.partial(objectives.cispo_loss, eps_low=1.0, eps_high=1.0),
            objectives.sapo_loss,
        ],
    )
    def test_fully_masked_rows_contribute_zero_and_no_nan(self, mode, loss_fn):
        mask = jnp.array([[1.0, 1, 0], [0, 0, 0]])
        logp = jnp.log(jnp.array([[0.5, 0.4, 0.3], [0.2, 0.1, 0.9]]))
        old = logp - 0.1

        def total(lp, m):
            return objectives.aggregate(loss_fn(lp, old, jnp.array([1.0, -1.0]), m)[0], m,
                                        mode=mode, num_seqs=2)

        value, grad = jax.jit(jax.value_and_grad(total))(logp, mask)
        row0 = jax.jit(total)(logp, mask.at[1].set(0))
        assert np.isfinite(value) and np.all(np.isfinite(grad))
        np.testing.assert_array_equal(np.asarray(grad[1]), 0.0)
        np.testing.assert_allclose(value, row0)
        empty = jax.jit(jax.value_and_grad(total))(logp, jnp.zeros_like(mask))
        assert float(empty[0]) == 0.0 and np.all(np.asarray(empty[1]) == 0)

    def test_reinforce_pp_and_gae_with_empty_row(self):
        mask = jnp.array([[1.0, 1, 1], [0, 0, 0], [1, 0, 0]])
        adv = objectives.reinforce_pp_advantages(jnp.array([1.0, 5.0, 0.0]), mask)
        assert np.all(np.isfinite(adv)) and np.all(np.asarray(adv[1]) == 0)
        a, r = objectives.gae(jnp.ones((3, 3)), jnp.ones((3, 3)), mask, gamma=0.9, lam=0.95)
        assert np.all(np.asarray(a[1]) == 0) and np.all(np.asarray(r[1]) == 0)


def _raises(match, fn, *args, **kwargs):
    with pytest.raises(ValueError, match=match):
        fn(*args, **kwargs)


class TestErrors:
    r8, m = jnp.arange(8.0), jnp.ones((8, 3))

    def test_group_size_must_divide_batch(self):
        _raises(
            r"group_size=3 does not divide the batch of 8 rows", objectives.group_advantages,
            self.r8, 3,
        )
        _raises(r"group_size=3 does not divide", objectives.rloo_advantages, self.r8, 3)
        _raises(r"group_size=3 does not divide", objectives.group_has_signal, self.r8, 3)
        _raises(r"group_size=5 does not divide", objectives.gdpo_advantages, self.m, 5)
        _raises(r"group_size=3 does not divide", objectives.reinforce_pp_advantages,
                self.r8, self.m, group_size=3)

    def test_rloo_needs_two(self):
        _raises(
            r"group_size must be an integer >= 2, got 1", objectives.rloo_advantages, self.r8, 1
        )

    def test_unbiased_std_needs_two(self):
        _raises(r"group_size must be an integer >= 2, got 1", objectives.group_advantages,
                self.r8, 1, ddof=1)

    @pytest.mark.parametrize("fn", [objectives.ppo_clip_loss, objectives.gspo_loss,
                                    functools.partial(objectives.cispo_loss, eps_low=0.2)])
    def test_negative_eps(self, fn):
        z = jnp.zeros((1, 1))
        _raises(r"eps_high must be >= 0, got -0.1", fn, z, z, jnp.ones(1), z, eps_high=-0.1)

    def test_negative_eps_low(self):
        z = jnp.zeros((1, 1))
        _raises(
            r"eps_low must be >= 0, got -1", objectives.ppo_clip_loss, z, z, jnp.ones(1), z,
            eps_low=-1,
        )

    @pytest.mark.parametrize("c", [1.0, 0.5, -2])
    def test_dual_clip_must_exceed_one(self, c):
        z = jnp.zeros((1, 1))
        _raises(
            rf"dual_clip must be > 1.0, got {c}", objectives.ppo_clip_loss, z, z, jnp.ones(1), z,
            dual_clip=c,
        )

    def test_unknown_names(self):
        z = jnp.zeros((2, 2))
        _raises(r"mode must be one of 'token-mean', 'seq-mean-token-mean', 'seq-mean-token-sum', "
                r"'seq-mean-token-sum-norm', 'bnpo'; got 'sum'", objectives.aggregate, z, z,
                mode="sum")
        _raises(r"kind must be one of 'k1', 'k2', 'k3', 'k3_unbiased'; got 'k4'",
                objectives.kl_penalty, z, z, kind="k4")
        _raises(r"scale must be one of 'group', 'batch', 'none'; got 'std'",
                objectives.group_advantages, self.r8, 4, scale="std")
        _raises(r"level must be one of 'token', 'sequence'; got 'seq'",
                objectives.importance_weights, z, z, z, level="seq")
        _raises(r"mode must be one of 'truncate', 'mask'; got 'clip'",
                objectives.importance_weights, z, z, z, mode="clip")

    def test_shaping_arguments(self):
        _raises(r"cache_len must be > 0, got 0", objectives.overlong_penalty, jnp.ones(2),
                max_len=10, cache_len=0)
        _raises(r"cache_len must be <= max_len", objectives.overlong_penalty, jnp.ones(2),
                max_len=10, cache_len=20)
        z = jnp.zeros((2, 2))
        _raises(
            r"cap must be > 1.0, got 0.5", objectives.importance_weights, z, z, z, mode="mask",
            cap=0.5,
        )
        _raises(r"alpha must be > 0", objectives.length_adaptive_lambda, jnp.ones(2), alpha=0.0)
        _raises(r"tau_neg must be > 0.0", objectives.sapo_loss, z, z, jnp.ones(2), z, tau_neg=0.0)
        _raises(r"rewards must be \[B, K\]", objectives.gdpo_advantages, self.r8, 4)

    def test_offpolicy_corrections_arguments(self):
        z = jnp.zeros((2, 2))
        _raises(r"kind='k3_unbiased' needs old_logp, the log-probs of the policy that sampled "
                r"the tokens; pass old_logp=...", objectives.kl_penalty, z, z, kind="k3_unbiased")
        _raises(r"delta must be >= 0, got -0.1", objectives.offpolicy_sequence_mask, z, z,
                jnp.ones(2), z, delta=-0.1)


class TestCompilesOnce:

    def test_new_values_same_shapes_do_not_recompile(self):
        pytest.importorskip("ml_collections", reason="builds DAPO's recipe: the train extra")
        from grpo_jax import config_lib
        objective = objectives.policy_objective(config_lib.load_config("configs/dapo.py").objective)
        traces = []

        def loss(logp, batch):
            traces.append(1)
            return objective(logp, batch)[0]

        step = jax.jit(jax.value_and_grad(loss))
        rng = np.random.default_rng(0)
        for _ in range(4):
            B, T = 16, 12
            batch = {"old_logp": jnp.asarray(rng.normal(size=(B, T)), jnp.float32),
                     "mask": jnp.asarray(rng.integers(0, 2, (B, T)), jnp.float32),
                     "rewards": jnp.asarray(rng.integers(0, 2, B), jnp.float32)}
            step(jnp.asarray(rng.normal(size=(B, T)), jnp.float32), batch)
        assert len(traces) == 1
        assert step._cache_size() == 1
