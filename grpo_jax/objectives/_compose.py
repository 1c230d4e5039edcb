"""The composer: a config section in, a pure objective out.

``policy_objective(config.objective, reward_weights=...)`` returns a `PolicyObjective`, a
callable ``(logp, batch) -> (loss, metrics)`` that a trainer differentiates without knowing
which recipe it runs. Adding a variant is one function, one registry line (the registries
are in `_registry`) and one config:

      register_policy_loss("my_loss", my_loss_fn, fields=("eps_low", "eps_high"))

The batch is a dict of arrays (B = P * G rows, T response tokens); docs/objectives.md
has the table of its keys (`_batch.BATCH_KEYS`), and ``describe(objective)`` lists the
ones an objective reads, required and optional. A key no objective reads raises, naming
the closest known key.

Global counts (micro-batching, sharding): ``num_tokens`` is ``loss_mask(batch).sum()``
over the whole minibatch, the tokens the loss is normalised over (truncated answers
already removed when overlong.mode == "mask"); ``num_seqs`` counts the real rows (padding
rows excluded, truncated rows included, as `aggregate`'s default B does). With them the
losses and metrics of micro-batches add up to those of the full batch, except M2PO's,
Clip-Cov's, KL-Cov's and top_entropy_quantile's, whose token selection is a statistic of
the micro-batch, and aggregation "bnpo"'s, a micro-batch's own token mean
(docs/objectives.md, "Objectives that depend on the micro-batch").

Metrics, each a scalar:

  =====================  ===============================================  ================
  name                   what it is                                       averaged
  =====================  ===============================================  ================
  ``loss``               the loss minimised: policy + beta KL - entropy   aggregation mode
                         (+ mu positive_nll)
  ``policy_loss``        the policy term alone, after importance weights  aggregation mode
                         and the off-policy mask
  ``kl_ref``             the KL-to-reference estimate (kl.kind) of        aggregation mode
                         KL(pi_theta || pi_ref), before beta; when
                         kl.beta > 0 and not kl.in_reward
  ``ratio``              pi_theta / pi_old per token (gspo: s_i; gmpo:    token mean
                         the unclipped geometric mean of its answer)
  ``kl_old``             r - 1 - log r: the k3 estimate of                token mean
                         KL(pi_old || pi_theta) from pi_old's samples
  ``clip_low``           share of tokens the lower clip binds             token mean
                         (ppo_clip, gspo, cispo, gmpo, clip_cov; dppo:
                         A < 0 tokens out of its trust region)
  ``clip_high``          share of tokens the upper (eps_high) clip binds  token mean
                         (same losses; dppo: A > 0 tokens out of it)
  ``clip_dual``          share of tokens the dual clip caps (ppo_clip     token mean
                         with loss.dual_clip)
  ``gate_scale``         sapo's factor on each token's policy gradient    token mean
  ``divergence``         dppo's binary TV or KL between pi_theta and      token mean
                         pi_old on the sampled token
  ``ratio_capped``       share of tokens whose dppo weight is capped      token mean
  ``cov_detached``       share of tokens clip_cov leaves out              token mean
  ``cov_penalized``      share of tokens kl_cov penalises                 token mean
  ``m2po_masked``        share of tokens M2PO's mask drops (m2po)         token mean
  ``entropy_kept``       share of tokens the top-entropy selection keeps  token mean
                         (top_entropy_quantile < 1)
  ``vespo_weight``       vespo's sequence weight phi(w) per token         token mean
  ``importance_weight``  the sampler/trainer correction weight            token mean
                         (importance.enabled), after its bounds
  ``importance_masked``  share of tokens whose weight the mask zeroes     token mean
                         (importance.mode == "mask")
  ``importance_          share of tokens whose weight the cap lowers      token mean
  truncated``            (importance.mode == "truncate")
  ``entropy``            the token entropy (batch has ``entropy``)        token mean
  ``offpolicy_masked``   share of rows the off-policy sequence mask       sum / num_seqs
                         drops (offpolicy_mask.enabled)
  ``positive_nll``       VAPO's positive-example LM loss: the NLL of the  token mean over
                         correct answers' tokens, before its weight mu    correct answers
                         (positive_nll_weight > 0)
  ``nonfinite_logp``     share of tokens whose logp or old_logp is NaN    token mean
                         or infinite (the loss is then NaN)
  ``nonfinite_           rows whose reward is NaN or infinite (batch has  count
  rewards``              ``rewards``): advantage 0
  =====================  ===============================================  ================

"Token mean" is the sum over `loss_mask` tokens / num_tokens, "sum / num_seqs" the count
over rows / num_seqs: both use the same global counts as the loss, so the metrics of
micro-batches add up to those of the full batch. The per-token diagnostics cover every
token of `loss_mask`, rows the off-policy mask drops included.
"""

import dataclasses
from typing import Callable

import jax
import jax.numpy as jnp

from grpo_jax.objectives import _batch, _checks
from grpo_jax.objectives._aggregation import aggregate
from grpo_jax.objectives._kl import kl_penalty
from grpo_jax.objectives._mismatch import rollout_correction
from grpo_jax.objectives._registry import (ADVANTAGE_ESTIMATORS, POLICY_LOSSES, RANDOM_LOSSES,
                                           REWARDLESS_ESTIMATORS, required)
from grpo_jax.objectives._shaping import offpolicy_sequence_mask, truncated_mask
from grpo_jax.objectives._spec import ObjectiveSpec, objective_spec
from grpo_jax.objectives._trl_variants import top_entropy_mask
from grpo_jax.objectives._trust_region import m2po_mask

sg = jax.lax.stop_gradient


def _keyword(spec, field):
    """A registry field -> ``(keyword, value)`` from `spec`."""
    name, keyword = (field, field) if isinstance(field, str) else field
    return keyword, getattr(spec, name)


def _loss_key(batch):
    """The PRNG key of a random loss: from ``batch["loss_seed"]``, `[B]` integers (one
    per row, so a trainer's row splits carry them); a micro-batch draws with the key of
    its first row's seed."""
    seeds = required(batch, "loss_seed", "objective.loss.kind='clip_cov' (its random draw)")
    return jax.random.key(seeds[0])


def validate_objective_config(config):
    """Raises ValueError naming the first impossible (or unknown) field of an objective
    config section (or nested dict); returns its frozen `ObjectiveSpec`."""
    return objective_spec(config)


# Estimators that leave a non-finite reward out of their statistics themselves.
NONFINITE_AWARE = ("group", "rloo", "gdpo")


def _nonfinite_rewards(rewards):
    """Rows whose reward (any column) is NaN or infinite: they get advantage 0. A count,
    so micro-batches add up to the batch's."""
    rows = ~jnp.isfinite(jnp.asarray(rewards).astype(jnp.float32))
    rows = jnp.any(rows, axis=1) if rows.ndim == 2 else rows
    return jnp.sum(rows, dtype=jnp.float32)


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
    """A composed objective; see the module docstring for the batch it reads.

    ``spec`` is its frozen `ObjectiveSpec`: the hyper-parameters were bound when it was
    built, so changing the config section it came from afterwards changes nothing.
    """

    spec: ObjectiveSpec
    advantage_fn: Callable
    loss_fn: Callable
    loss_kwargs: dict
    reward_weights: tuple | None = None
    extra_keys: tuple = ()

    def accepting(self, *keys):
        """A copy that accepts (and ignores) batch `keys` of the caller's own."""
        return dataclasses.replace(self, extra_keys=self.extra_keys + tuple(keys))

    def batch_keys(self):
        """``{"required": (...), "optional": (...)}``: the batch keys this objective reads
        (``advantages`` or ``rewards`` is required: either one). `describe` prints them."""
        spec = self.spec
        needs = {"old_logp": True, "mask": True, "advantages": False, "rewards": False,
                 "ref_logp": spec.kl_beta > 0, "values": spec.estimator == "gae",
                 "correct": spec.positive_nll_weight > 0,
                 "entropy": spec.entropy_coef != 0 or spec.top_entropy_quantile < 1,
                 "behaviour_logp": spec.importance, "truncated": spec.overlong == "mask",
                 "loss_seed": spec.policy_loss in RANDOM_LOSSES,
                 "teacher_logp": spec.estimator in REWARDLESS_ESTIMATORS}
        optional = ["prompt_ids", "row_valid", "num_tokens", "num_seqs", "entropy_coef"]
        if spec.positive_nll_weight > 0:
            optional.append("num_positive_tokens")
        if spec.entropy_coef == 0 and spec.top_entropy_quantile == 1:
            optional.append("entropy")
        if (spec.m2po or spec.offpolicy_mask) and not spec.importance:
            optional.append("behaviour_logp")
        required_keys = tuple(k for k, need in needs.items() if need)
        if spec.estimator in REWARDLESS_ESTIMATORS:
            optional_keys = ("advantages",) + tuple(optional)
        else:
            optional_keys = ("advantages", "rewards") + tuple(optional)
        return {"required": required_keys, "optional": optional_keys}

    def _prepared(self, batch, *, need_mask=True):
        """`batch` checked (every key known, ``mask`` present) with lists made arrays."""
        _batch.check_keys(batch, self.extra_keys, need_mask=need_mask)
        return _batch.as_arrays(batch)

    def advantages(self, batch):
        """`[B]` or `[B, T]` advantages from ``batch["rewards"]``.

        Group and batch statistics make this a whole-batch computation: call it once on
        the full rollout batch, before splitting into micro-batches.

        A row whose reward is NaN or infinite (any column, for gdpo) is unscorable: its
        advantage is 0 and the others' are computed without it (group, rloo and gdpo
        leave it out of their statistics; reinforce_pp and gae out of their whitening,
        reinforce_pp's group baseline counting it as 0); the objective's metric
        ``nonfinite_rewards`` counts such rows.

        With ``batch["prompt_ids"]`` (`[B]`, one id per row naming its prompt) the layout
        is checked: every group of G consecutive rows one prompt, neighbouring groups
        different prompts; a concrete array raises ValueError naming the first bad group,
        a traced one (under jit) makes every advantage NaN. Without it only "G divides B"
        can be checked: a wrong G that divides B, or interleaved rows, give other
        advantages without an error.
        """
        batch = self._prepared(batch, need_mask=False)
        if self.spec.estimator in REWARDLESS_ESTIMATORS:
            adv = self.advantage_fn(self.spec, batch, None, self.reward_weights)
            return self._layout_checked(adv, batch, "objective.advantages")
        rewards = required(batch, "rewards", "advantages")
        _checks.check_real("objective.advantages", rewards=rewards)
        rewards = rewards.astype(jnp.float32)
        finite = jnp.isfinite(rewards)
        finite = jnp.all(finite, axis=1) if finite.ndim == 2 else finite
        if self.spec.estimator not in NONFINITE_AWARE:
            # Unscorable rows: reward 0 and out of the mask the estimator whitens over.
            rewards = jnp.where(jnp.isfinite(rewards), rewards, 0.0)
            if "mask" in batch:
                mask = batch["mask"]
                batch = {**batch, "mask": mask * finite[:, None].astype(mask.dtype)}
        adv = self.advantage_fn(self.spec, batch, rewards, self.reward_weights)
        adv = jnp.where(finite[:, None] if adv.ndim == 2 else finite, adv, 0.0)
        return self._layout_checked(adv, batch, "objective.advantages")

    def _layout_checked(self, adv, batch, fn):
        """`adv`, after checking ``batch["prompt_ids"]`` when present (NaN if traced and
        wrong; `_batch.check_group_layout`)."""
        if "prompt_ids" not in batch:
            return adv
        ok = _batch.check_group_layout(batch["prompt_ids"], self.spec.group_size, fn=fn)
        return jnp.where(ok, adv, jnp.nan)

    def loss_mask(self, batch):
        """`[B, T]`: the tokens the loss is normalised over.

        ``batch["mask"]`` with every token of a truncated answer zeroed when
        overlong.mode == "mask" (DAPO's overlong filtering), and nothing else. A trainer
        that splits the batch counts ``num_tokens`` from this mask over the whole
        minibatch, so the split loss equals the whole batch's.
        """
        batch = self._prepared(batch)
        mask = batch["mask"]
        if self.spec.overlong == "mask":
            mask = truncated_mask(mask, required(batch, "truncated", "overlong.mode='mask'"))
        return mask

    def global_counts(self, batch):
        """The counts the loss normalises by, over `batch` (a whole minibatch): ``num_tokens``
        (`loss_mask` tokens), ``num_seqs`` (real rows: ``batch["row_valid"]`` when present,
        else every row) and, with ``positive_nll_weight > 0``, ``num_positive_tokens``.
        A trainer that splits the minibatch passes them with each piece."""
        batch = self._prepared(batch)
        mask = self.loss_mask(batch)
        rows = batch.get("row_valid", jnp.ones(mask.shape[:1], bool))
        counts = {"num_tokens": jnp.sum(mask, dtype=jnp.float32),
                  "num_seqs": jnp.sum(rows, dtype=jnp.float32)}
        if self.spec.positive_nll_weight > 0:
            correct = required(batch, "correct", "positive_nll_weight > 0")
            counts["num_positive_tokens"] = jnp.sum(mask * correct[:, None], dtype=jnp.float32)
        return counts

    def __call__(self, logp, batch):
        """Returns `(loss, metrics)`: the scalar loss to minimise and scalar metrics."""
        spec = self.spec
        batch = self._prepared(batch)
        logp = jnp.asarray(logp) if isinstance(logp, (list, tuple)) else logp
        mask = self.loss_mask(batch)
        num_tokens, num_seqs = batch.get("num_tokens"), batch.get("num_seqs")
        if "advantages" in batch:
            adv = self._layout_checked(batch["advantages"], batch, "objective")
        else:
            adv = self.advantages(batch)
        old_logp = required(batch, "old_logp", "every objective (pi_old's log-probs, [B, T])")
        kwargs = dict(self.loss_kwargs)
        if spec.policy_loss in RANDOM_LOSSES:
            kwargs["key"] = _loss_key(batch)
        per_token, diagnostics = self.loss_fn(logp, old_logp, adv, mask, **kwargs)
        metrics = {}
        if "rewards" in batch:
            metrics["nonfinite_rewards"] = _nonfinite_rewards(batch["rewards"])
        # Loss tokens whose log-probs are NaN or infinite (the loss is then NaN): a token
        # mean, reduced with the other diagnostics in one pass.
        diagnostics = {**diagnostics, "nonfinite_logp": ~(jnp.isfinite(logp)
                                                           & jnp.isfinite(old_logp))}
        if spec.importance:   # pi_old (trainer) vs the sampler's behaviour policy
            weights, correction = rollout_correction(
                old_logp, required(batch, "behaviour_logp", "importance.enabled"), mask,
                level=spec.importance_level, mode=spec.importance_mode,
                low=spec.importance_low, high=spec.importance_high)
            per_token = per_token * weights
            bounded = (
                "importance_masked" if spec.importance_mode == "mask" else "importance_truncated"
            )
            diagnostics = {**diagnostics, "importance_weight": weights,
                           bounded: correction["masked" if spec.importance_mode == "mask"
                                               else "truncated"]}
        if spec.offpolicy_mask:   # against the policy that sampled the tokens
            keep = offpolicy_sequence_mask(
                logp, batch.get("behaviour_logp", old_logp), adv, mask,
                delta=spec.offpolicy_delta)
            per_token = per_token * keep[:, None]
            metrics["offpolicy_masked"] = jnp.sum(1.0 - keep) / (
                mask.shape[0] if num_seqs is None else jnp.maximum(num_seqs, 1))
        if spec.m2po:   # M2PO: the largest squared log-ratios until their mean fits tau
            keep = m2po_mask(logp, batch.get("behaviour_logp", old_logp), mask,
                             tau=spec.m2po_tau)
            per_token = per_token * keep
            diagnostics = {**diagnostics, "m2po_masked": (1.0 - keep) * mask}
        if spec.top_entropy_quantile < 1:   # "80/20": the policy loss on forking tokens only
            keep = top_entropy_mask(
                required(batch, "entropy", "top_entropy_quantile < 1"), mask,
                quantile=spec.top_entropy_quantile)
            per_token = per_token * keep
            diagnostics = {**diagnostics, "entropy_kept": keep}
        if "entropy" in batch:
            diagnostics = {**diagnostics, "entropy": batch["entropy"]}

        # bnpo weighs a micro-batch by its share of the real rows.
        local_seqs = (jnp.sum(batch["row_valid"], dtype=jnp.float32)
                      if "row_valid" in batch and spec.aggregation == "bnpo" else None)

        def reduce(x):
            return aggregate(x, mask, mode=spec.aggregation, num_tokens=num_tokens,
                             num_seqs=num_seqs, norm_len=spec.norm_len, local_seqs=local_seqs)

        metrics.update(policy_loss=reduce(per_token), **_token_means(diagnostics, mask, num_tokens))
        total = per_token
        if spec.kl_beta > 0 and not spec.kl_in_reward:
            kl = kl_penalty(logp, required(batch, "ref_logp", "kl.beta > 0"), kind=spec.kl_kind,
                            old_logp=old_logp)
            metrics["kl_ref"] = reduce(kl)
            total = total + spec.kl_beta * kl
        if "entropy_coef" in batch:   # a step's coefficient (adaptive entropy control)
            total = total - sg(jnp.asarray(batch["entropy_coef"], jnp.float32)) * required(
                batch, "entropy", "batch['entropy_coef']")
        elif spec.entropy_coef != 0:
            total = total - spec.entropy_coef * required(batch, "entropy", "entropy_coef != 0")
        loss = reduce(total)
        if spec.positive_nll_weight > 0:   # VAPO: imitate the batch's correct answers
            positive = mask * required(batch, "correct", "positive_nll_weight > 0")[:, None]
            nll = aggregate(-logp, positive, mode="token-mean",
                            num_tokens=batch.get("num_positive_tokens"))
            metrics["positive_nll"] = nll
            loss = loss + spec.positive_nll_weight * nll
        metrics["loss"] = loss
        return loss, metrics


def describe(objective: PolicyObjective) -> str:
    """The batch keys `objective` reads, required and optional, one a line with its shape
    and meaning (docs/objectives.md has the table of every key);
    ``objective.batch_keys()`` gives the same as tuples.
    """
    keys = objective.batch_keys()
    lines = [f"batch keys of {objective.spec.policy_loss} / {objective.spec.estimator} "
             f"({objective.spec.aggregation}):"]
    for kind in ("required", "optional"):
        if kind == "optional" and "rewards" in keys[kind]:
            lines.append("optional (advantages or rewards is required):")
        elif kind == "optional":
            lines.append("optional:")
        else:
            lines.append("required:")
        for key in keys[kind]:
            shape, meaning = _batch.BATCH_KEYS[key]
            lines.append(f"  {key:<15} {shape:<15} {meaning}")
    return "\n".join(lines)


def policy_objective(config, *, reward_weights=None):
    """Builds the objective an ``objective`` config section, nested dict or spec selects.

    Args:
      config: a recipe's ``config.objective`` (an ml_collections ConfigDict; see
        configs/base.py), a nested dict of the same shape (fields left out take
        `ObjectiveSpec`'s defaults; group_size is required), or an `ObjectiveSpec`
        (what the presets in `grpo_jax.objectives.presets` build).
      reward_weights: one weight per reward column, in the order of the run's reward
        specs (``reward.specs``), or None for all 1. The gdpo estimator weights its
        normalised columns with them; the others see a single (already summed) reward.

    Returns:
      a `PolicyObjective`: ``objective(logp, batch) -> (loss, metrics)``,
      ``objective.advantages(batch)`` and ``objective.loss_mask(batch)``, its
      hyper-parameters frozen in ``objective.spec``.

    Raises:
      ValueError: naming the field, when a name is unknown (with the closest valid
        name) or a value impossible.
    """
    spec = objective_spec(config)
    loss_fn, fields = POLICY_LOSSES[spec.policy_loss]
    return PolicyObjective(
        spec=spec,
        advantage_fn=ADVANTAGE_ESTIMATORS[spec.estimator],
        loss_fn=loss_fn,
        loss_kwargs=dict(_keyword(spec, f) for f in fields),
        reward_weights=None if reward_weights is None else tuple(float(w) for w in reward_weights))
