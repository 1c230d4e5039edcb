"""The CPU demo: SFT warm start, then RL, then an equal-wall-time SFT control, then a table.

Each stage has its own workdir under the demo's, and a finished stage is not re-run, so
re-running the command after an interruption resumes where it stopped.
"""

import json
import time
from typing import Any

from grpo_jax import config_lib, parallel, paths, run_files
from grpo_jax.training import evaluation, rl, rl_checks, sft


def _timed(workdir, fn):
    """Runs `fn(spent)` until it finishes once in `workdir` and returns the wall seconds
    all its invocations took (for the control's equal time).

    ``wall_time.json`` keeps the seconds spent so far and whether the stage finished: an
    interrupted stage (an exception, SIGTERM) adds its part before it stops, so a resumed
    stage's time is the sum of its invocations (a SIGKILL loses the killed invocation's
    part). `spent` is what earlier invocations took.
    """
    record = paths.path(workdir) / "wall_time.json"
    state = (json.loads(record.read_text()) if record.exists()
             else {"seconds": 0.0, "finished": False})
    if state.get("finished", True):   # a record without the key was written once finished
        return state["seconds"]
    start, finished = time.time(), False
    try:
        fn(state["seconds"])
        finished = True
    finally:
        total = state["seconds"] + time.time() - start
        if parallel.is_main():
            paths.write_whole(record, json.dumps({"seconds": total, "finished": finished}))
    parallel.sync(f"{record} written")
    return total


def run(config: Any, workdir: str) -> list[dict[str, Any]]:
    """Runs the three stages and prints (and saves) the before/after table."""
    config, workdir = config_lib.resolve_run_paths(config, workdir)
    sft.check_settings(config)   # every stage's settings, before the first stage runs
    rl_checks.check_settings(config)
    parallel.initialize(config.distributed)   # which process is the main one
    if parallel.is_main():
        config_lib.record(config, workdir)
    sft_dir, rl_dir, control_dir = (paths.join(workdir, d) for d in ("sft", "rl", "sft_control"))
    warm = paths.join(sft_dir, run_files.EXPORT)

    sft_seconds = _timed(sft_dir, lambda spent: sft.train(config, sft_dir))
    rl_config = config_lib.replaced(config, {"model.path": warm, "model.name": "",
                                             "model.sft_warm_start": False})
    rl_seconds = _timed(rl_dir, lambda spent: rl.train(rl_config, rl_dir))
    control_config = config_lib.replaced(config, {"model.path": warm, "model.name": "",
                                                  "sft.steps": 10**9, "sft.eval_every": 10**9})
    _timed(control_dir, lambda spent: sft.train(control_config, control_dir,
                                                seconds=max(rl_seconds - spent, 0.0)))

    rows = [("SFT warm start", warm, sft_seconds),
            ("+ DAPO (RL)", paths.join(rl_dir, run_files.EXPORT), rl_seconds),
            ("+ SFT for the same time (control)", paths.join(control_dir, run_files.EXPORT),
             rl_seconds)]
    results = []
    for name, path, seconds in rows:
        metrics = evaluation.evaluate_export(config, path)
        results.append({"stage": name, "seconds": round(seconds, 1), **metrics})
    if parallel.is_main():
        paths.write_whole(paths.join(workdir, "results.json"), json.dumps(results, indent=2))
        print(
            format_table(results, k=config.eval.samples, prompts=config.eval.num_prompts),
            flush=True,
        )
    return results


def format_table(results: list[dict[str, Any]], *, k: int, prompts: int) -> str:
    lines = [f"held-out accuracy on {prompts} prompts (greedy pass@1; mean@{k} and pass@{k} "
             "at the rollout temperature)",
             f"{'stage':36s} {'pass@1':>7s} {f'mean@{k}':>7s} {f'pass@{k}':>7s} {'time':>8s}"]
    for r in results:
        lines.append(
            f"{r['stage']:36s} {r['eval_accuracy']:7.1%} {r.get('eval_mean_at_k', 0):7.1%} "
            f"{r.get('eval_pass_at_k', 0):7.1%} {r['seconds']:7.0f}s"
        )
    return "\n".join(lines)
