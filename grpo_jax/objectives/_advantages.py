"""Advantage estimators: group-relative (GRPO, Dr. GRPO), leave-one-out (RLOO),
batch-whitened returns (REINFORCE++), decoupled multi-reward (GDPO) and GAE (VAPO).

Rows are P prompts x G completions laid out consecutively: row p*G + g is the g-th
completion of prompt p.
"""

import jax
import jax.numpy as jnp

from grpo_jax.objectives import _checks

GROUP_SCALES = ("group", "batch", "none")


def _grouped(rewards, group_size, *, minimum=1, fn=None):
    """`[B]` -> `[P, G]`, after checking that G divides B."""
    _checks.check_group_size(group_size, rewards.shape[0], minimum=minimum, fn=fn)
    return rewards.reshape(-1, group_size)


def _check_rewards(fn, rewards, rows=None):
    """`rewards` is `[B]` (one scalar per completion, `rows` of them), any real dtype."""
    _checks.check_real(fn, rewards=rewards)
    columns = len(_checks.shape_of(rewards)) == 2
    _checks.check_rows(fn, "rewards", rewards, rows=rows,
                       hint="one scalar per completion (sum the reward columns, or use "
                            "gdpo_advantages for [B, K])" if columns else None)


def _all_equal(grouped_pg, finite):
    """`[P]` bool: every finite reward of the group is identical."""
    high = jnp.max(jnp.where(finite, grouped_pg, -jnp.inf), axis=1)
    low = jnp.min(jnp.where(finite, grouped_pg, jnp.inf), axis=1)
    return high == low


def _finite_stats(x, finite, *, ddof, axis=None):
    """Mean and std (with `ddof`) of `x` over its `finite` entries; `[..., 1]` keepdims.
    Too few entries for the ddof give a std of 1 (their advantages are 0 anyway)."""
    count = jnp.sum(finite, axis=axis, keepdims=True)
    mean = jnp.sum(jnp.where(finite, x, 0.0), axis=axis, keepdims=True) / jnp.maximum(count, 1)
    square = jnp.sum(jnp.where(finite, jnp.square(x - mean), 0.0), axis=axis, keepdims=True)
    enough = count - ddof > 0
    return mean, jnp.where(enough, jnp.sqrt(square / jnp.where(enough, count - ddof, 1)), 1.0)


def group_advantages(rewards, group_size, *, scale="group", ddof=0, eps=1e-6):
    r"""Group-relative advantages (GRPO; Dr. GRPO with ``scale="none"``).

    .. math::
        A_i = \frac{r_i - \operatorname{mean}_{group}(r)}{s + \epsilon}

    where s is the group's std (``"group"``, GRPO), the std of all rewards in the batch
    (``"batch"``), or no division at all (``"none"``, Dr. GRPO). A group whose rewards
    are all equal gets exactly 0, also when float rounding would leave a residue. A NaN
    or infinite reward is unscorable: its advantage is 0 and the statistics leave it out.

    What cannot be checked from the rewards alone: that the rows are laid out as
    consecutive groups, and that G is the batch's when it divides B (a wrong G, or
    interleaved rows, give other advantages without an error). A composed objective
    checks both from ``batch["prompt_ids"]`` (`check_group_layout`).

    Args:
      rewards: `[B]` scalar reward per completion, B = P * G.
      group_size: G, the completions per prompt; must divide B.
      scale: ``"group"``, ``"batch"`` or ``"none"``.
      ddof: 0 for the population std (docs/semantics.md's worked example), 1 for the
        unbiased std (TRL, verl).
      eps: added to the std before dividing.

    Returns:
      `[B]` float32 advantages.

    Example:
      >>> [round(float(a), 2) for a in group_advantages(jnp.array([1., 1, 1, 1, 1, 1, 1, 0]), 8)]
      [0.38, 0.38, 0.38, 0.38, 0.38, 0.38, 0.38, -2.65]
      >>> group_advantages(jnp.array([1., 0, jnp.nan, 0]), 4)   # the NaN row left out
      Array([ 1.4142106 , -0.70710534,  0.        , -0.70710534], dtype=float32)

    References:
      Shao et al., DeepSeekMath (2024), sec. 4.1.2; Liu et al., Understanding
      R1-Zero-Like Training (Dr. GRPO, 2025), sec. 3.
    """
    _checks.check_choice("scale", scale, GROUP_SCALES)
    _checks.check_nonnegative("eps", eps)
    _check_rewards("group_advantages", rewards)
    rewards = jnp.asarray(rewards).astype(jnp.float32)
    grouped = _grouped(rewards, group_size, minimum=ddof + 1 if scale == "group" else 1,
                       fn="group_advantages")
    finite = jnp.isfinite(grouped)
    mean, std = _finite_stats(grouped, finite, ddof=ddof, axis=1)
    centered = grouped - mean
    if scale == "group":
        centered = centered / (std + eps)
    elif scale == "batch":
        centered = centered / (_finite_stats(grouped, finite, ddof=ddof)[1] + eps)
    keep = finite & ~_all_equal(grouped, finite)[:, None]
    return jnp.where(keep, centered, 0.0).reshape(-1)


def rloo_advantages(rewards, group_size):
    r"""Leave-one-out advantages (RLOO): each baseline is the mean of the others.

    .. math::
        A_i = r_i - \frac{1}{G-1} \sum_{j \ne i} r_j = \frac{G}{G-1} (r_i - \bar r)

    Args:
      rewards: `[B]` scalar reward per completion, B = P * G.
      group_size: G >= 2; must divide B.

    Returns:
      `[B]` float32 advantages; exactly 0 for a group of equal rewards. A NaN or
      infinite reward is unscorable: advantage 0, left out of the others' baselines.

    Example:
      >>> rloo_advantages(jnp.array([1., 0, 0, 0]), 4)
      Array([ 1.        , -0.33333334, -0.33333334, -0.33333334], dtype=float32)

    References:
      Ahmadian et al., Back to Basics: Revisiting REINFORCE-Style Optimization (2024).
    """
    _check_rewards("rloo_advantages", rewards)
    grouped = _grouped(jnp.asarray(rewards).astype(jnp.float32), group_size, minimum=2,
                       fn="rloo_advantages")
    finite = jnp.isfinite(grouped)
    count = jnp.sum(finite, axis=1, keepdims=True)
    mean, _ = _finite_stats(grouped, finite, ddof=0, axis=1)
    advantages = (grouped - mean) * (count / jnp.maximum(count - 1, 1))
    keep = finite & (count >= 2) & ~_all_equal(grouped, finite)[:, None]
    return jnp.where(keep, advantages, 0.0).reshape(-1)


def masked_whiten(x, mask, *, shift_mean=True, eps=1e-8):
    r"""Whitens `x` over the positions where `mask` is 1.

    .. math:: \hat x = (x - \mu) / \sqrt{\sigma^2 + \epsilon}

    with mean and unbiased variance over the valid positions. With
    ``shift_mean=False`` the mean is added back (scale only). Masked positions are 0.

    Args:
      x: `[...]` values.
      mask: `[...]`, the shape of `x`: 1 where a value counts, 0 elsewhere.
      shift_mean: subtract the mean (True) or only rescale (False).
      eps: added to the variance.

    Returns:
      `[...]` float32, whitened where `mask` is 1 and 0 elsewhere.

    Example:
      >>> masked_whiten(jnp.array([1., 2, 3, 100]), jnp.array([1, 1, 1, 0]))
      Array([-1.,  0.,  1.,  0.], dtype=float32)

    References:
      Hu, REINFORCE++ (2025), sec. 3.
    """
    _checks.check_real("masked_whiten", x=x, mask=mask)
    _checks.check_like("masked_whiten", "[...]", x=x, mask=mask)
    x, mask = jnp.asarray(x), jnp.asarray(mask)
    valid = mask.astype(bool)
    x = jnp.where(valid, x.astype(jnp.float32), 0.0)
    count = jnp.sum(valid)
    mean = jnp.sum(x) / jnp.maximum(count, 1)
    var = jnp.sum(jnp.where(valid, jnp.square(x - mean), 0.0)) / jnp.maximum(count - 1, 1)
    whitened = (x - mean) * jax.lax.rsqrt(var + eps)
    if not shift_mean:
        whitened = whitened + mean
    return jnp.where(valid, whitened, 0.0)


def outcome_token_rewards(rewards, mask):
    r"""Places each completion's scalar reward on its last valid token.

    An outcome reward scores the whole answer: as a per-token reward sequence it is 0
    everywhere except at the last token the mask keeps (the stop token, or the last
    token of a truncated answer), the form GAE and discounted returns take.

    Args:
      rewards: `[B]` scalar reward per completion.
      mask: `[B, T]` response mask.

    Returns:
      `[B, T]` float32; a fully masked row is all 0.

    Example:
      >>> outcome_token_rewards(jnp.array([1., -1]), jnp.array([[1, 1, 0], [1, 0, 0]]))
      Array([[ 0.,  1.,  0.],
             [-1.,  0.,  0.]], dtype=float32)

    References:
      Ouyang et al., Training language models to follow instructions with human
      feedback (InstructGPT, 2022), sec. 3.5: the reward at the end of the episode.
    """
    _checks.check_real("outcome_token_rewards", rewards=rewards, mask=mask)
    rows, _ = _checks.check_token_arrays("outcome_token_rewards", mask=mask)
    _check_rewards("outcome_token_rewards", rewards, rows)
    rewards, mask = jnp.asarray(rewards), jnp.asarray(mask)
    positions = jnp.arange(mask.shape[1])
    last = jnp.max(jnp.where(mask.astype(bool), positions, -1), axis=1)
    at_last = positions[None, :] == last[:, None]
    return jnp.where(at_last, rewards.astype(jnp.float32)[:, None], 0.0)


def _discounted_returns(token_rewards, mask, gamma):
    """G_t = R_t + gamma G_{t'} over valid tokens (t' the next valid token)."""

    def step(future, inputs):
        reward_t, valid_t = inputs
        ret = jnp.where(valid_t, reward_t + gamma * future, future)
        return ret, jnp.where(valid_t, ret, 0.0)

    _, returns = jax.lax.scan(
        step, jnp.zeros(token_rewards.shape[0]), (token_rewards.T, mask.T.astype(bool)),
        reverse=True)
    return returns.T


def reinforce_pp_advantages(rewards, mask, *, gamma=1.0, group_size=None,
                            token_rewards=None, eps=1e-8):
    r"""REINFORCE++ advantages: discounted token returns, whitened over the batch.

    The scalar reward sits on the last valid token, token returns are
    G_t = R_t + \gamma G_{t+1} over valid tokens, and the returns are whitened over
    all valid tokens of the batch (`masked_whiten`). With `group_size`, each reward
    first has its group's mean subtracted (REINFORCE++-baseline).

    Args:
      rewards: `[B]` scalar reward per completion.
      mask: `[B, T]` response mask.
      gamma: discount per token.
      group_size: if given, subtract the group mean reward first (must divide B).
      token_rewards: optional `[B, T]` extra per-token rewards added before the
        returns, e.g. ``-beta * kl_penalty(old_logp, ref_logp, kind="k1")`` for
        REINFORCE++'s KL-in-reward.
      eps: added to the variance when whitening.

    Returns:
      `[B, T]` float32 advantages, 0 at masked positions.

    Example:
      >>> reinforce_pp_advantages(jnp.array([1., 0]), jnp.ones((2, 2)))
      Array([[ 0.8660254,  0.8660254],
             [-0.8660254, -0.8660254]], dtype=float32)

    References:
      Hu, REINFORCE++: A Simple and Efficient Approach for Aligning LLMs (2025).
    """
    fn = "reinforce_pp_advantages"
    _checks.check_real(fn, mask=mask, token_rewards=token_rewards)
    rows, _ = _checks.check_token_arrays(fn, mask=mask, token_rewards=token_rewards)
    _check_rewards(fn, rewards, rows)
    rewards, mask = jnp.asarray(rewards).astype(jnp.float32), jnp.asarray(mask)
    token_rewards = None if token_rewards is None else jnp.asarray(token_rewards)
    if group_size is not None:
        grouped = _grouped(rewards, group_size, fn=fn)
        rewards = (grouped - jnp.mean(grouped, axis=1, keepdims=True)).reshape(-1)
    per_token = outcome_token_rewards(rewards, mask)
    if token_rewards is not None:
        per_token = per_token + jnp.where(mask.astype(bool), token_rewards, 0.0)
    return masked_whiten(_discounted_returns(per_token, mask, gamma), mask, eps=eps)


def gdpo_advantages(rewards, group_size, *, weights=None, eps=1e-6):
    r"""GDPO: normalise each reward within its group, sum, then normalise the batch.

    .. math::
        s_i = \sum_k w_k \frac{r_{ik} - \operatorname{mean}_{group}(r_k)}
                              {\operatorname{std}_{group}(r_k) + \epsilon},
        \qquad A_i = \frac{s_i - \operatorname{mean}_{batch}(s)}
                          {\operatorname{std}_{batch}(s) + \epsilon}

    Normalising each reward separately keeps a reward with a wide range from drowning
    the others, which a sum normalised once (GRPO on the summed reward) does not.

    Args:
      rewards: `[B, K]` K rewards per completion.
      group_size: G; must divide B.
      weights: `[K]` weights of the rewards (default all 1).
      eps: added to each std.

    Returns:
      `[B]` float32 advantages; 0 for a row with a NaN or infinite reward (left out of
      every statistic).

    Example:
      >>> rewards = jnp.array([[1., 0], [0, 0], [1, 1], [1, 0]])
      >>> [round(float(a), 4) for a in gdpo_advantages(rewards, 2)]
      [1.0, -1.0, 1.0, -1.0]

    References:
      GDPO: Group reward-Decoupled Normalization Policy Optimization (2026).
    """
    fn = "gdpo_advantages"
    _checks.check_real(fn, rewards=rewards, weights=weights)
    _checks.check_rows(fn, "rewards", rewards, ndim=(2,),
                       hint="one column per reward; [B, 1] for a single reward")
    if weights is not None and _checks.shape_of(weights) != (rewards.shape[1],):
        raise _checks.shape_error(fn, "weights", "[K]", _checks.shape_of(weights),
                                  sizes=f"K = {rewards.shape[1]} reward columns")
    rewards = jnp.asarray(rewards).astype(jnp.float32)
    _checks.check_group_size(group_size, rewards.shape[0], fn=fn)
    finite = jnp.all(jnp.isfinite(rewards), axis=1)   # a row with any bad column is out
    rewards = jnp.where(finite[:, None], rewards, jnp.nan)
    per_reward = jax.vmap(lambda r: group_advantages(r, group_size, eps=eps),
                          in_axes=1, out_axes=1)(rewards)
    weights = jnp.ones(rewards.shape[1]) if weights is None else jnp.asarray(weights)
    summed = per_reward @ weights.astype(jnp.float32)
    mean, std = _finite_stats(summed, finite, ddof=0)
    return jnp.where(finite, (summed - mean) / (std + eps), 0.0)


def gae(token_rewards, values, mask, *, gamma, lam):
    r"""Generalised advantage estimation over the valid tokens of each row.

    .. math::
        \delta_t = r_t + \gamma V_{t+1} - V_t, \qquad
        A_t = \delta_t + \gamma \lambda A_{t+1}

    where t+1 is the next valid token and V after the last valid token is 0.

    Args:
      token_rewards: `[B, T]` per-token rewards (usually the scalar reward on the
        last valid token).
      values: `[B, T]` value estimates V(s_t).
      mask: `[B, T]` response mask.
      gamma: discount.
      lam: GAE lambda, a scalar or `[B]` per sequence (VAPO's length-adaptive
        lambda, see `length_adaptive_lambda`).

    Returns:
      `(advantages, returns)`, both `[B, T]` float32, unwhitened, 0 at masked
      positions; returns = advantages + values.

    Example:
      >>> adv, ret = gae(jnp.array([[0., 1]]), jnp.array([[0.5, 0.5]]),
      ...                jnp.ones((1, 2)), gamma=1.0, lam=1.0)
      >>> adv
      Array([[0.5, 0.5]], dtype=float32)

    References:
      Schulman et al., High-Dimensional Continuous Control Using GAE (2016);
      Yue et al., VAPO (2025), sec. 3.
    """
    _checks.check_real("gae", token_rewards=token_rewards, mask=mask, lam=lam)
    _checks.check_floating("gae", values=values)
    rows, _ = _checks.check_token_arrays("gae", token_rewards=token_rewards, values=values,
                                         mask=mask)
    _checks.check_scalar_or_rows("gae", "lam", lam, rows)
    token_rewards, values, mask = map(jnp.asarray, (token_rewards, values, mask))
    lam = jnp.broadcast_to(jnp.asarray(lam, jnp.float32), (token_rewards.shape[0],))
    valid = mask.astype(bool)

    def step(carry, inputs):
        next_value, next_adv = carry
        reward_t, value_t, valid_t = inputs
        delta = reward_t + gamma * next_value - value_t
        adv = delta + gamma * lam * next_adv
        carry = (jnp.where(valid_t, value_t, next_value), jnp.where(valid_t, adv, next_adv))
        return carry, jnp.where(valid_t, adv, 0.0)

    zeros = jnp.zeros(token_rewards.shape[0], jnp.float32)
    values = values.astype(jnp.float32)
    _, advantages = jax.lax.scan(
        step, (zeros, zeros),
        (token_rewards.astype(jnp.float32).T, values.T, valid.T), reverse=True)
    advantages = advantages.T
    return advantages, jnp.where(valid, advantages + values, 0.0)


def length_adaptive_lambda(lengths, *, alpha=0.05):
    r"""VAPO's length-adaptive GAE lambda for the policy: 1 - 1 / (alpha * length).

    Long answers get lambda near 1 (low bias over many tokens); answers of at most
    1/alpha tokens would get lambda <= 0 and are clamped to 0 (one-step TD).

    Args:
      lengths: `[B]` response lengths in tokens.
      alpha: VAPO's alpha (0.05 in the paper).

    Returns:
      `[B]` float32 lambdas in [0, 1).

    Example:
      >>> length_adaptive_lambda(jnp.array([100, 1000]))
      Array([0.8 , 0.98], dtype=float32)

    References:
      Yue et al., VAPO (2025), eq. 7.
    """
    _checks.check_greater("alpha", alpha, 0)
    _checks.check_real("length_adaptive_lambda", lengths=lengths)
    _checks.check_rows("length_adaptive_lambda", "lengths", lengths)
    lengths = jnp.asarray(lengths, jnp.float32)
    return jnp.maximum(1.0 - 1.0 / (alpha * jnp.maximum(lengths, 1.0)), 0.0)
