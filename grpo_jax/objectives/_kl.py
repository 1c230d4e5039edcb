"""Per-token KL estimators between the policy and a reference policy."""

import jax
import jax.numpy as jnp

from grpo_jax.objectives import _checks

KL_KINDS = ("k1", "k2", "k3", "k3_unbiased")
LOG_RATIO_CLAMP = 20.0


def _clamped(a, b):
    return jnp.clip(a - b, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)


def kl_penalty(logp, ref_logp, *, kind="k3", old_logp=None):
    r"""Per-token estimate of KL(pi_theta || pi_ref) from the sampled tokens' log-probs.

    With d = logp - ref_logp (clamped to [-20, 20]):

    - ``k1``: d (unbiased for tokens sampled from pi_theta, can be negative);
    - ``k2``: d^2 / 2 (biased, low variance);
    - ``k3``: exp(-d) + d - 1, computed as expm1(-d) + d so it is never negative
      (unbiased for tokens sampled from pi_theta; the GRPO paper's choice);
    - ``k3_unbiased``: r * k3 with r = pi_theta / pi_old = exp(logp - old_logp)
      (clamped likewise), DeepSeek-V3.2's estimate for tokens sampled from pi_old
      (arXiv:2512.02556, sec. 3.1, eq. 7):

      .. math::
          \frac{\pi_\theta}{\pi_{old}} \Big(\frac{\pi_{ref}}{\pi_\theta}
              - \log\frac{\pi_{ref}}{\pi_\theta} - 1\Big)

      The ratio is NOT stop-gradient: the paper writes it as part of the estimator and
      states that its gradient is unbiased, which holds only with the ratio
      differentiated. Then d/dlogp = r d, and under pi_old both the estimate and its
      gradient have the expectations KL(pi_theta || pi_ref) and its exact gradient
      (tests/objectives/test_offpolicy_corrections.py enumerates a categorical). Plain
      k3's gradient, (1 - pi_ref/pi_theta) grad logp, is biased, and most so where
      pi_theta << pi_ref.

    Args:
      logp: `[B, T]` log-probs under the policy being trained.
      ref_logp: `[B, T]` log-probs of the same tokens under the reference policy.
      kind: one of ``"k1"``, ``"k2"``, ``"k3"``, ``"k3_unbiased"``.
      old_logp: `[B, T]` log-probs under the policy that sampled the tokens; required
        by ``"k3_unbiased"`` and not read by the others.

    Returns:
      `[B, T]` per-token penalty; the caller masks and aggregates it.

    Example:
      >>> kl_penalty(jnp.log(jnp.array([[0.5]])), jnp.log(jnp.array([[0.25]])))
      Array([[0.19314718]], dtype=float32)
      >>> kl_penalty(jnp.log(jnp.array([[0.5]])), jnp.log(jnp.array([[0.25]])),
      ...            kind="k3_unbiased", old_logp=jnp.log(jnp.array([[0.25]])))
      Array([[0.38629436]], dtype=float32)

    References:
      Schulman, "Approximating KL Divergence" (2020); Shao et al., DeepSeekMath (2024),
      eq. 4; DeepSeek-AI, DeepSeek-V3.2 (arXiv:2512.02556), sec. 3.1, eq. 7.
    """
    _checks.check_choice("kind", kind, KL_KINDS)
    _checks.check_floating("kl_penalty", logp=logp, ref_logp=ref_logp, old_logp=old_logp)
    form = "[B, T]" if len(_checks.shape_of(logp)) == 2 else "[...]"
    _checks.check_like("kl_penalty", form, logp=logp, ref_logp=ref_logp, old_logp=old_logp)
    logp, ref_logp = jnp.asarray(logp), jnp.asarray(ref_logp)
    old_logp = None if old_logp is None else jnp.asarray(old_logp)
    log_ratio = _clamped(logp, jax.lax.stop_gradient(ref_logp))
    if kind == "k1":
        return log_ratio
    if kind == "k2":
        return 0.5 * jnp.square(log_ratio)
    k3 = jnp.maximum(jnp.expm1(-log_ratio) + log_ratio, 0.0)
    if kind == "k3":
        return k3
    if old_logp is None:
        raise ValueError("kind='k3_unbiased' needs old_logp, the log-probs of the policy "
                         "that sampled the tokens; pass old_logp=...")
    return jnp.exp(_clamped(logp, jax.lax.stop_gradient(old_logp))) * k3
