"""PPO's and VAPO's pieces against numpy: GAE as Monte-Carlo returns, per-sequence
lambda, padding; outcome rewards; the clipped value loss; explained variance; the "gae"
estimator and the positive-example LM loss through the composer."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from grpo_jax import config_lib, objectives

from tests.objectives import numpy_reference as ref

LENGTHS = (7, 0, 1, 4, 7, 3, 5, 2)   # ragged rows: an empty one and a length-1 one
T = 8


def _mask(lengths=LENGTHS, width=T):
    return (np.arange(width)[None] < np.asarray(lengths)[:, None]).astype(np.float32)


def _inputs(seed, lengths=LENGTHS):
    rng = np.random.default_rng(seed)
    mask = _mask(lengths)
    return (rng.normal(0, 0.5, mask.shape).astype(np.float32),
            rng.normal(0, 1.0, mask.shape).astype(np.float32), mask)


def _gae(gamma, lam=None):
    kwargs = {"gamma": gamma} if lam is None else {"gamma": gamma, "lam": lam}
    return jax.jit(functools.partial(objectives.gae, **kwargs))


class TestGaeMonteCarlo:

    def test_lambda_one_gamma_one_is_the_return_to_go(self):
        """lam = gamma = 1: the return at t is the sum of the rewards from t to the end of
        its row, whatever the values, and the advantage is that minus V_t."""
        rewards, values, mask = _inputs(0)
        advantages, returns = _gae(1.0, 1.0)(rewards, values, mask)
        to_go = np.cumsum((rewards * mask)[:, ::-1], axis=1)[:, ::-1] * mask
        np.testing.assert_allclose(returns, to_go, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(advantages, (to_go - values) * mask, rtol=1e-5, atol=1e-6)

    def test_outcome_reward_gives_every_token_the_answers_reward(self):
        """The form PPO on an answer takes: reward on the last token, lam = gamma = 1: every
        valid token's return is the answer's reward."""
        rewards = np.array([1, 0, 1, 0, 1, 0, 1, 0], np.float32)
        mask = _mask()
        values = np.random.default_rng(1).normal(size=mask.shape).astype(np.float32)
        token_rewards = jax.jit(objectives.outcome_token_rewards)(rewards, mask)
        _, returns = _gae(1.0, 1.0)(token_rewards, values, mask)
        np.testing.assert_allclose(returns, rewards[:, None] * mask, atol=1e-6)

    def test_discounted_lambda_one_is_the_discounted_return(self):
        rewards, values, mask = _inputs(2)
        _, returns = _gae(0.9, 1.0)(rewards, values, mask)
        expected = np.zeros_like(rewards)
        for b, n in enumerate(LENGTHS):
            for t in range(n):
                expected[b, t] = sum(0.9 ** (k - t) * rewards[b, k] for k in range(t, n))
        np.testing.assert_allclose(returns, expected, rtol=1e-5, atol=1e-6)

    def test_lambda_zero_is_the_one_step_td_error(self):
        rewards, values, mask = _inputs(3)
        advantages, _ = _gae(0.95, 0.0)(rewards, values, mask)
        next_values = np.concatenate([values[:, 1:], np.zeros((len(LENGTHS), 1))], axis=1)
        next_values = next_values * np.concatenate([mask[:, 1:], np.zeros((len(LENGTHS), 1))], 1)
        td = (rewards + 0.95 * next_values - values) * mask
        np.testing.assert_allclose(advantages, td, rtol=1e-5, atol=1e-6)


class TestGaePerSequenceLambda:

    def test_each_row_uses_its_own_lambda(self):
        """A `[B]` lambda gives each row what the scalar lambda of that row gives."""
        rewards, values, mask = _inputs(4)
        lam = np.array([0.0, 0.3, 1.0, 0.5, 0.95, 0.7, 0.2, 1.0], np.float32)
        advantages, returns = _gae(1.0)(rewards, values, mask, lam=lam)
        for b, row_lam in enumerate(lam):
            row_adv, row_ret = _gae(1.0, float(row_lam))(rewards, values, mask)
            np.testing.assert_allclose(advantages[b], row_adv[b], rtol=1e-6, atol=1e-7)
            np.testing.assert_allclose(returns[b], row_ret[b], rtol=1e-6, atol=1e-7)
        expected_adv, expected_ret = ref.gae(rewards, values, mask, gamma=1.0, lam=lam)
        np.testing.assert_allclose(advantages, expected_adv, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(returns, expected_ret, rtol=1e-5, atol=1e-6)

    def test_length_adaptive_lambda_of_the_paper(self):
        """VAPO eq. 7 with alpha = 0.05: lam = 1 - 1/(0.05 l); rows of <= 20 tokens get 0."""
        lengths = np.array([10, 20, 40, 100, 1000], np.float32)
        lam = jax.jit(objectives.length_adaptive_lambda)(lengths)
        np.testing.assert_allclose(lam, [0.0, 0.0, 0.5, 0.8, 0.98], rtol=1e-6, atol=1e-7)


class TestGaePadding:

    @pytest.mark.parametrize("garbage", [1e6, np.nan, np.inf])
    def test_values_and_rewards_at_padded_positions_change_nothing(self, garbage):
        rewards, values, mask = _inputs(5)
        clean = _gae(0.99)(rewards, values, mask, lam=np.float32(0.9))
        padded = mask == 0
        dirty = _gae(0.99)(np.where(padded, garbage, rewards).astype(np.float32),
                           np.where(padded, garbage, values).astype(np.float32), mask,
                           lam=np.float32(0.9))
        for got, want in zip(dirty, clean):
            np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
            np.testing.assert_array_equal(np.asarray(got)[padded], 0.0)

    def test_right_padding_equals_the_unpadded_rows(self):
        """Each row computed alone at its own length equals its row in the ragged batch."""
        rewards, values, mask = _inputs(6)
        advantages, returns = _gae(0.97, 0.9)(rewards, values, mask)
        for b, n in enumerate(LENGTHS):
            if n == 0:
                continue
            alone = _gae(0.97, 0.9)(rewards[b:b + 1, :n], values[b:b + 1, :n], np.ones((1, n)))
            np.testing.assert_allclose(advantages[b, :n], alone[0][0], rtol=1e-6, atol=1e-7)
            np.testing.assert_allclose(returns[b, :n], alone[1][0], rtol=1e-6, atol=1e-7)


class TestOutcomeTokenRewards:

    def test_reward_sits_on_the_last_valid_token(self):
        rewards = np.arange(1, 9, dtype=np.float32)
        got = np.asarray(jax.jit(objectives.outcome_token_rewards)(rewards, _mask()))
        expected = np.zeros((8, T), np.float32)
        for b, n in enumerate(LENGTHS):
            if n:
                expected[b, n - 1] = rewards[b]
        np.testing.assert_array_equal(got, expected)


class TestValueLoss:

    def test_hand_computed(self):
        """eps 0.2, old values 0.5, return 1: a value that moved to 0.9 is past the clip
        (the clipped value 0.7 is further from the return and wins the max); one that
        moved to 0.6 is inside it; one that moved away from the return (0.1) keeps its
        own larger error."""
        values = np.array([[0.9, 0.6, 0.1, 7.0]], np.float32)
        old = np.full((1, 4), 0.5, np.float32)
        returns = np.ones((1, 4), np.float32)
        mask = np.array([[1, 1, 1, 0]], np.float32)
        loss, diagnostics = jax.jit(functools.partial(objectives.value_loss, clip=0.2))(
            values, old, returns, mask)
        # 0.5 max((0.9-1)^2, (0.7-1)^2) = 0.045; 0.5 (0.6-1)^2 = 0.08;
        # 0.5 max((0.1-1)^2, (0.3-1)^2) = 0.405; padding 0.
        np.testing.assert_allclose(loss, [[0.045, 0.08, 0.405, 0.0]], rtol=1e-6)
        np.testing.assert_array_equal(diagnostics["value_clipped"], [[1.0, 0.0, 0.0, 0.0]])
        unclipped, _ = jax.jit(objectives.value_loss)(values, old, returns, mask)
        np.testing.assert_allclose(unclipped, [[0.005, 0.08, 0.405, 0.0]], rtol=1e-6)

    def test_gradient_is_zero_where_the_clip_binds(self):
        values = np.array([[0.9, 0.6, 0.1]], np.float32)
        old, returns, mask = np.full((1, 3), 0.5, np.float32), np.ones((1, 3)), np.ones((1, 3))
        grad = jax.jit(jax.grad(lambda v: jnp.sum(objectives.value_loss(
            v, old, returns, mask, clip=0.2)[0])))(values)
        # d/dV 0.5 (V - R)^2 = V - R where the unclipped term wins.
        np.testing.assert_allclose(grad, [[0.0, -0.4, -0.9]], rtol=1e-6)

    def test_matches_numpy_on_a_ragged_batch(self):
        rng = np.random.default_rng(7)
        mask = _mask()
        values, old, returns = (rng.normal(size=mask.shape).astype(np.float32) for _ in range(3))
        loss, diagnostics = jax.jit(functools.partial(objectives.value_loss, clip=0.3))(
            values, old, returns, mask)
        plain = (values - returns) ** 2
        clipped = (old + np.clip(values - old, -0.3, 0.3) - returns) ** 2
        np.testing.assert_allclose(loss, 0.5 * np.maximum(plain, clipped) * mask, rtol=1e-5,
                                   atol=1e-6)
        moved = np.abs(values - old) > 0.3
        np.testing.assert_array_equal(diagnostics["value_clipped"],
                                      (moved & (clipped > plain)) * mask)

    def test_a_value_inside_the_clip_never_binds(self):
        """Values near 0 of opposite signs: old + (V - old) rounds to a float other than V,
        so the clipped squared error may come out larger than V's own (here by rounding).
        V moved 0.00094, well inside eps 0.2: the clip does not bind and the loss is
        V's own 1/2 (V - R)^2."""
        values = np.array([[0.00035342577]], np.float32)
        old = np.array([[-0.0005884017]], np.float32)
        returns, mask = np.array([[0.89918226]], np.float32), np.ones((1, 1), np.float32)
        clipped = old + np.clip(values - old, -0.2, 0.2)
        assert (clipped - returns) ** 2 > (values - returns) ** 2   # the rounding at stake
        loss, diagnostics = jax.jit(functools.partial(objectives.value_loss, clip=0.2))(
            values, old, returns, mask)
        np.testing.assert_array_equal(diagnostics["value_clipped"], [[0.0]])
        np.testing.assert_allclose(loss, 0.5 * (values - returns) ** 2, rtol=1e-6)

    def test_bad_clip_is_named(self):
        with pytest.raises(ValueError, match=r"clip must be > 0.0, got -0.1"):
            objectives.value_loss(jnp.ones((1, 1)), jnp.ones((1, 1)), jnp.ones((1, 1)),
                                  jnp.ones((1, 1)), clip=-0.1)


class TestExplainedVariance:

    def test_matches_numpy_over_valid_tokens(self):
        rng = np.random.default_rng(8)
        mask = _mask()
        returns = rng.normal(size=mask.shape).astype(np.float32)
        values = (returns + rng.normal(0, 0.5, mask.shape)).astype(np.float32)
        values_with_garbage = np.where(mask > 0, values, 1e4).astype(np.float32)
        got = jax.jit(objectives.explained_variance)(values_with_garbage, returns, mask)
        valid = mask > 0
        expected = 1 - np.var(returns[valid] - values[valid]) / np.var(returns[valid])
        np.testing.assert_allclose(got, expected, rtol=1e-5)

    def test_perfect_constant_and_flat_returns(self):
        mask = np.ones((2, 3), np.float32)
        returns = np.array([[0, 1, 2], [3, 4, 5]], np.float32)
        ev = jax.jit(objectives.explained_variance)
        np.testing.assert_allclose(ev(returns, returns, mask), 1.0)
        np.testing.assert_allclose(ev(np.full_like(returns, 2.5), returns, mask), 0.0, atol=1e-6)
        # Flat returns: nothing to explain (NaN), also when GAE's float32 rounding leaves
        # them ~1e-10 apart, where the ratio would be two rounding errors' (-1e14).
        assert np.isnan(ev(returns, np.ones_like(returns), mask))
        rounding = np.array([[0, 1e-10, -1e-10], [2e-10, 0, 1e-10]], np.float32)
        assert np.isnan(ev(np.full_like(returns, 0.3), rounding, mask))
        tiny_but_real = 1e-4 * returns   # a spread of 1e-4 is explained as any other
        np.testing.assert_allclose(ev(tiny_but_real, tiny_but_real, mask), 1.0)


def _objective_config(**overrides):
    config = config_lib.load_config("configs/base.py").objective
    config.group_size = 4
    config.advantage.estimator = "gae"
    return config_lib.apply_overrides(config, overrides)


def _batch(seed=9):
    rng = np.random.default_rng(seed)
    mask = _mask()
    old = np.log(rng.uniform(0.05, 0.95, mask.shape)).astype(np.float32)
    batch = {"old_logp": old, "mask": mask,
             "rewards": np.array([1, 0, 1, 1, 0, 0, 1, 0], np.float32),
             "values": rng.normal(0.5, 0.3, mask.shape).astype(np.float32),
             "correct": np.array([1, 0, 1, 1, 0, 0, 1, 0], bool)}
    logp = (old + rng.normal(0, 0.2, mask.shape)).astype(np.float32)
    return jnp.asarray(logp), {k: jnp.asarray(v) for k, v in batch.items()}


class TestGaeEstimator:

    @pytest.mark.parametrize("whiten", [True, False])
    def test_outcome_reward_gae_then_whitening(self, whiten):
        objective = objectives.policy_objective(_objective_config(
            **{"advantage.lam": 0.9, "advantage.gamma": 0.99, "advantage.whiten": whiten}))
        _, b = _batch()
        got = jax.jit(objective.advantages)(b)
        mask, rewards = np.asarray(b["mask"]), np.asarray(b["rewards"])
        token_rewards = np.zeros_like(mask)
        for row, n in enumerate(LENGTHS):
            if n:
                token_rewards[row, n - 1] = rewards[row]
        expected, _ = ref.gae(token_rewards, b["values"], mask, gamma=0.99, lam=0.9)
        if whiten:   # over the batch's valid tokens: mean, unbiased variance
            expected = ref.masked_whiten(expected, mask)
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)

    def test_length_adaptive_lambda_replaces_lam(self):
        objective = objectives.policy_objective(_objective_config(
            **{"advantage.lam": 0.0, "advantage.lam_alpha": 0.5, "advantage.whiten": False}))
        _, b = _batch()
        mask = np.asarray(b["mask"])
        lam = np.array([max(1 - 1 / (0.5 * n), 0.0) if n else 0.0 for n in LENGTHS])
        token_rewards = np.asarray(objectives.outcome_token_rewards(b["rewards"], b["mask"]))
        expected, _ = ref.gae(token_rewards, b["values"], mask, gamma=1.0, lam=lam)
        np.testing.assert_allclose(jax.jit(objective.advantages)(b), expected, rtol=1e-5,
                                   atol=1e-6)

    def test_missing_values_are_named(self):
        objective = objectives.policy_objective(_objective_config())
        _, b = _batch()
        del b["values"]
        with pytest.raises(KeyError, match=r"batch\['values'\] is required by "
                                           r"advantage.estimator='gae'"):
            objective.advantages(b)

    @pytest.mark.parametrize("field, value, message", [
        ("advantage.lam", 1.5, r"objective.advantage.lam must be in \[0, 1\], got 1.5"),
        ("advantage.gamma", -0.1, r"objective.advantage.gamma must be in \[0, 1\]"),
        ("advantage.lam_alpha", -1.0, r"objective.advantage.lam_alpha must be >= 0"),
        ("positive_nll_weight", -0.1, r"objective.positive_nll_weight must be >= 0"),
    ])
    def test_bad_fields_are_named(self, field, value, message):
        with pytest.raises(ValueError, match=message):
            objectives.policy_objective(_objective_config(**{field: value}))


class TestPositiveExampleLmLoss:

    def test_adds_mu_times_the_nll_of_correct_answers(self):
        """VAPO: loss = PPO term + mu x (sum of -log p over correct answers' tokens) / (their
        token count); wrong answers add nothing to the second term."""
        logp, b = _batch()
        plain = objectives.policy_objective(_objective_config())
        with_nll = objectives.policy_objective(_objective_config(positive_nll_weight=0.1))
        b["advantages"] = plain.advantages(b)
        base_loss, _ = jax.jit(plain)(logp, b)
        loss, metrics = jax.jit(with_nll)(logp, b)
        positive = np.asarray(b["mask"]) * np.asarray(b["correct"])[:, None]
        nll = -np.sum(np.asarray(logp) * positive) / positive.sum()
        np.testing.assert_allclose(metrics["positive_nll"], nll, rtol=1e-6)
        np.testing.assert_allclose(loss, base_loss + 0.1 * nll, rtol=1e-6)
        # Its gradient reaches exactly the tokens of correct answers.
        grad_plain = jax.grad(lambda lp: plain(lp, b)[0])(logp)
        grad = jax.grad(lambda lp: with_nll(lp, b)[0])(logp)
        np.testing.assert_allclose(grad - grad_plain, -0.1 * positive / positive.sum(),
                                   rtol=1e-5, atol=1e-7)

    def test_micro_batches_add_up_with_the_global_positive_count(self):
        logp, b = _batch()
        objective = objectives.policy_objective(_objective_config(positive_nll_weight=0.1))
        b["advantages"] = objective.advantages(b)
        positive = b["mask"] * b["correct"][:, None]
        counts = {"num_tokens": jnp.sum(b["mask"]), "num_seqs": jnp.float32(8),
                  "num_positive_tokens": jnp.sum(positive)}
        full, _ = jax.jit(objective)(logp, {**b, **counts})
        halves = [jax.jit(objective)(logp[s], {**{k: v[s] for k, v in b.items()}, **counts})[0]
                  for s in (slice(0, 4), slice(4, 8))]
        np.testing.assert_allclose(sum(halves), full, rtol=1e-6)
