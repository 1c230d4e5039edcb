"""Per-token policy losses: the plain importance-weighted policy gradient (RLOO),
PPO clip (GRPO, DAPO), GSPO, CISPO and SAPO.

Every loss takes `[B, T]` float log-probs, `[B]`, `[B, 1]` or `[B, T]` advantages and a
`[B, T]` mask (bool, int or float), checked at entry (trace time), and returns
`(loss_bt, diagnostics)`: the per-token loss (0 at masked positions, with exactly zero
gradient there) and a dict of `[B, T]` stop-gradient diagnostics, 0 at masked positions.
Every loss reports

- ``ratio``: its importance ratio per token (GSPO: the sequence ratio s_i);
- ``kl_old``: r - 1 - log r with r = pi_theta / pi_old the token's ratio, the k3
  estimate of KL(pi_old || pi_theta) from tokens sampled by pi_old (its mean over the
  tokens estimates how far the update has moved the policy from the one that sampled);

and each its own activity: ``clip_low``/``clip_high`` (1.0 where the lower / upper clip
range binds; which tokens that is, each docstring says), ``clip_dual`` (PPO with a dual
clip) or ``gate_scale`` (SAPO). Reduction is `aggregate`'s job.
"""

import jax
import jax.numpy as jnp

from grpo_jax.objectives import _checks
from grpo_jax.objectives._kl import LOG_RATIO_CLAMP, kl_penalty

sg = jax.lax.stop_gradient


def _upcast(x):
    """bf16/f16 -> float32 (the ratios need it); float64 stays float64 (a Python list
    becomes an array)."""
    x = jnp.asarray(x)
    return x.astype(jnp.promote_types(x.dtype, jnp.float32))


def _per_token(adv, shape):
    """`[B]` or `[B, T]` advantages -> `[B, T]`, at least float32, stop-gradient."""
    adv = sg(_upcast(adv))
    return jnp.broadcast_to(adv[:, None] if adv.ndim == 1 else adv, shape)


def _masked_inputs(logp, old_logp, mask):
    """Zeroes masked log-probs so padding (even -inf or NaN) cannot reach a gradient;
    `old_logp` is stop-gradient (the package's gradient contract)."""
    valid = jnp.asarray(mask).astype(bool)
    logp = jnp.where(valid, _upcast(logp), 0.0)
    old_logp = sg(jnp.where(valid, _upcast(old_logp), 0.0))
    return logp, old_logp, valid


def _check_inputs(fn, logp, old_logp, adv, mask):
    """`[B, T]` float log-probs and mask, `[B]`, `[B, 1]` or `[B, T]` advantages."""
    _checks.check_floating(fn, logp=logp, old_logp=old_logp)
    _checks.check_real(fn, adv=adv, mask=mask)
    batch = _checks.check_token_arrays(fn, logp=logp, old_logp=old_logp, mask=mask)
    _checks.check_binary_mask(fn, "mask", mask)
    _checks.check_row_values(fn, "adv (advantages)", adv, batch, per_token=True)


def _check_clip(eps_low, eps_high):
    _checks.check_nonnegative("eps_low", eps_low)
    _checks.check_nonnegative("eps_high", eps_high)


def _token_ratio(logp, old_logp):
    return jnp.exp(jnp.clip(logp - old_logp, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))


def _diagnostics(ratio, logp, old_logp, valid, **activity):
    # k3 with the roles swapped: samples come from pi_old, so it estimates KL(pi_old || pi).
    out = {"ratio": ratio, "kl_old": kl_penalty(old_logp, logp, kind="k3"), **activity}
    return {k: sg(jnp.where(valid, v.astype(ratio.dtype), 0.0)) for k, v in out.items()}


def _clipped_surrogate(ratio, adv, valid, *, eps_low, eps_high, dual_clip):
    """-min(r A, clip(r, 1-eps_low, 1+eps_high) A), optionally dual-clipped.

    Returns the loss and the tokens whose gradient each bound zeroes: ``clip_low``
    (A < 0, r < 1 - eps_low), ``clip_high`` (A > 0, r > 1 + eps_high) and, with a
    dual clip, ``clip_dual`` (A < 0, r > c).
    """
    clipped_ratio = jnp.clip(ratio, 1.0 - eps_low, 1.0 + eps_high)
    loss = -jnp.minimum(ratio * adv, clipped_ratio * adv)
    activity = {"clip_low": (adv < 0) & (ratio < 1.0 - eps_low),
                "clip_high": (adv > 0) & (ratio > 1.0 + eps_high)}
    if dual_clip is not None:
        # For A < 0 an unbounded ratio makes -r A unbounded; Dual-clip PPO caps it at -c A.
        activity["clip_dual"] = (adv < 0) & (ratio > dual_clip)
        loss = jnp.where(adv < 0, jnp.minimum(loss, -dual_clip * adv), loss)
    return jnp.where(valid, loss, 0.0), activity


def pg_loss(logp, old_logp, adv, mask):
    r"""The plain importance-weighted policy gradient: no clip, no gate.

    .. math::
        r_t = \exp(\log\pi_\theta(y_t) - \log\pi_{old}(y_t)), \qquad L_t = -r_t A,
        \qquad \nabla L_t = -r_t A \nabla\log\pi_\theta(y_t)

    On-policy (r = 1) this is REINFORCE's -A grad log pi, the update of RLOO (on-policy
    REINFORCE with the leave-one-out baseline and no clipping); off-policy the ratio
    corrects for the sampling policy, unbounded. The log-ratio is clamped to [-20, 20]
    like every ratio here (no gradient flows through an active clamp).

    Args:
      logp: `[B, T]` log-probs of the sampled tokens under the current policy.
      old_logp: `[B, T]` the same under the policy that sampled them.
      adv: `[B]`, `[B, 1]` or `[B, T]` advantages.
      mask: `[B, T]` response mask.

    Returns:
      `(loss [B, T], diagnostics)` with ``ratio`` and ``kl_old``.

    Example:
      >>> logp = jnp.log(jnp.array([[0.75, 0.5]])); old = jnp.log(jnp.array([[0.5, 0.5]]))
      >>> pg_loss(logp, old, jnp.array([2.0]), jnp.ones((1, 2)))[0]
      Array([[-3., -2.]], dtype=float32)

    References:
      Williams, Simple Statistical Gradient-Following Algorithms (REINFORCE, 1992);
      Ahmadian et al., Back to Basics: Revisiting REINFORCE-Style Optimization for
      Learning from Human Feedback in LLMs (arXiv:2402.14740).
    """
    _check_inputs("pg_loss", logp, old_logp, adv, mask)
    logp, old_logp, valid = _masked_inputs(logp, old_logp, mask)
    ratio = _token_ratio(logp, old_logp)
    loss = jnp.where(valid, -ratio * _per_token(adv, logp.shape), 0.0)
    return loss, _diagnostics(ratio, logp, old_logp, valid)


def ppo_clip_loss(logp, old_logp, adv, mask, *, eps_low=0.2, eps_high=0.2, dual_clip=None):
    r"""PPO's clipped surrogate per token (GRPO; DAPO with eps_high > eps_low).

    .. math::
        r_t = \exp(\log\pi_\theta(y_t) - \log\pi_{old}(y_t)), \qquad
        L_t = -\min\big(r_t A,\ \operatorname{clip}(r_t, 1-\epsilon_{low}, 1+\epsilon_{high}) A\big)

    With ``dual_clip=c`` (c > 1), tokens with A < 0 have L_t = min(L_t, -c A).
    A clipped token gets exactly zero gradient. Diagnostics, each 1.0 on the tokens
    whose gradient that bound zeroes: ``clip_low`` (A < 0 and r < 1 - eps_low),
    ``clip_high`` (A > 0 and r > 1 + eps_high; only the eps_high clip), and with a dual
    clip ``clip_dual`` (A < 0 and r > c); plus ``ratio`` r and ``kl_old``.

    Args:
      logp: `[B, T]` log-probs of the sampled tokens under the current policy.
      old_logp: `[B, T]` the same under the behaviour (rollout) policy.
      adv: `[B]`, `[B, 1]` or `[B, T]` advantages.
      mask: `[B, T]` response mask.
      eps_low: lower clip range, >= 0.
      eps_high: upper clip range, >= 0 (DAPO's clip-higher: 0.28).
      dual_clip: None, or c > 1.

    Returns:
      `(loss [B, T], diagnostics)`: ``ratio``, ``kl_old``, ``clip_low``, ``clip_high``
      and, when `dual_clip` is set, ``clip_dual``.

    Example:
      >>> logp = jnp.log(jnp.array([[0.75, 0.5]])); old = jnp.log(jnp.array([[0.5, 0.5]]))
      >>> ppo_clip_loss(logp, old, jnp.array([1.0]), jnp.ones((1, 2)))[0]
      Array([[-1.2, -1. ]], dtype=float32)

    References:
      Schulman et al., PPO (2017), eq. 7; Yu et al., DAPO (2025), eq. 8-10;
      Ye et al., Mastering Complex Control in MOBA Games (dual clip, 2020).
    """
    _check_clip(eps_low, eps_high)
    if dual_clip is not None:
        _checks.check_greater("dual_clip", dual_clip, 1.0)
    _check_inputs("ppo_clip_loss", logp, old_logp, adv, mask)
    logp, old_logp, valid = _masked_inputs(logp, old_logp, mask)
    ratio = _token_ratio(logp, old_logp)
    loss, activity = _clipped_surrogate(ratio, _per_token(adv, logp.shape), valid,
                                        eps_low=eps_low, eps_high=eps_high, dual_clip=dual_clip)
    return loss, _diagnostics(ratio, logp, old_logp, valid, **activity)


def gspo_loss(logp, old_logp, adv, mask, *, eps_low=3e-4, eps_high=4e-4):
    r"""GSPO: one clipped ratio per sequence, the geometric mean of its token ratios.

    .. math::
        s_i = \exp\Big(\frac{1}{|y_i|}\sum_t
                        \log\frac{\pi_\theta(y_{i,t})}{\pi_{old}(y_{i,t})}\Big),
        \qquad \log s_{i,t} = \operatorname{sg}(\log s_i) + \log\pi_\theta(y_{i,t})
                                - \operatorname{sg}(\log\pi_\theta(y_{i,t}))

    and L_{i,t} = -min(s_{i,t} A, clip(s_{i,t}, 1-eps_low, 1+eps_high) A). Every token of
    a sequence has the value s_i; aggregated with ``seq-mean-token-mean`` the value and
    gradient are exactly GSPO's sequence objective -min(s_i A_i, clip(s_i) A_i).

    Args:
      logp, old_logp: `[B, T]` current and behaviour log-probs.
      adv: `[B]` or `[B, 1]` (or `[B, T]`) advantages.
      mask: `[B, T]` response mask.
      eps_low, eps_high: the sequence-ratio clip range (the paper: 3e-4, 4e-4).

    Returns:
      `(loss [B, T], diagnostics)`: ``ratio`` holds s_i on every valid token of row i;
      ``clip_low``/``clip_high`` are 1.0 on every token of a sequence whose ratio the
      lower (A < 0, s_i < 1 - eps_low) / upper (A > 0, s_i > 1 + eps_high) bound clips;
      ``kl_old`` is per token, from the token ratios.

    Example:
      >>> logp = jnp.log(jnp.array([[0.5, 0.5]])); old = jnp.log(jnp.array([[0.5, 0.5]]))
      >>> gspo_loss(logp, old, jnp.array([1.0]), jnp.ones((1, 2)))[0]
      Array([[-1., -1.]], dtype=float32)

    References:
      Zheng et al., Group Sequence Policy Optimization (2025), eq. 5-7 and 10-11.
    """
    _check_clip(eps_low, eps_high)
    _check_inputs("gspo_loss", logp, old_logp, adv, mask)
    logp, old_logp, valid = _masked_inputs(logp, old_logp, mask)
    lengths = jnp.maximum(jnp.sum(valid, axis=-1, keepdims=True), 1)
    log_seq_ratio = jnp.clip(jnp.sum(logp - old_logp, axis=-1, keepdims=True) / lengths,
                             -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    ratio = jnp.exp(sg(log_seq_ratio) + logp - sg(logp))
    loss, activity = _clipped_surrogate(ratio, _per_token(adv, logp.shape), valid,
                                        eps_low=eps_low, eps_high=eps_high, dual_clip=None)
    return loss, _diagnostics(ratio, logp, old_logp, valid, **activity)


def cispo_loss(logp, old_logp, adv, mask, *, eps_low, eps_high):
    r"""CISPO: clip the importance weight, never the gradient.

    .. math::
        L_t = -\operatorname{sg}\big(\operatorname{clip}(r_t, 1-\epsilon_{low},
              1+\epsilon_{high})\big)\, A \log\pi_\theta(y_t)

    Every valid token keeps the gradient -clip(r_t) A grad log pi, including tokens PPO
    would zero. eps_low = 1 (or larger) removes the lower bound, as MiniMax-M1 does.

    Args:
      logp, old_logp: `[B, T]` current and behaviour log-probs.
      adv: `[B]`, `[B, 1]` or `[B, T]` advantages.
      mask: `[B, T]` response mask.
      eps_low, eps_high: the weight's clip range, >= 0.

    Returns:
      `(loss [B, T], diagnostics)`: ``ratio``, ``kl_old``, and ``clip_low``/``clip_high``,
      1.0 where the weight is clipped (r < 1 - eps_low / r > 1 + eps_high, whatever the
      sign of A: the token keeps a gradient, scaled by the clipped weight).

    Example:
      >>> logp = jnp.log(jnp.array([[0.75]])); old = jnp.log(jnp.array([[0.5]]))
      >>> loss, _ = cispo_loss(logp, old, jnp.array([1.0]), jnp.ones((1, 1)), eps_low=1.0,
      ...                      eps_high=0.2)
      >>> loss.round(4)
      Array([[0.3452]], dtype=float32)

    References:
      MiniMax, MiniMax-M1 (2025), sec. 3.1, eq. 4-5.
    """
    _check_clip(eps_low, eps_high)
    _check_inputs("cispo_loss", logp, old_logp, adv, mask)
    logp, old_logp, valid = _masked_inputs(logp, old_logp, mask)
    ratio = _token_ratio(logp, old_logp)
    weight = sg(jnp.clip(ratio, 1.0 - eps_low, 1.0 + eps_high))
    loss = jnp.where(valid, -weight * _per_token(adv, logp.shape) * logp, 0.0)
    return loss, _diagnostics(ratio, logp, old_logp, valid,
                              clip_low=ratio < 1.0 - eps_low, clip_high=ratio > 1.0 + eps_high)


def sapo_loss(logp, old_logp, adv, mask, *, tau_pos=1.0, tau_neg=1.05):
    r"""SAPO: a smooth sigmoid gate in place of the hard clip.

    .. math::
        f(r) = \sigma(\tau (r - 1)) \cdot 4 / \tau, \qquad L_t = -f(r_t) A,
        \qquad \tau = \tau_{pos} \text{ if } A > 0 \text{ else } \tau_{neg}

    f'(1) = 1, so on-policy (r = 1) the gradient is the plain policy gradient; away from
    r = 1 the gate decays smoothly instead of cutting off. ``gate_scale`` reports
    f'(r) r, the factor on each token's policy gradient -A grad log pi: 1 on-policy,
    decaying towards 0 as r moves far from 1 on either side.

    Args:
      logp, old_logp: `[B, T]` current and behaviour log-probs.
      adv: `[B]`, `[B, 1]` or `[B, T]` advantages.
      mask: `[B, T]` response mask.
      tau_pos, tau_neg: gate temperatures (> 0) for positive and other advantages.

    Returns:
      `(loss [B, T], diagnostics)`: ``ratio``, ``kl_old`` and ``gate_scale``.

    Example:
      >>> sapo_loss(jnp.zeros((1, 1)), jnp.zeros((1, 1)), jnp.array([1.0]), jnp.ones((1, 1)))[0]
      Array([[-2.]], dtype=float32)

    References:
      Gao et al., Soft Adaptive Policy Optimization (Qwen, 2025), eq. 6-8.
    """
    _checks.check_greater("tau_pos", tau_pos, 0.0)
    _checks.check_greater("tau_neg", tau_neg, 0.0)
    _check_inputs("sapo_loss", logp, old_logp, adv, mask)
    logp, old_logp, valid = _masked_inputs(logp, old_logp, mask)
    ratio = _token_ratio(logp, old_logp)
    adv = _per_token(adv, logp.shape)
    tau = jnp.where(adv > 0, tau_pos, tau_neg)
    gate = jax.nn.sigmoid(tau * (ratio - 1.0))
    loss = jnp.where(valid, -gate * (4.0 / tau) * adv, 0.0)
    return loss, _diagnostics(ratio, logp, old_logp, valid,
                              gate_scale=4.0 * gate * (1.0 - gate) * ratio)
