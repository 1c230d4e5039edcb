"""The registries of the composer: advantage estimators and per-token policy losses by name.

An estimator is ``fn(spec, batch, rewards, reward_weights) -> advantages`` (`spec` an
`ObjectiveSpec`, rewards `[B]` or `[B, K]`, reward_weights one weight per reward column or
None); a policy loss is ``(function, the ObjectiveSpec fields it takes as keywords)``.
`register_advantage_estimator` and `register_policy_loss` add entries; `ObjectiveSpec`
validates its ``estimator`` and ``policy_loss`` names against these tables.
"""

import jax.numpy as jnp

from grpo_jax.objectives._advantages import (gae, gdpo_advantages, group_advantages,
                                             length_adaptive_lambda, masked_whiten,
                                             outcome_token_rewards, reinforce_pp_advantages,
                                             rloo_advantages)
from grpo_jax.objectives._covariance import clip_cov_loss, kl_cov_loss
from grpo_jax.objectives._distill import reverse_kl_distill_loss
from grpo_jax.objectives._kl import kl_penalty
from grpo_jax.objectives._policy_losses import (cispo_loss, gspo_loss, pg_loss, ppo_clip_loss,
                                                sapo_loss)
from grpo_jax.objectives._trl_variants import vespo_loss
from grpo_jax.objectives._trust_region import dppo_loss, gmpo_loss


def required(batch, key, why):
    """``batch[key]``, or a KeyError saying which setting (`why`) needs it."""
    if key not in batch:
        raise KeyError(f"batch[{key!r}] is required by {why}; the batch has {sorted(batch)}")
    return batch[key]


# --- Advantage estimators: (spec, batch, rewards [B] or [B,K], reward_weights) ->
# advantages. reward_weights is one weight per reward column, or None.

def _group(spec, batch, rewards, reward_weights):
    return group_advantages(rewards, spec.group_size, scale=spec.advantage_scale,
                            ddof=spec.ddof, eps=spec.advantage_eps)


def _rloo(spec, batch, rewards, reward_weights):
    return rloo_advantages(rewards, spec.group_size)


def _reinforce_pp(spec, batch, rewards, reward_weights):
    token_rewards = None
    if spec.kl_in_reward:
        token_rewards = -spec.kl_beta * kl_penalty(
            required(batch, "old_logp", "kl.in_reward"),
            required(batch, "ref_logp", "kl.in_reward"), kind=spec.kl_kind,
        )
    return reinforce_pp_advantages(
        rewards, required(batch, "mask", "advantage.estimator='reinforce_pp'"), gamma=spec.gamma,
        token_rewards=token_rewards, group_size=spec.group_size if spec.baseline else None,
    )


def _gdpo(spec, batch, rewards, reward_weights):
    if reward_weights is not None and rewards.ndim == 2 and len(reward_weights) != rewards.shape[1]:
        raise ValueError(
            f"objective.advantage.estimator='gdpo' got {len(reward_weights)} reward weights for "
            f"{rewards.shape[1]} reward columns; reward.specs must name one (reward, weight) "
            "per column")
    weights = None if reward_weights is None else jnp.asarray(reward_weights, jnp.float32)
    return gdpo_advantages(rewards, spec.group_size, weights=weights, eps=spec.advantage_eps)


def _policy_lambda(spec, mask):
    """The policy's GAE lambda: ``lam``, or with ``lam_alpha > 0`` VAPO's
    length-adaptive `[B]` lambda 1 - 1 / (alpha * length) (eq. 7)."""
    if spec.lam_alpha > 0:
        return length_adaptive_lambda(jnp.sum(mask, axis=1), alpha=spec.lam_alpha)
    return spec.lam


def _gae(spec, batch, rewards, reward_weights):
    """PPO's advantages from the critic's values: GAE over the outcome reward (on the
    last token), with the policy's lambda, whitened over the batch's tokens if asked."""
    if rewards.ndim != 1:
        raise ValueError(f"objective.advantage.estimator='gae' takes one reward per answer, got "
                         f"rewards of shape {rewards.shape}; sum the reward columns (not gdpo)")
    mask = required(batch, "mask", "advantage.estimator='gae'")
    values = required(batch, "values", "advantage.estimator='gae'")
    advantages, _ = gae(outcome_token_rewards(rewards, mask), values, mask,
                        gamma=spec.gamma, lam=_policy_lambda(spec, mask))
    return masked_whiten(advantages, mask) if spec.whiten else advantages


def _reverse_kl(spec, batch, rewards, reward_weights):
    """On-policy distillation's `[B, T]` advantages: the per-token reward -k_t =
    log pi_T(y_t) - log pi_old(y_t), the teacher's log-prob over the sampler's (Agarwal et
    al., arXiv:2306.13649, sec. 3.1, with the reverse KL); rewards are not read."""
    mask = required(batch, "mask", "advantage.estimator='reverse_kl'")
    teacher = required(batch, "teacher_logp", "advantage.estimator='reverse_kl'")
    _, diagnostics = reverse_kl_distill_loss(
        required(batch, "old_logp", "advantage.estimator='reverse_kl'"), teacher, mask)
    return -diagnostics["reverse_kl"]


ADVANTAGE_ESTIMATORS = {
    "group": _group,
    "rloo": _rloo,
    "reinforce_pp": _reinforce_pp,
    "gdpo": _gdpo,
    "gae": _gae,
    "reverse_kl": _reverse_kl,
}
# Estimators that read no reward (the batch's "rewards", if any, is ignored).
REWARDLESS_ESTIMATORS = {"reverse_kl"}

# --- Policy losses: name -> (function, the ObjectiveSpec fields passed as keywords).
# A field is its keyword's name, or (spec field, keyword) where the two differ.

POLICY_LOSSES = {
    "pg": (pg_loss, ()),
    "ppo_clip": (ppo_clip_loss, ("eps_low", "eps_high", "dual_clip")),
    "gspo": (gspo_loss, ("eps_low", "eps_high")),
    "cispo": (cispo_loss, ("eps_low", "eps_high")),
    "sapo": (sapo_loss, ("tau_pos", "tau_neg")),
    "gmpo": (gmpo_loss, ("eps_low", "eps_high")),
    "dppo": (dppo_loss, (("dppo_divergence", "divergence"), ("dppo_delta_low", "delta_low"),
                         ("dppo_delta_high", "delta_high"), ("dppo_ratio_cap", "ratio_cap"))),
    "clip_cov": (clip_cov_loss, (("clip_cov_fraction", "clip_fraction"),
                                 ("clip_cov_low", "cov_low"), ("clip_cov_high", "cov_high"),
                                 "eps_low", "eps_high")),
    "kl_cov": (kl_cov_loss, (("kl_cov_fraction", "kl_fraction"), ("kl_cov_coef", "kl_coef"))),
    # LUSPO: GSPO's per-token loss, aggregated by seq-mean-token-sum (`ObjectiveSpec`).
    "luspo": (gspo_loss, ("eps_low", "eps_high")),
    "vespo": (vespo_loss, (("vespo_k_pos", "k_pos"), ("vespo_lambda_pos", "lambda_pos"),
                           ("vespo_k_neg", "k_neg"), ("vespo_lambda_neg", "lambda_neg"))),
}
# Losses that draw at random: their key comes from the batch's per-row seeds.
RANDOM_LOSSES = {"clip_cov"}


def register_advantage_estimator(name, fn):
    """Adds `fn(spec, batch, rewards, reward_weights) -> advantages` as `name`
    (`spec` is the `ObjectiveSpec`)."""
    ADVANTAGE_ESTIMATORS[name] = fn


def register_policy_loss(name, fn, fields):
    """Adds a per-token loss `fn(logp, old_logp, adv, mask, **{f: spec.f for f in fields})`.

    `fields` are `ObjectiveSpec` keywords (e.g. ``("eps_low", "eps_high")``), or
    ``(spec field, keyword)`` pairs where `fn` names it otherwise; bind other
    hyper-parameters with functools.partial before registering.
    """
    POLICY_LOSSES[name] = (fn, tuple(fields))
