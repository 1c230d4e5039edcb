"""Reward shaping, filtering and off-policy correction (DAPO; sampler/trainer mismatch)."""

import jax
import jax.numpy as jnp

from grpo_jax.objectives import _checks

IMPORTANCE_LEVELS = ("token", "sequence")
IMPORTANCE_MODES = ("truncate", "mask")
LOG_RATIO_CLAMP = 20.0


def overlong_penalty(lengths, *, max_len, cache_len):
    r"""DAPO's soft overlong penalty, added to the reward.

    .. math::
        R_{len}(l) = \begin{cases} 0 & l \le L_{max} - L_{cache} \\
          \frac{(L_{max} - L_{cache}) - l}{L_{cache}} & L_{max} - L_{cache} < l \le L_{max} \\
          -1 & l > L_{max} \end{cases}

    Args:
      lengths: `[B]` response lengths in tokens.
      max_len: L_max, the longest response that is not cut off.
      cache_len: L_cache > 0, the width of the warning zone before max_len.

    Returns:
      `[B]` float32 penalties in [-1, 0].

    Example:
      >>> overlong_penalty(jnp.array([15_000, 18_000, 21_000]), max_len=20_000, cache_len=4_000)
      Array([ 0. , -0.5, -1. ], dtype=float32)

    References:
      Yu et al., DAPO (2025), eq. 13.
    """
    _checks.check_greater("cache_len", cache_len, 0)
    _checks.check_greater("max_len", max_len, 0)
    if max_len < cache_len:
        raise ValueError(f"cache_len must be <= max_len, got cache_len={cache_len} > max_len={max_len}")
    lengths = jnp.asarray(lengths, jnp.float32)
    zone_start = max_len - cache_len
    in_zone = (zone_start - lengths) / cache_len
    return jnp.where(lengths <= zone_start, 0.0, jnp.where(lengths <= max_len, in_zone, -1.0))


def truncated_mask(mask, truncated):
    """Zeroes every token of a truncated completion (DAPO's overlong filtering).

    Args:
      mask: `[B, T]` response mask.
      truncated: `[B]` bool, True where the completion hit the length limit.

    Returns:
      `[B, T]` mask of the same dtype, all 0 on truncated rows.

    Example:
      >>> truncated_mask(jnp.ones((2, 2)), jnp.array([False, True]))
      Array([[1., 1.],
             [0., 0.]], dtype=float32)

    References:
      Yu et al., DAPO (2025), sec. 3.4.
    """
    return jnp.where(jnp.asarray(truncated, bool)[:, None], jnp.zeros_like(mask), mask)


def group_has_signal(rewards, group_size):
    """True for each group whose rewards are not all equal (DAPO dynamic sampling).

    Args:
      rewards: `[B]` rewards, B = P * G.
      group_size: G; must divide B.

    Returns:
      `[P]` bool.

    Example:
      >>> group_has_signal(jnp.array([1., 1, 0, 1, 0, 0]), 2)
      Array([False,  True, False], dtype=bool)

    References:
      Yu et al., DAPO (2025), sec. 3.2, eq. 11.
    """
    _checks.check_group_size(group_size, rewards.shape[0])
    grouped = rewards.reshape(-1, group_size)
    return jnp.max(grouped, axis=1) != jnp.min(grouped, axis=1)


def importance_weights(old_logp, behaviour_logp, mask, *, level="token", cap=2.0,
                       mode="truncate"):
    r"""Corrects for the sampler and the trainer disagreeing on the behaviour policy.

    .. math::
        w_t = \frac{\pi_{old}(y_t)}{\pi_{behaviour}(y_t)} \quad\text{(token)},\qquad
        w_i = \prod_{t} w_t \quad\text{(sequence)}

    ``"truncate"`` caps w at `cap` (truncated importance sampling); ``"mask"`` zeroes
    tokens (or whole sequences) whose weight lies outside [1/cap, cap]. The result is a
    constant (stop-gradient) that multiplies the per-token loss.

    Args:
      old_logp: `[B, T]` log-probs recomputed by the trainer (the policy of record).
      behaviour_logp: `[B, T]` log-probs reported by the sampler.
      mask: `[B, T]` response mask.
      level: ``"token"`` or ``"sequence"``.
      cap: > 1 for ``"mask"``, > 0 for ``"truncate"``.
      mode: ``"truncate"`` or ``"mask"``.

    Returns:
      `[B, T]` float32 weights, 0 at masked positions.

    Example:
      >>> importance_weights(jnp.log(jnp.array([[0.5, 0.9]])), jnp.log(jnp.array([[0.2, 0.9]])),
      ...                    jnp.ones((1, 2)))
      Array([[2., 1.]], dtype=float32)

    References:
      Yao et al., Your Efficient RL Framework Secretly Brings You Off-Policy RL
      Training (TIS, 2025); Espeholt et al., IMPALA (2018).
    """
    _checks.check_choice("level", level, IMPORTANCE_LEVELS)
    _checks.check_choice("mode", mode, IMPORTANCE_MODES)
    _checks.check_greater("cap", cap, 1.0 if mode == "mask" else 0.0)
    valid = mask.astype(bool)
    log_w = jnp.where(valid, old_logp - behaviour_logp, 0.0)
    if level == "sequence":
        log_w = jnp.broadcast_to(jnp.sum(log_w, axis=-1, keepdims=True), log_w.shape)
    w = jnp.exp(jnp.clip(log_w, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
    if mode == "truncate":
        w = jnp.minimum(w, cap)
    else:
        w = jnp.where((w >= 1.0 / cap) & (w <= cap), w, 0.0)
    return jax.lax.stop_gradient(jnp.where(valid, w, 0.0))
