"""An RL run's state and life cycle: `Run` (what the steps read and the state they move),
`set_up` at the start, `restore` to the newest checkpoint, `checkpoint_state` (what a
checkpoint holds) and `export` at the end. The loop itself is `rl.train`.
"""

import dataclasses
from typing import Any, Callable

import jax
import jax.numpy as jnp
from flax import nnx

from grpo_jax import models, objectives, parallel, paths, run_files
from grpo_jax.training import (
    async_rl,
    checkpoint,
    distill,
    entropy_control,
    evaluation,
    partial,
    programs,
    rl_checks,
    rollout,
    rollout_source,
    steps,
)
from grpo_jax.training import critic as critic_lib
from grpo_jax.training import policy as policy_lib
from grpo_jax.training import task as task_lib


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
      suite: with ``eval.suite``, the suite the periodic evaluation also measures
        (`evaluation.open_suite`); else None.
      checkpointer: the run's `checkpoint.Checkpointer`.
      advantages_fn, mismatch_fn, seeds_fn: jitted functions of the batch: the
        advantages, sampler-vs-trainer log-prob metrics, a random loss's row seeds.
      source: where the steps' rollouts come from (`rollout_source`): `set_up` gives the
        `rollout_source.Synchronous` one; `rl.train` puts an asynchronous run's producer
        or the process roles' `roles.Learner` in its place once the run is restored.
      data_position: the prompt stream's position after the last step taken (what a
        checkpoint saves; an asynchronous source's stream may be further on).
      carry: with partial rollouts (``rollout.partial.enabled``), the `partial.Pool` of
        groups carried over after the last step taken (what a checkpoint saves; a
        producer's own may be further on); else None.
      teacher: the frozen teacher of on-policy distillation (`distill.Teacher`, never
        checkpointed), or None without ``distill.teacher_path``.
      entropy_control: with ``adaptive_entropy.enabled``, the controller's state
        (`entropy_control.initial_state`: the coefficient and the last step's entropy,
        checkpointed); else None.
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
    source: rollout_source.Source | None = None   # None only within `set_up`
    data_position: async_rl.DataPosition | None = None
    rollout_mesh: jax.sharding.Mesh | None = None
    rollout_frozen: Any = None
    carry: partial.Pool | None = None
    precision: policy_lib.RolloutPrecision | None = None
    # distillation hook: the frozen teacher (`distill.Teacher`), never checkpointed
    teacher: distill.Teacher | None = None
    entropy_control: dict | None = None
    suite: evaluation.OpenSuite | None = None


def copy_params(params: Any) -> Any:
    """A copy of `params` (new arrays, the same shardings): kept past updates that donate."""
    return jax.tree.map(jnp.copy, params)


def set_up(config: Any, workdir: str, mesh: jax.sharding.Mesh,
           rollout_mesh: jax.sharding.Mesh | None = None) -> Run:
    """The `Run` of `config` (resolved, read-only) in `workdir` at its start: data, the
    starting policy and critic, the objective, programs and optimizer states, the
    checkpointer, the synchronous rollout source. `restore` then moves it to the newest
    checkpoint. `rollout_mesh`: where the rollouts are sampled (default: `mesh`)."""
    train_source = task_lib.data_source(config.task, "train")
    eval_source = task_lib.data_source(config.task, config.task.eval_split)
    held_out = evaluation.own_examples(eval_source, config.eval.num_prompts)   # checks the count
    # The suite's files are read before the model loads: a missing one fails first.
    suite = evaluation.open_suite(config) if config.eval.suite else None
    try:
        return _run_with(config, workdir, mesh, rollout_mesh, train_source, held_out, suite)
    except BaseException:   # the suite's grader pool is the run's to close; no run, close it
        if suite is not None:
            suite.close()
        raise


def _run_with(config: Any, workdir: str, mesh: jax.sharding.Mesh,
              rollout_mesh: jax.sharding.Mesh | None, train_source: Any,
              held_out: list[dict], suite: evaluation.OpenSuite | None) -> Run:
    """`set_up` after the data and the suite are open."""
    texts = None if config.model.path else task_lib.tokenizer_corpus(train_source)
    policy = policy_lib.start_policy(config, mesh, workdir, texts)
    rl_checks.check_model(config, policy.model_config())
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
    rollout_mesh = mesh if rollout_mesh is None else rollout_mesh
    precision = policy_lib.RolloutPrecision.of(config, policy)
    frozen = nnx.filter_state(policy.params, nnx.Not(policy_run.trained))
    rollout_frozen = None if rollout_mesh is mesh else parallel.on_mesh(
        frozen if precision is None else precision.params(frozen), rollout_mesh)
    scorer = rollout_source.new_scorer(config)
    try:
        run = Run(
            config=config, workdir=workdir, mesh=mesh, policy=policy,
            rollout_mesh=rollout_mesh, rollout_frozen=rollout_frozen, precision=precision,
            opt_state=steps.init_optimizer_state(policy_run.tx, trained, mesh),
            lagged=[copy_params(trained) for _ in range(async_rl.lagged_copies(config))],
            ref_params=(copy_params(policy.params) if policy_lib.owns_reference(config)
                        else None),
            critic=critic, policy_programs=policy_run, critic_programs=critic_run,
            objective=objective,
            scorer=scorer, carry=partial.empty_pool(config, scorer, policy.model_config()),
            method=rollout.sampling_method(config),
            episodic=rollout.Episodic.of(config, policy.tokenizer),
            layout=programs.batch_layout(config, policy.model_config(), prompt_len=1),   # keys
            train_iter=iter(task_lib.loader(train_source, config,
                                            batch_size=config.rollout.prompts_per_batch)),
            held_out=held_out,
            checkpointer=checkpoint.Checkpointer(paths.join(workdir, run_files.CHECKPOINTS),
                                                 keep=config.train.keep_checkpoints),
            # distillation hooks: the teacher, and the advantages with its term mixed in
            teacher=distill.load_teacher(config, mesh, policy, policy_run.pieces),
            entropy_control=entropy_control.initial_state(config, mesh),
            suite=suite,
            advantages_fn=jax.jit(distill.advantages_fn(config, objective)),
            mismatch_fn=jax.jit(objectives.mismatch_metrics),
            seeds_fn=jax.jit(steps.loss_seeds, out_shardings=parallel.row_sharding(mesh)))
    except BaseException:   # no run to own the grader pool: close it
        scorer.close()
        raise
    run.source = rollout_source.Synchronous(run)
    return run


def reference_params(run: Run) -> Any:
    """pi_ref's parameters: the policy's with its adapters off in a LoRA run (the same base
    arrays, no copy), else `Run.ref_params`."""
    if run.config.model.lora.rank > 0:
        return models.adapters_off(run.policy.params)
    return run.ref_params


def checkpoint_state(run: Run) -> dict:
    """What a checkpoint of the run holds: the trained parameters (all, or a LoRA run's
    adapters: its base is the checkpoint's ``base`` pointer), optimizer state, the lagged
    rollout parameters, the KL reference when it can differ from the starting policy
    (``train.ref_reset_every``), the critic's parameters and optimizer state, and the
    adaptive entropy controller's state (``adaptive_entropy.enabled``)."""
    state = {"params": run.policy_programs.trained_part(run.policy.params),
             "opt_state": run.opt_state, "lagged": tuple(run.lagged)}
    if run.config.train.ref_reset_every:
        state["ref_params"] = run.ref_params
    if run.critic is not None:
        state["critic"] = {"params": run.critic.params, "opt_state": run.critic.opt_state}
    if run.entropy_control is not None:
        state["entropy_control"] = run.entropy_control
    return state


def restore(run: Run) -> int:
    """Moves `run` to its newest checkpoint (its state, this process's data position and
    the partial rollouts' pool); returns that checkpoint's step, 0 when there is none."""
    base = {"base": checkpoint.base_pointer(run.config)} if run.config.model.lora.rank else {}
    start, state, (arrays, info) = run.checkpointer.restore_run(
        checkpoint_state(run), run.train_iter, extra=True, expect=base)
    if run.carry is not None and info is not None:   # a pool of partial rollouts
        run.carry = partial.restored_pool(arrays, info, run.config, run.policy.model_config())
    run.policy.params = nnx.merge_state(run.policy.params, state["params"])
    run.opt_state = state["opt_state"]
    run.lagged, run.ref_params = list(state["lagged"]), state.get("ref_params", run.ref_params)
    if run.critic is not None:
        run.critic.params = state["critic"]["params"]
        run.critic.opt_state = state["critic"]["opt_state"]
    if run.entropy_control is not None:
        run.entropy_control = state["entropy_control"]
    if start and parallel.is_main():
        print(f"resumed from the checkpoint of step {start} in {run.workdir}", flush=True)
    return start


def export(run: Run) -> None:
    """Writes the policy to ``workdir/export`` (a LoRA policy merged, and its PEFT adapter
    in ``export/adapter``) and the critic to ``workdir/export_critic`` as Hugging Face
    checkpoints."""
    policy_lib.export(run.policy, paths.join(run.workdir, run_files.EXPORT),
                      base_path=run.config.model.path)
    if run.critic is not None:
        critic_lib.export(run.critic, run.policy.tokenizer,
                          paths.join(run.workdir, "export_critic"))
