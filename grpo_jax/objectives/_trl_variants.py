"""VESPO's sequence-level soft weight, the high-entropy token selection ("80/20") and
Skywork-OR1's adaptive entropy coefficient: the three methods TRL's GRPOTrainer offers
beyond the clip losses (LUSPO, the fourth, is `gspo_loss` under ``seq-mean-token-sum``).

Each agrees with TRL's own code on recorded cases (tests/objectives/test_trl_losses.py).
"""

import math

import jax
import jax.numpy as jnp

from grpo_jax.objectives import _checks
from grpo_jax.objectives._policy_losses import (_check_inputs, _diagnostics, _masked_inputs,
                                                _per_token, _token_ratio)

sg = jax.lax.stop_gradient
LOG_WEIGHT_LOW = math.log(1e-8)   # the kernel's clamp on log w, as VESPO's code and TRL's
LOG_WEIGHT_HIGH = 20.0


def vespo_loss(logp: jax.Array, old_logp: jax.Array, adv: jax.Array, mask: jax.Array, *,
               k_pos: float = 2.0, lambda_pos: float = 3.0, k_neg: float = 3.0,
               lambda_neg: float = 2.0) -> tuple[jax.Array, dict]:
    r"""VESPO: the policy gradient weighted by a Gamma-shaped kernel of the SEQUENCE ratio.

    .. math::
        \log w_i = \operatorname{clip}\Big(\sum_t \operatorname{clip}(\log r_{i,t}, -20, 20),
                   \log 10^{-8}, 20\Big), \qquad
        \phi(w) = e^{\lambda}\, w^{k}\, e^{-\lambda w}, \qquad
        L_{i,t} = -\operatorname{sg}(\phi(w_i))\, A_{i,t} \log\pi_\theta(y_{i,t})

    w_i is the product of the token ratios (no length normalisation); phi(1) = 1, it
    peaks at w = k / lambda and falls to 0 for very small or large w, so stale sequences
    are softly down-weighted instead of clipped. (k, lambda) are (k_pos, lambda_pos) for
    A >= 0 and (k_neg, lambda_neg) for A < 0; lambda is floored at 1e-4; a non-finite
    phi is 0. The weight carries no gradient: the gradient is -phi A grad log pi.

    Args:
      logp, old_logp: `[B, T]` current and behaviour log-probs.
      adv: `[B]`, `[B, 1]` or `[B, T]` advantages.
      mask: `[B, T]` response mask.
      k_pos, lambda_pos, k_neg, lambda_neg: the kernel's power and decay for A >= 0 and
        A < 0 (TRL's defaults 2, 3, 3, 2), > 0.

    Returns:
      `(loss [B, T], diagnostics)`: ``ratio`` (the token ratio), ``kl_old`` and
      ``vespo_weight`` (phi(w_i) on every valid token of row i).

    Example:
      >>> logp = jnp.log(jnp.array([[0.5, 0.5]])); old = logp
      >>> vespo_loss(logp, old, jnp.array([1.0]), jnp.ones((1, 2)))[0]   # w = 1: phi = 1
      Array([[0.6931472, 0.6931472]], dtype=float32)

    References:
      Shen, Zhao, Cheng, Huang, Yu, VESPO: Variational Sequence-Level Soft Policy
      Optimization (arXiv:2602.10693), the reshaping kernel phi(w); TRL's
      ``GRPOTrainer.get_gamma_weights`` (loss_type="vespo").
    """
    for name, value in (("k_pos", k_pos), ("lambda_pos", lambda_pos), ("k_neg", k_neg),
                        ("lambda_neg", lambda_neg)):
        _checks.check_greater(name, value, 0.0)
    _check_inputs("vespo_loss", logp, old_logp, adv, mask)
    logp, old_logp, valid = _masked_inputs(logp, old_logp, mask)
    adv = _per_token(adv, logp.shape)
    log_ratio = jnp.clip(logp - old_logp, -LOG_WEIGHT_HIGH, LOG_WEIGHT_HIGH)
    log_w = jnp.clip(jnp.sum(jnp.where(valid, sg(log_ratio), 0.0), axis=-1, keepdims=True),
                     LOG_WEIGHT_LOW, LOG_WEIGHT_HIGH)
    k = jnp.where(adv >= 0, k_pos, k_neg)
    lam = jnp.maximum(jnp.where(adv >= 0, lambda_pos, lambda_neg), 1e-4)
    phi = jnp.exp(lam + k * log_w - lam * jnp.exp(log_w))
    phi = sg(jnp.where(jnp.isfinite(phi), phi, 0.0))
    loss = jnp.where(valid, -phi * adv * logp, 0.0)
    return loss, _diagnostics(_token_ratio(logp, old_logp), logp, old_logp, valid,
                              vespo_weight=phi)


def top_entropy_mask(entropy: jax.Array, mask: jax.Array, *, quantile: float) -> jax.Array:
    r"""`[B, T]` float 0/1: the valid tokens whose entropy is in the top `quantile` share.

    .. math::
        \tau = Q_{1-\rho}\big(\{H_{i,t} : m_{i,t} = 1\}\big), \qquad
        \text{keep}_{i,t} = m_{i,t}\,[H_{i,t} \ge \tau]

    Q is the linear-interpolation quantile (numpy's and torch's default) over the valid
    tokens of the batch passed in, so the selection is a statistic of that batch (as in
    TRL, per micro-batch). rho = 1 keeps every valid token, rho = 0 the highest-entropy
    one(s) only; a batch with no valid token keeps none. The entropies select, they
    carry no gradient here.

    Args:
      entropy: `[B, T]` per-token entropy of the policy's distribution.
      mask: `[B, T]` response mask.
      quantile: rho in [0, 1], the share of tokens kept (the paper: 0.2).

    Returns:
      `[B, T]` float32 keep mask, 0 at masked positions.

    Example:
      >>> H = jnp.array([[0.1, 2.0, 0.5, 1.0]]); m = jnp.array([[1, 1, 1, 0]])
      >>> top_entropy_mask(H, m, quantile=0.5)
      Array([[0., 1., 1., 0.]], dtype=float32)

    References:
      Wang et al., Beyond the 80/20 Rule: High-Entropy Minority Tokens Drive Effective
      RL for LLM Reasoning (arXiv:2506.01939): the policy gradient on the top 20% of
      tokens by entropy; TRL's ``GRPOTrainer.get_high_entropy_mask`` (``top_entropy_quantile``).
    """
    _checks.check_unit_interval("top_entropy_mask: quantile", quantile)
    _checks.check_floating("top_entropy_mask", entropy=entropy)
    _checks.check_token_arrays("top_entropy_mask", entropy=entropy, mask=mask)
    _checks.check_binary_mask("top_entropy_mask", "mask", mask)
    valid = jnp.asarray(mask).astype(bool)
    entropy = sg(jnp.asarray(entropy).astype(jnp.float32))
    flat = jnp.sort(jnp.where(valid, entropy, jnp.inf).reshape(-1))   # valid ones first
    count = jnp.sum(valid)
    position = (jnp.maximum(count, 1) - 1).astype(jnp.float32) * (1.0 - quantile)
    low = jnp.floor(position).astype(jnp.int32)
    high = jnp.minimum(low + 1, jnp.maximum(count, 1) - 1)
    below, above = flat[low], flat[high]
    threshold = below + (position - low) * (above - below)
    return (valid & (entropy >= threshold) & (count > 0)).astype(jnp.float32)


def adaptive_entropy_coef(coef: jax.Array, entropy: jax.Array, *, target: float,
                          delta: float, low: float, high: float) -> jax.Array:
    r"""One step of Skywork-OR1's adaptive entropy control: the next coefficient.

    .. math::
        c_{k+1} = \begin{cases} \min(c_k + \delta, c_{max}) & H_k \le H_{target} \\
                                \max(c_k - \delta, c_{min}) & \text{else} \end{cases}

    with H_k the step's mean token entropy (over the tokens the loss reads). The bonus
    a step applies is `entropy_bonus_coef` of the coefficient and the previous step's
    entropy: c_k while H_{k-1} <= H_target, else 0 (so the first step, with no previous
    entropy, applies none). A trainer holds (c_k, H_{k-1}) between steps.

    Args:
      coef: `[]` the current coefficient c_k.
      entropy: `[]` this step's mean token entropy H_k (nats).
      target: H_target, the entropy the controller keeps the policy above.
      delta: the step size, >= 0.
      low, high: the coefficient's bounds, 0 <= low <= high.

    Returns:
      `[]` float32, c_{k+1}.

    Example:
      >>> adaptive_entropy_coef(0.01, 0.3, target=0.5, delta=0.02, low=0.0, high=0.05)
      Array(0.03, dtype=float32)

    References:
      He et al., Skywork Open Reasoner 1 Technical Report (arXiv:2505.22312), its
      adaptive entropy control; TRL's ``use_adaptive_entropy``.
    """
    _checks.check_nonnegative("adaptive_entropy_coef: delta", delta)
    _checks.check_nonnegative("adaptive_entropy_coef: low", low)
    if not low <= high:
        raise ValueError(f"adaptive_entropy_coef: low must be <= high, got {low} and {high}")
    coef = jnp.asarray(coef, jnp.float32)
    return jnp.where(jnp.asarray(entropy) <= target, jnp.minimum(coef + delta, high),
                     jnp.maximum(coef - delta, low))


def entropy_bonus_coef(coef: jax.Array, last_entropy: jax.Array, *, target: float) -> jax.Array:
    """The entropy coefficient a step applies under adaptive control: `coef` while the
    previous step's mean entropy `last_entropy` is <= `target`, else 0 (pass +inf before
    the first step). `[]` float32. See `adaptive_entropy_coef`.

    Example:
      >>> entropy_bonus_coef(0.02, jnp.inf, target=0.5), entropy_bonus_coef(0.02, 0.4, target=0.5)
      (Array(0., dtype=float32), Array(0.02, dtype=float32))
    """
    coef = jnp.asarray(coef, jnp.float32)
    return jnp.where(jnp.asarray(last_entropy) <= target, coef, 0.0)
