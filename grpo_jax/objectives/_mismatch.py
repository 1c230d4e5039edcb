r"""Sampler/trainer mismatch: correction weights, logging metrics, decoupled PPO.

An inference engine (vLLM, SGLang, a JAX sampler with other kernels or another
precision) and the trainer disagree on the log-probs of the very tokens the engine
sampled, even with identical weights. Training on those tokens is off-policy by the ratio
pi_trainer / pi_sampler. Three tools:

- `rollout_correction`: the importance weight pi_trainer / pi_sampler per token, per
  sequence (the product) or per sequence as a geometric mean, either truncated above
  (TIS) or masked outside a band (MIS / IcePop). A stop-gradient constant that multiplies
  the per-token loss.
- `mismatch_metrics`: cheap scalars a trainer logs every step (|delta logp|, KL estimates
  in a stated direction, chi-square, perplexities, the share of tokens masked).
- `decoupled_ppo_loss`: AReaL's decoupled PPO, the clip taken around a proximal policy
  and the whole term weighted by pi_prox / pi_behav (the stale sampling policy).

Peer agreement: tests/objectives/test_mismatch.py reproduces outputs recorded from
verl's own code (rollout_corr_helper.py, and its earlier mismatch_helper.py with all
three levels and both modes) and AReaL's own ``ppo_actor_loss_fn`` (with the historic
``behav_imp_weight_cap`` and with its successor ``rejection_sampling``); the recorder is
experiments/peer_agreement/record_mismatch.py.
"""

import numbers

import jax
import jax.numpy as jnp

from grpo_jax.objectives import _checks
from grpo_jax.objectives._kl import LOG_RATIO_CLAMP
from grpo_jax.objectives._policy_losses import ppo_clip_loss

sg = jax.lax.stop_gradient

MISMATCH_LEVELS = ("token", "sequence", "geometric")
MISMATCH_MODES = ("truncate", "mask")
BEHAV_WEIGHT_MODES = ("mask", "truncate")
TIS_CAP = 2.0                # Yao et al.'s C (their experiments use C = 2)
ICEPOP_BOUNDS = (0.5, 5.0)   # IcePop's [alpha, beta] (Ring-1T, arXiv:2510.18855)


def _upcast(x):
    """bf16/f16 -> float32; float64 stays float64."""
    x = jnp.asarray(x)
    return x.astype(jnp.promote_types(x.dtype, jnp.float32))


def resolve_bounds(mode, low, high):
    """The (low, high) a mode uses; None takes the paper's value. Raises on bad bounds."""
    if mode == "truncate":
        if low is not None:
            raise ValueError(
                f"rollout_correction: low={low} applies to mode='mask' only; truncation (TIS) "
                "caps the weight above and never below: pass low=None")
        high = TIS_CAP if high is None else high
        _checks.check_greater("high", high, 0.0)
        return None, high
    low = ICEPOP_BOUNDS[0] if low is None else low
    high = ICEPOP_BOUNDS[1] if high is None else high
    _checks.check_nonnegative("low", low)
    _checks.check_greater("high", high, 0.0)
    if isinstance(low, numbers.Real) and isinstance(high, numbers.Real) and not low < high:
        raise ValueError(f"rollout_correction: low must be < high, got low={low}, high={high}")
    return low, high


def rollout_correction(trainer_logp, sampler_logp, mask, *, level="token", mode="truncate",
                       low=None, high=None):
    r"""The importance weight pi_trainer / pi_sampler that corrects for the sampler.

    .. math::
        \log w_{i,t} = \operatorname{clip}_{\pm 20}\big(\ell_{i,t}\big) \ \text{(token)},\quad
        \operatorname{clip}_{\pm 20}\Big(\sum_{t} \ell_{i,t}\Big) \ \text{(sequence)},\quad
        \operatorname{clip}_{\pm 20}\Big(\frac{1}{|y_i|}\sum_{t} \ell_{i,t}\Big)
        \ \text{(geometric)}

    with :math:`\ell_{i,t} = \log\pi_{trainer}(y_{i,t}) - \log\pi_{sampler}(y_{i,t})` over
    the row's valid tokens, then

    .. math::
        \text{truncate (TIS):}\ \tilde w = \min(w, C), \qquad
        \text{mask (MIS / IcePop):}\ \tilde w = M(w; \alpha, \beta) =
        \begin{cases} w & \alpha \le w \le \beta \\ 0 & \text{otherwise} \end{cases}

    The sums are clamped in log space before the exp (a sequence weight cannot overflow);
    the bounds are inclusive. Sequence and geometric weights are one value per row,
    broadcast to its valid tokens, so ``mask`` drops whole rows there. Multiply the
    per-token policy loss by the result (a stop-gradient constant); a masked token then
    has loss 0 and gradient 0 but still counts in the loss's normalisation, as in the
    IcePop objective and in verl.

    Defaults: ``high=None`` is C = 2 for ``truncate`` (Yao et al.) and beta = 5 for
    ``mask``; ``low=None`` is alpha = 0.5 (IcePop). ``low`` applies to ``mask`` only.
    Where verl differs: its mask mode defaults the lower bound to 1/upper (so [0.5, 2]
    with its default threshold 2) and its current rejection sampling (``token_k1``,
    ``seq_*_k1``) compares its bounds with pi_sampler / pi_trainer, the reciprocal of
    this weight; both agree with this function for the bounds mapped accordingly
    (the tests check it on verl's recorded outputs). Its ``seq_sum_k1`` also clamps each
    token's log-ratio to +-20 before summing; here, as in verl's importance weights, the
    sum is clamped.

    Args:
      trainer_logp: `[B, T]` log-probs of the sampled tokens recomputed by the trainer
        (the policy of record; PPO's pi_old). Read without gradient.
      sampler_logp: `[B, T]` the same tokens' log-probs reported by the sampler.
      mask: `[B, T]` response mask. Masked positions may hold anything (NaN, -inf).
      level: ``"token"``, ``"sequence"`` (product of the token ratios) or ``"geometric"``
        (exp of the mean token log-ratio over the row's valid tokens).
      mode: ``"truncate"`` (cap at `high`) or ``"mask"`` (0 outside [low, high]).
      low: the lower bound alpha >= 0 of ``mask`` (0: none); None is 0.5.
      high: C (``truncate``) or beta (``mask``), > 0 and > low; None is 2 or 5.

    Returns:
      `(weights, diagnostics)`: `[B, T]` float32 stop-gradient weights, 0 at masked
      positions; diagnostics (stop-gradient) hold `[B, T]` ``log_weight`` (the log weight
      of the level before any bound), ``masked`` and ``truncated`` (1.0 on the valid
      tokens the mask zeroes / the cap lowers; a micro-batching trainer sums these and
      divides by its global token count), and the scalars ``masked_fraction`` and
      ``truncated_fraction``, their shares of this call's valid tokens.

    Example:
      >>> trainer = jnp.log(jnp.array([[0.9, 0.5, 0.1]]))
      >>> sampler = jnp.log(jnp.array([[0.3, 0.5, 0.4]]))
      >>> rollout_correction(trainer, sampler, jnp.ones((1, 3)))[0]      # TIS, C = 2
      Array([[2.  , 1.  , 0.25]], dtype=float32)
      >>> w, diag = rollout_correction(trainer, sampler, jnp.ones((1, 3)), mode="mask")
      >>> w, diag["masked_fraction"]                                     # IcePop, [0.5, 5]
      (Array([[3., 1., 0.]], dtype=float32), Array(0.33333334, dtype=float32))

    References:
      Yao et al., Your Efficient RL Framework Secretly Brings You Off-Policy RL Training
      (2025), the truncated importance weight min(pi_fsdp / pi_vllm, C);
      Ling Team, Every Step Evolves: Scaling Reinforcement Learning for Trillion-Scale
      Thinking Model (Ring-1T, arXiv:2510.18855), IcePop's masking function
      M(k; alpha, beta), alpha = 0.5, beta = 5;
      Liu, Li et al., When Speed Kills Stability: Demystifying RL Collapse from the
      Training-Inference Mismatch (2025), sequence and geometric levels (verl).
    """
    fn = "rollout_correction"
    _checks.check_choice("level", level, MISMATCH_LEVELS)
    _checks.check_choice("mode", mode, MISMATCH_MODES)
    low, high = resolve_bounds(mode, low, high)
    _checks.check_floating(fn, trainer_logp=trainer_logp, sampler_logp=sampler_logp)
    _checks.check_real(fn, mask=mask)
    _checks.check_token_arrays(fn, trainer_logp=trainer_logp, sampler_logp=sampler_logp, mask=mask)
    valid = jnp.asarray(mask).astype(bool)
    log_ratio = sg(jnp.where(valid, _upcast(trainer_logp) - _upcast(sampler_logp), 0.0))
    if level == "token":
        log_w = log_ratio
    else:
        log_w = jnp.sum(log_ratio, axis=-1, keepdims=True)
        if level == "geometric":
            count = jnp.maximum(jnp.sum(valid, axis=-1, keepdims=True, dtype=log_w.dtype), 1.0)
            log_w = log_w / count
        log_w = jnp.broadcast_to(log_w, log_ratio.shape)
    log_w = jnp.clip(log_w, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    w = jnp.exp(log_w)
    none = jnp.zeros_like(valid)
    if mode == "truncate":
        truncated, masked = valid & (w > high), none
        w = jnp.minimum(w, high)
    else:
        keep = (w >= low) & (w <= high)
        truncated, masked = none, valid & ~keep
        w = jnp.where(keep, w, 0.0)
    count = jnp.maximum(jnp.sum(valid, dtype=w.dtype), 1.0)
    diagnostics = {
        "log_weight": jnp.where(valid, log_w, 0.0),
        "masked": masked.astype(w.dtype),
        "truncated": truncated.astype(w.dtype),
        "masked_fraction": jnp.sum(masked, dtype=w.dtype) / count,
        "truncated_fraction": jnp.sum(truncated, dtype=w.dtype) / count,
    }
    return sg(jnp.where(valid, w, 0.0)), {k: sg(v) for k, v in diagnostics.items()}


def mismatch_metrics(trainer_logp, sampler_logp, mask, *, weights=None):
    r"""Scalars that measure how far the sampler is from the trainer, for every step's log.

    With :math:`d_t = \log\pi_{sampler}(y_t) - \log\pi_{trainer}(y_t)` and
    :math:`\rho_t = \pi_{trainer}/\pi_{sampler} = e^{-d_t}` over the valid tokens (sampled
    by the sampler), token means over all valid tokens of the batch:

    .. math::
        \mathrm{kl} = \overline{d_t}, \qquad
        \mathrm{k3\_kl} = \overline{\rho_t - 1 - \log\rho_t}, \qquad
        \mathrm{chi2\_token} = \overline{\rho_t^2} - 1, \qquad
        \mathrm{chi2\_seq} = \operatorname{mean}_i \Big(\prod_t \rho_{i,t}\Big)^2 - 1

    Both ``kl`` (k1) and ``k3_kl`` (k3) estimate KL(pi_sampler || pi_trainer) from the
    sampler's tokens: k1 is unbiased but can be negative, k3 is never negative and has
    lower variance (Schulman's estimators with the samples' policy first). Keys:

    - ``abs_diff_mean``, ``abs_diff_max``: mean and max of |d_t|;
    - ``kl``, ``k3_kl``, ``chi2_token``, ``chi2_seq``: as above (verl's names and
      definitions; log rho is clamped to +-20 for the exps, where verl's k3 is not);
    - ``log_ppl_diff``, ``log_ppl_abs_diff``: the mean over rows of the row's mean d_t
      (= log(ppl_trainer / ppl_sampler)) and of its absolute value;
    - ``training_ppl``, ``rollout_ppl``: the mean over rows of exp(-mean log-prob) under
      the trainer and the sampler;
    - with `weights` (from `rollout_correction`): ``masked_fraction``, the share of valid
      tokens whose weight is 0, and ``weight_mean``, the weights' token mean.

    Row means cover the rows with at least one valid token (verl averages over all rows,
    an empty row counting as 0 difference). A batch without valid tokens gives 0s. One
    fused pass, no host sync: jit it with the train step.

    Args:
      trainer_logp: `[B, T]` log-probs recomputed by the trainer.
      sampler_logp: `[B, T]` log-probs reported by the sampler.
      mask: `[B, T]` response mask.
      weights: optional `[B, T]` correction weights.

    Returns:
      dict of float32 scalars (stop-gradient).

    Example:
      >>> trainer = jnp.log(jnp.array([[0.5, 0.25]])); sampler = jnp.log(jnp.array([[0.5, 0.5]]))
      >>> m = mismatch_metrics(trainer, sampler, jnp.ones((1, 2)))
      >>> m["abs_diff_max"], m["kl"], m["k3_kl"]
      (Array(0.6931472, dtype=float32), Array(0.3465736, dtype=float32),
       Array(0.09657359, dtype=float32))

    References:
      Schulman, Approximating KL Divergence (2020), k1 and k3; Liu, Li et al., When Speed
      Kills Stability (2025): verl's compute_offpolicy_metrics, whose names these follow.
    """
    fn = "mismatch_metrics"
    _checks.check_floating(fn, trainer_logp=trainer_logp, sampler_logp=sampler_logp,
                           weights=weights)
    _checks.check_real(fn, mask=mask)
    _checks.check_token_arrays(fn, trainer_logp=trainer_logp, sampler_logp=sampler_logp,
                               mask=mask, weights=weights)
    valid = jnp.asarray(mask).astype(bool)
    trainer = sg(jnp.where(valid, _upcast(trainer_logp), 0.0))
    sampler = sg(jnp.where(valid, _upcast(sampler_logp), 0.0))
    dtype = trainer.dtype
    d = sampler - trainer
    log_rho = jnp.clip(-d, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    row_count = jnp.sum(valid, axis=-1, dtype=dtype)
    count = jnp.maximum(jnp.sum(row_count), 1.0)

    def token_mean(x):
        return jnp.sum(jnp.where(valid, x, 0.0)) / count

    rows = row_count > 0
    num_rows = jnp.maximum(jnp.sum(rows, dtype=dtype), 1.0)

    def row_mean(x):
        return jnp.sum(jnp.where(rows, x, 0.0)) / num_rows

    per_row = jnp.maximum(row_count, 1.0)
    mean_trainer, mean_sampler = jnp.sum(trainer, -1) / per_row, jnp.sum(sampler, -1) / per_row
    log_ppl_diff = mean_sampler - mean_trainer
    seq_log_rho = jnp.clip(-jnp.sum(d, axis=-1), -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    out = {
        "abs_diff_mean": token_mean(jnp.abs(d)),
        "abs_diff_max": jnp.max(jnp.where(valid, jnp.abs(d), 0.0)),
        "kl": token_mean(d),
        "k3_kl": token_mean(jnp.expm1(log_rho) - log_rho),
        "chi2_token": token_mean(jnp.exp(2.0 * log_rho)) - 1.0,
        "chi2_seq": row_mean(jnp.exp(2.0 * seq_log_rho)) - 1.0,
        "log_ppl_diff": row_mean(log_ppl_diff),
        "log_ppl_abs_diff": row_mean(jnp.abs(log_ppl_diff)),
        "training_ppl": row_mean(jnp.exp(-mean_trainer)),
        "rollout_ppl": row_mean(jnp.exp(-mean_sampler)),
    }
    if weights is not None:
        weights = sg(_upcast(weights))
        out["masked_fraction"] = token_mean((weights == 0).astype(dtype))
        out["weight_mean"] = token_mean(weights)
    return {k: sg(v.astype(jnp.promote_types(dtype, jnp.float32))) for k, v in out.items()}


def decoupled_ppo_loss(logp, prox_logp, behav_logp, adv, mask, *, eps_low=0.2, eps_high=0.2,
                       dual_clip=None, behav_weight_cap=None, behav_weight_mode="mask"):
    r"""Decoupled PPO: clip around a proximal policy, weight by pi_prox / pi_behav.

    .. math::
        u_t = \frac{\pi_\theta(y_t)}{\pi_{prox}(y_t)}, \qquad
        w_t = \operatorname{sg}\Big(\frac{\pi_{prox}(y_t)}{\pi_{behav}(y_t)}\Big), \qquad
        L_t = -\, w_t \min\big(u_t A_t,\ \operatorname{clip}(u_t, 1-\epsilon_{low},
              1+\epsilon_{high}) A_t\big)

    pi_behav is the (stale) policy that sampled the tokens, its log-probs as the sampler
    reported them; pi_prox is the proximal policy the trust region is centred on (in
    AReaL the trainer's recomputation with the current weights before the update).
    The trust region then bounds the step from pi_prox, however stale the data, and w
    corrects the sampling. With ``dual_clip=c``, tokens with A < 0 have
    min(clipped term, -c A) before the weight, as in `ppo_clip_loss`.

    The weight (stop-gradient; log-ratio clamped to +-20) is uncapped by default, as in
    the paper's eq. 5. ``behav_weight_cap=c`` bounds it like AReaL's
    ``behav_imp_weight_cap``: ``"mask"`` (AReaL's, their recommended c = 5) gives weight
    0 to tokens with w > c (no lower bound; w = c is kept), ``"truncate"`` uses min(w, c)
    (AReaL's later ``rejection_sampling.action='clamp'``). A masked token has loss 0 and
    gradient 0 but stays in the normaliser, as in AReaL (its loss divides by the
    original mask's count). Differs from AReaL's current code with no rejection sampling
    configured, which drops the weight altogether.

    Equals ``ppo_clip_loss(logp, prox_logp, ...)`` times
    ``rollout_correction(prox_logp, behav_logp, mask, level="token", ...)``: the
    composer's importance correction on a PPO loss is this objective, with its bounds.

    Args:
      logp: `[B, T]` log-probs under the policy being trained (the only input with a
        gradient).
      prox_logp: `[B, T]` log-probs under the proximal policy.
      behav_logp: `[B, T]` log-probs under the behaviour policy that sampled the tokens.
      adv: `[B]`, `[B, 1]` or `[B, T]` advantages.
      mask: `[B, T]` response mask.
      eps_low, eps_high: the clip range around pi_prox, >= 0.
      dual_clip: None, or c > 1.
      behav_weight_cap: None (no cap), or c > 0.
      behav_weight_mode: ``"mask"`` or ``"truncate"``, how the cap applies.

    Returns:
      `(loss [B, T], diagnostics)`: `ppo_clip_loss`'s (``ratio`` u_t, ``kl_old`` the k3
      estimate of KL(pi_prox || pi_theta), ``clip_low``, ``clip_high``, and ``clip_dual``
      with a dual clip), plus ``behav_weight`` (w_t as applied: 0 where masked) and
      ``behav_capped`` (1.0 where the cap masked or lowered w_t), all `[B, T]`.

    Example:
      >>> logp = jnp.log(jnp.array([[0.6, 0.5]])); prox = jnp.log(jnp.array([[0.5, 0.5]]))
      >>> behav = jnp.log(jnp.array([[0.25, 0.05]]))                     # w = 2 and 10
      >>> decoupled_ppo_loss(logp, prox, behav, jnp.array([1.0]), jnp.ones((1, 2)))[0]
      Array([[ -2.4, -10. ]], dtype=float32)
      >>> decoupled_ppo_loss(logp, prox, behav, jnp.array([1.0]), jnp.ones((1, 2)),
      ...                    behav_weight_cap=5.0)[0]
      Array([[-2.4, -0. ]], dtype=float32)

    References:
      Fu et al., AReaL: A Large-Scale Asynchronous Reinforcement Learning System for
      Language Reasoning (arXiv:2505.24298), eq. 5; Hilton et al., Batch size-invariance
      for policy optimization (arXiv:2110.00641), the decoupled objective.
    """
    fn = "decoupled_ppo_loss"
    _checks.check_nonnegative("eps_low", eps_low)
    _checks.check_nonnegative("eps_high", eps_high)
    if dual_clip is not None:
        _checks.check_greater("dual_clip", dual_clip, 1.0)
    _checks.check_choice("behav_weight_mode", behav_weight_mode, BEHAV_WEIGHT_MODES)
    if behav_weight_cap is not None:
        _checks.check_greater("behav_weight_cap", behav_weight_cap, 0.0)
    _checks.check_floating(fn, logp=logp, prox_logp=prox_logp, behav_logp=behav_logp)
    _checks.check_real(fn, adv=adv, mask=mask)
    batch = _checks.check_token_arrays(fn, logp=logp, prox_logp=prox_logp,
                                       behav_logp=behav_logp, mask=mask)
    _checks.check_row_values(fn, "adv (advantages)", adv, batch, per_token=True)

    clipped, diagnostics = ppo_clip_loss(logp, prox_logp, adv, mask, eps_low=eps_low,
                                         eps_high=eps_high, dual_clip=dual_clip)
    if behav_weight_cap is None:   # mask mode with an unreachable band: the plain weight
        weight, corr = rollout_correction(prox_logp, behav_logp, mask, mode="mask",
                                          low=0.0, high=float("inf"))
    elif behav_weight_mode == "mask":
        weight, corr = rollout_correction(prox_logp, behav_logp, mask, mode="mask",
                                          low=0.0, high=behav_weight_cap)
    else:
        weight, corr = rollout_correction(prox_logp, behav_logp, mask, mode="truncate",
                                          high=behav_weight_cap)
    valid = jnp.asarray(mask).astype(bool)
    loss = jnp.where(valid, clipped * weight.astype(clipped.dtype), 0.0)
    diagnostics = {**diagnostics,
                   "behav_weight": weight.astype(clipped.dtype),
                   "behav_capped": (corr["masked"] + corr["truncated"]).astype(clipped.dtype)}
    return loss, diagnostics
