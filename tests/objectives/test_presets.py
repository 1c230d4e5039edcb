"""Presets: each method's objective by name, frozen, with group_size stated at the call.

Core install only (jax + numpy); tests/objectives/test_presets_recipes.py checks that the
recipes in configs/ build exactly these objectives."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from grpo_jax import objectives
from grpo_jax.objectives import presets
from tests.objectives import preset_batches

G, T = preset_batches.G, preset_batches.T
batch = preset_batches.batch


def loss_and_grad(objective, logp, b):
    return jax.jit(jax.value_and_grad(lambda lp: objective(lp, b)[0]))(logp)


class TestPresetsAreTheirMethod:
    """Each preset against the same objective composed by hand from the pure functions."""

    @pytest.mark.parametrize("preset, loss_fn, kwargs, mode", [
        (presets.dapo, objectives.ppo_clip_loss, dict(eps_low=0.2, eps_high=0.28), "token-mean"),
        (presets.gspo, objectives.gspo_loss, dict(eps_low=3e-4, eps_high=4e-4),
         "seq-mean-token-mean"),
        (presets.cispo, objectives.cispo_loss, dict(eps_low=1.0, eps_high=0.28), "token-mean"),
        (presets.sapo, objectives.sapo_loss, dict(tau_pos=1.0, tau_neg=1.05),
         "seq-mean-token-mean"),
    ])
    def test_group_advantage_presets_are_their_loss_and_aggregation(self, preset, loss_fn, kwargs,
                                                                    mode):
        logp, b = batch(1)
        adv = objectives.group_advantages(b["rewards"], G)

        def by_hand(lp):
            per_token, _ = loss_fn(lp, b["old_logp"], adv, b["mask"], **kwargs)
            return objectives.aggregate(per_token, b["mask"], mode=mode)

        loss, grad = loss_and_grad(preset(group_size=G), logp, b)
        want, want_grad = jax.value_and_grad(by_hand)(logp)
        np.testing.assert_allclose(loss, want, rtol=1e-6)
        np.testing.assert_allclose(grad, want_grad, rtol=1e-6, atol=1e-9)

    def test_grpo_has_its_kl_and_dr_grpo_its_constant(self):
        logp, b = batch(2)
        adv = objectives.group_advantages(b["rewards"], G)
        per_token, _ = objectives.ppo_clip_loss(logp, b["old_logp"], adv, b["mask"])
        kl = objectives.kl_penalty(logp, b["ref_logp"], kind="k3")
        want = objectives.aggregate(per_token + 0.001 * kl, b["mask"], mode="seq-mean-token-mean")
        np.testing.assert_allclose(presets.grpo(group_size=G)(logp, b)[0], want, rtol=1e-6)

        adv = objectives.group_advantages(b["rewards"], G, scale="none")
        per_token, _ = objectives.ppo_clip_loss(logp, b["old_logp"], adv, b["mask"])
        want = objectives.aggregate(per_token, b["mask"], mode="seq-mean-token-sum-norm",
                                    norm_len=48)
        np.testing.assert_allclose(presets.dr_grpo(group_size=G, norm_len=48)(logp, b)[0], want,
                                   rtol=1e-6)

    def test_rloo_is_the_unclipped_gradient_with_leave_one_out(self):
        logp, b = batch(3)
        adv = objectives.rloo_advantages(b["rewards"], G)
        per_token, _ = objectives.pg_loss(logp, b["old_logp"], adv, b["mask"])
        want = objectives.aggregate(per_token, b["mask"], mode="token-mean")
        np.testing.assert_allclose(presets.rloo(group_size=G)(logp, b)[0], want, rtol=1e-6)

    def test_reinforce_pp_defaults_its_kl_to_the_reward_choice(self):
        assert presets.reinforce_pp(group_size=G).spec.kl_beta == 0.0
        spec = presets.reinforce_pp(group_size=G, kl_in_reward=True).spec
        assert (spec.kl_beta, spec.kl_kind, spec.kl_in_reward) == (0.01, "k1", True)

    @pytest.mark.parametrize("name", presets.__all__)
    def test_every_preset_builds_and_runs(self, name):
        kwargs = {"group_size": G}
        if name == "dr_grpo":
            kwargs["norm_len"] = T
        objective = getattr(presets, name)(**kwargs)
        assert isinstance(objective, objectives.PolicyObjective)
        assert objective.spec.group_size == G
        logp, b = batch(4)
        if name == "gdpo":   # one column per reward
            b["rewards"] = jnp.stack([b["rewards"], b["correct"]], axis=1)
        if name == "distill":   # a teacher's log-probs instead of a reward
            b["teacher_logp"] = b["old_logp"] - 0.1
        loss, metrics = objective(logp, b)
        assert np.isfinite(float(loss)) and float(metrics["loss"]) == float(loss)


class TestGroupSizeIsStated:

    def test_without_group_size_is_a_type_error_naming_it(self):
        with pytest.raises(TypeError, match="group_size"):
            presets.dapo()

    def test_a_group_size_that_does_not_divide_the_batch_raises(self):
        logp, b = batch()
        with pytest.raises(ValueError, match=r"group_size=3 does not divide the batch of 8 rows"):
            presets.dapo(group_size=3)(logp, b)

    def test_the_grouping_is_the_callers(self):
        """4 prompts x 4 answers: G = 4 groups them right; the recipe's G = 16 would not."""
        rewards = jnp.array([1., 1, 1, 1, 0, 1, 0, 1, 0, 0, 0, 0, 1, 0, 0, 0])
        adv = presets.dapo(group_size=4).advantages({"rewards": rewards})
        np.testing.assert_allclose(adv[:4], 0.0)     # an all-correct group: no signal
        np.testing.assert_allclose(adv[8:12], 0.0)   # an all-wrong group: no signal
        np.testing.assert_allclose(adv[4:8], [-1, 1, -1, 1], rtol=1e-5)

    def test_a_traced_group_size_gets_the_static_hint(self):
        with pytest.raises(TypeError, match=r"group_size is a traced value .* static_argnames"):
            jax.jit(lambda g: objectives.ObjectiveSpec(group_size=g))(4)


class TestFrozenAndChecked:

    def test_unknown_keyword_names_the_closest(self):
        with pytest.raises(TypeError, match=r"presets.dapo: unknown objective keyword 'eps_hgh'; "
                                            r"did you mean 'eps_high'\?"):
            presets.dapo(group_size=G, eps_hgh=0.3)

    def test_unknown_config_path_names_the_closest(self):
        section = {"group_size": G, "loss": {"kind": "ppo_clip", "eps_hgh": 0.3}}
        with pytest.raises(ValueError, match=r"objective.loss.eps_hgh is not an objective field; "
                                             r"did you mean objective.loss.eps_high\?"):
            objectives.policy_objective(section)

    def test_spec_is_frozen_and_replace_checks(self):
        spec = presets.dapo(group_size=G).spec
        with pytest.raises(dataclasses.FrozenInstanceError):
            spec.eps_high = 0.5
        assert spec.replace(eps_high=0.3).eps_high == 0.3 and spec.eps_high == 0.28
        with pytest.raises(TypeError, match="did you mean 'kl_beta'"):
            spec.replace(kl_bta=0.1)
        with pytest.raises(ValueError, match=r"objective.loss.eps_high must be >= 0, got -1"):
            spec.replace(eps_high=-1)

    def test_a_nested_dict_builds_the_same_objective_as_the_preset(self):
        section = {"group_size": G, "loss": {"kind": "gspo", "eps_low": 3e-4, "eps_high": 4e-4},
                   "aggregation": {"mode": "seq-mean-token-mean"}}
        assert objectives.objective_spec(section) == presets.gspo(group_size=G).spec

    def test_config_paths_cover_every_field(self):
        names = [f.name for f in dataclasses.fields(objectives.ObjectiveSpec)]
        assert sorted(names) == sorted(objectives.CONFIG_PATHS)
        assert len(set(objectives.CONFIG_PATHS.values())) == len(names)


class TestCorrectionsThroughTheComposer:
    """The mismatch corrections as `ObjectiveSpec` options equal the pure functions."""

    def _batch(self, seed=7):
        logp, b = batch(seed)
        rng = np.random.default_rng(seed)
        b["behaviour_logp"] = b["old_logp"] + jnp.asarray(rng.normal(0, 0.8, b["mask"].shape),
                                                          jnp.float32)
        return logp, b

    def test_decoupled_ppo_is_ppo_clip_with_a_one_sided_masked_behaviour_weight(self):
        """AReaL's eq. 5: old_logp = pi_prox, behaviour_logp = pi_behav, weight capped at 2
        by masking (no lower bound)."""
        logp, b = self._batch()
        objective = presets.dapo(group_size=G, importance=True, importance_mode="mask",
                                 importance_low=0.0, importance_high=2.0)
        adv = objectives.group_advantages(b["rewards"], G)

        def by_hand(lp):
            per_token, _ = objectives.decoupled_ppo_loss(
                lp, b["old_logp"], b["behaviour_logp"], adv, b["mask"], eps_low=0.2,
                eps_high=0.28, behav_weight_cap=2.0, behav_weight_mode="mask")
            return objectives.aggregate(per_token, b["mask"], mode="token-mean")

        (loss, metrics), grad = jax.value_and_grad(lambda lp: objective(lp, b), has_aux=True)(logp)
        want, want_grad = jax.value_and_grad(by_hand)(logp)
        np.testing.assert_allclose(loss, want, rtol=1e-6)
        np.testing.assert_allclose(grad, want_grad, rtol=1e-5, atol=1e-9)
        w = np.exp(np.asarray(b["old_logp"] - b["behaviour_logp"]))
        valid = np.asarray(b["mask"]) > 0
        assert 0 < float(metrics["importance_masked"]) < 1
        np.testing.assert_allclose(metrics["importance_masked"], (w[valid] > 2.0).mean(),
                                   rtol=1e-6)

    @pytest.mark.parametrize("level", ["token", "sequence", "geometric"])
    @pytest.mark.parametrize("mode", ["truncate", "mask"])
    def test_importance_option_is_rollout_correction_times_the_loss(self, level, mode):
        logp, b = self._batch(8)
        objective = presets.grpo(group_size=G, kl_beta=0.0, importance=True,
                                 importance_level=level, importance_mode=mode)
        adv = objectives.group_advantages(b["rewards"], G)
        w, _ = objectives.rollout_correction(b["old_logp"], b["behaviour_logp"], b["mask"],
                                             level=level, mode=mode)
        per_token, _ = objectives.ppo_clip_loss(logp, b["old_logp"], adv, b["mask"])
        want = objectives.aggregate(per_token * w, b["mask"], mode="seq-mean-token-mean")
        np.testing.assert_allclose(objective(logp, b)[0], want, rtol=1e-6)

    def test_bad_bounds_are_named(self):
        with pytest.raises(ValueError, match=r"objective.importance .*low must be < high"):
            presets.dapo(group_size=G, importance=True, importance_mode="mask",
                         importance_low=3.0, importance_high=2.0)
        with pytest.raises(ValueError, match=r"objective.importance .*applies to mode='mask' only"):
            presets.dapo(group_size=G, importance=True, importance_low=0.5)


class TestNewerLossesThroughTheComposer:
    """GMPO, DPPO, Clip-Cov, KL-Cov and M2PO presets equal their pure functions."""

    @pytest.mark.parametrize("name, fn, kwargs, mode", [
        ("gmpo", objectives.gmpo_loss, dict(eps_low=0.4, eps_high=0.4), "seq-mean-token-mean"),
        ("dppo", objectives.dppo_loss, dict(divergence="binary_tv", ratio_cap=20.0), "token-mean"),
        ("kl_cov", objectives.kl_cov_loss, dict(kl_fraction=2e-3, kl_coef=1.0), "token-mean"),
    ])
    def test_deterministic_losses(self, name, fn, kwargs, mode):
        logp, b = batch(9)
        adv = objectives.group_advantages(b["rewards"], G)

        def by_hand(lp):
            per_token, _ = fn(lp, b["old_logp"], adv, b["mask"], **kwargs)
            return objectives.aggregate(per_token, b["mask"], mode=mode)

        objective = getattr(presets, name)(group_size=G)
        loss, grad = loss_and_grad(objective, logp, b)
        want, want_grad = jax.value_and_grad(by_hand)(logp)
        np.testing.assert_allclose(loss, want, rtol=1e-6)
        np.testing.assert_allclose(grad, want_grad, rtol=1e-5, atol=1e-9)

    def test_clip_cov_draws_with_the_first_rows_seed(self):
        logp, b = batch(10)
        adv = objectives.group_advantages(b["rewards"], G)
        objective = presets.clip_cov(group_size=G, clip_fraction=0.2, cov_low=-1.0)
        per_token, diag = objectives.clip_cov_loss(
            logp, b["old_logp"], adv, b["mask"], key=jax.random.key(b["loss_seed"][0]),
            clip_fraction=0.2, cov_low=-1.0, cov_high=5.0, eps_low=1.0, eps_high=1.0)
        loss, metrics = objective(logp, b)
        np.testing.assert_allclose(loss, objectives.aggregate(per_token, b["mask"],
                                                              mode="token-mean"), rtol=1e-6)
        valid = np.asarray(b["mask"]) > 0
        assert float(metrics["cov_detached"]) > 0
        np.testing.assert_allclose(metrics["cov_detached"],
                                   np.asarray(diag["cov_detached"])[valid].mean(), rtol=1e-6)
        del b["loss_seed"]
        with pytest.raises(KeyError, match=r"batch\['loss_seed'\] is required by "
                                           r"objective.loss.kind='clip_cov'"):
            objective(logp, b)

    def test_m2po_masks_against_the_behaviour_policy(self):
        logp, b = batch(11)
        rng = np.random.default_rng(11)
        b["behaviour_logp"] = b["old_logp"] + jnp.asarray(rng.normal(0, 0.4, b["mask"].shape),
                                                          jnp.float32)
        adv = objectives.group_advantages(b["rewards"], G)
        keep = objectives.m2po_mask(logp, b["behaviour_logp"], b["mask"], tau=0.04)
        valid = np.asarray(b["mask"]) > 0
        assert 0 < (np.asarray(keep)[valid] == 0).mean() < 1
        per_token, _ = objectives.pg_loss(logp, b["old_logp"], adv, b["mask"])
        want = objectives.aggregate(per_token * keep, b["mask"], mode="token-mean")
        loss, metrics = presets.m2po(group_size=G)(logp, b)
        np.testing.assert_allclose(loss, want, rtol=1e-6)
        np.testing.assert_allclose(metrics["m2po_masked"],
                                   (np.asarray(keep)[valid] == 0).mean(), rtol=1e-6)

    def test_bad_new_fields_are_named(self):
        with pytest.raises(ValueError, match="objective.loss.divergence must be one of"):
            presets.dppo(group_size=G, divergence="tv")
        with pytest.raises(ValueError, match=r"objective.m2po.tau must be > 0.0, got 0"):
            presets.m2po(group_size=G, tau=0)
        with pytest.raises(ValueError, match="objective.aggregation.mode='token-mean' changes "
                                             "the gmpo objective"):
            presets.gmpo(group_size=G, aggregation="token-mean")
