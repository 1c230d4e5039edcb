"""Reward shaping, filtering and off-policy corrections (DAPO; sampler/trainer mismatch;
DeepSeek-V3.2's off-policy sequence masking)."""

import jax
import jax.numpy as jnp

from grpo_jax.objectives import _checks
from grpo_jax.objectives._mismatch import rollout_correction

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
        raise ValueError(
            f"cache_len must be <= max_len, got cache_len={cache_len} > max_len={max_len}"
        )
    _checks.check_real("overlong_penalty", lengths=lengths)
    _checks.check_rows("overlong_penalty", "lengths", lengths)
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
    _checks.check_real("truncated_mask", mask=mask, truncated=truncated)
    rows, _ = _checks.check_token_arrays("truncated_mask", mask=mask)
    _checks.check_rows("truncated_mask", "truncated", truncated, rows=rows)
    mask = jnp.asarray(mask)
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
    _checks.check_real("group_has_signal", rewards=rewards)
    _checks.check_rows("group_has_signal", "rewards", rewards)
    rewards = jnp.asarray(rewards)
    _checks.check_group_size(group_size, rewards.shape[0], fn="group_has_signal")
    grouped = rewards.reshape(-1, group_size)
    return jnp.max(grouped, axis=1) != jnp.min(grouped, axis=1)


SIGNALS = ("correct", "reward")


def dynamic_sampling_signal(rewards, correct, group_size, signal="correct"):
    """True for each group DAPO's dynamic sampling keeps.

    DAPO keeps a prompt while ``0 < |{o_i : o_i is correct}| < G`` (eq. 11): the test is
    on accuracy, so shaping terms added to the reward (the soft overlong penalty, a format
    bonus) do not make a group of all-wrong or all-right answers count as signal.

    Args:
      rewards: `[B]` scalar rewards or `[B, K]` reward columns (GDPO), B = P * G.
      correct: `[B]` bool, each answer's correctness.
      group_size: G; must divide B.
      signal: ``"correct"`` (DAPO's test: correctness differs within the group) or
        ``"reward"`` (the rewards entering the advantages differ; with K columns, any
        column differs: a group whose columns are all constant has zero advantages).

    Returns:
      `[P]` bool.

    Example:
      >>> rewards = jnp.array([0., -0.5, 1., 1.])        # a penalty on one wrong answer
      >>> correct = jnp.array([False, False, True, True])
      >>> dynamic_sampling_signal(rewards, correct, 2)
      Array([False, False], dtype=bool)
      >>> dynamic_sampling_signal(rewards, correct, 2, signal="reward")
      Array([ True, False], dtype=bool)

    References:
      Yu et al., DAPO (2025), arXiv:2503.14476, sec. 3.2, eq. 11.
    """
    fn = "dynamic_sampling_signal"
    _checks.check_choice(f"{fn}: signal", signal, SIGNALS)
    _checks.check_real(fn, rewards=rewards, correct=correct)
    rows, *_ = _checks.check_rows(fn, "rewards", rewards, ndim=(1, 2))
    _checks.check_rows(fn, "correct", correct, rows=rows)
    _checks.check_group_size(group_size, rows, fn=fn)
    if signal == "correct":
        return group_has_signal(jnp.asarray(correct).astype(jnp.float32), group_size)
    rewards = jnp.asarray(rewards).reshape(rows, -1)
    grouped = rewards.reshape(-1, group_size, rewards.shape[1])
    return jnp.any(jnp.max(grouped, axis=1) != jnp.min(grouped, axis=1), axis=1)


def importance_weights(old_logp, behaviour_logp, mask, *, level="token", cap=2.0,
                       mode="truncate"):
    r"""Corrects for the sampler and the trainer disagreeing on the behaviour policy.

    .. math::
        w_t = \frac{\pi_{old}(y_t)}{\pi_{behaviour}(y_t)} \quad\text{(token)},\qquad
        w_i = \prod_{t} w_t \quad\text{(sequence)}

    ``"truncate"`` caps w at `cap` (truncated importance sampling); ``"mask"`` zeroes
    tokens (or whole sequences) whose weight lies outside [1/cap, cap]. The result is a
    constant (stop-gradient) that multiplies the per-token loss. The symmetric special
    case of `rollout_correction` (which adds the geometric level, free bounds such as
    IcePop's [0.5, 5] and the shares masked or truncated); the composer uses that.

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
    fn = "importance_weights"
    _checks.check_floating(fn, old_logp=old_logp, behaviour_logp=behaviour_logp)
    _checks.check_real(fn, mask=mask)
    _checks.check_token_arrays(fn, old_logp=old_logp, behaviour_logp=behaviour_logp, mask=mask)
    low = 1.0 / cap if mode == "mask" else None
    return rollout_correction(old_logp, behaviour_logp, mask, level=level, mode=mode, low=low,
                              high=cap)[0]


def offpolicy_sequence_mask(logp, old_logp, adv, mask, *, delta):
    r"""DeepSeek-V3.2's off-policy sequence mask: drop negative answers gone stale.

    .. math::
        M_i = \begin{cases} 0 & A_i < 0 \text{ and } \frac{1}{|o_i|} \sum_t
              \log\frac{\pi_{old}(o_{i,t})}{\pi_\theta(o_{i,t})} > \delta \\
              1 & \text{otherwise} \end{cases}

    The mean log-ratio is the k1 estimate of KL(pi_old || pi_theta) over answer i's
    tokens. An answer is dropped only when it is both bad (A_i < 0) and too far off the
    current policy: the model learns mostly from its own mistakes, and pushing down
    tokens it no longer produces adds noise. Multiply answer i's per-token policy loss
    by M_i; the loss keeps its normalisation (the paper multiplies the clipped term by
    M_{i,t} inside the same 1/G sum_i 1/|o_i| sum_t, eq. 8), and the KL term is not
    masked. pi_old is the policy that sampled the tokens (the sampler's log-probs where
    they differ from the trainer's recomputation).

    Args:
      logp: `[B, T]` log-probs under the current policy (read without gradient).
      old_logp: `[B, T]` log-probs under the policy that sampled the tokens.
      adv: `[B]` (or `[B, 1]`) advantages, or `[B, T]` per-token advantages; then A_i is
        their mean over the row's valid tokens (REINFORCE++ with gamma = 1 and no token
        rewards gives every token of a row the same advantage, so this is the paper's
        rule exactly).
      mask: `[B, T]` response mask.
      delta: the threshold, >= 0. A row without valid tokens is kept (M = 1).

    Returns:
      `[B]` float32 in {0, 1}, stop-gradient.

    Example:
      >>> logp = jnp.log(jnp.array([[0.2, 0.5], [0.2, 0.5]]))
      >>> old = jnp.log(jnp.array([[0.4, 0.5], [0.4, 0.5]]))   # mean log(old/new) = 0.35
      >>> offpolicy_sequence_mask(logp, old, jnp.array([-1.0, 1.0]), jnp.ones((2, 2)), delta=0.1)
      Array([0., 1.], dtype=float32)

    References:
      DeepSeek-AI, DeepSeek-V3.2 (arXiv:2512.02556), sec. 3.1, eq. 8-9.
    """
    _checks.check_nonnegative("delta", delta)
    fn = "offpolicy_sequence_mask"
    _checks.check_floating(fn, logp=logp, old_logp=old_logp)
    _checks.check_real(fn, adv=adv, mask=mask)
    batch = _checks.check_token_arrays(fn, logp=logp, old_logp=old_logp, mask=mask)
    _checks.check_row_values(fn, "adv (advantages)", adv, batch, per_token=True)
    logp, old_logp, adv, mask = map(jnp.asarray, (logp, old_logp, adv, mask))
    valid = mask.astype(bool)
    count = jnp.maximum(jnp.sum(valid, axis=-1, dtype=jnp.float32), 1.0)
    log_old_over_new = jnp.where(valid, old_logp - logp, 0.0).astype(jnp.float32)
    divergence = jnp.sum(log_old_over_new, axis=-1) / count
    if adv.ndim == 2:   # the row's sum has the sign of its mean
        adv = jnp.sum(jnp.where(valid, adv, 0.0), axis=-1)
    drop = (adv < 0) & (divergence > delta)
    return jax.lax.stop_gradient((~drop).astype(jnp.float32))
