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
        "lengths": np.array([10, 16, 1, 14, 0, 16, 12, 15])[:B],
    }
    logp = old + rng.normal(0, 0.3, (B, T)).astype(np.float32)
    return jnp.asarray(logp), {k: jnp.asarray(v) for k, v in arrays.items()}


class TestMatchesHandComposition:

    def test_grpo_with_kl_and_entropy(self):
        cfg = _config("grpo", entropy_coef=0.01)
        logp, b = _batch()
        loss, metrics = jax.jit(objectives.policy_objective(cfg))(logp, b)
        adv = objectives.group_advantages(b["rewards"], 4)
        per_token, diag = objectives.ppo_clip_loss(logp, b["old_logp"], adv, b["mask"])
        per_token = (per_token + 0.04 * objectives.kl_penalty(logp, b["ref_logp"])
                     - 0.01 * b["entropy"])
        expected = objectives.aggregate(per_token, b["mask"], mode="seq-mean-token-mean")
        np.testing.assert_allclose(loss, expected, rtol=1e-6)
        np.testing.assert_allclose(metrics["loss"], expected, rtol=1e-6)
        m = np.asarray(b["mask"]) > 0
        np.testing.assert_allclose(metrics["clip_high"], np.asarray(diag["clip_high"])[m].mean(), rtol=1e-6)
        assert set(metrics) == {"loss", "policy_loss", "kl", "entropy", "ratio", "approx_kl",
                                "clip_low", "clip_high"}

    def test_precomputed_advantages_equal_computed(self):
        objective = objectives.policy_objective(_config("dapo"))
        logp, b = _batch()
        inside = objective(logp, b)[0]
        outside = objective(logp, {**b, "advantages": objective.advantages(b)})[0]
        np.testing.assert_allclose(inside, outside, rtol=1e-7)

    def test_dapo_overlong_penalty_shapes_rewards(self):
        cfg = _config("dapo", **{"overlong.max_len": 16, "overlong.cache_len": 4})
        logp, b = _batch()
        adv = objectives.policy_objective(cfg).advantages(b)
        shaped = b["rewards"] + objectives.overlong_penalty(b["lengths"], max_len=16, cache_len=4)
        np.testing.assert_allclose(adv, objectives.group_advantages(shaped, 4), rtol=1e-6)
        assert float(jnp.min(shaped)) < 0   # the batch really hits the zone

    def test_overlong_mask_drops_truncated_rows(self):
        objective = objectives.policy_objective(_config(**{"overlong.mode": "mask"}))
        logp, b = _batch()
        adv = objective.advantages(b)
        got = objective(logp, {**b, "advantages": adv})[0]
        m = objectives.truncated_mask(b["mask"], b["truncated"])
        expected = objectives.aggregate(
            objectives.ppo_clip_loss(logp, b["old_logp"], adv, m)[0], m, mode="token-mean")
        np.testing.assert_allclose(got, expected, rtol=1e-6)

    def test_importance_weights_multiply_the_policy_term(self):
        objective = objectives.policy_objective(_config("olmo3"))
        logp, b = _batch()
        loss, metrics = objective(logp, b)
        adv = objectives.group_advantages(b["rewards"], 4, scale="none")
        per_token = objectives.ppo_clip_loss(logp, b["old_logp"], adv, b["mask"],
                                             eps_high=0.28)[0]
        w = objectives.importance_weights(b["old_logp"], b["behaviour_logp"], b["mask"], cap=2.0)
        np.testing.assert_allclose(loss, objectives.aggregate(per_token * w, b["mask"], mode="token-mean"),
                                   rtol=1e-6)
        assert 0 < float(metrics["importance_weight"]) <= 2.0

    def test_reinforce_pp_kl_in_reward(self):
        config = config_lib.load_config("configs/reinforce_pp.py:kl_in_reward=True").objective
        config.group_size = 4
        objective = objectives.policy_objective(config)
        logp, b = _batch()
        kl = objectives.kl_penalty(b["old_logp"], b["ref_logp"], kind="k1")
        expected = objectives.reinforce_pp_advantages(b["rewards"], b["mask"], token_rewards=-0.01 * kl)
        np.testing.assert_allclose(objective.advantages(b), expected, rtol=1e-6)
        assert "kl" not in objective(logp, b)[1]   # the KL is in the reward, not the loss

    @pytest.mark.parametrize("recipe, kind", [("gspo", "gspo"), ("cispo", "cispo"), ("sapo", "sapo")])
    def test_recipe_selects_its_loss(self, recipe, kind):
        cfg = _config(recipe)
        logp, b = _batch()
        loss_fn, fields = objectives.POLICY_LOSSES[kind]
        adv = objectives.group_advantages(b["rewards"], 4)
        per_token = loss_fn(logp, b["old_logp"], adv, b["mask"], **{f: cfg.loss[f] for f in fields})[0]
        expected = objectives.aggregate(per_token, b["mask"], mode=cfg.aggregation.mode)
        np.testing.assert_allclose(objectives.policy_objective(cfg)(logp, b)[0], expected, rtol=1e-6)


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
        expected = jnp.sum(jnp.where(b["mask"] > 0, -1.5 * adv[:, None] * logp, 0)) / jnp.sum(b["mask"])
        np.testing.assert_allclose(objective(logp, b)[0], expected, rtol=1e-6)


class TestConfigErrors:

    @pytest.mark.parametrize("overrides, message", [
        ({"loss.kind": "ppo"}, r"objective.loss.kind must be one of 'ppo_clip', 'gspo', 'cispo', 'sapo'; got 'ppo'"),
        ({"loss.eps_high": -0.1}, r"objective.loss.eps_high must be >= 0, got -0.1"),
        ({"loss.dual_clip": 1.0}, r"objective.loss.dual_clip must be > 1.0, got 1.0"),
        ({"kl.kind": "k4"}, r"objective.kl.kind must be one of 'k1', 'k2', 'k3'; got 'k4'"),
        ({"aggregation.mode": "mean"}, r"objective.aggregation.mode must be one of"),
        ({"advantage.estimator": "ppo"}, r"objective.advantage.estimator must be one of 'group', 'rloo'"),
        ({"advantage.estimator": "rloo", "group_size": 1}, r"objective.group_size must be >= 2 for rloo"),
        ({"kl.in_reward": True}, r"objective.kl.in_reward=True needs"),
        ({"overlong.mode": "penalty"}, r"objective.overlong.cache_len must be > 0, got 0"),
        ({"overlong.mode": "soft"}, r"objective.overlong.mode must be one of 'none', 'mask', 'penalty'"),
        ({"kl.beta": -1.0}, r"objective.kl.beta must be >= 0"),
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
