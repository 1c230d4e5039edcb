"""The worked examples of docs/semantics.md, reproduced exactly by the library."""

import decimal
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from grpo_jax import objectives


def _policy_gradient(mode, lengths, adv):
    """d(aggregated PPO loss)/d logp at r = 1 for answers of the given lengths."""
    T = max(lengths)
    mask = (np.arange(T)[None, :] < np.array(lengths)[:, None]).astype(np.float32)
    old = jnp.zeros((len(lengths), T))

    @jax.jit
    @jax.grad
    def grad(logp):
        loss, _ = objectives.ppo_clip_loss(logp, old, jnp.asarray(adv), mask)
        return objectives.aggregate(loss, mask, mode=mode)

    return np.asarray(grad(old)), mask


def _round_half_up(x):
    """Two decimals the way the worked example rounds (0.125 -> 0.13, -0.875 -> -0.88)."""
    return float(decimal.Decimal(float(x)).quantize(decimal.Decimal("0.01"),
                                                    rounding=decimal.ROUND_HALF_UP))


class TestLossAggregationExample:
    """Worked example 1: a right answer of 200 tokens and a wrong one of 1,200."""

    def test_seq_mean_token_mean_pushes(self):
        g, mask = _policy_gradient("seq-mean-token-mean", [200, 1200], [1.0, -1.0])
        push = -g  # gradient descent on the loss pushes log-probs along -grad
        right, wrong = push[0, 0], push[1, 0]
        assert right / -wrong == pytest.approx(6.0, rel=1e-5)
        assert np.sum(push[0] * mask[0]) == pytest.approx(0.50, abs=1e-6)
        assert np.sum(push[1] * mask[1]) == pytest.approx(-0.50, abs=1e-6)
        # Every token of an answer is pushed equally.
        np.testing.assert_allclose(push[0, :200], right, rtol=1e-6)
        np.testing.assert_allclose(push[1], wrong, rtol=1e-6)

    def test_token_mean_ratio_is_one(self):
        g, _ = _policy_gradient("token-mean", [200, 1200], [1.0, -1.0])
        assert -g[0, 0] / g[1, 0] == pytest.approx(1.0, rel=1e-6)
        assert g[0, 0] == pytest.approx(-1 / 1400, rel=1e-5)


class TestStdNormalisationExample:
    """Worked example 2: rewards (1,1,1,1,1,1,1,0)."""

    rewards = jnp.array([1.0, 1, 1, 1, 1, 1, 1, 0])

    @pytest.mark.parametrize("kwargs, right, wrong", [
        (dict(scale="group"), 0.38, -2.65),
        (dict(scale="none"), 0.13, -0.88),
        (dict(scale="group", ddof=1), 0.35, -2.47),
    ])
    def test_two_decimals(self, kwargs, right, wrong):
        fn = jax.jit(functools.partial(objectives.group_advantages, group_size=8, **kwargs))
        adv = [_round_half_up(a) for a in np.asarray(fn(self.rewards))]
        assert adv == [right] * 7 + [wrong]

    def test_mean_and_std_as_stated(self):
        r = np.asarray(self.rewards, np.float64)
        assert r.mean() == 0.875 and round(r.std(), 2) == 0.33


class TestClipHigherExample:
    """Worked example 3: how far one batch can move a token before the clip stops it."""

    @staticmethod
    @jax.jit
    def _gradient(p_old, p_new, eps_high):
        def loss(logp):
            return objectives.ppo_clip_loss(
                logp, jnp.log(p_old), jnp.ones(1), jnp.ones((1, 1)),
                eps_low=0.2, eps_high=eps_high)[0].sum()
        return jax.grad(loss)(jnp.log(p_new))

    def _gets_gradient(self, p_old, p_new, eps_high):
        args = jnp.full((1, 1), p_old), jnp.full((1, 1), p_new), jnp.float32(eps_high)
        return float(self._gradient(*args)[0, 0]) != 0.0

    def _ceiling(self, p_old, eps_high):
        """Largest new probability that still gets gradient, by bisection on the loss."""
        lo, hi = p_old, min(1.0, p_old * 2)
        for _ in range(60):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if self._gets_gradient(p_old, mid, eps_high) else (lo, mid)
        return lo

    @pytest.mark.parametrize("p, ceiling", [
        (0.600, 0.720), (0.200, 0.240), (0.050, 0.060), (0.010, 0.012)])
    def test_gradient_stops_at_one_plus_eps(self, p, ceiling):
        assert self._ceiling(p, 0.2) == pytest.approx(ceiling, rel=1e-5)

    @pytest.mark.parametrize("eps_high, batches", [(0.2, 13), (0.28, 10)])
    def test_batches_to_grow_one_to_ten_percent(self, eps_high, batches):
        # Each batch the token can grow until the clip stops its gradient; closed form
        # ceil(log 10 / log(1 + eps_high)) cross-checks the count.
        p, count = 0.01, 0
        while p < 0.10 * (1 - 1e-6):
            p, count = self._ceiling(p, eps_high), count + 1
        assert count == batches == math.ceil(math.log(10) / math.log(1 + eps_high))


class TestOverlongPenaltyExample:
    """Worked example 4: max 20,000 tokens with a 4,000-token warning zone."""

    def test_table(self):
        fn = jax.jit(
            functools.partial(objectives.overlong_penalty, max_len=20_000, cache_len=4_000)
        )
        got = fn(jnp.array([15_000, 16_000, 18_000, 20_000, 21_000]))
        np.testing.assert_array_equal(np.asarray(got), [0.0, 0.0, -0.5, -1.0, -1.0])
