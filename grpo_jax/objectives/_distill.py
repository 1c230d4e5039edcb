r"""On-policy distillation: the student samples, a teacher scores the student's tokens.

- `reverse_kl_distill_loss`: per-token reverse KL to the teacher from the sampled tokens'
  log-probs alone (what a teacher served behind a log-prob API gives).
- `generalized_jsd`: GKD's generalized Jensen-Shannon divergence between the two
  next-token distributions at each position, from both models' full logits.

Conventions as in `_policy_losses`: `[B, T]` log-probs (or `[B, T, V]` logits), a `[B, T]`
mask; `(loss [B, T], diagnostics)` out, 0 at masked positions with exactly zero gradient
there. Only the student's log-probs (logits) are differentiated; the teacher's are read
with a stop-gradient.
"""

import jax
import jax.numpy as jnp

from grpo_jax.objectives import _checks
from grpo_jax.objectives._kl import LOG_RATIO_CLAMP
from grpo_jax.objectives._policy_losses import _masked_inputs

sg = jax.lax.stop_gradient


def reverse_kl_distill_loss(logp, teacher_logp, mask):
    r"""Per-token reverse KL from the student to a teacher, on the student's own samples.

    .. math::
        k_t = \log\pi_\theta(y_t) - \log\pi_T(y_t), \qquad y \sim \pi_\theta, \qquad
        L_t = \operatorname{sg}(k_t) + \operatorname{sg}(k_t)\big(\log\pi_\theta(y_t)
              - \operatorname{sg}(\log\pi_\theta(y_t))\big)

    k_t is the sampled estimate of KL(pi_theta || pi_T) at position t (its expectation
    under the student); L_t has the value k_t and the gradient k_t grad log pi_theta(y_t):
    the policy gradient with the per-token reward -k_t (the pathwise term grad k_t =
    grad log pi_theta has expectation 0 and is left out, as a policy gradient does).
    This is on-policy distillation with the reverse KL (Agarwal et al.'s on-policy GKD,
    sec. 3.1), each token's reward its own (no return to go). The composed form is
    ``presets.distill``; the log-ratio is clamped to [-20, 20].

    Args:
      logp: `[B, T]` the student's log-probs of its sampled tokens (differentiated).
      teacher_logp: `[B, T]` the teacher's log-probs of the same tokens.
      mask: `[B, T]` response mask.

    Returns:
      `(loss [B, T], diagnostics)`: ``reverse_kl``, k_t per token.

    Example:
      >>> logp = jnp.log(jnp.array([[0.5, 0.25]])); teacher = jnp.log(jnp.array([[0.25, 0.25]]))
      >>> reverse_kl_distill_loss(logp, teacher, jnp.ones((1, 2)))[0]   # log 2, 0
      Array([[0.6931472, 0.       ]], dtype=float32)

    References:
      Agarwal et al., On-Policy Distillation of Language Models: Learning from
      Self-Generated Mistakes (GKD, arXiv:2306.13649), sec. 3.1 and eq. 3 (the
      on-policy objective with the reverse KL, D_RKL).
    """
    fn = "reverse_kl_distill_loss"
    _checks.check_floating(fn, logp=logp, teacher_logp=teacher_logp)
    _checks.check_real(fn, mask=mask)
    _checks.check_token_arrays(fn, logp=logp, teacher_logp=teacher_logp, mask=mask)
    _checks.check_binary_mask(fn, "mask", mask)
    logp, teacher_logp, valid = _masked_inputs(logp, teacher_logp, mask)
    k = jnp.clip(logp - teacher_logp, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    loss = sg(k) + sg(k) * (logp - sg(logp))
    return jnp.where(valid, loss, 0.0), {"reverse_kl": sg(jnp.where(valid, k, 0.0))}


def generalized_jsd(student_logits, teacher_logits, mask, *, beta=0.5, temperature=1.0):
    r"""GKD's generalized Jensen-Shannon divergence per position, over the vocabulary.

    With P the teacher's and Q the student's next-token distributions (softmax of the
    logits / temperature) and M = beta P + (1 - beta) Q:

    .. math::
        D_{JSD(\beta)}(P \| Q) = \beta\, KL(P \| M) + (1 - \beta)\, KL(Q \| M)

    for 0 < beta < 1. The formula vanishes at the ends; there, as TRL's GKD trainer does,
    beta = 0 is the forward KL(P || Q) and beta = 1 the reverse KL(Q || P) (the limits of
    D_JSD(beta) / beta and / (1 - beta)). Only the student's logits are differentiated.

    Args:
      student_logits: `[B, T, V]` the student's logits at the completion positions.
      teacher_logits: `[B, T, V]` the teacher's, same tokenizer and positions.
      mask: `[B, T]` response mask.
      beta: in [0, 1] (the paper's beta; 0.5 the symmetric JSD).
      temperature: divides both models' logits (> 0).

    Returns:
      `(loss [B, T], diagnostics)`: the divergence per position in nats, 0 at masked
      positions; diagnostics empty.

    Example:
      >>> s = jnp.log(jnp.array([[[0.5, 0.5]]])); t = jnp.log(jnp.array([[[0.9, 0.1]]]))
      >>> generalized_jsd(s, t, jnp.ones((1, 1)), beta=1.0)[0]   # KL(Q || P)
      Array([[0.5108256]], dtype=float32)

    References:
      Agarwal et al., On-Policy Distillation of Language Models (GKD, arXiv:2306.13649),
      sec. 3 (the generalized JSD, with beta) and sec. 3.1 (its on-policy use).
    """
    fn = "generalized_jsd"
    _checks.check_unit_interval("beta", beta)
    _checks.check_greater("temperature", temperature, 0.0)
    _checks.check_floating(fn, student_logits=student_logits, teacher_logits=teacher_logits)
    _checks.check_real(fn, mask=mask)
    shape = _checks.check_like(fn, "[B, T, V]", student_logits=student_logits,
                               teacher_logits=teacher_logits)
    if len(shape) != 3 or _checks.shape_of(mask) != shape[:2]:
        raise _checks.shape_error(fn, "mask", f"[B, T] = {_checks.shape_text(shape[:2])} "
                                  "(the logits' first two axes)", _checks.shape_of(mask))
    _checks.check_binary_mask(fn, "mask", mask)
    q = jax.nn.log_softmax(jnp.asarray(student_logits).astype(jnp.float32) / temperature, -1)
    p = sg(jax.nn.log_softmax(jnp.asarray(teacher_logits).astype(jnp.float32) / temperature,
                              -1))

    def kl(a, b):   # KL(a || b) from log-probs, summed over the vocabulary
        return jnp.sum(jnp.exp(a) * (a - b), axis=-1)

    if beta == 0.0:
        divergence = kl(p, q)
    elif beta == 1.0:
        divergence = kl(q, p)
    else:
        m = jnp.logaddexp(p + jnp.log(beta), q + jnp.log1p(-beta))
        divergence = beta * kl(p, m) + (1.0 - beta) * kl(q, m)
    valid = jnp.asarray(mask).astype(bool)
    return jnp.where(valid, divergence, 0.0), {}
