"""Trust regions other than PPO's token ratio clip: GMPO, DPPO and M2PO.

- `gmpo_loss`: GMPO clips each token's log-ratio (per the sign of the answer's
  advantage) and optimises the geometric mean of the clipped token ratios.
- `dppo_loss`: DPPO masks a token's gradient when the policy has moved too far from the
  behaviour policy in a divergence (total variation or KL of the "sampled token vs the
  rest" binary distribution), not in the probability ratio.
- `m2po_mask`: M2PO's batch mask, dropping the tokens with the largest squared
  log-ratio until the second moment of the rest is under a budget.

The losses follow `_policy_losses`' conventions: `[B, T]` log-probs, `[B]` or `[B, T]`
advantages, a `[B, T]` mask; `(loss [B, T], diagnostics)` out, 0 at masked positions
with exactly zero gradient there; ``ratio`` and ``kl_old`` in every diagnostics dict.
Only `logp` is differentiated (old log-probs and advantages are stop-gradient inside).
"""

import jax
import jax.numpy as jnp

from grpo_jax.objectives import _checks
from grpo_jax.objectives._kl import LOG_RATIO_CLAMP
from grpo_jax.objectives._policy_losses import (_check_inputs, _diagnostics, _masked_inputs,
                                                _per_token, _token_ratio, _upcast)

sg = jax.lax.stop_gradient

DPPO_DIVERGENCES = ("binary_tv", "binary_kl")
# The thresholds the paper recommends (App. F, as quoted by the authors' verl port and
# its example script): 0.15 for total variation, 0.05 for KL.
DPPO_DEFAULT_DELTA = {"binary_tv": 0.15, "binary_kl": 0.05}


def _row_advantage(adv, valid):
    """`[B]`, `[B, 1]` or `[B, T]` advantages -> one advantage per row, `[B, 1]`.

    A `[B, T]` advantage becomes its mean over the row's valid tokens (equal to the
    sequence advantage when every token of a row carries it, as GRPO's do).
    """
    adv = _per_token(adv, valid.shape)
    count = jnp.maximum(jnp.sum(valid, axis=-1, keepdims=True), 1)
    return jnp.sum(jnp.where(valid, adv, 0.0), axis=-1, keepdims=True) / count


def gmpo_loss(logp, old_logp, adv, mask, *, eps_low=0.4, eps_high=0.4):
    r"""GMPO: the geometric mean of token ratios, each clipped in log space.

    .. math::
        c_{i,t} = \begin{cases} \min(d_{i,t}, \epsilon_{high}) & A_i > 0 \\
                                \max(d_{i,t}, -\epsilon_{low}) & A_i < 0 \end{cases},
        \qquad d_{i,t} = \log\frac{\pi_\theta(y_{i,t})}{\pi_{old}(y_{i,t})},

        J_i = A_i \exp\Big(\frac{1}{|y_i|}\sum_t c_{i,t}\Big)
            = \operatorname{sgn}(A_i)\Big(\prod_t \big|\min(\rho_{i,t} A_i,
              \operatorname{clip}(\rho_{i,t}, e^{-\epsilon_{low}}, e^{\epsilon_{high}}) A_i)\big|
              \Big)^{1/|y_i|}

    The clip range is in log space: the token ratio is clipped to
    (e^-eps_low, e^eps_high), (e^-0.4, e^0.4) in the paper. Like PPO's, the clip is
    one-sided by the sign of A_i (``min`` of the clipped and unclipped terms): for A_i > 0
    only the upper bound binds, for A_i < 0 only the lower one, and a clipped token's
    log-ratio gets no gradient. Per token, L_{i,t} = -A_i exp(sg(log s_i) + c_{i,t} -
    sg(c_{i,t})) with s_i the clipped geometric mean: every token holds -A_i s_i and,
    aggregated with ``seq-mean-token-mean``, value and gradient are exactly GMPO's
    1/G sum_i -J_i (the paper's per-answer mean; verl's ``geo_mean`` loss computes that
    mean whatever its loss_agg_mode). With `[B, T]` advantages, A_i is the row's mean over
    its valid tokens, for the multiplier and for the sign that picks the bound (verl takes
    each token's own sign for the bound; the two agree when a row's advantages are equal).

    Args:
      logp: `[B, T]` log-probs of the sampled tokens under the current policy.
      old_logp: `[B, T]` the same under pi_old.
      adv: `[B]` (or `[B, T]`) advantages.
      mask: `[B, T]` response mask.
      eps_low, eps_high: the log-space clip range, >= 0 (paper and verl's GMPO recipe:
        0.4 and 0.4).

    Returns:
      `(loss [B, T], diagnostics)`: ``ratio`` holds the geometric mean of row i's token
      ratios before the clip, exp(mean_t d_{i,t}), on each of its valid tokens;
      ``clip_low``/``clip_high`` are 1.0 on the tokens whose log-ratio the lower
      (A_i < 0, d < -eps_low) / upper (A_i > 0, d > eps_high) bound clips; ``kl_old``
      per token.

    Example:
      >>> logp = jnp.log(jnp.array([[0.6, 0.5]])); old = jnp.log(jnp.array([[0.5, 0.5]]))
      >>> gmpo_loss(logp, old, jnp.array([1.0]), jnp.ones((1, 2)))[0]   # -sqrt(1.2 * 1)
      Array([[-1.0954452, -1.0954452]], dtype=float32)

    References:
      Zhao et al., Geometric-Mean Policy Optimization (arXiv:2507.20673): the GMPO
      objective, token-level clipping and its range (e^-0.4, e^0.4); the authors' code
      (callsys/GMPO, train_zero_math_gmpo.py) and its verl port, the ``geo_mean`` policy
      loss (verl/trainer/ppo/core_algos.py) with examples/gmpo_trainer.
    """
    _check_inputs("gmpo_loss", logp, old_logp, adv, mask)
    _checks.check_nonnegative("eps_low", eps_low)
    _checks.check_nonnegative("eps_high", eps_high)
    logp, old_logp, valid = _masked_inputs(logp, old_logp, mask)
    shape = logp.shape
    adv_row = sg(_row_advantage(adv, valid))
    d = jnp.clip(logp - old_logp, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    positive, negative = adv_row > 0, adv_row < 0
    clipped = jnp.where(positive, jnp.minimum(d, eps_high),
                        jnp.where(negative, jnp.maximum(d, -eps_low), d))
    clipped = jnp.where(valid, clipped, 0.0)
    lengths = jnp.maximum(jnp.sum(valid, axis=-1, keepdims=True), 1)
    log_s = jnp.clip(jnp.sum(clipped, axis=-1, keepdims=True) / lengths,
                     -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    per_token = jnp.exp(sg(log_s) + clipped - sg(clipped))
    loss = jnp.where(valid, -adv_row * per_token, 0.0)
    geo_ratio = jnp.exp(jnp.clip(jnp.sum(sg(d) * valid, axis=-1, keepdims=True) / lengths,
                                 -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
    return loss, _diagnostics(jnp.broadcast_to(geo_ratio, shape), logp, old_logp, valid,
                              clip_low=negative & (d < -eps_low),
                              clip_high=positive & (d > eps_high))


def _log1m_exp(log_x):
    """log(1 - exp(log_x)) for log_x <= 0: -inf at log_x = 0 (probability 1)."""
    return jnp.log(-jnp.expm1(jnp.minimum(log_x, 0.0)))


def binary_divergence(logp, old_logp, *, divergence):
    r"""DPPO's Binary approximation of the divergence between pi_old and pi_theta.

    Each token's distribution is collapsed to two outcomes, the sampled token (mu =
    pi_old(y_t), p = pi_theta(y_t)) and the rest of the vocabulary:

    .. math::
        D_{TV} = |p - \mu|, \qquad
        D_{KL} = \mu \log\frac{\mu}{p} + (1 - \mu) \log\frac{1 - \mu}{1 - p}
        \quad (= \mathrm{KL}(\mathrm{Bern}(\mu) \,\|\, \mathrm{Bern}(p)))

    (the binary TV is half the L1 distance between the two binary distributions, |p - mu|.)
    Computed from the log-probs, log(1 - x) as log(-expm1(log x)); mu = 1 gives the KL's
    limit mu log(mu / p). Read without gradient.

    Args:
      logp: `[B, T]` log-probs of the sampled tokens under the current policy.
      old_logp: `[B, T]` the same under the behaviour policy mu.
      divergence: ``"binary_tv"`` or ``"binary_kl"``.

    Returns:
      `[B, T]` stop-gradient divergence (not masked; the caller masks).

    Example:
      >>> binary_divergence(jnp.log(jnp.array([[0.5, 0.2]])), jnp.log(jnp.array([[0.25, 0.2]])),
      ...                   divergence="binary_tv")
      Array([[0.25, 0.  ]], dtype=float32)

    References:
      Qi et al., Rethinking the Trust Region in LLM Reinforcement Learning
      (arXiv:2602.04879), the Binary approximation of DPPO's divergence.
    """
    _checks.check_choice("divergence", divergence, DPPO_DIVERGENCES)
    logp, old_logp = sg(_upcast(logp)), sg(_upcast(old_logp))
    p, mu = jnp.exp(logp), jnp.exp(old_logp)
    if divergence == "binary_tv":
        return jnp.abs(p - mu)
    rest = (1.0 - mu) * (_log1m_exp(old_logp) - _log1m_exp(logp))
    return mu * (old_logp - logp) + jnp.where(mu < 1.0, rest, 0.0)


def dppo_loss(logp, old_logp, adv, mask, *, divergence="binary_tv", delta_low=None,
              delta_high=None, ratio_cap=20.0):
    r"""DPPO: a trust region on a divergence between the policies, not on the ratio.

    .. math::
        M_t = \begin{cases} 0 & A_t > 0,\ p_t > \mu_t,\ D_t > \delta_{high} \\
                            0 & A_t \le 0,\ p_t < \mu_t,\ D_t > \delta_{low} \\
                            1 & \text{otherwise} \end{cases}, \qquad
        L_t = -\operatorname{sg}\big(\min(r_t, C)\big)\, M_t\, A_t \log\pi_\theta(y_t)

    with p_t = pi_theta(y_t), mu_t = pi_old(y_t) of the sampled token, r_t = p_t / mu_t
    and D_t the Binary approximation of the divergence (`binary_divergence`: |p - mu| or
    the binary KL). A token leaves the update only when it has moved out of the trust
    region in the direction its advantage pushes it: the update that would grow the
    divergence further. The gradient, -M_t min(r_t, C) A_t grad log pi, is that of the
    masked surrogate -M_t r_t A_t wherever r_t <= C; the value is that gradient's
    REINFORCE form (like CISPO's), not the surrogate's. The weight min(r_t, C) is DPPO's
    truncated importance weight in place of PPO's dual clip (the paper, sec. 5.4,
    recommends a large C: verl's DPPO falls back to 20, TRL's defaults to 20, the authors'
    example script passes 1e4). The log-ratio is clamped to [-20, 20] first, as every
    ratio here. The Top-K approximation (the divergence over pi_old's K most likely
    tokens) needs vocabulary log-probs the `[B, T]` interface does not carry and is not
    implemented.

    pi_old is the behaviour policy, the one that sampled the tokens: the paper anchors
    the trust region to the rollout policy (pass the sampler's log-probs where they
    differ from the trainer's recomputation).

    Args:
      logp: `[B, T]` log-probs of the sampled tokens under the current policy.
      old_logp: `[B, T]` the same under the behaviour policy.
      adv: `[B]` or `[B, T]` advantages.
      mask: `[B, T]` response mask.
      divergence: ``"binary_tv"`` (DPPO-Binary-TV) or ``"binary_kl"`` (DPPO-Binary-KL).
      delta_low: threshold for tokens pushed down (A <= 0), >= 0; None: the paper's
        value, 0.15 for TV and 0.05 for KL.
      delta_high: threshold for tokens pushed up (A > 0), >= 0; None likewise.
      ratio_cap: C > 0, the importance weight's cap; None for no cap.

    Returns:
      `(loss [B, T], diagnostics)`: ``ratio`` r_t, ``kl_old``, ``divergence`` D_t,
      ``clip_high`` (1.0 where M_t = 0 and A > 0), ``clip_low`` (M_t = 0 and A < 0) and
      ``ratio_capped`` (r_t > C).

    Example:
      >>> logp = jnp.log(jnp.array([[0.9, 0.05]])); old = jnp.log(jnp.array([[0.6, 0.1]]))
      >>> loss, diag = dppo_loss(logp, old, jnp.array([1.0]), jnp.ones((1, 2)))
      >>> loss.round(4), diag["clip_high"]   # |0.9 - 0.6| > 0.15: masked; 0.05 < 0.1: kept
      (Array([[0.    , 1.4979]], dtype=float32), Array([[1., 0.]], dtype=float32))

    References:
      Qi et al., Rethinking the Trust Region in LLM Reinforcement Learning
      (arXiv:2602.04879): DPPO, its Binary-TV / Binary-KL approximations, the truncated
      importance weight (sec. 5.4) and thresholds (App. F); the authors' implementation
      (sail-sg/Stable-RL) and their verl port (``dppo_tv``, ``dppo_kl``).
    """
    _check_inputs("dppo_loss", logp, old_logp, adv, mask)
    _checks.check_choice("divergence", divergence, DPPO_DIVERGENCES)
    delta_low = DPPO_DEFAULT_DELTA[divergence] if delta_low is None else delta_low
    delta_high = DPPO_DEFAULT_DELTA[divergence] if delta_high is None else delta_high
    _checks.check_nonnegative("delta_low", delta_low)
    _checks.check_nonnegative("delta_high", delta_high)
    if ratio_cap is not None:
        _checks.check_greater("ratio_cap", ratio_cap, 0.0)
    logp, old_logp, valid = _masked_inputs(logp, old_logp, mask)
    shape = logp.shape
    adv = _per_token(adv, shape)
    ratio = _token_ratio(logp, old_logp)
    weight = sg(ratio if ratio_cap is None else jnp.minimum(ratio, ratio_cap))
    div = binary_divergence(logp, old_logp, divergence=divergence)
    p, mu = jnp.exp(sg(logp)), jnp.exp(old_logp)
    out_high = (p > mu) & (div > delta_high)
    out_low = (p < mu) & (div > delta_low)
    keep = jnp.where(adv > 0, ~out_high, ~out_low)
    loss = jnp.where(valid & keep, -weight * adv * logp, 0.0)
    capped = jnp.zeros(shape, bool) if ratio_cap is None else ratio > ratio_cap
    return loss, _diagnostics(ratio, logp, old_logp, valid, divergence=div,
                              clip_high=(adv > 0) & out_high, clip_low=(adv < 0) & out_low,
                              ratio_capped=capped)


def m2po_mask(logp, old_logp, mask, *, tau=0.04):
    r"""M2PO's second-moment mask: drop the largest log-ratios until M2 is within tau.

    .. math::
        \hat M_2(S) = \frac{1}{|S|} \sum_{t \in S} \Big(\log\frac{\pi_\theta(y_t)}
                      {\pi_{behav}(y_t)}\Big)^2, \qquad
        M_t = 1 \iff t \in S^*

    where S* keeps the valid tokens of the whole batch except the k with the largest
    squared log-ratio, k the smallest count with M2(S*) < tau. Multiply the per-token
    policy loss by M (the tokens outside S* get no gradient); M2PO optimises
    1/sum_i |y_i| sum_{i,t} M_{i,t} r_{i,t} A_{i,t} with no ratio clip, so keep the
    normalisation (divide by all valid tokens, as `offpolicy_sequence_mask`'s callers do).

    The log-ratio is the current policy's over the behaviour policy's (the one that
    sampled, possibly many updates stale): the paper's M2 and the authors' code (their
    ``old_log_prob``, computed when the rollout was generated, against the
    differentiated ``log_prob``). AReaL's port computes it between the behaviour policy
    and its proximal (recomputed) policy instead; pass that pair to get its mask.

    One pass: sort the squared log-ratios (descending), suffix sums give the M2 of every
    candidate S*, the first under tau fixes k. Strict ``<`` as in AReaL; when no suffix
    gets under tau, only the smallest token is kept (AReaL's rule; a batch of one token
    is kept). Ties at the cut are broken by position (the earlier token is dropped
    first; AReaL's unstable sort leaves that order unspecified). The mask is a function
    of the whole batch passed in, so a trainer that splits the minibatch masks per
    micro-batch, as AReaL does (docs/objectives.md, "Objectives that depend on the
    micro-batch", measures how much the loss moves).

    Args:
      logp: `[B, T]` log-probs under the current policy (read without gradient).
      old_logp: `[B, T]` log-probs under the behaviour policy.
      mask: `[B, T]` response mask.
      tau: the second-moment budget tau_M2 > 0 (the paper and the authors' scripts: 0.04).

    Returns:
      `[B, T]` float32 in {0, 1}, stop-gradient, 0 at masked positions.

    Example:
      >>> logp = jnp.log(jnp.array([[0.5, 0.05]])); old = jnp.log(jnp.array([[0.6, 0.5]]))
      >>> m2po_mask(logp, old, jnp.ones((1, 2)), tau=0.04)   # (log 0.1)^2 = 5.3 goes
      Array([[1., 0.]], dtype=float32)

    References:
      Zheng, Zhao & Chen, Prosperity before Collapse: How Far Can Off-Policy RL Reach
      with Stale Data on LLMs? (arXiv:2510.01161), M2PO: the second moment of the
      log importance weights and its masking rule; AReaL's ``_apply_m2po_masking``.
    """
    _checks.check_floating("m2po_mask", logp=logp, old_logp=old_logp)
    _checks.check_real("m2po_mask", mask=mask)
    _checks.check_token_arrays("m2po_mask", logp=logp, old_logp=old_logp, mask=mask)
    _checks.check_greater("tau", tau, 0.0)
    valid = jnp.asarray(mask).astype(bool)
    d = jnp.where(valid, _upcast(jnp.asarray(logp)) - _upcast(jnp.asarray(old_logp)), 0.0)
    flat_valid = valid.reshape(-1)
    sq = sg(d * d).reshape(-1)
    # Descending by squared log-ratio, padding last; a stable sort breaks ties by position.
    order = jnp.argsort(jnp.where(flat_valid, -sq, jnp.inf), stable=True)
    sorted_sq = jnp.where(flat_valid[order], sq[order], 0.0)
    n = jnp.sum(flat_valid)
    position = jnp.arange(sorted_sq.shape[0])
    suffix_sum = jnp.flip(jnp.cumsum(jnp.flip(sorted_sq)))
    suffix_m2 = suffix_sum / jnp.maximum(n - position, 1).astype(sorted_sq.dtype)
    below = (position < n) & (suffix_m2 < tau)
    num_dropped = jnp.where(jnp.any(below), jnp.argmax(below), jnp.maximum(n - 1, 0))
    keep_sorted = (position >= num_dropped) & (position < n)
    keep = jnp.zeros_like(flat_valid).at[order].set(keep_sorted)
    return sg(keep.reshape(valid.shape).astype(jnp.float32))
