"""Per-token KL estimators between the policy and a reference policy."""

import jax.numpy as jnp

from grpo_jax.objectives import _checks

KL_KINDS = ("k1", "k2", "k3")
LOG_RATIO_CLAMP = 20.0


def kl_penalty(logp, ref_logp, *, kind="k3"):
    r"""Per-token estimate of KL(pi || pi_ref) from the sampled tokens' log-probs.

    With d = logp - ref_logp (clamped to [-20, 20]) and samples from pi:

    - ``k1``: d (unbiased, can be negative);
    - ``k2``: d^2 / 2 (biased, low variance);
    - ``k3``: exp(-d) + d - 1, computed as expm1(-d) + d so it is never negative
      (unbiased, low variance; the GRPO paper's choice).

    Args:
      logp: `[B, T]` log-probs under the policy being trained.
      ref_logp: `[B, T]` log-probs of the same tokens under the reference policy.
      kind: one of ``"k1"``, ``"k2"``, ``"k3"``.

    Returns:
      `[B, T]` per-token penalty; the caller masks and aggregates it.

    Example:
      >>> kl_penalty(jnp.log(jnp.array([[0.5]])), jnp.log(jnp.array([[0.25]])))
      Array([[0.19314718]], dtype=float32)

    References:
      Schulman, "Approximating KL Divergence" (2020); Shao et al., DeepSeekMath (2024), eq. 4.
    """
    _checks.check_choice("kind", kind, KL_KINDS)
    log_ratio = jnp.clip(logp - ref_logp, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    if kind == "k1":
        return log_ratio
    if kind == "k2":
        return 0.5 * jnp.square(log_ratio)
    return jnp.maximum(jnp.expm1(-log_ratio) + log_ratio, 0.0)
