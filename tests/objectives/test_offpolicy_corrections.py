"""DeepSeek-V3.2's off-policy corrections (arXiv:2512.02556, sec. 3.1): the unbiased KL
estimate (eq. 7) and off-policy sequence masking (eq. 8-9), alone and in the composer."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from grpo_jax import config_lib, objectives

sg = jax.lax.stop_gradient
V = 6   # the support of one token's categorical distribution


def _log_softmax(x):
    return x - np.log(np.sum(np.exp(x)))


def _policies(seed=0):
    """(theta [V] logits of pi_theta, log pi_old [V], log pi_ref [V]), all different."""
    rng = np.random.default_rng(seed)
    return (rng.normal(0, 1, V), _log_softmax(rng.normal(0, 1.5, V)),
            _log_softmax(rng.normal(0, 1.5, V)))


def _exact_kl(theta, ref_logp):
    """KL(pi_theta || pi_ref), summed over the support."""
    logp = jax.nn.log_softmax(theta)
    return jnp.sum(jnp.exp(logp) * (logp - ref_logp))


def _forward_kl(theta, ref_logp):
    """KL(pi_ref || pi_theta)."""
    return jnp.sum(jnp.exp(ref_logp) * (ref_logp - jax.nn.log_softmax(theta)))


def _k3_with_stopped_ratio(logp, ref_logp, old_logp):
    """The alternative reading of eq. 7, sg(pi/pi_old) * k3, for the control."""
    return jnp.exp(sg(logp) - old_logp) * objectives.kl_penalty(logp, ref_logp, kind="k3")


def _estimators():
    return {
        "k3_unbiased": lambda lp, ref, old: objectives.kl_penalty(lp, ref, kind="k3_unbiased",
                                                                  old_logp=old),
        "k3": lambda lp, ref, old: objectives.kl_penalty(lp, ref, kind="k3"),
        "stopped_ratio": _k3_with_stopped_ratio,
    }


class TestUnbiasedKlEstimate:
    """Tokens from pi_old: the estimate and its gradient are unbiased for KL(pi_theta || pi_ref)."""

    @staticmethod
    def _expectation_under_old(estimator, theta, old_logp, ref_logp):
        """E_{x ~ pi_old}[estimator(x)], exactly: a sum over the support."""
        est = estimator(jax.nn.log_softmax(theta), ref_logp, old_logp)
        return jnp.sum(jnp.exp(old_logp) * est)

    @pytest.mark.parametrize("seed", [0, 1, 2])
    def test_expected_value_and_gradient_are_exact(self, seed):
        theta, old_logp, ref_logp = _policies(seed)
        with jax.enable_x64():
            theta = jnp.asarray(theta, jnp.float64)
            expected = lambda th: self._expectation_under_old(
                _estimators()["k3_unbiased"], th, old_logp, ref_logp)
            value, grad = jax.value_and_grad(expected)(theta)
            exact_value, exact_grad = jax.value_and_grad(_exact_kl)(theta, ref_logp)
            np.testing.assert_allclose(value, exact_value, rtol=1e-12)
            np.testing.assert_allclose(grad, exact_grad, rtol=1e-10, atol=1e-14)

    def test_the_controls_are_biased(self):
        """Plain k3 is biased off-policy; stopping the ratio's gradient keeps the value but
        descends the forward KL(pi_ref || pi_theta) instead: eq. 7 differentiates the ratio."""
        theta, old_logp, ref_logp = _policies(0)
        with jax.enable_x64():
            theta = jnp.asarray(theta, jnp.float64)
            exact_value, exact_grad = jax.value_and_grad(_exact_kl)(theta, ref_logp)

            def moments(name):
                return jax.value_and_grad(lambda th: self._expectation_under_old(
                    _estimators()[name], th, old_logp, ref_logp))(theta)

            k3_value, k3_grad = moments("k3")
            assert abs(float(k3_value - exact_value)) > 1e-2
            assert float(jnp.max(jnp.abs(k3_grad - exact_grad))) > 1e-2
            stopped_value, stopped_grad = moments("stopped_ratio")
            np.testing.assert_allclose(stopped_value, exact_value, rtol=1e-12)
            assert float(jnp.max(jnp.abs(stopped_grad - exact_grad))) > 1e-2
            np.testing.assert_allclose(stopped_grad, jax.grad(_forward_kl)(theta, ref_logp),
                                       rtol=1e-10, atol=1e-14)

    def test_monte_carlo_from_pi_old(self):
        """200,000 tokens sampled from pi_old: the sample means hit the exact KL and its
        gradient within 4 standard errors."""
        theta, old_logp, ref_logp = _policies(3)
        n = 200_000
        tokens = np.random.default_rng(4).choice(V, size=n, p=np.exp(old_logp))
        theta = jnp.asarray(theta, jnp.float32)

        def per_sample(th):
            logp = jax.nn.log_softmax(th)[tokens]
            return objectives.kl_penalty(logp, jnp.asarray(ref_logp, jnp.float32)[tokens],
                                         kind="k3_unbiased",
                                         old_logp=jnp.asarray(old_logp, jnp.float32)[tokens])

        values = np.asarray(jax.jit(per_sample)(theta), np.float64)
        grads = np.asarray(jax.jit(jax.jacfwd(per_sample))(theta), np.float64)   # [n, V]
        exact_value, exact_grad = jax.value_and_grad(_exact_kl)(theta, jnp.asarray(ref_logp))
        sem = values.std() / np.sqrt(n)
        assert abs(values.mean() - float(exact_value)) < 4 * sem
        grad_sem = grads.std(axis=0) / np.sqrt(n)
        assert np.all(np.abs(grads.mean(axis=0) - np.asarray(exact_grad)) < 4 * grad_sem + 1e-6)


class TestOffpolicySequenceMaskByHand:
    """M_i = 0 iff A_i < 0 and mean_t log(pi_old / pi_theta) > delta."""

    def test_table(self):
        half, quarter = np.log(0.5), np.log(0.25)
        # Per row: (A, logp per token, old_logp per token, valid tokens) and M at delta 0.5.
        rows = [
            (-1.0, (quarter, quarter), (half, half), 2, 0.0),      # log 2 = 0.693 > 0.5: dropped
            (-1.0, (np.log(0.4),) * 2, (half, half), 2, 1.0),      # log 1.25 = 0.223: kept
            (+2.0, (quarter, quarter), (half, half), 2, 1.0),      # positive advantage: kept
            (0.0, (quarter, quarter), (half, half), 2, 1.0),       # A = 0 is not negative: kept
            (-1.0, (-1.5, -0.5), (-0.5, -0.7), 2, 1.0),            # mean of 1.0 and -0.2 = 0.4
            (-1.0, (-1.0, -1.0), (-0.5, -0.5), 2, 1.0),            # exactly delta: kept (strict >)
            (-1.0, (quarter, 0.0), (half, 0.0), 1, 0.0),           # one valid token, 0.693
            (-1.0, (0.0, 0.0), (0.0, 0.0), 0, 1.0),                # no valid token: kept
        ]
        adv = np.array([r[0] for r in rows], np.float32)
        logp = np.array([r[1] for r in rows], np.float32)
        old = np.array([r[2] for r in rows], np.float32)
        mask = (np.arange(2)[None] < np.array([r[3] for r in rows])[:, None]).astype(np.float32)
        logp[~mask.astype(bool)] = np.nan   # padding never reaches the decision
        fn = jax.jit(objectives.offpolicy_sequence_mask, static_argnames="delta")
        got = fn(logp, old, adv, mask, delta=0.5)
        np.testing.assert_array_equal(np.asarray(got), [r[4] for r in rows])
        # delta = 0.3 also drops the mixed row (mean 0.4).
        np.testing.assert_array_equal(np.asarray(fn(logp, old, adv, mask, delta=0.3))[4], 0.0)

    def test_per_token_advantages_use_the_row_mean(self):
        logp = np.full((2, 3), np.log(0.25), np.float32)
        old = np.full((2, 3), np.log(0.5), np.float32)
        # Row means over the valid tokens: -1/6 and -0.25 (row 1's padded 5.0 not counted).
        adv = np.array([[-1.0, -1.0, 1.5], [-1.0, 0.5, 5.0]], np.float32)
        mask = np.array([[1, 1, 1], [1, 1, 0]], np.float32)
        got = objectives.offpolicy_sequence_mask(logp, old, adv, mask, delta=0.5)
        np.testing.assert_array_equal(np.asarray(got), [0.0, 0.0])
        adv[1, 1] = 1.5   # row 1's valid mean turns positive: 0.25
        got = objectives.offpolicy_sequence_mask(logp, old, adv, mask, delta=0.5)
        np.testing.assert_array_equal(np.asarray(got), [0.0, 1.0])


def _config(**overrides):
    config = config_lib.load_config("configs/base.py").objective
    config.group_size = 2
    config.loss.kind = "pg"
    return config_lib.apply_overrides(config, {"offpolicy_mask.enabled": True,
                                               "offpolicy_mask.delta": 0.5, **overrides})


def _hand_batch():
    """The table's first four kinds of row, for pg: L = -r A per token.

    row 0: A = -1, r = 0.5 on 2 tokens, log(old/new) = 0.693 -> dropped (L would be 0.5, 0.5)
    row 1: A = -1, r = 0.8 on 2 tokens, 0.223 -> kept, L = 0.8, 0.8
    row 2: A = +2, r = 0.5 on 2 tokens -> kept, L = -1, -1
    row 3: A = -1, r = 1 on 1 token -> kept, L = 1
    """
    half, quarter = np.log(0.5), np.log(0.25)
    logp = jnp.asarray([[quarter] * 2, [np.log(0.4)] * 2, [quarter] * 2, [half] * 2], jnp.float32)
    old = jnp.full((4, 2), half, jnp.float32)
    mask = jnp.asarray([[1, 1], [1, 1], [1, 1], [1, 0]], jnp.float32)
    return logp, {"old_logp": old, "mask": mask, "advantages": jnp.asarray([-1.0, -1.0, 2.0, -1.0])}


class TestOffpolicyMaskInTheComposer:

    @pytest.mark.parametrize("mode, expected", [
        ("token-mean", (0.8 + 0.8 - 1 - 1 + 1) / 7),       # the dropped row's 2 tokens still count
        ("seq-mean-token-mean", (0.8 - 1 + 1) / 4),        # ... and its row
        ("seq-mean-token-sum", (1.6 - 2 + 1) / 4),
    ])
    def test_drops_the_row_and_keeps_the_normalisation(self, mode, expected):
        logp, batch = _hand_batch()
        loss, metrics = jax.jit(objectives.policy_objective(_config(**{"aggregation.mode": mode})))(
            logp, batch)
        np.testing.assert_allclose(loss, expected, rtol=1e-6)
        np.testing.assert_allclose(metrics["policy_loss"], expected, rtol=1e-6)
        np.testing.assert_allclose(metrics["offpolicy_masked"], 0.25, rtol=1e-6)

    def test_off_changes_nothing(self):
        logp, batch = _hand_batch()
        loss, metrics = objectives.policy_objective(_config(**{"offpolicy_mask.enabled": False}))(
            logp, batch)
        np.testing.assert_allclose(loss, (0.5 + 0.5 + 0.8 + 0.8 - 1 - 1 + 1) / 7, rtol=1e-6)
        assert "offpolicy_masked" not in metrics

    def test_gradient_of_a_dropped_row_is_zero(self):
        logp, batch = _hand_batch()
        grad = jax.grad(lambda lp: objectives.policy_objective(_config())(lp, batch)[0])(logp)
        np.testing.assert_array_equal(np.asarray(grad[0]), 0.0)
        # pg: d(-r A)/d logp = -r A / num_tokens on kept tokens.
        np.testing.assert_allclose(
            grad[1:], np.array([[0.8, 0.8], [-1, -1], [1, 0]]) / 7, rtol=1e-6
        )

    def test_pi_old_is_the_sampler_when_it_reports(self):
        """With behaviour_logp the mask measures the sampler's divergence, not old_logp's."""
        logp, batch = _hand_batch()
        on_trainer = {**batch, "old_logp": logp, "behaviour_logp": batch["old_logp"]}
        loss, metrics = objectives.policy_objective(_config())(logp, on_trainer)
        # r = pi / old_logp = 1: L = -A; row 0 dropped by the sampler's divergence.
        np.testing.assert_allclose(loss, (1 + 1 - 2 - 2 + 1) / 7, rtol=1e-6)
        np.testing.assert_allclose(metrics["offpolicy_masked"], 0.25, rtol=1e-6)
        without_sampler = {**batch, "old_logp": logp}
        loss, metrics = objectives.policy_objective(_config())(logp, without_sampler)
        np.testing.assert_allclose(loss, (1 + 1 + 1 + 1 - 2 - 2 + 1) / 7, rtol=1e-6)
        assert float(metrics["offpolicy_masked"]) == 0.0

    def test_kl_term_is_not_masked(self):
        logp, batch = _hand_batch()
        batch = {**batch, "ref_logp": batch["old_logp"] + 0.1}
        loss, metrics = objectives.policy_objective(_config(**{"kl.beta": 0.5}))(logp, batch)
        kl = objectives.kl_penalty(logp, batch["ref_logp"])
        kl_mean = objectives.aggregate(kl, batch["mask"], mode="token-mean")
        np.testing.assert_allclose(metrics["kl_ref"], kl_mean, rtol=1e-6)
        np.testing.assert_allclose(loss, (0.8 + 0.8 - 1 - 1 + 1) / 7 + 0.5 * kl_mean, rtol=1e-6)

    def test_global_num_seqs_averages_the_metric(self):
        logp, batch = _hand_batch()
        metrics = objectives.policy_objective(_config())(logp, {**batch, "num_seqs": 10.0})[1]
        np.testing.assert_allclose(metrics["offpolicy_masked"], 0.1, rtol=1e-6)
