r"""Clip-Cov and KL-Cov: restrain the tokens whose log-prob and advantage co-vary most.

Cui et al. show that the policy's entropy falls in proportion to the covariance between
a token's log-prob and its advantage; the two losses act on the few tokens with the
largest such covariance,

.. math::
    \operatorname{Cov}_t = \Big(\log\pi_\theta(y_t) - \frac{1}{N}\sum_j \log\pi_\theta(y_j)\Big)
                           \Big(A_t - \frac{1}{N}\sum_j A_j\Big)

over the N valid tokens of the whole batch (`token_covariance`). Clip-Cov drops a random
few of them from the update; KL-Cov adds a penalty on |log r| to the top fraction. The
batch is the one passed in: a trainer that splits a minibatch selects per micro-batch,
as verl does (docs/objectives.md, "Objectives that depend on the micro-batch").
Conventions as in `_policy_losses` (shapes, masked positions, diagnostics, gradient
contract). Clip-Cov is the one function of `grpo_jax.objectives` that takes a PRNG key.
"""

import jax
import jax.numpy as jnp

from grpo_jax.objectives import _checks
from grpo_jax.objectives._policy_losses import (_check_inputs, _clipped_surrogate,
                                                _diagnostics, _masked_inputs, _per_token,
                                                _token_ratio)

sg = jax.lax.stop_gradient


def token_covariance(logp, adv, mask):
    r"""Per-token centred cross-product of log-prob and advantage, over the batch.

    .. math::
        \operatorname{Cov}_t = (\log\pi_\theta(y_t) - \overline{\log\pi})(A_t - \bar A)

    with the means over the valid tokens of the whole `[B, T]` batch (one mean, not one
    per row); its mean over the tokens is the covariance of Cui et al.'s entropy
    dynamics. Stop-gradient; 0 at masked positions.

    Args:
      logp: `[B, T]` log-probs of the sampled tokens under the current policy.
      adv: `[B]` or `[B, T]` advantages.
      mask: `[B, T]` response mask.

    Returns:
      `[B, T]` float32 (float64 for float64 inputs).

    Example:
      >>> token_covariance(jnp.log(jnp.array([[0.5, 0.25], [0.5, 0.25]])), jnp.array([1.0, -1.0]),
      ...                  jnp.ones((2, 2))).round(4)
      Array([[ 0.3466, -0.3466],
             [-0.3466,  0.3466]], dtype=float32)

    References:
      Cui et al., The Entropy Mechanism of Reinforcement Learning for Reasoning Language
      Models (arXiv:2505.22617): the token covariance that drives the entropy change
      under policy gradient, which Clip-Cov and KL-Cov threshold.
    """
    _check_inputs("token_covariance", logp, logp, adv, mask)
    logp, _, valid = _masked_inputs(logp, logp, mask)
    shape = logp.shape
    return _covariance(sg(logp), _per_token(adv, shape), valid)


def _covariance(logp, adv, valid):
    count = jnp.maximum(jnp.sum(valid), 1).astype(logp.dtype)
    mean_logp = jnp.sum(jnp.where(valid, logp, 0.0)) / count
    mean_adv = jnp.sum(jnp.where(valid, adv, 0.0)) / count
    return sg(jnp.where(valid, (logp - mean_logp) * (adv - mean_adv), 0.0))


def _fraction_count(fraction, valid):
    """max(floor(fraction * N), 1), N the valid tokens (verl's int(), computed in float32:
    a relative 1e-6 nudge keeps products like 0.7 * 10 from flooring to 6)."""
    product = fraction * jnp.sum(valid).astype(jnp.float32)
    return jnp.maximum(jnp.floor(product * (1.0 + 1e-6)), 1.0)


def _top_ranked(score, eligible, count):
    """`[B, T]` bool: the `count` eligible tokens with the largest `score` (ties: the
    earlier position first). Sort-based, jittable; `count` may be traced."""
    flat = jnp.where(eligible, score, -jnp.inf).reshape(-1)
    order = jnp.argsort(-flat, stable=True)
    rank = jnp.zeros(flat.shape, jnp.int32).at[order].set(jnp.arange(flat.size, dtype=jnp.int32))
    return eligible & (rank.reshape(eligible.shape) < count)


def _random_subset(key):
    """A selector: `count` eligible tokens uniformly at random (random priorities)."""
    def select(eligible, count):
        return _top_ranked(jax.random.uniform(key, eligible.shape), eligible, count)
    return select


def _clip_cov(logp, old_logp, adv, mask, *, select, clip_fraction, cov_low, cov_high,
              eps_low, eps_high):
    """Clip-Cov with the random choice abstracted: `select(eligible, count)` -> `[B, T]`."""
    _check_inputs("clip_cov_loss", logp, old_logp, adv, mask)
    _checks.check_greater("clip_fraction", clip_fraction, 0.0)
    _checks.check_nonnegative("eps_low", eps_low)
    _checks.check_nonnegative("eps_high", eps_high)
    logp, old_logp, valid = _masked_inputs(logp, old_logp, mask)
    shape = logp.shape
    adv = _per_token(adv, shape)
    ratio = _token_ratio(logp, old_logp)
    surrogate, activity = _clipped_surrogate(ratio, adv, valid, eps_low=eps_low,
                                             eps_high=eps_high, dual_clip=None)
    cov = _covariance(sg(logp), adv, valid)
    eligible = (valid & ~activity["clip_low"] & ~activity["clip_high"]
                & (cov > cov_low) & (cov < cov_high))
    detached = select(eligible, _fraction_count(clip_fraction, valid))
    loss = jnp.where(detached, 0.0, surrogate)
    return loss, _diagnostics(ratio, logp, old_logp, valid, **activity, cov_detached=detached)


def clip_cov_loss(logp, old_logp, adv, mask, *, key, clip_fraction=2e-4, cov_low=1.0,
                  cov_high=5.0, eps_low=1.0, eps_high=1.0):
    r"""Clip-Cov: PPO's clipped loss, with a random few high-covariance tokens left out.

    .. math::
        I = \text{a uniformly random subset of } \{t : \omega_{low} < \operatorname{Cov}_t
            < \omega_{high},\ t \text{ not clipped by PPO}\}, \qquad
        |I| = \min\big(\max(\lfloor f N \rfloor, 1),\ \#\text{candidates}\big)

        L_t = \begin{cases} 0 & t \in I \\ -\min\big(r_t A_t,\ \operatorname{clip}(r_t,
              1-\epsilon_{low}, 1+\epsilon_{high}) A_t\big) & \text{otherwise}\end{cases}

    Cov_t is `token_covariance` (batch means over the N valid tokens), f = clip_fraction
    (the paper's r).
    The tokens of I have loss 0 and no gradient (verl multiplies their loss by 0, which
    is what "detach" means there); tokens already clipped by PPO are never candidates.
    Given the candidates, the choice is a function of `key` (uniform random priorities,
    the |I| largest): the same key gives the same tokens; use a fresh key every step.
    It cannot reproduce verl's torch.randperm draw. With clip_fraction >= (candidates / N)
    every candidate is chosen and the loss is deterministic (equal to verl's).

    Args:
      logp: `[B, T]` log-probs of the sampled tokens under the current policy.
      old_logp: `[B, T]` the same under pi_old.
      adv: `[B]` or `[B, T]` advantages.
      mask: `[B, T]` response mask.
      key: a jax PRNG key (e.g. ``jax.random.key(step)``) that draws I.
      clip_fraction: f > 0, the share of valid tokens to leave out (paper: 2e-4).
      cov_low, cov_high: the covariance band (omega_low, omega_high) = (1, 5) in the paper.
      eps_low, eps_high: PPO's clip range, >= 0 (the authors' Clip-Cov scripts: 1 and 1).

    Returns:
      `(loss [B, T], diagnostics)`: ``ratio``, ``kl_old``, ``clip_low``/``clip_high`` as
      for `ppo_clip_loss`, and ``cov_detached`` (1.0 on the tokens of I).

    Example:
      >>> logp = jnp.log(jnp.array([[0.9, 0.02], [0.9, 0.02]])); adv = jnp.array([2.0, -2.0])
      >>> loss, diag = clip_cov_loss(logp, logp, adv, jnp.ones((2, 2)), key=jax.random.key(0),
      ...                            clip_fraction=1.0)
      >>> loss, diag["cov_detached"]   # Cov = 3.81 at (0, 0) and (1, 1): both left out
      (Array([[ 0., -2.],
             [ 2.,  0.]], dtype=float32), Array([[1., 0.],
             [0., 1.]], dtype=float32))

    References:
      Cui et al., The Entropy Mechanism of Reinforcement Learning for Reasoning Language
      Models (arXiv:2505.22617): Clip-Cov and its hyper-parameters (r = 2e-4,
      omega = (1, 5)); the authors' code (PRIME-RL/Entropy-Mechanism-of-RL,
      recipe/dapo/7b_clip_cov.sh) and verl's ``clip_cov`` policy loss.
    """
    return _clip_cov(logp, old_logp, adv, mask, select=_random_subset(key),
                     clip_fraction=clip_fraction, cov_low=cov_low, cov_high=cov_high,
                     eps_low=eps_low, eps_high=eps_high)


def kl_cov_loss(logp, old_logp, adv, mask, *, kl_fraction=2e-3, kl_coef=1.0):
    r"""KL-Cov: a |log r| penalty on the top fraction of tokens by covariance.

    .. math::
        L_t = -r_t A_t + \begin{cases} \beta\, |\log r_t| & t \in I_{KL} \\
                                        0 & \text{otherwise} \end{cases}, \qquad
        I_{KL} = \text{the } \max(\lfloor k N \rfloor, 1) \text{ valid tokens with the
                 largest } \operatorname{Cov}_t

    with r_t = pi_theta / pi_old (no ratio clip: the penalty is the trust region) and
    Cov_t `token_covariance` over the N valid tokens of the batch. The paper states the
    penalty as a KL term between pi_old and pi_theta; the authors' code (and verl's)
    computes it per token as |log r_t|, which is what is implemented here. Its gradient is
    beta sign(log r_t) (0 on-policy, as torch's abs gives). Ties in Cov are broken by
    position (torch.topk leaves them unspecified).

    Args:
      logp: `[B, T]` log-probs of the sampled tokens under the current policy.
      old_logp: `[B, T]` the same under pi_old.
      adv: `[B]` or `[B, T]` advantages.
      mask: `[B, T]` response mask.
      kl_fraction: k > 0, the share of valid tokens penalised (the authors' 7B recipe:
        2e-3, their ``k_percent=0.2``; 32B: 2e-4, verl's default).
      kl_coef: beta >= 0 (paper and recipes: 1).

    Returns:
      `(loss [B, T], diagnostics)`: ``ratio``, ``kl_old`` and ``cov_penalized`` (1.0 on the
      tokens of I_KL).

    Example:
      >>> logp = jnp.log(jnp.array([[0.9, 0.02], [0.9, 0.02]])); adv = jnp.array([2.0, -2.0])
      >>> old = jnp.log(jnp.array([[0.6, 0.02], [0.9, 0.04]]))
      >>> loss, diag = kl_cov_loss(logp, old, adv, jnp.ones((2, 2)), kl_fraction=0.5)
      >>> diag["cov_penalized"]   # Cov = +3.8 at (0, 0) and (1, 1), -3.8 elsewhere
      Array([[1., 0.],
             [0., 1.]], dtype=float32)
      >>> bool(jnp.allclose(loss, jnp.array([[-1.5 * 2 + jnp.log(1.5), -2.0],
      ...                                    [2.0, 0.5 * 2 + jnp.log(2.0)]])))
      True

    References:
      Cui et al., The Entropy Mechanism of Reinforcement Learning for Reasoning Language
      Models (arXiv:2505.22617): KL-Cov and its hyper-parameters; the authors' code
      (PRIME-RL/Entropy-Mechanism-of-RL, recipe/dapo/7b_kl_cov.sh) and verl's ``kl_cov``
      policy loss.
    """
    _check_inputs("kl_cov_loss", logp, old_logp, adv, mask)
    _checks.check_greater("kl_fraction", kl_fraction, 0.0)
    _checks.check_nonnegative("kl_coef", kl_coef)
    logp, old_logp, valid = _masked_inputs(logp, old_logp, mask)
    shape = logp.shape
    adv = _per_token(adv, shape)
    ratio = _token_ratio(logp, old_logp)
    cov = _covariance(sg(logp), adv, valid)
    penalized = _top_ranked(cov, valid, _fraction_count(kl_fraction, valid))
    log_ratio = logp - old_logp
    abs_log_ratio = jnp.sign(sg(log_ratio)) * log_ratio
    loss = -ratio * adv + jnp.where(penalized, kl_coef * abs_log_ratio, 0.0)
    return (jnp.where(valid, loss, 0.0),
            _diagnostics(ratio, logp, old_logp, valid, cov_penalized=penalized))
