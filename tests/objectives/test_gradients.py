"""Gradient semantics of the policy losses (docs/semantics.md, "Policy losses")."""

import functools

import jax
import jax.numpy as jnp
import jax.test_util
import numpy as np
import pytest

from grpo_jax import objectives

B, T = 6, 7


def _batch(seed=0, spread=0.5):
    rng = np.random.default_rng(seed)
    lengths = np.array([7, 5, 1, 6, 3, 4])
    mask = (np.arange(T)[None] < lengths[:, None]).astype(np.float32)
    old = np.log(rng.uniform(0.05, 0.9, (B, T))).astype(np.float32)
    logp = (old + rng.uniform(-spread, spread, (B, T))).astype(np.float32)
    adv = rng.normal(size=B).astype(np.float32)
    return jnp.asarray(logp), jnp.asarray(old), jnp.asarray(adv), jnp.asarray(mask)


def _token_grad(loss_fn, logp, old, adv, mask, **kw):
    """d sum_t L_t / d logp_t: each token's own gradient."""
    return jax.jit(jax.grad(lambda lp: loss_fn(lp, old, adv, mask, **kw)[0].sum()))(logp)


class TestPPOClip:

    def test_zero_gradient_exactly_on_clipped_tokens(self):
        logp, old, adv, mask = _batch()
        g = np.asarray(_token_grad(objectives.ppo_clip_loss, logp, old, adv, mask))
        r = np.exp(np.asarray(logp - old))
        a = np.asarray(adv)[:, None]
        clipped = ((a > 0) & (r > 1.2)) | ((a < 0) & (r < 0.8))
        valid = np.asarray(mask) > 0
        assert (clipped & valid).sum() >= 5 and (~clipped & valid).sum() >= 5
        np.testing.assert_array_equal(g[clipped], 0.0)
        np.testing.assert_allclose(g[~clipped & valid], (-a * r)[~clipped & valid], rtol=1e-5)

    def test_dual_clip_bounds_loss_for_negative_advantage(self):
        old = jnp.zeros((1, 4))
        logp = jnp.log(jnp.array([[0.5, 2.0, 4.0, 10.0]]))   # ratios 0.5, 2, 4, 10
        adv = jnp.array([-2.0])
        loss_fn = jax.jit(functools.partial(objectives.ppo_clip_loss, dual_clip=3.0))
        loss, diag = loss_fn(logp, old, adv, jnp.ones((1, 4)))
        # -min(rA, clip(r)A) = -rA for r >= 0.8 with A < 0; bounded at -cA = 6.
        np.testing.assert_allclose(np.asarray(loss), [[-0.8 * 2.0 * -1, 4.0, 6.0, 6.0]], rtol=1e-6)
        assert float(jnp.max(loss)) <= 6.0
        g = jax.grad(lambda lp: loss_fn(lp, old, adv, jnp.ones((1, 4)))[0].sum())(logp)
        np.testing.assert_allclose(np.asarray(g), [[0.0, 4.0, 0.0, 0.0]], rtol=1e-6)
        # The dual bound binds at r = 4 and 10; clip_high counts only the eps_high clip
        # (A > 0), so none here.
        np.testing.assert_array_equal(np.asarray(diag["clip_dual"]), [[0, 0, 1, 1]])
        np.testing.assert_array_equal(np.asarray(diag["clip_high"]), [[0, 0, 0, 0]])
        np.testing.assert_array_equal(np.asarray(diag["clip_low"]), [[1, 0, 0, 0]])


class TestPG:

    def test_on_policy_gradient_is_reinforce(self):
        # r = 1: d(-r A)/d logp = -A, REINFORCE's -A grad log pi (RLOO's update).
        _, old, adv, mask = _batch()
        g = _token_grad(objectives.pg_loss, old, old, adv, mask)
        np.testing.assert_allclose(g, -np.asarray(adv)[:, None] * np.asarray(mask), rtol=1e-6)

    def test_off_policy_gradient_is_ratio_weighted_and_never_clipped(self):
        logp, old, adv, mask = _batch(spread=2.0)
        g = np.asarray(_token_grad(objectives.pg_loss, logp, old, adv, mask))
        r = np.exp(np.asarray(logp - old, np.float64))
        np.testing.assert_allclose(g, -r * np.asarray(adv)[:, None] * np.asarray(mask), rtol=1e-5)
        assert (r[np.asarray(mask) > 0] > 1.28).sum() >= 5   # beyond any clip range used here


class TestCISPO:

    def test_every_valid_token_gets_minus_clipped_ratio_times_advantage(self):
        logp, old, adv, mask = _batch()
        g = np.asarray(_token_grad(objectives.cispo_loss, logp, old, adv, mask,
                                   eps_low=0.2, eps_high=0.2))
        r = np.exp(np.asarray(logp - old))
        expected = -np.clip(r, 0.8, 1.2) * np.asarray(adv)[:, None] * np.asarray(mask)
        np.testing.assert_allclose(g, expected, rtol=1e-5)

    def test_nonzero_where_ppo_is_zero(self):
        logp, old, adv, mask = _batch()
        g_ppo = np.asarray(_token_grad(objectives.ppo_clip_loss, logp, old, adv, mask))
        g_cispo = np.asarray(_token_grad(objectives.cispo_loss, logp, old, adv, mask,
                                         eps_low=0.2, eps_high=0.2))
        zeroed_by_ppo = (g_ppo == 0) & (np.asarray(mask) > 0) & (np.asarray(adv)[:, None] != 0)
        assert zeroed_by_ppo.sum() >= 5
        assert np.all(g_cispo[zeroed_by_ppo] != 0)


class TestGSPO:

    @staticmethod
    def _sequence_objective(logp, old, adv, mask, eps_low, eps_high):
        """GSPO's objective written directly at the sequence level (paper eq. 5-7)."""
        n = jnp.maximum(mask.sum(-1), 1)
        s = jnp.exp(jnp.sum((logp - old) * mask, -1) / n)
        per_seq = -jnp.minimum(s * adv, jnp.clip(s, 1 - eps_low, 1 + eps_high) * adv)
        return jnp.mean(per_seq)

    @pytest.mark.parametrize("eps", [(3e-4, 4e-4), (0.05, 0.05), (10.0, 10.0)])
    def test_value_and_gradient_equal_the_sequence_objective(self, eps):
        logp, old, adv, mask = _batch(spread=0.05)
        eps_low, eps_high = eps

        def token_form(lp):
            loss, _ = objectives.gspo_loss(lp, old, adv, mask, eps_low=eps_low, eps_high=eps_high)
            return objectives.aggregate(loss, mask, mode="seq-mean-token-mean")

        seq = functools.partial(self._sequence_objective, old=old, adv=adv, mask=mask,
                                eps_low=eps_low, eps_high=eps_high)
        v1, g1 = jax.jit(jax.value_and_grad(token_form))(logp)
        v2, g2 = jax.jit(jax.value_and_grad(seq))(logp)
        np.testing.assert_allclose(v1, v2, rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(g1, g2, rtol=1e-5, atol=1e-7)

    def test_ratio_is_geometric_mean_of_token_ratios(self):
        logp, old, adv, mask = _batch()
        _, diag = jax.jit(objectives.gspo_loss)(logp, old, adv, mask)
        r = np.exp(np.asarray(logp - old, np.float64))
        m = np.asarray(mask) > 0
        for i in range(B):
            geo = np.prod(r[i][m[i]]) ** (1 / m[i].sum())
            np.testing.assert_allclose(np.asarray(diag["ratio"])[i][m[i]], geo, rtol=1e-5)


class TestSAPO:

    def test_on_policy_gradient_is_plain_policy_gradient(self):
        _, old, adv, mask = _batch()
        g = _token_grad(objectives.sapo_loss, old, old, adv, mask)
        np.testing.assert_allclose(g, -np.asarray(adv)[:, None] * np.asarray(mask), rtol=1e-6)

    def test_off_policy_gradient_is_gated_smoothly(self):
        logp, old, adv, mask = _batch(spread=2.0)
        g = np.asarray(_token_grad(objectives.sapo_loss, logp, old, adv, mask))
        r = np.exp(np.asarray(logp - old, np.float64))
        a = np.asarray(adv, np.float64)[:, None]
        tau = np.where(a > 0, 1.0, 1.05)
        sig = 1 / (1 + np.exp(-tau * (r - 1)))
        expected = -a * 4 * sig * (1 - sig) * r * np.asarray(mask)
        np.testing.assert_allclose(g, expected, rtol=1e-4, atol=1e-7)


class TestCheckGrads:
    """Finite-difference checks away from the clip kinks.

    CISPO is left out on purpose: its gradient is not the derivative of its value
    (the weight is stop-gradient); TestCISPO pins that gradient analytically.
    """

    @pytest.mark.parametrize("loss_fn, kw", [
        (objectives.pg_loss, {}),
        (objectives.ppo_clip_loss, dict(eps_low=10.0, eps_high=10.0)),
        (objectives.gspo_loss, dict(eps_low=10.0, eps_high=10.0)),
        (objectives.sapo_loss, {}),
    ])
    def test_check_grads(self, loss_fn, kw):
        logp, old, adv, mask = _batch(spread=0.3)
        f = lambda lp: objectives.aggregate(loss_fn(lp, old, adv, mask, **kw)[0], mask,
                                            mode="token-mean")
        with jax.enable_x64():
            jax.test_util.check_grads(f, (logp.astype(jnp.float64),), order=1, modes=["rev"],
                                      atol=1e-4, rtol=1e-3)


LOSSES = {
    "pg_loss": (objectives.pg_loss, {}),
    "ppo_clip_loss": (objectives.ppo_clip_loss, dict(eps_low=0.2, eps_high=0.28, dual_clip=3.0)),
    "gspo_loss": (objectives.gspo_loss, {}),
    "cispo_loss": (objectives.cispo_loss, dict(eps_low=1.0, eps_high=0.28)),
    "sapo_loss": (objectives.sapo_loss, {}),
    "gmpo_loss": (objectives.gmpo_loss, {}),
    "dppo_loss": (objectives.dppo_loss, dict(divergence="binary_kl")),
    "kl_cov_loss": (objectives.kl_cov_loss, dict(kl_fraction=0.5)),
    # a covariance band nothing falls in: no token drawn, so the loss is PPO's
    "clip_cov_loss": (objectives.clip_cov_loss, dict(key=jax.random.key(0), cov_low=1e3,
                                                     cov_high=2e3)),
    # pi_behav = pi_prox: the weight is 1 (on-policy data)
    "decoupled_ppo_loss": (lambda lp, old, a, m, **kw: objectives.decoupled_ppo_loss(
        lp, old, old, a, m, **kw), dict(behav_weight_cap=5.0)),
}


def _riding_on(x, lp):
    """`x`'s values with a derivative of 1 in `lp` (a stop-gradient inside makes it 0)."""
    return x + (lp - jax.lax.stop_gradient(lp))


class TestGradientContract:
    """The policy's log-probs are the only differentiated input: passing the very array
    that is differentiated as old_logp (on-policy, TRL's habit), or reference log-probs,
    advantages or value targets that depend on it, gives the gradient of passing constants
    with the same values, and that gradient is the policy gradient, non-zero on every
    valid token with an advantage."""

    @pytest.mark.parametrize("name", sorted(LOSSES))
    def test_old_logp_and_advantages_are_constants(self, name):
        loss_fn, kw = LOSSES[name]
        logp, _, adv, mask = _batch()

        def total(lp, old, a):
            return loss_fn(lp, old, a, mask, **kw)[0].sum()

        constant = jax.jit(jax.grad(lambda lp: total(lp, logp, adv)))(logp)
        same_array = jax.jit(jax.grad(lambda lp: total(lp, lp, adv)))(logp)
        from_logp = jax.jit(jax.grad(lambda lp: total(lp, lp, _riding_on(adv, lp.sum(-1)))))(logp)
        # equal up to float rounding (a leak through a missing stop-gradient is O(1))
        np.testing.assert_allclose(same_array, constant, rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(from_logp, constant, rtol=1e-6, atol=1e-7)
        # on-policy every ratio is 1, so each valid token's gradient is -A (GSPO: the
        # sequence ratio's gradient 1/|y| summed over |y| tokens, -A per token too)
        valid = np.asarray(mask) > 0
        expected = np.where(valid, -np.asarray(adv)[:, None], 0.0)
        np.testing.assert_allclose(constant, expected, rtol=1e-6, atol=1e-7)
        assert np.all(np.asarray(constant)[valid] != 0)

    @pytest.mark.parametrize("kind", objectives.KL_KINDS)
    def test_reference_and_old_logp_are_constants(self, kind):
        logp, ref, _, mask = _batch(spread=0.3)
        total = lambda lp, r, o: (objectives.kl_penalty(lp, r, kind=kind, old_logp=o) * mask).sum()
        constant = jax.jit(jax.grad(lambda lp: total(lp, ref, logp)))(logp)
        traced = jax.jit(jax.grad(lambda lp: total(lp, _riding_on(ref, lp), lp)))(logp)
        np.testing.assert_array_equal(traced, constant)
        d = np.asarray(logp - ref, np.float64)
        expected = {"k1": np.ones_like(d), "k2": d, "k3": 1.0 - np.exp(-d),
                    # d/dlp [exp(lp - old) k3] at old = lp: k3 + (1 - e^{-d})
                    "k3_unbiased": np.exp(-d) + d - 1.0 + 1.0 - np.exp(-d)}[kind]
        np.testing.assert_allclose(constant, expected * np.asarray(mask), rtol=2e-5, atol=1e-6)

    def test_value_targets_are_constants(self):
        values, old, _, mask = _batch(spread=0.3)
        returns = old + 0.1
        total = lambda v, o, r: objectives.value_loss(v, o, r, mask, clip=0.2)[0].sum()
        constant = jax.jit(jax.grad(lambda v: total(v, old, returns)))(values)
        traced = jax.jit(jax.grad(lambda v: total(v, _riding_on(old, v), _riding_on(returns, v))))(
            values
        )
        np.testing.assert_array_equal(traced, constant)
        assert np.any(np.asarray(constant) != 0)
