"""Supervised warm start: the task's reference solutions, token-mean cross-entropy.

    python -m grpo_jax.main --config configs/dapo.py:runlocal=True --config.mode=sft \\
        --workdir /tmp/sft

Rows have the RL layout (prompt left-padded, target right-padded), so the SFT and RL
losses read the same log-probs. The run ends by exporting a Hugging Face checkpoint to
``workdir/export``, which an RL run loads with ``--config.model.path``. Every
``sft.eval_every`` steps it evaluates the policy on the held-out split and, with
``eval.suite``, on the suite, as RL does (`evaluation.evaluate`, `evaluation.suite_results`).
"""

from typing import Any

import jax
import numpy as np
from flax import nnx

from grpo_jax import config_lib, parallel, paths, run_files
from grpo_jax.training import checkpoint, evaluation, footprint, loop, metrics as metrics_lib
from grpo_jax.training import policy as policy_lib, programs
from grpo_jax.training import rollout, steps, task as task_lib


def check_settings(config: Any) -> None:
    """Raises ValueError naming the field and the fix for an ``sft`` setting the loop cannot
    run; called once, before anything compiles (docs/faults.md lists the refusals)."""
    for field, least, meaning in (("steps", 0, "supervised steps"),
                                  ("batch_size", 1, "examples per step"),
                                  ("log_every", 1, "steps between console lines"),
                                  ("eval_every", 1, "steps between evaluations")):
        value = config.sft[field]
        if not isinstance(value, int) or value < least:
            raise ValueError(f"sft.{field} must be an int >= {least} ({meaning}), got {value!r}")
    checkpoint.check_config(config)
    evaluation.check_config(config)


def train(config: Any, workdir: str, *, seconds: float | None = None) -> int:
    """Trains to ``sft.steps`` in `workdir`, resuming it; exports the policy; returns the
    last step. With `seconds` (the demo's control), the run also ends after the first step
    that finishes past that much wall time; that step is logged and saved, as every last one."""
    # --- set-up ------------------------------------------------------------------------
    config, workdir = config_lib.resolve_run_paths(config, workdir)   # read-only from here
    check_settings(config)
    mesh = parallel.setup_mesh(config, lambda: footprint.replicated_state_bytes(config, "sft"))
    if parallel.is_main():
        config_lib.record(config, workdir)
    train_source = task_lib.data_source(config.task, "train")
    eval_source = task_lib.data_source(config.task, config.task.eval_split)
    held_out = evaluation.own_examples(eval_source, config.eval.num_prompts)   # checks the count
    texts = None if config.model.path else task_lib.tokenizer_corpus(train_source)
    policy = policy_lib.start_policy(config, mesh, workdir, texts)
    task_lib.check_context(config, policy.model_config().max_position_embeddings, held_out[0],
                           policy.tokenizer, "the held-out prompts (eval.num_prompts)")
    train_iter = iter(task_lib.loader(train_source, config, batch_size=config.sft.batch_size))
    scorer = task_lib.Scorer(
        config.reward, separate=False, max_new_tokens=config.rollout.max_new_tokens
    )
    method = rollout.sampling_method(config)
    run = programs.sft_programs(config, mesh, policy.graphdef, policy.params)
    opt_state = steps.init_optimizer_state(run.tx, run.trained_part(policy.params), mesh)
    update = run.update
    checkpointer = checkpoint.Checkpointer(paths.join(workdir, run_files.CHECKPOINTS),
                                           keep=config.train.keep_checkpoints)
    base = {"base": checkpoint.base_pointer(config)} if config.model.lora.rank else {}
    step, state = checkpointer.restore_run(
        {"params": run.trained_part(policy.params), "opt_state": opt_state}, train_iter,
        expect=base)
    policy.params, opt_state = nnx.merge_state(policy.params, state["params"]), state["opt_state"]
    if step and parallel.is_main():
        print(f"resumed from the checkpoint of step {step} in {workdir}", flush=True)
    writer = metrics_lib.MetricWriter(workdir, total_steps=config.sft.steps, start_step=step,
                                      total_seconds=seconds,
                                      prefix="sft " if seconds is None else "sft (timed) ")
    index = np.arange(config.sft.batch_size, dtype=np.int32)

    def save(step):
        writer.flush()   # the rows up to the step saved: what a resume keeps
        checkpointer.save_run(
            step, {"params": run.trained_part(policy.params), "opt_state": opt_state},
            train_iter, seed=config.seed, base=checkpoint.base_pointer(config))

    # With eval.suite each evaluation also measures the suite, as RL's does.
    suite = evaluation.open_suite(config) if config.eval.suite else None

    # --- the loop ------------------------------------------------------------------------
    tail = loop.Tail(last_step=config.sft.steps, seconds=seconds,
                     checkpoint_every=config.sft.checkpoint_every, save=save,
                     directory=checkpointer.directory)
    try:
        while step < config.sft.steps:
            step += 1
            rows, cut = task_lib.target_rows(next(train_iter), config.task, policy.tokenizer,
                                             config.rollout.max_new_tokens)
            batch = parallel.global_rows(mesh, rows)
            policy.params, opt_state, metrics = update(policy.params, opt_state, batch, index,
                                                       rng=steps.dropout_rng(config, step))
            metrics = {k: float(v) for k, v in jax.device_get(metrics).items()}
            metrics["targets_cut"] = float(np.mean(parallel.allgather_json(cut)))
            metrics_lib.stop_if_not_finite(metrics, step, checkpointer)
            last = tail.is_last(step)   # logged and saved
            if step % config.sft.eval_every == 0:
                metrics.update(evaluation.evaluate(policy, mesh, scorer, held_out, config,
                                                   step=step, method=method))
                if suite is not None:
                    metrics.update(evaluation.suite_metrics(evaluation.suite_results(
                        policy, mesh, suite, config, step=step)))
            if step % config.sft.log_every == 0 or last or "eval_accuracy" in metrics:
                writer.write(step, metrics)
            if tail.end(step, last):
                break
    finally:
        tail.close()
        writer.close()
        checkpointer.close()
        scorer.close()
        if suite is not None:
            suite.close()
    policy_lib.export(policy, paths.join(workdir, run_files.EXPORT))
    return step
