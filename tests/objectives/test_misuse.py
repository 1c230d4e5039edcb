"""Misuses that used to pass silently (a different loss, or NaN, with no error) now raise,
or are handled as documented. One test per case."""

import re
import warnings
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from grpo_jax import objectives
from grpo_jax.objectives import presets

DOCS = Path(__file__).resolve().parents[2] / "docs" / "objectives.md"


def _batch(b=8, t=5, seed=0):
    rng = np.random.default_rng(seed)
    mask = (np.arange(t) < rng.integers(1, t + 1, b)[:, None]).astype(np.float32)
    old = rng.normal(-1.5, 0.3, (b, t)).astype(np.float32)
    logp = (old + rng.normal(0, 0.2, (b, t))).astype(np.float32)
    rewards = rng.integers(0, 2, b).astype(np.float32)
    return jnp.asarray(logp), {"old_logp": jnp.asarray(old), "mask": jnp.asarray(mask),
                               "rewards": jnp.asarray(rewards)}


class TestBatchKeys:
    @pytest.mark.parametrize("key, closest", [("behavior_logp", "behaviour_logp"),
                                              ("num_token", "num_tokens"),
                                              ("advantage", "advantages"),
                                              ("ref_logps", "ref_logp")])
    def test_misspelled_key_raises_naming_the_closest(self, key, closest):
        logp, batch = _batch()
        batch[key] = batch["old_logp"]
        objective = presets.m2po(group_size=4)
        with pytest.raises(ValueError, match=rf"batch\['{key}'\].*did you mean '{closest}'"):
            objective(logp, batch)
        with pytest.raises(ValueError, match=f"did you mean '{closest}'"):
            objective.advantages(batch)

    def test_own_keys_pass_once_accepted(self):
        logp, batch = _batch()
        objective = presets.dapo(group_size=4)
        expected = objective(logp, batch)[0]
        with pytest.raises(ValueError, match="objective.accepting"):
            objective(logp, {**batch, "my_ids": jnp.arange(8)})
        loss = objective.accepting("my_ids")(logp, {**batch, "my_ids": jnp.arange(8)})[0]
        assert float(loss) == float(expected)

    def test_missing_mask_names_what_it_is(self):
        logp, batch = _batch()
        del batch["mask"]
        with pytest.raises(KeyError, match=r"batch\['mask'\] is required: the \[B, T\]"):
            presets.dapo(group_size=4)(logp, batch)

    def test_describe_lists_required_and_optional_keys(self):
        grpo = presets.grpo(group_size=4).batch_keys()
        assert grpo["required"] == ("old_logp", "mask", "ref_logp")
        m2po = presets.m2po(group_size=4).batch_keys()
        assert m2po["required"] == ("old_logp", "mask")
        assert "behaviour_logp" in m2po["optional"]
        clip_cov = presets.clip_cov(group_size=4).batch_keys()
        assert clip_cov["required"] == ("old_logp", "mask", "loss_seed")
        text = objectives.describe(presets.vapo(group_size=4))
        for key in ("old_logp", "mask", "values", "correct", "num_positive_tokens"):
            assert re.search(rf"^  {key} +\[", text, re.M), key

    def test_docs_table_lists_every_key_with_its_shape(self):
        rows = dict(re.findall(r"^\| `(\w+)` \| ([^|]+?) \|", DOCS.read_text(), re.M))
        for key, (shape, _) in objectives.BATCH_KEYS.items():
            assert rows.get(key) == shape, (key, rows.get(key), shape)

    def test_the_trainers_batch_keys_are_known(self):
        """What the trainer carries (its layout, packing plan, counts, dropout key) is
        accepted: the table plus TRAINER_KEYS (the training tests run the real batches)."""
        logp, batch = _batch()
        extra = {k: jnp.zeros(8) for k in objectives.TRAINER_KEYS}
        objective = presets.dapo(group_size=4)
        assert float(objective(logp, {**batch, **extra})[0]) == float(objective(logp, batch)[0])


class TestGroupLayout:
    def test_wrong_group_size_that_divides_the_batch_raises(self):
        logp, batch = _batch()
        batch["prompt_ids"] = jnp.repeat(jnp.arange(2), 4)      # G = 4
        for g, what in ((2, "share the prompt id"), (8, "must be consecutive")):
            with pytest.raises(ValueError, match=what):
                presets.dapo(group_size=g).advantages(batch)
        presets.dapo(group_size=4).advantages(batch)

    def test_interleaved_rows_raise(self):
        logp, batch = _batch()
        batch["prompt_ids"] = jnp.tile(jnp.arange(2), 4)        # 0 1 0 1 ...
        with pytest.raises(ValueError, match=r"rows 0\.\.3 \(group 0\) hold the prompt_ids "
                                             r"\[0, 1, 0, 1\]"):
            presets.dapo(group_size=4)(logp, batch)

    def test_right_layout_changes_nothing_and_traced_wrong_layout_is_nan(self):
        logp, batch = _batch()
        objective = presets.dapo(group_size=4)
        ids = {"prompt_ids": jnp.array([5, 5, 5, 5, 9, 9, 9, 9])}
        assert float(objective(logp, {**batch, **ids})[0]) == float(objective(logp, batch)[0])
        bad = jnp.tile(jnp.arange(2), 4)
        adv = jax.jit(objective.advantages)({**batch, "prompt_ids": bad})
        assert bool(jnp.all(jnp.isnan(adv)))
        good = jax.jit(objective.advantages)({**batch, **ids})
        np.testing.assert_array_equal(good, objective.advantages(batch))


class TestCompletionLogprobsRanges:
    def setup_method(self):
        self.logits = jnp.zeros((2, 5, 3))
        self.tokens = jnp.zeros((2, 5), jnp.int32)

    def test_past_the_sequence_raises(self):
        with pytest.raises(ValueError, match=r"prompt_lengths \+ completion_len must be <= "
                                             r"L = 5.*3 \+ 3 = 6"):
            objectives.completion_logprobs(self.logits, self.tokens, 3, 3)
        with pytest.raises(ValueError, match="4 \\+ 2 = 6"):
            objectives.completion_logprobs(self.logits, self.tokens, jnp.array([1, 4]), 2)

    def test_prompt_length_zero_raises(self):
        with pytest.raises(ValueError, match="prompt_lengths must be >= 1, got 0"):
            objectives.completion_logprobs(self.logits, self.tokens, np.array([0, 2]), 2)

    def test_traced_out_of_range_is_nan_not_a_neighbour(self):
        fn = jax.jit(lambda p: objectives.completion_logprobs(self.logits, self.tokens, p, 2))
        out = fn(jnp.array([0, 4]))   # row 0: no prompt; row 1: its 2nd token is past L = 5
        assert np.all(np.isnan(out[0]))
        assert np.isclose(out[1, 0], np.log(1 / 3)) and np.isnan(out[1, 1])


class TestNormLen:
    @pytest.mark.parametrize("norm_len", [0, -3, 2.5])
    def test_dr_grpo_refuses_a_norm_len_below_one(self, norm_len):
        with pytest.raises(ValueError, match="objective.aggregation.norm_len must be None"):
            presets.dr_grpo(group_size=4, norm_len=norm_len)

    def test_aggregate_refuses_zero(self):
        with pytest.raises(ValueError, match="norm_len must be > 0, got 0"):
            objectives.aggregate(jnp.ones((2, 2)), jnp.ones((2, 2)),
                                 mode="seq-mean-token-sum-norm", norm_len=0)

    def test_numpy_integers_are_ints(self):
        spec = presets.dr_grpo(group_size=np.int64(4), norm_len=np.int32(8)).spec
        assert type(spec.group_size) is int and spec.group_size == 4
        assert type(spec.norm_len) is int and spec.norm_len == 8


@pytest.mark.parametrize("preset", ["grpo", "sapo", "gspo"])
def test_no_valid_row_gives_zero_with_global_counts(preset):
    """Per-answer averaging with num_seqs = 0 (a micro-batch of padding rows): 0, not NaN."""
    logp, batch = _batch()
    batch.update(mask=jnp.zeros((8, 5)), row_valid=jnp.zeros(8, bool),
                 ref_logp=batch["old_logp"])
    objective = getattr(presets, preset)(group_size=4, offpolicy_mask=True)
    counts = objective.global_counts(batch)
    assert float(counts["num_seqs"]) == 0.0
    loss, metrics = objective(logp, {**batch, **counts})
    assert float(loss) == 0.0 and float(metrics["offpolicy_masked"]) == 0.0


class TestNonFinite:
    def test_nan_reward_row_gets_zero_and_is_left_out(self):
        rewards = np.array([1.0, 0, np.nan, 0, 2, np.inf, 1, 0], np.float32)
        got = np.asarray(objectives.group_advantages(jnp.asarray(rewards), 4))
        expected = np.zeros(8)
        for p in range(2):
            r = rewards[4 * p:4 * p + 4]
            ok = np.isfinite(r)
            expected[4 * p:4 * p + 4][ok] = (r[ok] - r[ok].mean()) / (r[ok].std() + 1e-6)
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)

    def test_rloo_baseline_leaves_the_row_out(self):
        got = objectives.rloo_advantages(jnp.array([1.0, 0, jnp.nan, 0]), 4)
        np.testing.assert_allclose(got, [1.0, -0.5, 0.0, -0.5], atol=1e-6)

    def test_gdpo_row_with_a_bad_column_is_zero(self):
        rewards = jnp.array([[1.0, 0], [0, jnp.nan], [1, 1], [1, 0], [0, 1], [1, 1]])
        got = np.asarray(objectives.gdpo_advantages(rewards, 3))
        assert got[1] == 0.0 and np.all(np.isfinite(got))
        # the others: GDPO on the batch without row 1 (groups of 2 and 3 rows)
        col = lambda c, rows: (c[rows] - c[rows].mean()) / (c[rows].std() + 1e-6)
        r = np.asarray(rewards)
        s = np.zeros(6)
        for rows in ([0, 2], [3, 4, 5]):
            s[rows] = col(r[:, 0], rows) + col(r[:, 1], rows)
        keep = [0, 2, 3, 4, 5]
        expected = (s[keep] - s[keep].mean()) / (s[keep].std() + 1e-6)
        np.testing.assert_allclose(got[keep], expected, rtol=1e-5, atol=1e-6)

    @pytest.mark.parametrize("preset", ["dapo", "rloo", "reinforce_pp", "gdpo"])
    def test_objective_loss_stays_finite_and_counts_the_rows(self, preset):
        logp, batch = _batch()
        rewards = batch["rewards"].at[2].set(jnp.nan).at[5].set(-jnp.inf)
        if preset == "gdpo":
            rewards = jnp.stack([rewards, jnp.ones(8)], axis=1)
        batch["rewards"] = rewards
        objective = getattr(presets, preset)(group_size=4)
        adv = objective.advantages(batch)
        assert np.all(np.isfinite(adv)) and np.all(np.asarray(adv)[[2, 5]] == 0)
        loss, metrics = objective(logp, batch)
        assert np.isfinite(float(loss)) and float(metrics["nonfinite_rewards"]) == 2.0

    def test_reinforce_pp_whitens_without_the_row(self):
        logp, batch = _batch()
        rewards = np.asarray(batch["rewards"]).copy()
        rewards[3] = np.nan
        mask = np.asarray(batch["mask"])
        got = presets.reinforce_pp(group_size=4).advantages(
            {**batch, "rewards": jnp.asarray(rewards)})
        kept = mask.copy()
        kept[3] = 0
        expected = objectives.reinforce_pp_advantages(jnp.asarray(np.nan_to_num(rewards)),
                                                      jnp.asarray(kept))
        np.testing.assert_allclose(got, expected, atol=1e-6)

    def test_nonfinite_logp_at_valid_tokens_is_reported(self):
        logp, batch = _batch()
        mask = np.asarray(batch["mask"])
        logp = logp.at[0, 0].set(jnp.nan).at[1, 0].set(-jnp.inf)
        batch["mask"] = jnp.asarray(mask)
        _, metrics = presets.dapo(group_size=4)(logp, batch)
        np.testing.assert_allclose(metrics["nonfinite_logp"], 2 / mask.sum(), rtol=1e-6)


class TestUnreadOptions:
    @pytest.mark.parametrize("preset, option, reader", [
        ("sapo", {"eps_high": 0.3}, "loss.kind 'ppo_clip', 'gspo', 'cispo', 'gmpo', 'clip_cov'"),
        ("gspo", {"dual_clip": 3.0}, "loss.kind 'ppo_clip'"),
        ("dapo", {"importance_level": "sequence"}, "importance.enabled=True"),
        ("dapo", {"tau_pos": 2.0}, "loss.kind 'sapo'"),
        ("dapo", {"m2po_tau": 0.1}, "m2po.enabled=True"),
        ("dapo", {"lam": 0.9}, "advantage.estimator 'gae'"),
        ("sapo", {"eps_high": 0.2}, "loss.kind 'ppo_clip'"),   # given, even at its default
        ("grpo", {"norm_len": 16}, "aggregation.mode 'seq-mean-token-sum-norm'"),
    ])
    def test_option_the_loss_does_not_read_raises(self, preset, option, reader):
        with pytest.raises(ValueError, match=re.escape(reader)):
            getattr(presets, preset)(group_size=4, **option)

    def test_config_section_warns_once(self):
        """A recipe's section holds every field and a sweep's base may set one only some
        entries read: a warning, once, not an error."""
        section = {"group_size": 4, "loss": {"kind": "sapo", "eps_high": 0.31},
                   "aggregation": {"mode": "seq-mean-token-mean"}}
        with pytest.warns(UserWarning, match=r"objective.loss.eps_high=0.31 has no effect"):
            objectives.policy_objective(section)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            objectives.policy_objective(section)   # the same message again: silent

    def test_spec_replace_raises(self):
        with pytest.raises(ValueError, match=r"ObjectiveSpec.replace: objective.loss.tau_pos"):
            presets.dapo(group_size=4).spec.replace(tau_pos=2.0)

    def test_read_options_still_pass(self):
        presets.dapo(group_size=4, importance=True, importance_level="sequence")
        presets.grpo(group_size=4, dual_clip=3.0)
        presets.dr_grpo(group_size=4, norm_len=16)


class TestPeerNameHints:
    @pytest.mark.parametrize("name, field", [
        ("clip_ratio_low", "'eps_low'"), ("clip_ratio_high", "'eps_high'"),
        ("kl_loss_coef", "'kl_beta'"), ("beta", "'kl_beta'"),
        ("importance_sampling_level", "'policy_loss'"), ("epsilon_high", "'eps_high'"),
        ("num_generations", "'group_size'"), ("loss_agg_mode", "'aggregation'"),
    ])
    def test_keyword(self, name, field):
        with pytest.raises(TypeError, match=f"did you mean {field}"):
            presets.dapo(group_size=4, **{name: 1})

    def test_config_path(self):
        with pytest.raises(ValueError, match=r"did you mean objective.loss.eps_low\? "
                                             r"\('clip_ratio_low' is TRL's or verl's name\)"):
            objectives.policy_objective({"group_size": 4, "loss": {"clip_ratio_low": 0.2}})
        with pytest.raises(ValueError, match=r"did you mean objective.kl.beta\?"):
            objectives.policy_objective({"group_size": 4, "kl": {"kl_loss_coef": 0.1}})


class TestSmaller:
    def test_python_lists_work(self):
        logp, batch = _batch(b=4, t=3)
        listed = {k: np.asarray(v).tolist() for k, v in batch.items()}
        objective = presets.dapo(group_size=2)
        np.testing.assert_allclose(objective(np.asarray(logp).tolist(), listed)[0],
                                   objective(logp, batch)[0], rtol=1e-6)
        np.testing.assert_allclose(objectives.aggregate([[1.0, 3.0]], [[1, 1]],
                                                        mode="token-mean"), 2.0)

    def test_soft_mask_raises(self):
        logp, batch = _batch()
        batch["mask"] = batch["mask"] * 0.5
        with pytest.raises(ValueError, match="mask must hold 0 and 1 only"):
            presets.dapo(group_size=4)(logp, batch)

    def test_reward_dtype_is_checked(self):
        _, batch = _batch()
        batch["rewards"] = batch["rewards"].astype(jnp.complex64)
        with pytest.raises(TypeError, match="rewards must be a bool, integer or floating"):
            presets.dapo(group_size=4).advantages(batch)

    def test_docs_list_every_preset(self):
        text = DOCS.read_text()
        for name in presets.__all__:
            assert f"`{name}`" in text, name


class TestTrlConventions:
    def test_cispo_absolute_cap(self):
        """TRL's CISPO clamps the weight at epsilon_high itself: 5.0 caps at 5, not 6."""
        objective = presets.cispo(group_size=2, trl_epsilon_high=5.0)
        assert objective.spec.eps_high == 4.0 and objective.spec.eps_low == 1.0
        logp = jnp.log(jnp.array([[0.55, 0.5], [0.2, 0.5]]))
        old = jnp.log(jnp.array([[0.1, 0.5], [0.4, 0.5]]))        # ratios 5.5, 1; 0.5, 1
        batch = {"old_logp": old, "mask": jnp.ones((2, 2)), "advantages": jnp.array([1.0, -1.0])}
        weight = np.minimum(np.exp(np.asarray(logp - old)), 5.0)   # TRL: clamp(max=eps_high)
        trl = np.mean(-weight * np.array([[1.0], [-1.0]]) * np.asarray(logp))
        np.testing.assert_allclose(objective(logp, batch)[0], trl, rtol=1e-6)
        relative = presets.cispo(group_size=2, eps_high=5.0)(logp, batch)[0]
        # 5.0 as eps_high caps at 6: the 5.5 weight is not clipped, 0.5 more on one token
        np.testing.assert_allclose(float(relative) - trl, 0.5 * -np.log(0.55) / 4, rtol=1e-5)

    def test_cispo_refuses_both_and_a_cap_below_one(self):
        with pytest.raises(ValueError, match="not both"):
            presets.cispo(group_size=2, eps_high=0.5, trl_epsilon_high=5.0)
        with pytest.raises(ValueError, match="must be >= 1, got 0.5"):
            presets.cispo(group_size=2, trl_epsilon_high=0.5)

    def test_trl_advantage_convention_is_two_keywords(self):
        rewards = np.array([1.0, 0, 0, 1, 1, 1, 0, 1], np.float32)
        adv = presets.dapo(group_size=4, ddof=1, advantage_eps=1e-4).advantages(
            {"rewards": jnp.asarray(rewards)})
        grouped = rewards.reshape(2, 4)
        trl = (grouped - grouped.mean(1, keepdims=True)) / (grouped.std(1, ddof=1,
                                                                        keepdims=True) + 1e-4)
        np.testing.assert_allclose(adv, trl.reshape(-1), rtol=1e-5)
