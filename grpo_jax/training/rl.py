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
function once per phase; the loop's tail (metrics, checkpoint, preemption, the time
limit) is the same for both. With a critic (``critic.enabled``: PPO, VAPO), a value model
gives every completion token its value, the policy's advantages are GAE over them, and
the critic makes the same ``epochs x minibatches`` updates toward its targets.

With ``async_rl.enabled`` the rollouts come from a producer thread that samples the next
steps while this loop updates (`async_rl`, `start_producer`): the loop takes each step's
batch from it instead of sampling, and the rest of the step is unchanged. With
``rollout.mesh`` the rollouts are sampled on devices of their own (`_collect`: the
parameters copied there, the batch copied back), synchronous or not; on several
processes the rollout mesh's processes sample and the others run this loop (`roles`). With
``rollout.partial.enabled`` rows past a per-step token budget carry over to the next
step (`partial`): the run (or its producer) holds the pool of groups in flight, and a
checkpoint saves it.

The config is read, never written: `train` works on a resolved, read-only copy
(`paths.resolve_run_paths`), the warm start makes a new one, and the run's config is
printed once and saved as ``workdir/config.json``.

Re-running the same command resumes from the last checkpoint (in either phase):
parameters, optimizer state (the critic's too), step and every process's data position
are restored, and the step's RNG is `fold_in(seed, step)`, so the resumed run continues
exactly as an uninterrupted one would.
"""

import copy
import dataclasses
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from grpo_jax import config_lib, models, objectives, parallel, paths
from grpo_jax.training import async_rl, checkpoint, critic as critic_lib, distill, evaluation
from grpo_jax.training import footprint
from grpo_jax.training import batch as batch_lib, metrics as metrics_lib, packing, programs
from grpo_jax.training import partial, policy as policy_lib, preemption
from grpo_jax.training import roles, rollout, steps, task as task_lib, warm_start

OLD_LOGP = ("recompute", "sampler")


def check_settings(config):
    """Raises ValueError naming the field and the fix for a setting the loop cannot run (or
    would run to no purpose), whatever the mesh: called once, before anything compiles.
    The refusals are listed in docs/faults.md."""
    objectives.validate_objective_config(config.objective)
    if not isinstance(config.train.steps, int) or config.train.steps < 0:
        raise ValueError(f"train.steps must be an int >= 0 (RL steps after "
                         f"critic.pretrain_steps), got {config.train.steps!r}")
    for field, meaning in (("epochs", "passes over each rollout batch"),
                           ("minibatches", "optimizer updates per pass"),
                           ("micro_batches", "gradient accumulation pieces per update; 1: none"),
                           ("eval_every", "RL steps between evaluations")):
        value = config.train[field]
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"train.{field} must be an int >= 1 ({meaning}), got {value!r}")
    rollout.check_sampling_config(config)
    checkpoint.check_config(config)
    evaluation.check_config(config)
    distill.check_config(config)   # distillation hook: the distill section's refusals


def check_config(config, mesh):
    """Raises ValueError naming the field for settings the loop cannot run (`check_settings`,
    and how the batch splits over `mesh`)."""
    check_settings(config)
    rows = config.rollout.prompts_per_batch * config.objective.group_size
    minibatches, micro = config.train.minibatches, config.train.micro_batches
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
    if config.critic.enabled and config.model.lora.rank > 0:
        raise ValueError("model.lora.rank > 0 with critic.enabled is not supported yet (the "
                         "critic would train and export its trunk's adapters as its own); set "
                         "model.lora.rank=0 for PPO/VAPO")
    if config.train.ref_reset_every and config.model.lora.rank > 0:
        raise ValueError("with model.lora.rank > 0 the KL reference is the frozen base (adapters "
                         "off); train.ref_reset_every cannot move it: set it to 0")
    if config.train.ref_reset_every and config.objective.kl.beta <= 0:
        raise ValueError("train.ref_reset_every replaces the KL reference, but objective.kl.beta "
                         "is 0 (no reference); set kl.beta > 0 or ref_reset_every = 0")
    r = config.rollout
    if r.keep_sampling_mask and r.top_p >= 1.0 and r.top_k <= 0 and r.min_p <= 0.0:
        raise ValueError("rollout.keep_sampling_mask keeps the top-p / top-k / min-p cut of each "
                         "sampled position, but none is configured (top_p=1, top_k=0, min_p=0); "
                         "set one, or keep_sampling_mask=False")
    if not isinstance(r.slots, int) or r.slots < 0:
        raise ValueError("rollout.slots must be an int >= 0 (0: no continuous batching), "
                         f"got {r.slots!r}")
    policy_lib.check_rollout_dtype(config)
    check_paging_config(config)
    if config.filtering.short_batch not in rollout.SHORT_BATCH:
        raise ValueError(f"filtering.short_batch must be one of {rollout.SHORT_BATCH}, got "
                         f"{config.filtering.short_batch!r}")
    programs.packs(config)   # train.packing is one of programs.PACKING
    check_critic_config(config)
    rollout.check_environment_config(config)
    async_rl.check_config(config, jax.process_count())
    partial.check_config(config, jax.process_count())


def check_paging_config(config):
    """``rollout.kv_page_size`` pages the slots' caches of the one-shot sampler: it needs
    ``rollout.slots`` > 0, and multi-turn episodes and partial rollouts (`sampling.Engine`)
    keep contiguous caches."""
    r = config.rollout
    for field in ("kv_page_size", "kv_pages"):
        if not isinstance(r[field], int) or r[field] < 0:
            raise ValueError(f"rollout.{field} must be an int >= 0 (0: off / the default pool), "
                             f"got {r[field]!r}")
    if not r.kv_page_size:
        if r.kv_pages:
            raise ValueError(f"rollout.kv_pages={r.kv_pages} sizes the page pool of "
                             "rollout.kv_page_size, which is 0; set kv_page_size > 0 or kv_pages=0")
        return
    if r.slots <= 0:
        raise ValueError(f"rollout.kv_page_size={r.kv_page_size} pages the continuous-batching "
                         "slots' caches, but rollout.slots is 0; set rollout.slots > 0 or "
                         "rollout.kv_page_size=0")
    if config.environment.name or r.partial.enabled:
        raise ValueError("rollout.kv_page_size pages the one-shot sampler only; multi-turn "
                         "episodes (environment.name) and partial rollouts (rollout.partial) "
                         "decode contiguously: set rollout.kv_page_size=0")
    if r.keep_routing:
        raise ValueError("rollout.kv_page_size does not record routing; set "
                         "rollout.keep_routing=False or rollout.kv_page_size=0")
    per_row = -(-r.max_new_tokens // r.kv_page_size)
    if r.kv_pages and r.kv_pages < per_row:
        raise ValueError(f"rollout.kv_pages={r.kv_pages} cannot hold one row of "
                         f"rollout.max_new_tokens={r.max_new_tokens} in pages of "
                         f"{r.kv_page_size}; set rollout.kv_pages >= {per_row} (or 0)")


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
                    micro_batches=1, sft_rows=None, plan_for=None, dropout_key=None):
    """``epochs x minibatches`` optimizer updates on one rollout batch, each epoch in a
    fresh random order of its rows (drawn from `seed`, the same on every process);
    returns (params, opt_state, metrics): the mean over the updates of each metric, and
    ``grad_norm_std``, the standard deviation (ddof=0) of the updates' gradient norms.
    With `sft_rows`, each update also takes its share of them for the supervised term;
    with `plan_for` (`packing.Planner.pieces`), each update's micro-batches run packed;
    with `dropout_key` (`steps.dropout_rng`), update u drops its adapters' inputs with
    `steps.update_key(dropout_key, u)`."""
    rows = batch["mask"].shape[0]
    per_update = []
    for epoch in range(epochs):
        rng = np.random.default_rng([*seed, epoch])
        order = rng.permutation(rows).astype(np.int32)
        sft_order = None if sft_rows is None else rng.permutation(
            sft_rows["mask"].shape[0]).astype(np.int32)
        for i, index in enumerate(np.split(order, minibatches)):
            extra = () if sft_rows is None else (sft_rows, np.split(sft_order, minibatches)[i])
            plan = None if plan_for is None else plan_for(
                index[batch_lib.piece_rows(len(index), micro_batches)])
            dropout = {} if dropout_key is None else {
                "rng": steps.update_key(dropout_key, len(per_update))}
            params, opt_state, metrics = update(params, opt_state, batch, index, *extra, plan=plan,
                                                **dropout)
            per_update.append(metrics)
    per_update = jax.device_get(per_update)
    metrics = {k: float(np.mean([m[k] for m in per_update])) for k in per_update[0]}
    metrics["grad_norm_std"] = float(np.std([m["grad_norm"] for m in per_update]))
    return params, opt_state, metrics


@dataclasses.dataclass
class Run:
    """An RL run from its set-up to its last step: what the steps read, and the state they
    move (the policy's and the critic's parameters and optimizer states, the lagged
    copies, the reference).

    Attributes:
      config: the run's resolved, read-only config; workdir: its absolute workdir.
      mesh: the device mesh; rollout_mesh: the one the rollouts are sampled on (`mesh`
        itself unless ``rollout.mesh`` splits the devices: `parallel.setup_meshes`).
      rollout_frozen: with split meshes, the untrained part of the parameters (a LoRA
        run's base; constants) copied to the rollout mesh once (in the sampler's dtype);
        else None.
      precision: the sampler's `policy_lib.RolloutPrecision` (``rollout.dtype`` other
        than ``model.dtype``), or None: it samples with the parameters as they are.
      policy: the `policy_lib.Policy` being trained; opt_state: its optimizer state.
      lagged: `async_rl.lagged_copies` copies of the policy's trained parameters (all of
        them, or a LoRA run's adapters), oldest first: after step t, those of steps
        t - k .. t - 1 (the starting ones for steps before 1). Synchronous rollouts
        sample with ``lagged[0]``; asynchronous ones with any of them or the current.
      ref_params: pi_ref's parameters (None without a KL term: ``kl.beta = 0``, or with
        LoRA, whose reference is the policy with its adapters off: `reference_params`).
      critic: PPO's value model (`critic_lib.Critic`; None without ``critic.enabled``).
      policy_programs, critic_programs: the policy's and the critic's `programs.Programs`.
      objective: the recipe's objective (`programs.rl_objective`).
      scorer, method: the rewards (`task_lib.Scorer`) and the rollouts' sampling method.
      episodic: the environment of multi-turn rollouts (`rollout.Episodic`), or None.
      layout: the RL batch's keys (`programs.batch_layout`), checked at every step.
      train_iter: this process's prompt stream; held_out: its held-out examples.
      checkpointer: the run's `checkpoint.Checkpointer`.
      advantages_fn, mismatch_fn, seeds_fn: jitted functions of the batch: the
        advantages, sampler-vs-trainer log-prob metrics, a random loss's row seeds.
      producer: the `async_rl.Producer` of an asynchronous run (`start_producer`), or
        with process roles the `roles.Learner` taking the sampling processes' batches, else
        None; data_position: with a producer, the prompt stream's position after the
        last step taken (what a checkpoint saves; the stream itself may be further on).
      carry: with partial rollouts (``rollout.partial.enabled``), the `partial.Pool` of
        groups carried over after the last step taken (what a checkpoint saves; a
        producer's own may be further on); else None.
      teacher: the frozen teacher of on-policy distillation (`distill.Teacher`, never
        checkpointed), or None without ``distill.teacher_path``.
    """

    config: Any
    workdir: str
    mesh: jax.sharding.Mesh
    policy: policy_lib.Policy
    opt_state: Any
    lagged: list
    ref_params: Any
    critic: critic_lib.Critic | None
    policy_programs: programs.Programs
    critic_programs: programs.Programs | None
    objective: Any
    scorer: task_lib.Scorer
    method: Any
    episodic: rollout.Episodic | None
    layout: dict
    train_iter: Any
    held_out: tuple
    checkpointer: checkpoint.Checkpointer
    advantages_fn: Callable
    mismatch_fn: Callable
    seeds_fn: Callable
    producer: async_rl.Producer | roles.Learner | None = None
    device_turns: async_rl.DeviceTurns = dataclasses.field(
        default_factory=lambda: async_rl.DeviceTurns(shared=False))
    data_position: Any = None
    rollout_mesh: jax.sharding.Mesh | None = None
    rollout_frozen: Any = None
    carry: partial.Pool | None = None
    precision: policy_lib.RolloutPrecision | None = None
    # distillation hook: the frozen teacher (`distill.Teacher`), never checkpointed
    teacher: distill.Teacher | None = None


def _copy(params):
    return jax.tree.map(jnp.copy, params)


def set_up(config, workdir, mesh, rollout_mesh=None):
    """The `Run` of `config` (resolved, read-only) in `workdir` at its start: data, the
    starting policy and critic, the objective, programs and optimizer states, the
    checkpointer. `restore` then moves it to the newest checkpoint. `rollout_mesh`: where
    the rollouts are sampled (default: `mesh`)."""
    train_source = task_lib.data_source(config.task, "train")
    eval_source = task_lib.data_source(config.task, config.task.eval_split)
    held_out = evaluation.own_examples(eval_source, config.eval.num_prompts)   # checks the count
    texts = None if config.model.path else task_lib.tokenizer_corpus(train_source)
    policy = policy_lib.start_policy(config, mesh, workdir, texts)
    check_model(config, policy.model_config())
    task_lib.check_context(config, policy.model_config().max_position_embeddings, held_out[0],
                           policy.tokenizer, "the held-out prompts (eval.num_prompts)")
    objective = programs.rl_objective(config)
    policy_run = programs.policy_programs(config, mesh, policy.graphdef, policy.params, objective)
    critic = critic_run = None
    if config.critic.enabled:   # PPO's value model: its own optimizer, the same minibatches
        critic = critic_lib.start_critic(config, mesh, policy)
        critic_run = programs.critic_programs(config, mesh, critic.graphdef, critic.params)
        critic.opt_state = steps.init_optimizer_state(critic_run.tx, critic.params, mesh)
    trained = policy_run.trained_part(policy.params)
    own_reference = config.objective.kl.beta > 0 and not config.model.lora.rank
    rollout_mesh = mesh if rollout_mesh is None else rollout_mesh
    precision = policy_lib.RolloutPrecision.of(config, policy)
    frozen = nnx.filter_state(policy.params, nnx.Not(policy_run.trained))
    rollout_frozen = None if rollout_mesh is mesh else parallel.on_mesh(
        frozen if precision is None else precision.params(frozen), rollout_mesh)
    scorer = _scorer(config)
    return Run(
        config=config, workdir=workdir, mesh=mesh, policy=policy,
        rollout_mesh=rollout_mesh, rollout_frozen=rollout_frozen, precision=precision,
        opt_state=steps.init_optimizer_state(policy_run.tx, trained, mesh),
        lagged=[_copy(trained) for _ in range(async_rl.lagged_copies(config))],
        ref_params=_copy(policy.params) if own_reference else None,
        critic=critic, policy_programs=policy_run, critic_programs=critic_run, objective=objective,
        scorer=scorer, carry=partial.empty_pool(config, scorer),
        method=rollout.sampling_method(config),
        episodic=rollout.Episodic.of(config, policy.tokenizer),
        layout=programs.batch_layout(config, policy.model_config(), prompt_len=1),   # its keys
        train_iter=iter(task_lib.loader(train_source, config,
                                        batch_size=config.rollout.prompts_per_batch)),
        held_out=held_out,
        checkpointer=checkpoint.Checkpointer(paths.join(workdir, "checkpoints"),
                                             keep=config.train.keep_checkpoints),
        # distillation hooks: the teacher, and the advantages with its term mixed in
        teacher=distill.load_teacher(config, mesh, policy, policy_run.pieces),
        advantages_fn=jax.jit(distill.advantages_fn(config, objective)),
        mismatch_fn=jax.jit(objectives.mismatch_metrics),
        seeds_fn=jax.jit(loss_seeds, out_shardings=parallel.row_sharding(mesh)))


def _scorer(config):
    return task_lib.Scorer(config.reward, separate=config.objective.advantage.estimator == "gdpo",
                           max_new_tokens=config.rollout.max_new_tokens)


def reference_params(run):
    """pi_ref's parameters: the policy's with its adapters off in a LoRA run (the same base
    arrays, no copy), else `Run.ref_params`."""
    if run.config.model.lora.rank > 0:
        return models.adapters_off(run.policy.params)
    return run.ref_params


def checkpoint_state(run):
    """What a checkpoint of the run holds: the trained parameters (all, or a LoRA run's
    adapters: its base is the checkpoint's ``base`` pointer), optimizer state, the lagged
    rollout parameters, the KL reference when it can differ from the starting policy
    (``train.ref_reset_every``), and the critic's parameters and optimizer state."""
    state = {"params": run.policy_programs.trained_part(run.policy.params),
             "opt_state": run.opt_state, "lagged": tuple(run.lagged)}
    if run.config.train.ref_reset_every:
        state["ref_params"] = run.ref_params
    if run.critic is not None:
        state["critic"] = {"params": run.critic.params, "opt_state": run.critic.opt_state}
    return state


def restore(run):
    """Moves `run` to its newest checkpoint (its state, this process's data position and
    the partial rollouts' pool); returns that checkpoint's step, 0 when there is none."""
    base = {"base": checkpoint.base_pointer(run.config)} if run.config.model.lora.rank else {}
    start, state, (arrays, info) = run.checkpointer.restore_run(
        checkpoint_state(run), run.train_iter, extra=True, expect=base)
    if run.carry is not None and info is not None:   # a pool of partial rollouts
        run.carry = partial.Pool.from_checkpoint(arrays, info)
    run.policy.params = nnx.merge_state(run.policy.params, state["params"])
    run.opt_state = state["opt_state"]
    run.lagged, run.ref_params = list(state["lagged"]), state.get("ref_params", run.ref_params)
    if run.critic is not None:
        run.critic.params = state["critic"]["params"]
        run.critic.opt_state = state["critic"]["opt_state"]
    if start and parallel.is_main():
        print(f"resumed from the checkpoint of step {start} in {run.workdir}", flush=True)
    return start


def export(run):
    """Writes the policy to ``workdir/export`` (a LoRA policy merged, and its PEFT adapter
    in ``export/adapter``) and the critic to ``workdir/export_critic`` as Hugging Face
    checkpoints."""
    policy_lib.export(run.policy, paths.join(run.workdir, "export"),
                      base_path=run.config.model.path)
    if run.critic is not None:
        critic_lib.export(run.critic, run.policy.tokenizer,
                          paths.join(run.workdir, "export_critic"))


def schedule(config, start):
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
    """The step's rollouts and rewards (DAPO's dynamic sampling draws more if asked),
    sampled by the parameters of ``policy_lag`` steps ago (or taken from the producer of
    an asynchronous run: `_produced_rollouts`); the lag moves on by one. Returns `(batch,
    metrics, examples, behaviour)`: `rollout.collect`'s three, with ``staleness`` (the
    steps between the parameters that sampled and the current ones) in the metrics, and
    the `Policy` that sampled."""
    if run.producer is not None:
        return _produced_rollouts(run, step)
    config, policy = run.config, run.policy
    behaviour = (policy_lib.Policy(policy.graphdef, nnx.merge_state(policy.params, run.lagged[0]),
                                   policy.tokenizer) if run.lagged else policy)
    staleness = min(len(run.lagged), step - 1)
    batch, metrics, examples, run.carry = _collect(
        run, behaviour, step, scorer=run.scorer, episodic=run.episodic, carry=run.carry,
        version=step - 1 - staleness)
    metrics["staleness"] = float(staleness)
    if run.lagged:
        run.lagged = run.lagged[1:] + [_copy(run.policy_programs.trained_part(policy.params))]
    _write_samples(config, run.workdir, step, batch, policy.tokenizer)
    return batch, metrics, examples, behaviour


def _collect(run, behaviour, step, *, scorer, episodic, carry, version):
    """`rollout.collect` of step `step` by the `behaviour` policy (version `version`: the
    parameters after that many steps), on the rollout mesh; with partial rollouts
    (`carry`, the `partial.Pool` of the groups carried over) `partial.collect`. Returns
    `(batch, metrics, examples, carry)`, carry the pool for the next step (None without).

    With split meshes (``rollout.mesh``) the trained part of its parameters is copied to
    the rollout mesh first (the frozen part is there already: ``run.rollout_frozen``) and
    the batch back to the training mesh after: JAX's cross-mesh transfers, each timed to
    its end (``time_weight_transfer``, ``time_batch_transfer`` in the metrics).

    With ``rollout.dtype`` (`Run.precision`) the sampler gets the parameters cast to it,
    once per call (before the copy, which then moves the smaller arrays)."""
    config = run.config
    common = dict(config=config, scorer=scorer, method=run.method,
                  rng=steps.step_rng(config.seed, "rollout", step))

    def collect(policy, mesh):
        if carry is None:
            return (*rollout.collect(policy, mesh, run.train_iter, episodic=episodic, **common),
                    None)
        return partial.collect(policy, mesh, run.train_iter, carry, step=step, version=version,
                               **common)

    precision = run.precision
    if run.rollout_mesh is run.mesh:
        return collect(behaviour if precision is None else precision.policy(behaviour), run.mesh)
    begin = time.time()
    trained = nnx.filter_state(behaviour.params, run.policy_programs.trained)
    trained = jax.block_until_ready(parallel.on_mesh(
        trained if precision is None else precision.params(trained), run.rollout_mesh))
    sent = time.time() - begin
    graphdef = behaviour.graphdef if precision is None else precision.graphdef
    sampler = policy_lib.Policy(graphdef, nnx.merge_state(run.rollout_frozen, trained),
                                behaviour.tokenizer)
    batch, metrics, examples, carry = collect(sampler, run.rollout_mesh)
    begin = time.time()
    batch = jax.block_until_ready(parallel.on_mesh(batch, run.mesh))
    metrics.update(time_weight_transfer=sent, time_batch_transfer=time.time() - begin)
    return batch, metrics, examples, carry


def _write_samples(config, workdir, step, batch, tokenizer):
    if config.train.log_rollouts_every and step % config.train.log_rollouts_every == 0:
        rollout.write_samples(batch, tokenizer, paths.join(workdir, "rollouts", f"{step}.jsonl"))


def _produced_rollouts(run, step):
    """`_rollouts` of an asynchronous run: publishes the current parameters (those of the
    step's start, theta_{step-1}) to the producer, takes the step's batch from it and
    finds the version that sampled it among the lagged copies, for pi_old."""
    policy = run.policy
    current = _copy(run.policy_programs.trained_part(policy.params))
    run.producer.publish(step - 1, current)
    with run.device_turns.given_up((checkpoint_state(run), current)):
        begin = time.time()   # the wait for the batch, not for the learner's own programs
        produced = run.producer.take(step)
    waited = time.time() - begin
    k = len(run.lagged)   # lagged[i] holds version step - 1 - k + i (0 before the start)
    held = {max(0, step - 1 - k + i): trained for i, trained in enumerate(run.lagged)}
    held[step - 1] = current
    behaviour = policy_lib.Policy(policy.graphdef,
                                  nnx.merge_state(policy.params, held[produced.version]),
                                  policy.tokenizer)
    run.lagged = run.lagged[1:] + [current]
    run.data_position = async_rl.DataPosition(produced.data_position)
    run.carry = produced.carry
    metrics = {**produced.metrics, "staleness": float(step - 1 - produced.version),
               "time_rollout_wait": waited}
    return produced.batch, metrics, produced.examples, behaviour


def start_producer(run, start, last):
    """The `async_rl.Producer` of steps ``start + 1 .. last``: it samples on the run's
    rollout mesh (`_collect`) with its own tokenizer copy, reward workers and environment,
    so nothing the learner's thread uses (evaluation) is shared; the frozen part of the
    parameters (a LoRA run's base) is read from the policy as it is now, which the update
    does not donate in an asynchronous run. With partial rollouts it carries the pool
    from step to step itself, starting from the run's, and hands each step's pool over
    with its batch (what that step's checkpoint saves). Returns `(producer, close)`."""
    config, policy = run.config, run.policy
    frozen = nnx.filter_state(policy.params, nnx.Not(run.policy_programs.trained))
    tokenizer = copy.deepcopy(policy.tokenizer)
    scorer = _scorer(config)
    episodic = rollout.Episodic.of(config, tokenizer)

    carry = run.carry

    def sample(step, version, trained):
        nonlocal carry
        with run.device_turns.held():   # on one mesh the learner waits meanwhile
            behaviour = policy_lib.Policy(policy.graphdef, nnx.merge_state(frozen, trained),
                                          tokenizer)
            batch, metrics, examples, carry = _collect(
                run, behaviour, step, scorer=scorer, episodic=episodic, carry=carry,
                version=version)
            _write_samples(config, run.workdir, step, batch, tokenizer)
            jax.block_until_ready(batch)
        return batch, metrics, examples, run.train_iter.get_state(), carry

    k = config.async_rl.max_staleness
    versions = {max(0, start - k + i): trained for i, trained in enumerate(run.lagged)}
    producer = async_rl.Producer(sample, first=start + 1, last=last, max_staleness=k,
                                 fixed=config.async_rl.fixed, versions=versions)

    def close():
        producer.close()
        scorer.close()
        if episodic is not None:
            episodic.close()
    return producer, close


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
        batch["ref_logp"] = logp_fn(reference_params(run), batch, plan)
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
    critic.params, critic.opt_state, updates = update_on_batch(
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


def critic_pretraining_step(run, step):
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


def rl_step(run, step):
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
    policy.params, run.opt_state, updates = update_on_batch(
        run.policy_programs.update, policy.params, run.opt_state, batch, (config.seed, step),
        epochs=config.train.epochs, minibatches=config.train.minibatches,
        micro_batches=config.train.micro_batches, sft_rows=sft_rows, plan_for=plan_for,
        dropout_key=steps.dropout_rng(config, step))
    metrics.update(updates)
    metrics.update(_critic_update(run, batch, step, plan_for))
    metrics = _checked_updates(run, batch, metrics, begin, step)
    if config.train.ref_reset_every and rl_steps % config.train.ref_reset_every == 0:
        run.ref_params = _copy(policy.params)   # DeepSeek-R1: the reference follows the policy
    # 4. Held-out evaluation.
    if rl_steps % config.train.eval_every == 0:
        metrics.update(_evaluate(run, step))
    return metrics


def _evaluate(run, step):
    """The held-out evaluation of the policy as it is at `step`, with its time_eval."""
    begin = time.time()
    metrics = evaluation.evaluate(run.policy, run.mesh, run.scorer, run.held_out, run.config,
                                  step=step, method=run.method, episodic=run.episodic)
    return {**metrics, "time_eval": time.time() - begin}


def train(config, workdir, *, seconds=None):
    """Runs (or resumes) the RL loop in `workdir`; returns the last step. `config` is left
    as it is: the run reads a resolved, read-only copy.

    With `seconds`, the run also ends after the first step that finishes past that much
    wall time (for comparisons at equal time): that step is saved and exported.

    On several processes with ``rollout.mesh`` (process roles, `roles`) the processes of
    the rollout mesh only sample (`roles.sample`; they return None) and the others run
    this loop, taking each step's batch from them."""
    # --- set-up: mesh, warm start, data, policy, objective, optimizer, checkpoint --------
    config, workdir = paths.resolve_run_paths(config, workdir)   # read-only from here
    mesh, rollout_mesh = parallel.setup_meshes(
        config, lambda: footprint.replicated_state_bytes(config, "rl"))
    check_config(config, mesh)
    config = warm_start.prepared(config)   # its own phase: an SFT run, cached
    if parallel.is_main():
        config_lib.record(config, workdir)
    if not roles.split(mesh, rollout_mesh):
        return _learn(config, workdir, mesh, rollout_mesh, seconds)
    with roles.acting(mesh, rollout_mesh):   # each role's collectives among its processes
        if roles.samples(rollout_mesh):
            return roles.sample(config, workdir, mesh, rollout_mesh, scorer=_scorer(config),
                                last=config_lib.last_rl_step(config))
        with roles.learning(rollout_mesh) as learner:
            return _learn(config, workdir, mesh, mesh, seconds, learner=learner)


def _learn(config, workdir, mesh, rollout_mesh, seconds, learner=None):
    """`train`'s loop on `mesh` after the set-up, the rollouts sampled on `rollout_mesh`
    (`mesh` itself, or the last devices of this process), or by the sampling processes
    (`learner`: `roles.Learner` but for the run and its arguments)."""
    run = set_up(config, workdir, mesh, rollout_mesh)
    start = restore(run)
    total_steps = config_lib.last_rl_step(config)
    close_producer, passed_on = (lambda: None), None
    if learner is not None:
        run.producer = learner(run, start=start, last=total_steps, taken=lambda step, batch:
                               _write_samples(config, workdir, step, batch, run.policy.tokenizer))
        passed_on = run.producer.sigterm_passed_on   # a sampling process's SIGTERM
    elif config.async_rl.enabled:
        # One mesh: the learner and the producer take turns on its devices (`DeviceTurns`).
        run.device_turns = async_rl.DeviceTurns(shared=rollout_mesh is mesh)
        run.producer, close_producer = start_producer(run, start, total_steps)
        run.device_turns.take()
    writer = metrics_lib.MetricWriter(workdir, total_steps=total_steps, start_step=start,
                                      total_seconds=seconds)
    if start == 0 and config.train.eval_at_start:
        writer.write(0, _evaluate(run, 0))   # the starting policy: step 0's row
    started, step = time.time(), start

    # --- the loop: value pre-training, then RL (`schedule`) ------------------------------
    stop = preemption.Preemption(passed_on)   # SIGTERM: finish the step, save it, raise Stopped
    try:
        for step, take_step in schedule(config, start):
            metrics = take_step(run, step)
            writer.write(step, metrics)
            out_of_time = seconds is not None and bool(   # agreed by every process
                parallel.agree_max(int(time.time() - started >= seconds)))
            last = step == total_steps or out_of_time
            stopping = stop.requested() and not last   # agreed by every process
            if step % config.train.checkpoint_every == 0 or last or stopping:
                writer.flush()   # the rows up to the step saved: what a resume keeps
                position = run.train_iter if run.producer is None else run.data_position
                run.checkpointer.save_run(
                    step, checkpoint_state(run), position,
                    extra=None if run.carry is None else run.carry.to_checkpoint(),
                    seed=config.seed, base=checkpoint.base_pointer(config))
            if stopping:
                raise preemption.Stopped(step, run.checkpointer.directory)
            if last:
                break
    finally:
        run.device_turns.give_back(checkpoint_state(run))   # the producer may finish its turn
        close_producer()   # the rollouts in flight are dropped; a resume samples them again
        stop.close()
        writer.close()
        run.checkpointer.close()
        run.scorer.close()
        if run.episodic is not None:
            run.episodic.close()
    if config.train.export:
        export(run)
    return step
