"""The registry and the composer: a config section in, a pure objective out.

``policy_objective(config.objective)`` returns a `PolicyObjective`, a callable
``(logp, batch) -> (loss, metrics)`` that a trainer differentiates without knowing which
recipe it runs. Adding a variant is one function, one registry line and one config:

      register_policy_loss("my_loss", my_loss_fn, fields=("eps_low", "eps_high"))

The batch is a dict of arrays (B = P * G rows, T response tokens):

  ====================  ========  ===================================================
  key                   shape     needed
  ====================  ========  ===================================================
  ``old_logp``          [B, T]    always (behaviour log-probs)
  ``mask``              [B, T]    always (response mask)
  ``advantages``        [B]/[B,T] or ``rewards``; precompute them over the FULL batch
                                  (``objective.advantages(batch)``) before splitting
  ``rewards``           [B]/[B,K] to compute advantages inside the call
  ``ref_logp``          [B, T]    kl.beta > 0
  ``entropy``           [B, T]    entropy_coef != 0; computed inside the
                                  differentiated function (`entropy_from_logits`)
  ``behaviour_logp``    [B, T]    importance.enabled (sampler log-probs; ``old_logp``
                                  then holds the trainer's recomputed ones)
  ``truncated``         [B]       overlong.mode == "mask"
  ``lengths``           [B]       overlong.mode == "penalty"
  ``num_tokens``        scalar    optional: GLOBAL valid-token count (micro-batching)
  ``num_seqs``          scalar    optional: GLOBAL row count (micro-batching)
  ====================  ========  ===================================================

Every metric is normalised by the same global counts as the loss, so the metrics of
micro-batches add up to those of the full batch.
"""

import dataclasses
from typing import Any, Callable

import jax.numpy as jnp

from grpo_jax.objectives import _checks
from grpo_jax.objectives._advantages import (gdpo_advantages, group_advantages,
                                             reinforce_pp_advantages, rloo_advantages)
from grpo_jax.objectives._aggregation import AGGREGATION_MODES, aggregate
from grpo_jax.objectives._kl import KL_KINDS, kl_penalty
from grpo_jax.objectives._policy_losses import cispo_loss, gspo_loss, ppo_clip_loss, sapo_loss
from grpo_jax.objectives._shaping import (IMPORTANCE_LEVELS, IMPORTANCE_MODES,
                                          importance_weights, overlong_penalty,
                                          truncated_mask)

OVERLONG_MODES = ("none", "mask", "penalty")


# --- Advantage estimators: (objective config, batch, rewards [B] or [B,K]) -> advantages.

def _group(cfg, batch, rewards):
    a = cfg.advantage
    return group_advantages(rewards, cfg.group_size, scale=a.scale, ddof=a.ddof, eps=a.eps)


def _rloo(cfg, batch, rewards):
    return rloo_advantages(rewards, cfg.group_size)


def _reinforce_pp(cfg, batch, rewards):
    token_rewards = None
    if cfg.kl.in_reward:
        token_rewards = -cfg.kl.beta * kl_penalty(
            _require(batch, "old_logp", "kl.in_reward"), _require(batch, "ref_logp", "kl.in_reward"),
            kind=cfg.kl.kind)
    return reinforce_pp_advantages(
        rewards, batch["mask"], gamma=cfg.advantage.gamma, token_rewards=token_rewards,
        group_size=cfg.group_size if cfg.advantage.baseline else None)


def _gdpo(cfg, batch, rewards):
    weights = tuple(cfg.advantage.reward_weights) or None
    return gdpo_advantages(rewards, cfg.group_size, weights=weights, eps=cfg.advantage.eps)


ADVANTAGE_ESTIMATORS = {
    "group": _group,
    "rloo": _rloo,
    "reinforce_pp": _reinforce_pp,
    "gdpo": _gdpo,
}

# --- Policy losses: name -> (function, the loss-config fields passed as keywords).

POLICY_LOSSES = {
    "ppo_clip": (ppo_clip_loss, ("eps_low", "eps_high", "dual_clip")),
    "gspo": (gspo_loss, ("eps_low", "eps_high")),
    "cispo": (cispo_loss, ("eps_low", "eps_high")),
    "sapo": (sapo_loss, ("tau_pos", "tau_neg")),
}


def register_advantage_estimator(name, fn):
    """Adds `fn(objective_config, batch, rewards) -> advantages` under `name`."""
    ADVANTAGE_ESTIMATORS[name] = fn


def register_policy_loss(name, fn, fields):
    """Adds a per-token loss `fn(logp, old_logp, adv, mask, **{f: config.loss[f]})`."""
    POLICY_LOSSES[name] = (fn, tuple(fields))


def _require(batch, key, why):
    if key not in batch:
        raise KeyError(f"batch[{key!r}] is required by {why}; the batch has {sorted(batch)}")
    return batch[key]


def validate_objective_config(cfg):
    """Raises ValueError naming the first impossible field of an objective config."""
    _checks.check_group_size(cfg.group_size, cfg.group_size)
    _checks.check_choice("objective.advantage.estimator", cfg.advantage.estimator,
                         tuple(ADVANTAGE_ESTIMATORS))
    _checks.check_choice("objective.loss.kind", cfg.loss.kind, tuple(POLICY_LOSSES))
    _checks.check_choice("objective.aggregation.mode", cfg.aggregation.mode, AGGREGATION_MODES)
    _checks.check_choice("objective.kl.kind", cfg.kl.kind, KL_KINDS)
    _checks.check_choice("objective.overlong.mode", cfg.overlong.mode, OVERLONG_MODES)
    _checks.check_choice("objective.importance.level", cfg.importance.level, IMPORTANCE_LEVELS)
    _checks.check_choice("objective.importance.mode", cfg.importance.mode, IMPORTANCE_MODES)
    _checks.check_choice("objective.advantage.scale", cfg.advantage.scale, ("group", "batch", "none"))
    for field in ("eps_low", "eps_high"):
        _checks.check_nonnegative(f"objective.loss.{field}", cfg.loss[field])
    if cfg.loss.dual_clip is not None:
        _checks.check_greater("objective.loss.dual_clip", cfg.loss.dual_clip, 1.0)
    _checks.check_nonnegative("objective.kl.beta", cfg.kl.beta)
    if cfg.advantage.estimator == "rloo" and cfg.group_size < 2:
        raise ValueError(f"objective.group_size must be >= 2 for rloo, got {cfg.group_size}")
    if cfg.kl.in_reward and cfg.advantage.estimator != "reinforce_pp":
        raise ValueError("objective.kl.in_reward=True needs objective.advantage.estimator="
                         f"'reinforce_pp' (token rewards); got {cfg.advantage.estimator!r}")
    if cfg.overlong.mode == "penalty":
        _checks.check_greater("objective.overlong.cache_len", cfg.overlong.cache_len, 0)
        if cfg.advantage.estimator == "gdpo":
            raise ValueError("objective.overlong.mode='penalty' adds to a scalar reward; with "
                             "gdpo add the length reward as one of the reward columns instead")


def _token_means(named, mask, num_tokens):
    """``{name: [B, T]}`` -> ``{name: token-mean}``, all in one reduction.

    One stacked sum instead of one `aggregate` per metric: XLA on CPU does not fuse
    separate reductions, and the metrics otherwise cost more than the loss itself
    (experiments/bench_objectives.py, section 5).
    """
    if not named:
        return {}
    names = sorted(named)
    valid = mask.astype(bool)
    stacked = jnp.stack([jnp.where(valid, named[k], 0.0) for k in names])
    count = jnp.sum(valid, dtype=jnp.float32) if num_tokens is None else num_tokens
    means = jnp.sum(stacked, axis=(1, 2)) / jnp.maximum(count, 1)
    return dict(zip(names, means))


@dataclasses.dataclass(frozen=True, eq=False)  # hashed by identity, so jax.jit(objective) works
class PolicyObjective:
    """A composed objective; see the module docstring for the batch it reads."""

    config: Any
    advantage_fn: Callable
    loss_fn: Callable
    loss_kwargs: dict

    def advantages(self, batch):
        """`[B]` or `[B, T]` advantages from ``batch["rewards"]`` (+ overlong penalty).

        Group and batch statistics make this a whole-batch computation: call it once on
        the full rollout batch, before splitting into micro-batches.
        """
        cfg = self.config
        rewards = _require(batch, "rewards", "advantages").astype(jnp.float32)
        if cfg.overlong.mode == "penalty":
            rewards = rewards + overlong_penalty(
                _require(batch, "lengths", "overlong.mode='penalty'"),
                max_len=cfg.overlong.max_len, cache_len=cfg.overlong.cache_len)
        return self.advantage_fn(cfg, batch, rewards)

    def loss_mask(self, batch):
        """`[B, T]`: the tokens the loss is normalised over (truncated answers dropped
        when overlong.mode is "mask"); count global num_tokens from this."""
        mask = batch["mask"]
        if self.config.overlong.mode == "mask":
            mask = truncated_mask(mask, _require(batch, "truncated", "overlong.mode='mask'"))
        return mask

    def __call__(self, logp, batch):
        """Returns `(loss, metrics)`: the scalar loss to minimise and scalar metrics."""
        cfg = self.config
        mask = self.loss_mask(batch)
        adv = batch["advantages"] if "advantages" in batch else self.advantages(batch)
        per_token, diagnostics = self.loss_fn(logp, batch["old_logp"], adv, mask, **self.loss_kwargs)
        if cfg.importance.enabled:
            weights = importance_weights(
                batch["old_logp"], _require(batch, "behaviour_logp", "importance.enabled"), mask,
                level=cfg.importance.level, cap=cfg.importance.cap, mode=cfg.importance.mode)
            per_token = per_token * weights
            diagnostics = {**diagnostics, "importance_weight": weights}

        def reduce(x, mode=cfg.aggregation.mode):
            return aggregate(x, mask, mode=mode, num_tokens=batch.get("num_tokens"),
                             num_seqs=batch.get("num_seqs"), norm_len=cfg.aggregation.norm_len)

        if "entropy" in batch:
            diagnostics = {**diagnostics, "entropy": batch["entropy"]}
        metrics = {"policy_loss": reduce(per_token),
                   **_token_means(diagnostics, mask, batch.get("num_tokens"))}
        total = per_token
        if cfg.kl.beta > 0 and not cfg.kl.in_reward:
            kl = kl_penalty(logp, _require(batch, "ref_logp", "kl.beta > 0"), kind=cfg.kl.kind)
            metrics["kl"] = reduce(kl)
            total = total + cfg.kl.beta * kl
        if cfg.entropy_coef != 0:
            total = total - cfg.entropy_coef * _require(batch, "entropy", "entropy_coef != 0")
        loss = reduce(total)
        metrics["loss"] = loss
        return loss, metrics


def policy_objective(config, *, reward_weights=None):
    """Builds the objective selected by an ``objective`` config section.

    Args:
      config: an ml_collections ConfigDict (``config.objective`` of a recipe; see
        configs/base.py for every field and its default).

    Returns:
      a `PolicyObjective`: ``objective(logp, batch) -> (loss, metrics)`` and
      ``objective.advantages(batch)``.

    Raises:
      ValueError: naming the field, when a name is unknown or a value impossible.
    """
    validate_objective_config(config)
    loss_fn, fields = POLICY_LOSSES[config.loss.kind]
    return PolicyObjective(
        config=config,
        advantage_fn=ADVANTAGE_ESTIMATORS[config.advantage.estimator],
        loss_fn=loss_fn,
        loss_kwargs={f: config.loss[f] for f in fields})
