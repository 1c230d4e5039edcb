"""The composer: config section in, the same numbers as composing the functions by hand."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from grpo_jax import config_lib, objectives


def _config(recipe="base", **overrides):
    config = config_lib.load_config(f"configs/{recipe}.py").objective
    config.group_size = 4
    return config_lib.apply_overrides(config, overrides)


def _batch(seed=0, B=8, T=6):
    rng = np.random.default_rng(seed)
    lengths = np.array([6, 4, 1, 5, 0, 6, 3, 2])[:B]
    mask = (np.arange(T)[None] < lengths[:, None]).astype(np.float32)
    old = np.log(rng.uniform(0.05, 0.95, (B, T))).astype(np.float32)
    arrays = {
        "old_logp": old, "mask": mask,
        "rewards": rng.integers(0, 2, B).astype(np.float32),
        "ref_logp": old + rng.normal(0, 0.2, (B, T)).astype(np.float32),
        "behaviour_logp": old + rng.normal(0, 0.5, (B, T)).astype(np.float32),
        "entropy": rng.uniform(0, 2, (B, T)).astype(np.float32),
        "truncated": np.array([0, 1, 0, 0, 0, 1, 0, 0], bool)[:B],
    }
    logp = old + rng.normal(0, 0.3, (B, T)).astype(np.float32)
    return jnp.asarray(logp), {k: jnp.asarray(v) for k, v in arrays.items()}


class TestMatchesHandComposition:

    def test_grpo_with_kl_and_entropy(self):
        cfg = _config("grpo", entropy_coef=0.01, **{"kl.beta": 0.04})
        logp, b = _batch()
        loss, metrics = jax.jit(objectives.policy_objective(cfg))(logp, b)
        adv = objectives.group_advantages(b["rewards"], 4)
        per_token, diag = objectives.ppo_clip_loss(logp, b["old_logp"], adv, b["mask"])
        kl = objectives.kl_penalty(logp, b["ref_logp"])
        per_token_total = per_token + 0.04 * kl - 0.01 * b["entropy"]

        def reduce(x):
            return objectives.aggregate(x, b["mask"], mode="seq-mean-token-mean")

        np.testing.assert_allclose(loss, reduce(per_token_total), rtol=1e-6)
        np.testing.assert_allclose(metrics["loss"], reduce(per_token_total), rtol=1e-6)
        np.testing.assert_allclose(metrics["policy_loss"], reduce(per_token), rtol=1e-6)
        np.testing.assert_allclose(metrics["kl_ref"], reduce(kl), rtol=1e-6)
        m = np.asarray(b["mask"]) > 0
        for name in ("ratio", "kl_old", "clip_low", "clip_high"):
            np.testing.assert_allclose(metrics[name], np.asarray(diag[name])[m].mean(), rtol=1e-6)
        np.testing.assert_allclose(
            metrics["entropy"], np.asarray(b["entropy"])[m].mean(), rtol=1e-6
        )
        assert set(metrics) == {"loss", "policy_loss", "kl_ref", "entropy", "ratio", "kl_old",
                                "clip_low", "clip_high", "nonfinite_logp", "nonfinite_rewards"}
        assert metrics["nonfinite_logp"] == 0 and metrics["nonfinite_rewards"] == 0

    def test_dual_clip_reports_its_own_metric(self):
        cfg = _config("grpo", **{"loss.dual_clip": 1.1, "kl.beta": 0.04})
        logp, b = _batch()
        metrics = objectives.policy_objective(cfg)(logp, b)[1]
        adv = objectives.group_advantages(b["rewards"], 4)
        diag = objectives.ppo_clip_loss(logp, b["old_logp"], adv, b["mask"], dual_clip=1.1)[1]
        m = np.asarray(b["mask"]) > 0
        assert float(metrics["clip_dual"]) > 0
        np.testing.assert_allclose(metrics["clip_dual"], np.asarray(diag["clip_dual"])[m].mean(),
                                   rtol=1e-6)

    def test_precomputed_advantages_equal_computed(self):
        objective = objectives.policy_objective(_config("dapo"))
        logp, b = _batch()
        inside = objective(logp, b)[0]
        outside = objective(logp, {**b, "advantages": objective.advantages(b)})[0]
        np.testing.assert_allclose(inside, outside, rtol=1e-7)

    def test_overlong_mask_drops_truncated_rows(self):
        objective = objectives.policy_objective(_config(**{"overlong.mode": "mask"}))
        logp, b = _batch()
        adv = objective.advantages(b)
        got = objective(logp, {**b, "advantages": adv})[0]
        m = objectives.truncated_mask(b["mask"], b["truncated"])
        np.testing.assert_array_equal(objective.loss_mask(b), m)
        expected = objectives.aggregate(
            objectives.ppo_clip_loss(logp, b["old_logp"], adv, m)[0], m, mode="token-mean")
        np.testing.assert_allclose(got, expected, rtol=1e-6)

    def test_loss_mask_is_the_mask_without_overlong_masking(self):
        objective = objectives.policy_objective(_config())
        _, b = _batch()
        del b["truncated"]   # not needed
        np.testing.assert_array_equal(objective.loss_mask(b), b["mask"])

    def test_importance_weights_multiply_the_policy_term(self):
        objective = objectives.policy_objective(_config("olmo3"))
        logp, b = _batch()
        loss, metrics = objective(logp, b)
        adv = objectives.group_advantages(b["rewards"], 4, scale="none")
        per_token = objectives.ppo_clip_loss(logp, b["old_logp"], adv, b["mask"],
                                             eps_high=0.272)[0]
        w = objectives.importance_weights(b["old_logp"], b["behaviour_logp"], b["mask"], cap=2.0)
        np.testing.assert_allclose(
            loss, objectives.aggregate(per_token * w, b["mask"], mode="token-mean"), rtol=1e-6
        )
        assert 0 < float(metrics["importance_weight"]) <= 2.0

    def test_reinforce_pp_kl_in_reward(self):
        config = config_lib.load_config("configs/reinforce_pp.py:kl_in_reward=True").objective
        config.group_size = 4
        objective = objectives.policy_objective(config)
        logp, b = _batch()
        kl = objectives.kl_penalty(b["old_logp"], b["ref_logp"], kind="k1")
        expected = objectives.reinforce_pp_advantages(
            b["rewards"], b["mask"], token_rewards=-0.01 * kl
        )
        np.testing.assert_allclose(objective.advantages(b), expected, rtol=1e-6)
        assert "kl_ref" not in objective(logp, b)[1]  # the KL is in the reward, not the loss

    @pytest.mark.parametrize(
        "recipe, kind", [("gspo", "gspo"), ("cispo", "cispo"), ("sapo", "sapo")]
    )
    def test_recipe_selects_its_loss(self, recipe, kind):
        cfg = _config(recipe)
        logp, b = _batch()
        loss_fn, fields = objectives.POLICY_LOSSES[kind]
        adv = objectives.group_advantages(b["rewards"], 4)
        per_token = loss_fn(
            logp, b["old_logp"], adv, b["mask"], **{f: cfg.loss[f] for f in fields}
        )[0]
        expected = objectives.aggregate(per_token, b["mask"], mode=cfg.aggregation.mode)
        np.testing.assert_allclose(
            objectives.policy_objective(cfg)(logp, b)[0], expected, rtol=1e-6
        )

    def test_pg_with_leave_one_out_advantages(self):
        cfg = _config("rloo", **{"loss.kind": "pg"})
        logp, b = _batch()
        loss, metrics = objectives.policy_objective(cfg)(logp, b)
        adv = objectives.rloo_advantages(b["rewards"], 4)
        per_token = objectives.pg_loss(logp, b["old_logp"], adv, b["mask"])[0]
        np.testing.assert_allclose(
            loss, objectives.aggregate(per_token, b["mask"], mode="token-mean"), rtol=1e-6
        )
        assert set(metrics) == {"loss", "policy_loss", "entropy", "ratio", "kl_old",
                                "nonfinite_logp", "nonfinite_rewards"}

    def test_k3_unbiased_kl_term(self):
        cfg = _config("grpo", **{"kl.kind": "k3_unbiased", "kl.beta": 0.04})
        logp, b = _batch()
        loss, metrics = objectives.policy_objective(cfg)(logp, b)
        adv = objectives.group_advantages(b["rewards"], 4)
        per_token = objectives.ppo_clip_loss(logp, b["old_logp"], adv, b["mask"])[0]
        kl = objectives.kl_penalty(logp, b["ref_logp"], kind="k3_unbiased", old_logp=b["old_logp"])

        def reduce(x):
            return objectives.aggregate(x, b["mask"], mode="seq-mean-token-mean")

        np.testing.assert_allclose(loss, reduce(per_token + 0.04 * kl), rtol=1e-6)
        np.testing.assert_allclose(metrics["kl_ref"], reduce(kl), rtol=1e-6)
        # Off-policy it is not plain k3.
        assert (
            abs(float(metrics["kl_ref"] - reduce(objectives.kl_penalty(logp, b["ref_logp"]))))
            > 1e-3
        )


class TestGdpoRewardWeights:

    def _rewards(self):
        rng = np.random.default_rng(4)
        return jnp.asarray(rng.integers(0, 3, (8, 2)).astype(np.float32))

    @pytest.mark.parametrize("weights", [None, (1.0, 0.5)])
    def test_weights_from_the_caller(self, weights):
        objective = objectives.policy_objective(_config("gdpo"), reward_weights=weights)
        rewards = self._rewards()
        expected = objectives.gdpo_advantages(
            rewards, 4, weights=None if weights is None else jnp.asarray(weights))
        np.testing.assert_allclose(objective.advantages({"rewards": rewards}), expected, rtol=1e-6)

    def test_weights_change_the_advantages(self):
        rewards = self._rewards()
        even = objectives.policy_objective(_config("gdpo")).advantages({"rewards": rewards})
        skewed = objectives.policy_objective(_config("gdpo"), reward_weights=(1.0, 0.25))
        assert np.max(np.abs(np.asarray(skewed.advantages({"rewards": rewards}) - even))) > 1e-3

    def test_wrong_number_of_weights_names_reward_specs(self):
        objective = objectives.policy_objective(_config("gdpo"), reward_weights=(1.0, 0.5, 2.0))
        with pytest.raises(ValueError, match=r"got 3 reward weights for 2 reward columns; "
                                             r"reward.specs must name one"):
            objective.advantages({"rewards": self._rewards()})


class TestAggregationTheLossDefines:

    @pytest.mark.parametrize("kind", ["gspo", "sapo"])
    @pytest.mark.parametrize(
        "mode", ["token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"]
    )
    def test_other_modes_are_rejected_with_the_fix(self, kind, mode):
        with pytest.raises(ValueError, match=(
                rf"objective.aggregation.mode='{mode}' changes the {kind} objective, which its "
                r"paper \(.*\) defines with 'seq-mean-token-mean'; set objective.aggregation.mode="
                r"'seq-mean-token-mean', or objective.aggregation.allow_other_modes=True")):
            objectives.policy_objective(_config(kind, **{"aggregation.mode": mode}))

    @pytest.mark.parametrize("kind", ["gspo", "sapo"])
    def test_override_runs_the_variant(self, kind):
        cfg = _config(
            kind, **{"aggregation.mode": "token-mean", "aggregation.allow_other_modes": True}
        )
        logp, b = _batch()
        loss_fn, fields = objectives.POLICY_LOSSES[kind]
        adv = objectives.group_advantages(b["rewards"], 4)
        per_token = loss_fn(
            logp, b["old_logp"], adv, b["mask"], **{f: cfg.loss[f] for f in fields}
        )[0]
        expected = objectives.aggregate(per_token, b["mask"], mode="token-mean")
        np.testing.assert_allclose(
            objectives.policy_objective(cfg)(logp, b)[0], expected, rtol=1e-6
        )

    @pytest.mark.parametrize("kind", ["pg", "ppo_clip", "cispo"])
    def test_token_losses_take_every_mode(self, kind):
        for mode in objectives.AGGREGATION_MODES:
            objectives.policy_objective(_config(**{"loss.kind": kind, "aggregation.mode": mode,
                                                   "loss.eps_low": 0.2, "loss.eps_high": 0.2}))


class TestRegistry:

    def test_new_variant_is_one_function_and_one_line(self):
        def scaled_pg(logp, old_logp, adv, mask, *, eps_high):
            return jnp.where(mask > 0, -(1 + eps_high) * adv[:, None] * logp, 0.0), {}

        objectives.register_policy_loss("scaled_pg", scaled_pg, fields=("eps_high",))
        try:
            objective = objectives.policy_objective(
                _config(**{"loss.kind": "scaled_pg", "loss.eps_high": 0.5}))
        finally:
            del objectives.POLICY_LOSSES["scaled_pg"]
        logp, b = _batch()
        adv = objectives.group_advantages(b["rewards"], 4)
        expected = jnp.sum(jnp.where(b["mask"] > 0, -1.5 * adv[:, None] * logp, 0)) / jnp.sum(
            b["mask"]
        )
        np.testing.assert_allclose(objective(logp, b)[0], expected, rtol=1e-6)

    def test_new_estimator_receives_the_reward_weights(self):
        def weighted_mean(cfg, batch, rewards, reward_weights):
            return rewards @ jnp.asarray(reward_weights) - jnp.mean(
                rewards @ jnp.asarray(reward_weights)
            )

        objectives.register_advantage_estimator("weighted_mean", weighted_mean)
        try:
            objective = objectives.policy_objective(
                _config(**{"advantage.estimator": "weighted_mean"}), reward_weights=(2.0, -1.0))
        finally:
            del objectives.ADVANTAGE_ESTIMATORS["weighted_mean"]
        rewards = jnp.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [0.0, 0.0]])
        np.testing.assert_allclose(objective.advantages({"rewards": rewards}),
                                   [1.5, -1.5, 0.5, -0.5], rtol=1e-6)


class TestConfigErrors:

    @pytest.mark.parametrize("overrides, message", [
        ({"loss.kind": "ppo"},
         r"objective.loss.kind must be one of 'pg', 'ppo_clip', 'gspo', 'cispo', 'sapo', "
         r"'gmpo', 'dppo', 'clip_cov', 'kl_cov', 'luspo', 'vespo'; got 'ppo'"),
        ({"loss.eps_high": -0.1}, r"objective.loss.eps_high must be >= 0, got -0.1"),
        ({"loss.dual_clip": 1.0}, r"objective.loss.dual_clip must be > 1.0, got 1.0"),
        ({"kl.kind": "k4"},
         r"objective.kl.kind must be one of 'k1', 'k2', 'k3', 'k3_unbiased'; got 'k4'"),
        ({"aggregation.mode": "mean"}, r"objective.aggregation.mode must be one of"),
        ({"advantage.estimator": "ppo"},
         r"objective.advantage.estimator must be one of 'group', 'rloo'"),
        ({"advantage.estimator": "rloo", "group_size": 1},
         r"objective.group_size must be >= 2 for rloo"),
        ({"kl.in_reward": True}, r"objective.kl.in_reward=True needs"),
        ({"advantage.estimator": "reinforce_pp", "kl.in_reward": True, "kl.kind": "k3_unbiased"},
         r"objective.kl.kind='k3_unbiased' corrects the KL loss's gradient; a KL folded into the "
         r"reward \(objective.kl.in_reward=True\) has none"),
        ({"overlong.mode": "penalty"},
         r"objective.overlong.mode must be one of 'none', 'mask'; got 'penalty'"),
        ({"kl.beta": -1.0}, r"objective.kl.beta must be >= 0"),
        ({"offpolicy_mask.delta": -0.1}, r"objective.offpolicy_mask.delta must be >= 0, got -0.1"),
    ])
    def test_names_the_field(self, overrides, message):
        with pytest.raises(ValueError, match=message):
            objectives.policy_objective(_config(**overrides))

    def test_missing_batch_key_is_named(self):
        objective = objectives.policy_objective(_config("grpo"))
        logp, b = _batch()
        del b["ref_logp"]
        with pytest.raises(KeyError, match=r"batch\['ref_logp'\] is required by kl.beta > 0"):
            objective(logp, b)
