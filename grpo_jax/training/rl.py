"""The RL loop, top to bottom: rollout -> rewards -> advantages -> updates -> metrics -> checkpoint.

    python -m grpo_jax.main --config configs/dapo.py:runlocal=True --workdir /tmp/dapo

The batch lives on the mesh from the moment its prompts enter it: the sampler's tokens,
the behaviour, old and reference log-probs, the advantages and the minibatches are
global arrays whose rows are split over the mesh's row axes. A process's host sees the
rows it scores (`rollout.draw`) and the metrics, nothing else. Each step makes
``train.epochs x train.minibatches`` optimizer updates on one rollout batch, so from the
second update on the policy is off the behaviour policy and the clip (or gate, or cap)
of the recipe acts.

A run goes through phases, each before the next, and the loop's body never asks which
one it is in: the SFT warm start (`warm_start.prepared`, before the loop), VAPO's value
pre-training (steps 1..P, P = ``critic.pretrain_steps``: `critic_pretraining_step`),
then the ``train.steps`` RL steps (P+1..P+T: `rl_step`). `schedule` picks each step's
function once per phase; the loop's tail (metrics, then `loop.Tail`: the time limit,
preemption, the checkpoint) is the same for both. With a critic (``critic.enabled``:
PPO, VAPO), a value model gives every completion token its value, the policy's
advantages are GAE over them, and the critic makes the same ``epochs x minibatches``
updates toward its targets.

Each step takes its rollouts from the run's source (`rollout_source`, one interface):
sampled in the step (`rollout_source.Synchronous`); with ``async_rl.enabled`` by a
producer thread that samples the next steps while this loop updates
(`rollout_source.Asynchronous`); on several processes with ``rollout.mesh`` by the
rollout mesh's processes while the others run this loop (`roles`). With ``rollout.mesh``
on one process the rollouts are sampled on devices of their own
(`rollout_source.collect`: the parameters copied there, the batch copied back). With
``rollout.partial.enabled`` rows past a per-step token budget carry over to the next
step (`partial`): the source holds the pool of groups in flight, and a checkpoint saves
it. The run's state and life cycle (`Run`, set-up, restore, export) are `rl_run`'s; the
config checks `rl_checks`'; the updates on a batch `steps.update_on_batch`.

The config is read, never written: `train` works on a resolved, read-only copy
(`config_lib.resolve_run_paths`), the warm start makes a new one, and the run's config is
printed once and saved as ``workdir/config.json``.

Re-running the same command resumes from the last checkpoint (in either phase):
parameters, optimizer state (the critic's too), step and every process's data position
are restored, and the step's RNG is `fold_in(seed, step)`, so the resumed run continues
exactly as an uninterrupted one would.
"""

import time
from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.numpy as jnp

from grpo_jax import config_lib, objectives, parallel
from grpo_jax.training import (
    async_rl,
    checkpoint,
    distill,
    entropy_control,
    evaluation,
    footprint,
    loop,
    packing,
    partial,
    programs,
    rl_checks,
    rl_run,
    roles,
    rollout_source,
    steps,
    warm_start,
)
from grpo_jax.training import critic as critic_lib
from grpo_jax.training import metrics as metrics_lib
from grpo_jax.training import policy as policy_lib
from grpo_jax.training import task as task_lib


def schedule(config: Any, start: int) -> Iterator[tuple[int, Callable]]:
    """`(step, step function)` for every step after `start`: `critic_pretraining_step`
    for steps 1..P (P = ``critic.pretrain_steps``), then `rl_step` for P+1..P+T
    (T = ``train.steps``). The function is chosen once per phase."""
    pretrain = config.critic.pretrain_steps
    phases = ((critic_pretraining_step, 1, pretrain),
              (rl_step, pretrain + 1, config_lib.last_rl_step(config)))
    for take_step, first, last in phases:
        for step in range(max(first, start + 1), last + 1):
            yield step, take_step


def _rollouts(run, step):
    """The step's rollouts and rewards from the run's source (`rollout_source`; DAPO's
    dynamic sampling draws more if asked): publishes the parameters of the step's start
    (theta_{step-1}) to it, takes the step's batch and finds the version that sampled it
    among the lagged copies, for pi_old; the lag moves on by one. Returns `(batch,
    metrics, examples, behaviour)`: `rollout.collect`'s three, with ``staleness`` (the
    steps between the parameters that sampled and the current ones) in the metrics, and
    the `Policy` that sampled."""
    policy, k = run.policy, len(run.lagged)
    current = run.policy_programs.trained_part(policy.params)
    # With a lag, theta_{step-1} is kept past the step's updates (which may donate the
    # policy's arrays): copied before a source that keeps what it is given (a producer
    # samples with it during the updates), after sampling for the synchronous one (which
    # keeps nothing), so no second copy of the parameters is live while it samples.
    copy_first = k and not isinstance(run.source, rollout_source.Synchronous)
    if copy_first:
        current = rl_run.copy_params(current)
    run.source.publish(step - 1, current)
    produced = run.source.take(step)
    if k and not copy_first:
        current = rl_run.copy_params(current)
    # lagged[i] holds version step - 1 - k + i (0 before the start); without a lag every
    # source samples with the policy as it is.
    held = {max(0, step - 1 - k + i): trained for i, trained in enumerate(run.lagged)}
    held[step - 1] = current
    behaviour = policy_lib.sampling_policy(policy.graphdef, policy.params,
                                           held[produced.version],
                                           policy.tokenizer) if k else policy
    run.lagged = (run.lagged + [current])[1:]   # [] without a lag
    run.data_position = async_rl.DataPosition(produced.data_position)
    run.carry = produced.carry
    metrics = {**produced.metrics, "staleness": float(step - 1 - produced.version)}
    return produced.batch, metrics, produced.examples, behaviour


def _packing(run, batch):
    """`(plan_for, forward plan, metrics)` of the batch when the run packs its forward
    passes (``train.packing``), else `(None, None, {})`: `plan_for` makes an update's
    plan of its micro-batches, the forward plan runs the batch's packed rows a piece's
    worth at a time (`Programs.pieces`)."""
    if not programs.packs(run.config):
        return None, None, {}
    planner = packing.Planner.of(batch, run.mesh)
    forward_plan, metrics = planner.chunks(run.policy_programs.pieces)
    return planner.pieces, forward_plan, metrics


def _value_targets(run, batch, lam, plan):
    """``{"values", "returns"}``: the critic's `[B, N]` values of the batch and its
    targets, the GAE returns with `lam` (1: Monte-Carlo); {} without a critic."""
    if run.critic is None:
        return {}
    values = run.critic_programs.forward(run.critic.params, batch, plan)
    returns = critic_lib.value_targets({**batch, "values": values}, lam,
                                       gamma=run.config.objective.advantage.gamma)
    return {"values": values, "returns": returns}


def _policy_targets(run, batch, behaviour, step, plan):
    """Adds pi_old (the parameters that sampled, recomputed, or the sampler's log-probs),
    pi_ref, the distillation teacher's log-probs, the advantages and a random loss's seeds
    to `batch`; returns the metrics of the sampler's against the trainer's log-probs (none
    when pi_old is the sampler's) and the teacher's (`distill.add_teacher_logp`)."""
    config, objective, logp_fn = run.config, run.objective, run.policy_programs.forward
    metrics = {}
    if config.train.old_logp == "recompute":
        batch["old_logp"] = logp_fn(behaviour.params, batch, plan)
        mismatch = run.mismatch_fn(batch["old_logp"], batch["behaviour_logp"],
                                   objective.loss_mask(batch))
        metrics = {f"mismatch/{k}": float(v) for k, v in jax.device_get(mismatch).items()}
    else:
        batch["old_logp"] = batch["behaviour_logp"]
    if config.objective.kl.beta > 0:
        batch["ref_logp"] = logp_fn(rl_run.reference_params(run), batch, plan)
    # distillation hook: the teacher's log-probs of the sampled tokens, before advantages
    metrics.update(distill.add_teacher_logp(run.teacher, batch, plan, objective.loss_mask(batch)))
    batch["advantages"] = run.advantages_fn(batch)
    if objective.spec.policy_loss in objectives.RANDOM_LOSSES:   # Clip-Cov's draw
        batch["loss_seed"] = run.seeds_fn(batch["mask"], jnp.int32(step))
    return metrics


def _critic_update(run, batch, step, plan_for):
    """The critic on the batch (`critic_lib.batch_statistics`), then its ``epochs x
    minibatches`` updates toward the batch's targets; returns their metrics ({} without
    a critic)."""
    if run.critic is None:
        return {}
    config, critic = run.config, run.critic
    metrics = jax.device_get(critic_lib.batch_statistics(batch))
    critic.params, critic.opt_state, updates = steps.update_on_batch(
        run.critic_programs.update, critic.params, critic.opt_state, batch, (config.seed, step),
        epochs=config.train.epochs, minibatches=config.train.minibatches,
        micro_batches=config.train.micro_batches, plan_for=plan_for)
    return {**metrics, **critic_lib.update_metrics(updates)}


def _checked_updates(run, batch, metrics, begin, step):
    """`metrics` with the update stage's time and throughput (it began at `begin`); stops
    the run (`metrics_lib.stop_if_not_finite`) when one of them is not finite."""
    seconds = time.time() - begin
    tokens = float(jnp.sum(batch["mask"])) * run.config.train.epochs
    metrics.update(time_update=seconds, update_tokens_per_s=tokens / max(seconds, 1e-9),
                   updates_per_step=float(programs.updates_per_step(run.config)))
    metrics_lib.stop_if_not_finite(metrics, step, run.checkpointer)
    return metrics


def critic_pretraining_step(run: rl_run.Run, step: int) -> dict[str, Any]:
    """One step of VAPO's value pre-training (Yue et al., arXiv:2504.05118, sec. 3.1,
    after VC-PPO, arXiv:2503.01491): rollouts of the frozen starting policy train only
    the critic, toward Monte-Carlo returns (lambda = 1). Returns the step's metrics."""
    batch, metrics, _, _ = _rollouts(run, step)
    begin = time.time()
    plan_for, plan, packing_metrics = _packing(run, batch)
    metrics.update(packing_metrics)
    batch.update(_value_targets(run, batch, 1.0, plan))
    programs.check_batch(batch, run.layout, pretraining=True)
    jax.block_until_ready(batch["returns"])
    metrics["time_old_logp"] = time.time() - begin
    begin = time.time()
    metrics.update(_critic_update(run, batch, step, plan_for))
    return _checked_updates(run, batch, metrics, begin, step)


def rl_step(run: rl_run.Run, step: int) -> dict[str, Any]:
    """One RL step; returns its metrics. RL steps count from the end of value
    pre-training (``train.eval_every`` and ``train.ref_reset_every`` count them)."""
    config, policy = run.config, run.policy
    rl_steps = step - config.critic.pretrain_steps
    # 1. Rollouts and rewards.
    batch, metrics, examples, behaviour = _rollouts(run, step)
    # 2. The critic's values and targets; pi_old and pi_ref, then advantages.
    begin = time.time()
    plan_for, plan, packing_metrics = _packing(run, batch)
    metrics.update(packing_metrics)
    batch.update(_value_targets(run, batch, config.critic.lam, plan))
    metrics.update(_policy_targets(run, batch, behaviour, step, plan))
    if run.entropy_control is not None:   # adaptive entropy control: this step's coefficient
        entropy_control.add_coef(batch, entropy_control.applied(config, run.entropy_control))
    programs.check_batch(batch, run.layout, pretraining=False)
    jax.block_until_ready(batch["advantages"])
    metrics["time_old_logp"] = time.time() - begin
    weights = metrics_lib.advantage_statistics(
        batch["advantages"], batch["correct"], batch["row_valid"],
        run.objective.loss_mask(batch), group_size=config.objective.group_size)
    metrics.update({k: float(v) for k, v in jax.device_get(weights).items()})
    # 3. Updates: epochs x minibatches optimizer steps on the batch (policy, critic).
    begin = time.time()
    sft_rows = None
    if config.train.sft_weight:   # the reference solutions of the step's first prompts
        local, _ = task_lib.target_rows(examples, config.task, policy.tokenizer,
                                        config.rollout.max_new_tokens)
        sft_rows = parallel.global_rows(run.mesh, local)
    policy.params, run.opt_state, updates = steps.update_on_batch(
        run.policy_programs.update, policy.params, run.opt_state, batch, (config.seed, step),
        epochs=config.train.epochs, minibatches=config.train.minibatches,
        micro_batches=config.train.micro_batches, sft_rows=sft_rows, plan_for=plan_for,
        dropout_key=steps.dropout_rng(config, step))
    metrics.update(updates)
    if run.entropy_control is not None:   # ... and the next, from this step's entropy
        run.entropy_control, coefs = entropy_control.advance(
            config, run.entropy_control, metrics["entropy"], run.mesh)
        metrics.update(coefs)
    metrics.update(_critic_update(run, batch, step, plan_for))
    metrics = _checked_updates(run, batch, metrics, begin, step)
    if config.train.ref_reset_every and rl_steps % config.train.ref_reset_every == 0:
        # DeepSeek-R1: the reference follows the policy
        run.ref_params = rl_run.copy_params(policy.params)
    # 4. Held-out evaluation.
    if rl_steps % config.train.eval_every == 0:
        metrics.update(_evaluate(run, step))
    return metrics


def _evaluate(run, step):
    """The held-out evaluation of the policy as it is at `step` and, with ``eval.suite``,
    the suite's metrics (`evaluation.suite_metrics`), with their time_eval."""
    begin = time.time()
    metrics = evaluation.evaluate(run.policy, run.mesh, run.scorer, run.held_out, run.config,
                                  step=step, method=run.method, episodic=run.episodic)
    if run.suite is not None:
        metrics.update(evaluation.suite_metrics(evaluation.suite_results(
            run.policy, run.mesh, run.suite, run.config, step=step)))
    return {**metrics, "time_eval": time.time() - begin}



def train(config: Any, workdir: str, *, seconds: float | None = None) -> int | None:
    """Runs (or resumes) the RL loop in `workdir`; returns the last step. `config` is left
    as it is: the run reads a resolved, read-only copy.

    With `seconds`, the run also ends after the first step that finishes past that much
    wall time (for comparisons at equal time): that step is saved and exported.

    On several processes with ``rollout.mesh`` (process roles, `roles`) the processes of
    the rollout mesh only sample (`roles.sample`; they return None) and the others run
    this loop, taking each step's batch from them."""
    # --- set-up: mesh, warm start, data, policy, objective, optimizer, checkpoint --------
    config, workdir = config_lib.resolve_run_paths(config, workdir)   # read-only from here
    mesh, rollout_mesh = parallel.setup_meshes(
        config, lambda: footprint.replicated_state_bytes(config, "rl"))
    rl_checks.check_config(config, mesh)
    config = warm_start.prepared(config)   # its own phase: an SFT run, cached
    if parallel.is_main():
        config_lib.record(config, workdir)
    if not roles.split(mesh, rollout_mesh):
        return _learn(config, workdir, mesh, rollout_mesh, seconds)
    with roles.acting(mesh, rollout_mesh):   # each role's collectives among its processes
        if roles.samples(rollout_mesh):
            return roles.sample(config, workdir, mesh, rollout_mesh,
                                scorer=rollout_source.new_scorer(config),
                                last=config_lib.last_rl_step(config))
        with roles.learning(rollout_mesh) as learner:
            return _learn(config, workdir, mesh, mesh, seconds, learner=learner)


def _learn(config, workdir, mesh, rollout_mesh, seconds, learner=None):
    """`train`'s loop on `mesh` after the set-up, the rollouts sampled on `rollout_mesh`
    (`mesh` itself, or the last devices of this process), or by the sampling processes
    (`learner`: `roles.Learner` but for the run and its arguments)."""
    run = rl_run.set_up(config, workdir, mesh, rollout_mesh)
    start = rl_run.restore(run)
    total_steps = config_lib.last_rl_step(config)
    if learner is not None:
        run.source = learner(run, start=start, last=total_steps, taken=lambda step, batch:
                             rollout_source.write_samples(config, workdir, step, batch,
                                                          run.policy.tokenizer))
    elif config.async_rl.enabled:
        run.source = rollout_source.Asynchronous(
            run, start, total_steps, learner_outputs=lambda: rl_run.checkpoint_state(run))
    writer = metrics_lib.MetricWriter(workdir, total_steps=total_steps, start_step=start,
                                      total_seconds=seconds)
    if start == 0 and config.train.eval_at_start:
        writer.write(0, _evaluate(run, 0))   # the starting policy: step 0's row

    def save(step):
        writer.flush()   # the rows up to the step saved: what a resume keeps
        run.checkpointer.save_run(
            step, rl_run.checkpoint_state(run), run.data_position,
            extra=None if run.carry is None else partial.to_checkpoint(run.carry),
            seed=config.seed, base=checkpoint.base_pointer(config))

    # --- the loop: value pre-training, then RL (`schedule`) ------------------------------
    step = start
    tail = loop.Tail(last_step=total_steps, seconds=seconds,
                     checkpoint_every=config.train.checkpoint_every, save=save,
                     directory=run.checkpointer.directory,
                     passed_on=run.source.sigterm_passed_on)   # a sampling process's SIGTERM
    try:
        for step, take_step in schedule(config, start):
            writer.write(step, take_step(run, step))
            if tail.end(step, tail.is_last(step)):
                break
    finally:
        run.source.close()   # the rollouts in flight are dropped; a resume samples them again
        tail.close()
        writer.close()
        run.checkpointer.close()
        run.scorer.close()
        if run.episodic is not None:
            run.episodic.close()
        if run.suite is not None:
            run.suite.close()
    if config.train.export:
        rl_run.export(run)
    return step
