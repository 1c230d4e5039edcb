"""The RL loop, top to bottom: rollout -> rewards -> advantages -> updates -> metrics -> checkpoint.

    python -m grpo_jax.main --config configs/dapo.py:runlocal=True --workdir /tmp/dapo

The batch lives on the mesh from the moment its prompts enter it: the sampler's tokens,
the behaviour, old and reference log-probs, the advantages and the minibatches are
global arrays whose rows are split over the mesh's row axes. A process's host sees the
rows it scores (`rollout.draw`) and the metrics, nothing else. Each step makes
``train.epochs x train.minibatches`` optimizer updates on one rollout batch, so from the
second update on the policy is off the behaviour policy and the clip (or gate, or cap)
of the recipe acts.

With a critic (``critic.enabled``: PPO, VAPO), a value model gives every completion token
its value, the policy's advantages are GAE over them, and the critic makes the same
``epochs x minibatches`` updates toward its targets. VAPO's value pre-training is the
first ``critic.pretrain_steps`` steps: rollouts of the frozen starting policy train only
the critic, toward Monte-Carlo returns (lambda = 1); the ``train.steps`` RL steps follow.

Re-running the same command resumes from the last checkpoint: parameters, optimizer
state (the critic's too), step and every process's data position are restored, and the
step's RNG is `fold_in(seed, step)`, so the resumed run continues exactly as an
uninterrupted one would.
"""

import functools
import os
import time

import jax
import jax.numpy as jnp
import numpy as np

from grpo_jax import objectives, parallel, paths
from grpo_jax.training import batch as batch_lib
from grpo_jax.training import checkpoint, critic as critic_lib, evaluation, footprint
from grpo_jax.training import metrics as metrics_lib, programs
from grpo_jax.training import policy as policy_lib, preemption
from grpo_jax.training import rollout, steps, task as task_lib, warm_start

OLD_LOGP = ("recompute", "sampler")
def check_config(config, mesh):
    """Raises ValueError naming the field for settings the loop cannot run."""
    objectives.validate_objective_config(config.objective)
    rows = config.rollout.prompts_per_batch * config.objective.group_size
    minibatches, micro = config.train.minibatches, config.train.micro_batches
    if config.train.epochs < 1:
        raise ValueError(f"train.epochs must be >= 1, got {config.train.epochs}")
    if rows % (minibatches * micro):
        raise ValueError(f"rollout.prompts_per_batch * objective.group_size = {rows} rows must "
                         f"divide into train.minibatches * train.micro_batches = "
                         f"{minibatches * micro} pieces")
    ways = parallel.row_ways(mesh)
    if (rows // (minibatches * micro)) % ways:
        raise ValueError(f"a micro-batch of {rows // (minibatches * micro)} rows does not split "
                         f"over the {ways}-way row axes of mesh {dict(mesh.shape)}; change "
                         "rollout.prompts_per_batch, train.minibatches, train.micro_batches "
                         "or the mesh")
    if config.train.old_logp not in OLD_LOGP:
        raise ValueError(f"train.old_logp must be one of {OLD_LOGP}, got {config.train.old_logp!r}")
    if config.train.old_logp == "sampler" and config.objective.importance.enabled:
        raise ValueError("objective.importance.enabled corrects the trainer's pi_old against the "
                         "sampler's log-probs; with train.old_logp='sampler' they are the same "
                         "numbers and the weight is 1. Use train.old_logp='recompute'")
    if config.rollout.policy_lag < 0:
        raise ValueError(f"rollout.policy_lag must be >= 0, got {config.rollout.policy_lag}")
    if config.train.sft_weight < 0:
        raise ValueError(f"train.sft_weight must be >= 0, got {config.train.sft_weight}")
    if config.train.sft_weight and config.rollout.prompts_per_batch % config.train.minibatches:
        raise ValueError(f"train.sft_weight adds the reference solutions of the "
                         f"{config.rollout.prompts_per_batch} prompts, which must split into "
                         f"train.minibatches = {config.train.minibatches}")
    if config.train.ref_reset_every and config.objective.kl.beta <= 0:
        raise ValueError("train.ref_reset_every replaces the KL reference, but objective.kl.beta "
                         "is 0 (no reference); set kl.beta > 0 or ref_reset_every = 0")
    r = config.rollout
    if r.keep_sampling_mask and r.top_p >= 1.0 and r.top_k <= 0 and r.min_p <= 0.0:
        raise ValueError("rollout.keep_sampling_mask keeps the top-p / top-k / min-p cut of each "
                         "sampled position, but none is configured (top_p=1, top_k=0, min_p=0); "
                         "set one, or keep_sampling_mask=False")
    if config.filtering.short_batch not in rollout.SHORT_BATCH:
        raise ValueError(f"filtering.short_batch must be one of {rollout.SHORT_BATCH}, got "
                         f"{config.filtering.short_batch!r}")
    check_critic_config(config)


def check_critic_config(config):
    """The critic and the "gae" estimator need each other; pre-training needs a critic."""
    gae, enabled = config.objective.advantage.estimator == "gae", config.critic.enabled
    if gae and not enabled:
        raise ValueError("objective.advantage.estimator='gae' takes the critic's values; set "
                         "critic.enabled=True (or choose a critic-free estimator)")
    if enabled and not gae:
        raise ValueError(f"critic.enabled trains a value model that objective.advantage.estimator="
                         f"{config.objective.advantage.estimator!r} never reads; set the estimator "
                         "to 'gae' or critic.enabled=False")
    if config.critic.pretrain_steps < 0:
        raise ValueError(f"critic.pretrain_steps must be >= 0, got {config.critic.pretrain_steps}")
    if config.critic.pretrain_steps and not enabled:
        raise ValueError("critic.pretrain_steps pre-trains a critic, but critic.enabled is False")
    if not 0.0 <= config.critic.lam <= 1.0:
        raise ValueError(f"critic.lam must be in [0, 1], got {config.critic.lam}")
    if config.critic.value_clip is not None and config.critic.value_clip <= 0:
        raise ValueError(f"critic.value_clip must be > 0 (None: no clip), got "
                         f"{config.critic.value_clip}")


def check_model(config, model_cfg):
    """Raises ValueError naming the field for settings the model (a `models.ModelConfig`)
    cannot serve."""
    if config.rollout.keep_routing and not model_cfg.n_experts:
        raise ValueError("rollout.keep_routing replays an MoE's experts, but the model has none; "
                         "set rollout.keep_routing=False for a dense model")


def loss_seeds(mask, step):
    """`[B]` int32 seeds of a random loss's draw (Clip-Cov), one per row and step: a
    micro-batch draws with its first row's, so every update of every step draws anew."""
    rows = mask.shape[0]
    return step * rows + jnp.arange(rows, dtype=jnp.int32)


def update_on_batch(update, params, opt_state, batch, seed, *, epochs, minibatches,
                    sft_rows=None):
    """``epochs x minibatches`` optimizer updates on one rollout batch, each epoch in a
    fresh random order of its rows (drawn from `seed`, the same on every process);
    returns (params, opt_state, metrics): the mean over the updates of each metric, and
    ``grad_norm_std``, the standard deviation (ddof=0) of the updates' gradient norms.
    With `sft_rows`, each update also takes its share of them for the supervised term."""
    rows = batch["mask"].shape[0]
    per_update = []
    for epoch in range(epochs):
        rng = np.random.default_rng([*seed, epoch])
        order = rng.permutation(rows).astype(np.int32)
        sft_order = None if sft_rows is None else rng.permutation(
            sft_rows["mask"].shape[0]).astype(np.int32)
        for i, index in enumerate(np.split(order, minibatches)):
            extra = () if sft_rows is None else (sft_rows, np.split(sft_order, minibatches)[i])
            params, opt_state, metrics = update(params, opt_state, batch, index, *extra)
            per_update.append(metrics)
    per_update = jax.device_get(per_update)
    metrics = {k: float(np.mean([m[k] for m in per_update])) for k in per_update[0]}
    metrics["grad_norm_std"] = float(np.std([m["grad_norm"] for m in per_update]))
    return params, opt_state, metrics


def run_state(params, opt_state, lagged, ref_params, *, reference_moves, critic=None):
    """What a checkpoint of the run holds: parameters, optimizer state, the lagged rollout
    parameters, the KL reference when it can differ from the starting policy, and the
    critic's parameters and optimizer state when there is one."""
    state = {"params": params, "opt_state": opt_state, "lagged": tuple(lagged)}
    if reference_moves:
        state["ref_params"] = ref_params
    if critic is not None:
        state["critic"] = {"params": critic.params, "opt_state": critic.opt_state}
    return state


def train(config, workdir, *, seconds=None):
    """Runs (or resumes) the RL loop in `workdir`; returns the last step.

    With `seconds`, the run also ends after the first step that finishes past that much
    wall time (for comparisons at equal time): that step is saved and exported."""
    # --- set-up: mesh, data, policy, objective, optimizer, checkpoint --------------------
    workdir = paths.resolve_run_paths(config, workdir)
    mesh = parallel.setup_mesh(config, lambda: footprint.replicated_state_bytes(config, "rl"))
    check_config(config, mesh)
    warm_start.use_if_configured(config)
    cfg = config
    train_source = task_lib.data_source(cfg.task, "train")
    eval_source = task_lib.data_source(cfg.task, cfg.task.eval_split)
    texts = None if cfg.model.path else task_lib.tokenizer_corpus(train_source)
    policy = policy_lib.start_policy(cfg, mesh, workdir, texts)
    check_model(cfg, policy.model_config())
    train_iter = iter(task_lib.loader(train_source, cfg, batch_size=cfg.rollout.prompts_per_batch))
    held_out = evaluation.own_examples(eval_source, cfg.eval.num_prompts)
    scorer = task_lib.Scorer(cfg.reward, separate=cfg.objective.advantage.estimator == "gdpo",
                             max_new_tokens=cfg.rollout.max_new_tokens)
    objective = programs.rl_objective(cfg)
    method = rollout.sampling_method(cfg)
    layout = programs.batch_layout(cfg, policy.model_config(), prompt_len=1)   # its keys

    total_steps = cfg.critic.pretrain_steps + cfg.train.steps   # value pre-training first
    updates_per_step = programs.updates_per_step(cfg)
    run = programs.policy_programs(cfg, mesh, policy.graphdef, policy.params, objective)
    opt_state = steps.init_optimizer_state(run.tx, policy.params, mesh)
    update, logp_fn = run.update, run.forward
    advantages_fn = jax.jit(objective.advantages)
    mismatch_fn = jax.jit(objectives.mismatch_metrics)   # sampler vs trainer log-probs
    seeds_fn = jax.jit(loss_seeds, out_shardings=parallel.row_sharding(mesh))
    copy = lambda params: jax.tree.map(jnp.copy, params)
    ref_params = copy(policy.params) if cfg.objective.kl.beta > 0 else None
    lagged = [copy(policy.params) for _ in range(cfg.rollout.policy_lag)]
    reference_moves = bool(cfg.train.ref_reset_every)
    critic = None   # PPO's value model: its own optimizer, the same minibatches
    if cfg.critic.enabled:
        critic = critic_lib.start_critic(cfg, mesh, policy)
        critic_run = programs.critic_programs(cfg, mesh, critic.graphdef, critic.params)
        critic.opt_state = steps.init_optimizer_state(critic_run.tx, critic.params, mesh)
        critic_update, values_fn = critic_run.update, critic_run.forward

    checkpointer = checkpoint.Checkpointer(os.path.join(workdir, "checkpoints"),
                                           keep=cfg.train.keep_checkpoints)
    start, state = checkpointer.restore_run(
        run_state(policy.params, opt_state, lagged, ref_params, reference_moves=reference_moves,
                  critic=critic), train_iter)
    policy.params, opt_state, lagged = state["params"], state["opt_state"], list(state["lagged"])
    ref_params = state.get("ref_params", ref_params)
    if critic is not None:
        critic.params, critic.opt_state = state["critic"]["params"], state["critic"]["opt_state"]
    if start and parallel.is_main():
        print(f"resumed from the checkpoint of step {start} in {workdir}", flush=True)
    writer = metrics_lib.MetricWriter(workdir, total_steps=total_steps, start_step=start,
                                      total_seconds=seconds)
    started, step = time.time(), start

    # --- the loop ------------------------------------------------------------------------
    stop = preemption.Preemption()   # SIGTERM: finish the step, save it, raise Stopped
    try:
        for step in range(start + 1, total_steps + 1):
            # VAPO's value pre-training: only the critic learns, on the starting policy's
            # rollouts, toward Monte-Carlo returns; RL steps count from its end.
            rl_step = step - cfg.critic.pretrain_steps
            pretraining = rl_step <= 0
            # 1. Rollouts and rewards (DAPO's dynamic sampling draws more if asked), sampled
            #    by the parameters of `policy_lag` steps ago (asynchronous RL's staleness).
            behaviour = (policy_lib.Policy(policy.graphdef, lagged[0], policy.tokenizer)
                         if lagged else policy)
            batch, metrics, examples = rollout.collect(behaviour, mesh, train_iter, config=cfg,
                                                       scorer=scorer, method=method,
                                                       rng=steps.step_rng(cfg.seed, "rollout", step))
            if lagged:
                lagged = lagged[1:] + [copy(policy.params)]
            if cfg.train.log_rollouts_every and step % cfg.train.log_rollouts_every == 0:
                rollout.write_samples(batch, policy.tokenizer,
                                      os.path.join(workdir, "rollouts", f"{step}.jsonl"))
            # 2. The critic's values and targets; pi_old (the parameters that sampled,
            #    recomputed) and pi_ref, then advantages.
            begin = time.time()
            if critic is not None:
                batch["values"] = values_fn(critic.params, batch)
                lam = 1.0 if pretraining else cfg.critic.lam   # pre-training: Monte-Carlo
                batch["returns"] = critic_lib.value_targets(batch, lam,
                                                            gamma=cfg.objective.advantage.gamma)
            if not pretraining:
                if cfg.train.old_logp == "recompute":
                    batch["old_logp"] = logp_fn(behaviour.params, batch)
                    metrics.update({f"mismatch/{k}": float(v) for k, v in jax.device_get(
                        mismatch_fn(batch["old_logp"], batch["behaviour_logp"],
                                    objective.loss_mask(batch))).items()})
                else:
                    batch["old_logp"] = batch["behaviour_logp"]
                if ref_params is not None:
                    batch["ref_logp"] = logp_fn(ref_params, batch)
                batch["advantages"] = advantages_fn(batch)
                if objective.spec.policy_loss in objectives.RANDOM_LOSSES:   # Clip-Cov's draw
                    batch["loss_seed"] = seeds_fn(batch["mask"], jnp.int32(step))
            programs.check_batch(batch, layout, pretraining=pretraining)
            jax.block_until_ready(batch.get("advantages", batch.get("returns")))
            metrics["time_old_logp"] = time.time() - begin
            if not pretraining:
                weights = metrics_lib.advantage_statistics(
                    batch["advantages"], batch["correct"], batch["row_valid"],
                    objective.loss_mask(batch), group_size=cfg.objective.group_size)
                metrics.update({k: float(v) for k, v in jax.device_get(weights).items()})
            # 3. Updates: epochs x minibatches optimizer steps on the batch (policy, critic).
            begin = time.time()
            if not pretraining:
                sft_rows = None
                if cfg.train.sft_weight:   # the reference solutions of the step's first prompts
                    local, _ = task_lib.target_rows(examples, cfg.task, policy.tokenizer,
                                                    cfg.rollout.max_new_tokens)
                    sft_rows = parallel.global_rows(mesh, local)
                policy.params, opt_state, update_metrics = update_on_batch(
                    update, policy.params, opt_state, batch, (cfg.seed, step),
                    epochs=cfg.train.epochs, minibatches=cfg.train.minibatches, sft_rows=sft_rows)
                metrics.update(update_metrics)
            if critic is not None:
                metrics.update(jax.device_get(critic_lib.batch_statistics(batch)))
                critic.params, critic.opt_state, critic_metrics = update_on_batch(
                    critic_update, critic.params, critic.opt_state, batch, (cfg.seed, step),
                    epochs=cfg.train.epochs, minibatches=cfg.train.minibatches)
                metrics.update(critic_lib.update_metrics(critic_metrics))
            update_seconds = time.time() - begin
            tokens = float(jnp.sum(batch["mask"])) * cfg.train.epochs
            metrics.update(time_update=update_seconds,
                           update_tokens_per_s=tokens / max(update_seconds, 1e-9),
                           updates_per_step=float(updates_per_step))
            metrics_lib.stop_if_not_finite(metrics, step, checkpointer)
            if not pretraining and cfg.train.ref_reset_every and (
                    rl_step % cfg.train.ref_reset_every == 0):
                ref_params = copy(policy.params)   # DeepSeek-R1: the reference follows the policy
            # 4. Held-out evaluation (of the policy: not while it is frozen), metrics, checkpoint.
            if not pretraining and rl_step % cfg.train.eval_every == 0:
                begin = time.time()
                metrics.update(evaluation.evaluate(policy, mesh, scorer, held_out, cfg,
                                                   rng=steps.step_rng(cfg.seed, "eval", step),
                                                   method=method))
                metrics["time_eval"] = time.time() - begin
            writer.write(step, metrics)
            out_of_time = seconds is not None and bool(   # agreed by every process
                parallel.agree_max(int(time.time() - started >= seconds)))
            last = step == total_steps or out_of_time
            stopping = stop.requested() and not last   # agreed by every process
            if step % cfg.train.checkpoint_every == 0 or last or stopping:
                state = run_state(policy.params, opt_state, lagged, ref_params,
                                  reference_moves=reference_moves, critic=critic)
                checkpointer.save_run(step, state, train_iter, seed=cfg.seed)
            if stopping:
                raise preemption.Stopped(step, checkpointer.directory)
            if last:
                break
    finally:
        stop.close()
        writer.close()
        checkpointer.close()
        scorer.close()
    if cfg.train.export:
        policy_lib.export(policy, os.path.join(workdir, "export"))
        if critic is not None:
            critic_lib.export(critic, policy.tokenizer, os.path.join(workdir, "export_critic"))
    return step
