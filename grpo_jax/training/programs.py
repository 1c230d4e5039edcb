"""The programs a run compiles, built in one place for the trainers and the fit report.

`rl.train` and `sft.train` build their optimizers, update steps, log-prob and value
functions here from concrete parameters; `grpo_jax.aot` builds the same from abstract
ones (`jax.ShapeDtypeStruct`s carrying shardings), so the fit report compiles exactly
what the trainer runs. `batch_layout` is the rollout batch the RL update reads: the
trainer checks every batch it builds against it, and the fit report lowers with it.
"""

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any, Callable

import jax
import jax.numpy as jnp
import ml_collections
from flax import nnx

from grpo_jax import config_lib, models, objectives, parallel, rewards
from grpo_jax.training import batch as batch_lib
from grpo_jax.training import critic as critic_lib, distill, entropy_control, optimizer, steps


@dataclasses.dataclass(frozen=True)
class Programs:
    """One model's optimizer and the jitted functions a run calls on it.

    Attributes:
      tx: the optax optimizer (its schedule spans the run's updates).
      opt_shardings: the sharding of every leaf of ``tx.init(params)``.
      update: ``(params, opt_state, rows, index[, sft_rows, sft_index]) -> (params,
        opt_state, metrics)``, one optimizer step on the rows at `index`.
      forward: ``(params, rows) -> [B, N]``: completion log-probs (the policy) or values
        (the critic), `pieces` rows at a time; None for SFT.
      pieces: how many pieces the batch's rows are split into for `forward`, as an update
        splits them (train.minibatches x train.micro_batches).
      trained: the `nnx` filter of the parameters the update trains (`trained_filter`).
    """

    tx: Any
    opt_shardings: Any
    update: Callable
    forward: Callable | None
    pieces: int
    trained: Any = nnx.Param

    def trained_part(self, params: nnx.State) -> nnx.State:
        """The part of `params` (an `nnx.State`) the update trains: what the optimizer
        state mirrors and a checkpoint holds."""
        return nnx.filter_state(params, self.trained)


def trained_filter(config: ml_collections.ConfigDict) -> type[nnx.Param]:
    """`nnx.LoRAParam` (the adapters only) when ``model.lora.rank`` > 0, else every
    `nnx.Param`."""
    return nnx.LoRAParam if config.model.lora.rank > 0 else nnx.Param


def policy_loss(
    objective: objectives.PolicyObjective, temperature: float
) -> Callable[[nnx.Module, dict[str, jax.Array]], tuple[jax.Array, dict[str, jax.Array]]]:
    """The loss of one micro-batch: completion log-probs at the rollout temperature ->
    the recipe's objective (+ the MoE load-balancing loss). Its metrics add the moments
    of the token log-ratio (`log_ratio_moments`) and, for an MoE whose rows carry the
    sampler's experts, ``routing_churn``: the token mean of the share of MoE layers
    whose top-k experts now differ from the sampler's (`batch.completion_logprobs`)."""

    def loss_fn(model, micro):
        micro = entropy_control.step_coef(micro)   # adaptive entropy control's coefficient
        churn = bool(model.cfg.n_experts) and batch_lib.sampled_routing(micro) is not None
        logp, entropy, aux_loss, *changed = batch_lib.completion_logprobs(
            model, micro, temperature=temperature, with_stats=True, with_churn=churn)
        loss, metrics = objective(logp, {**micro, "entropy": entropy})
        mask = objective.loss_mask(micro)
        # num_tokens counts the minibatch's loss tokens (overlong masking may leave some
        # out), so each micro-batch's token means add up to the minibatch's
        tokens = jnp.maximum(micro["num_tokens"], 1)
        metrics = {**metrics, **log_ratio_moments(logp, micro["old_logp"], mask, tokens)}
        if churn:
            metrics["routing_churn"] = jnp.sum(changed[0] * mask) / tokens
        if model.cfg.n_experts:   # keep the experts balanced; micro-batches add up to 1
            share = jnp.sum(mask) / tokens
            loss = loss + model.cfg.router_aux_loss_coef * aux_loss * share
            metrics = {**metrics, "loss": loss, "router_aux_loss": aux_loss * share}
        return loss, metrics

    return loss_fn


def log_ratio_moments(logp: jax.Array, old_logp: jax.Array, mask: jax.Array,
                      num_tokens: jax.Array) -> dict[str, jax.Array]:
    """``log_ratio_mean`` and ``log_ratio_sq_mean``: the token means of log(pi_theta /
    pi_old) and of its square over `mask`, divided by the global `num_tokens`, so the
    micro-batches' values add up to the minibatch's (`log_ratio_spread` then takes the
    standard deviation). Per token whatever the loss (GSPO's sequence ratio included):
    the spread of the token ratios that routing changes make noisy (GSPO, Zheng et al.,
    arXiv:2507.18071, sec. 5.3).

    Args:
      logp, old_logp: `[b, N]` log-probs under pi_theta and pi_old.
      mask: `[b, N]` the loss tokens; num_tokens: `[]` the minibatch's count of them.
    """
    d = jax.lax.stop_gradient(logp - old_logp) * mask
    return {"log_ratio_mean": jnp.sum(d) / num_tokens,
            "log_ratio_sq_mean": jnp.sum(d * d) / num_tokens}


def log_ratio_spread(metrics: Mapping[str, jax.Array]) -> dict[str, jax.Array]:
    """The summed metrics of an update with ``log_ratio_std``, sqrt(E[(log r)^2] - E[log
    r]^2) over the minibatch's loss tokens, in place of ``log_ratio_sq_mean``."""
    metrics = dict(metrics)
    mean, square = metrics["log_ratio_mean"], metrics.pop("log_ratio_sq_mean")
    metrics["log_ratio_std"] = jnp.sqrt(jnp.maximum(square - mean * mean, 0.0))
    return metrics


def rl_objective(config: ml_collections.ConfigDict) -> objectives.PolicyObjective:
    """The run's objective, its reward weights those of ``reward.specs`` (GDPO's)."""
    weights = rewards.spec_weights(rewards.as_specs(config.reward.specs))
    return objectives.policy_objective(config.objective, reward_weights=weights)


PACKING = ("auto", "on", "off")
PACK_FROM_TOKENS = 256   # "auto" packs from this completion budget on (docs/performance.md)


def packs(config: ml_collections.ConfigDict) -> bool:
    """Whether the run's forward passes (pi_old, pi_ref, values, updates) run packed:
    ``train.packing`` "on", or "auto" with a completion budget of at least
    `PACK_FROM_TOKENS` tokens, where packing measured faster."""
    if config.train.packing not in PACKING:
        raise ValueError(f"train.packing must be one of {PACKING}, got {config.train.packing!r}")
    if config.train.packing == "auto":
        return config.rollout.max_new_tokens >= PACK_FROM_TOKENS
    return config.train.packing == "on"


def updates_per_step(config: ml_collections.ConfigDict) -> int:
    """Optimizer updates per RL step: train.epochs x train.minibatches."""
    return config.train.epochs * config.train.minibatches


def _pieces(config):
    return config.train.minibatches * config.train.micro_batches


def _programs(tx, graphdef, params, mesh, loss_fn, count_fn, *, micro_batches, forward,
              pieces, sft_weight=0.0, trained=nnx.Param, donate_params=True, finish_metrics=None):
    opt_shardings = steps.optimizer_state_shardings(tx, nnx.filter_state(params, trained), mesh)
    update = steps.make_update_step(
        graphdef, tx, loss_fn, count_fn, mesh=mesh, param_shardings=parallel.tree_shardings(params),
        opt_shardings=opt_shardings, micro_batches=micro_batches, sft_weight=sft_weight,
        trained=trained, donate_params=donate_params, finish_metrics=finish_metrics)
    return Programs(tx, opt_shardings, update, forward, pieces, trained)


def policy_programs(config: ml_collections.ConfigDict, mesh: jax.sharding.Mesh,
                    graphdef: nnx.GraphDef, params: nnx.State,
                    objective: objectives.PolicyObjective) -> Programs:
    """The RL policy's optimizer, update step and log-prob function.

    `params` may be concrete or abstract; only their shardings are read. An asynchronous
    run's update does not donate the parameters: the rollout thread may be sampling with
    the frozen ones (a LoRA run's base) or a lagged copy while it runs.
    """
    temperature = config.rollout.temperature
    tx = optimizer.make_optimizer(config.optimizer, config.train.steps * updates_per_step(config))
    logprob = batch_lib.make_logprob_fn(graphdef, mesh, temperature=temperature,
                                        num_pieces=_pieces(config))
    return _programs(tx, graphdef, params, mesh, policy_loss(objective, temperature),
                     objective.global_counts, micro_batches=config.train.micro_batches,
                     forward=logprob, pieces=_pieces(config), sft_weight=config.train.sft_weight,
                     trained=trained_filter(config), donate_params=not config.async_rl.enabled,
                     finish_metrics=log_ratio_spread)


def critic_programs(config: ml_collections.ConfigDict, mesh: jax.sharding.Mesh,
                    graphdef: nnx.GraphDef, params: nnx.State) -> Programs:
    """PPO's critic: its own optimizer (over value pre-training and the RL steps), its
    update on the policy's minibatches and its value function."""
    total = config_lib.last_rl_step(config) * updates_per_step(config)
    tx = optimizer.make_optimizer(config.critic.optimizer, total)
    values = critic_lib.make_value_fn(graphdef, mesh, num_pieces=_pieces(config))
    return _programs(tx, graphdef, params, mesh, critic_lib.make_loss(config.critic.value_clip),
                     batch_lib.token_counts, micro_batches=config.train.micro_batches,
                     forward=values, pieces=_pieces(config))


def sft_programs(config: ml_collections.ConfigDict, mesh: jax.sharding.Mesh, graphdef: nnx.GraphDef,
                 params: nnx.State) -> Programs:
    """Supervised fine-tuning: token-mean NLL of the reference solutions."""
    tx = optimizer.make_optimizer(config.sft.optimizer, config.sft.steps)
    return _programs(tx, graphdef, params, mesh, batch_lib.nll_loss, batch_lib.token_counts,
                     micro_batches=config.train.micro_batches, forward=None, pieces=1,
                     trained=trained_filter(config))


def batch_layout(config: ml_collections.ConfigDict, model_cfg: models.ModelConfig,
                 prompt_len: int) -> dict[str, tuple[tuple[int, ...], jax.typing.DTypeLike]]:
    """The rollout batch an RL update reads: ``{key: (shape, dtype)}``.

    What the sampler returns (`rollout.collect`, with its records when the run keeps
    them) plus what the loop adds before the updates: pi_old's log-probs, pi_ref's
    (kl.beta > 0), the critic's values and targets (critic.enabled), the advantages and
    a random loss's per-row seeds. P prompts x G completions of S + N tokens (with an
    environment, ``context_mask`` besides ``mask``).
    """
    from grpo_jax.training import rollout
    p, g = config.rollout.prompts_per_batch, config.objective.group_size
    b, s, n = p * g, prompt_len, config.rollout.max_new_tokens
    columns = len(rewards.as_specs(config.reward.specs))
    gdpo = config.objective.advantage.estimator == "gdpo"
    layout = {
        "prompt_tokens": ((b, s), jnp.int32), "prompt_mask": ((b, s), jnp.int32),
        "tokens": ((b, n), jnp.int32), "mask": ((b, n), jnp.int32),
        "behaviour_logp": ((b, n), jnp.float32), "old_logp": ((b, n), jnp.float32),
        "lengths": ((b,), jnp.int32), "truncated": ((b,), bool), "correct": ((b,), bool),
        "rewards": ((b, columns) if gdpo else (b,), jnp.float32), "row_valid": ((b,), bool),
        **rollout.record_layout(config, model_cfg, b, s, n),
    }
    if config.environment.name:   # multi-turn: the loss's mask and what the forward reads
        layout["context_mask"] = ((b, n), jnp.int32)
    if config.objective.kl.beta > 0:
        layout["ref_logp"] = ((b, n), jnp.float32)
    if config.critic.enabled:
        layout["values"] = layout["returns"] = ((b, n), jnp.float32)
    layout.update(distill.layout(config, b, n))   # distillation hook: teacher_logp
    layout.update(entropy_control.layout(config, b))   # adaptive entropy's coefficient
    objective = rl_objective(config)
    if objective.spec.policy_loss in objectives.RANDOM_LOSSES:
        layout["loss_seed"] = ((b,), jnp.int32)
    abstract = {k: jax.ShapeDtypeStruct(shape, dtype) for k, (shape, dtype) in layout.items()}
    advantages = jax.eval_shape(distill.advantages_fn(config, objective), abstract)
    layout["advantages"] = (advantages.shape, advantages.dtype)
    return layout


def check_batch(batch: Mapping[str, jax.Array], layout_keys: Iterable[str], *,
                pretraining: bool) -> None:
    """Raises if the loop's batch has other keys than `batch_layout` names (what the fit
    report compiles for); during value pre-training only the critic's keys are added."""
    expected = set(layout_keys)
    if pretraining:
        expected -= {"old_logp", "ref_logp", "advantages", "loss_seed", "teacher_logp",
                     entropy_control.KEY}
    if set(batch) != expected:
        raise AssertionError(
            f"the RL batch has keys {sorted(set(batch) - expected)} that "
            f"training.programs.batch_layout does not list, and lacks "
            f"{sorted(expected - set(batch))}: update batch_layout so the fit report "
            "compiles what the trainer runs")
