"""A tool recipe measured: held-out accuracy with the tool vs the same model and budget
without it, before RL (the SFT warm start) and after, per seed.

    python experiments/tool_vs_no_tool.py --config configs/tool_countdown.py --seeds 0 1 2 \\
        --workdir workdirs/tool_countdown --out experiments/results/tool_countdown_cpu.txt

For each seed S it runs the commands a user would (each its own process):

    python -m grpo_jax.main --config CONFIG --workdir W/seedS --config.seed=S
    python -m grpo_jax.main --config CONFIG --config.seed=S --config.mode=eval \\
        --config.model.path=P --config.model.name= --config.environment.name=E \\
        --workdir W/seedS/eval_<before|after>_<with|without>

with P the warm start the training started from (W/seedS/config.json's ``model.path``)
and then its export (W/seedS/export), and E the recipe's environment and "" (the model
then writes the tool's reply itself). Finished runs are kept and not re-run. The table
(mean ± std over seeds) has greedy pass@1, mean@k and pass@k at the rollout temperature,
and the share of greedy episodes that call the tool (``eval_tool_use_rate``); below it
the training rollouts' accuracy and tool use at the first and last step, and the times.
It is printed and written to ``--out``, headed by the commands, the commit and the machine.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STAGES = ("before", "after")
TOOLS = ("with", "without")
ROLLOUT_KEYS = ("accuracy", "tool_use_rate", "tool_calls_per_episode", "tool_errors_per_episode")


def _main(args, log_path):
    """`python -m grpo_jax.main args`, its output to `log_path`; returns its wall seconds."""
    begin = time.time()
    with open(log_path, "w") as log:
        status = subprocess.run([sys.executable, "-m", "grpo_jax.main", *args], cwd=REPO,
                                stdout=log, stderr=subprocess.STDOUT,
                                env={**os.environ, "PYTHONPATH": REPO}).returncode
    if status:
        raise RuntimeError(f"{' '.join(args)} failed (status {status}); see {log_path}")
    return time.time() - begin


def run_seed(config, seed, workdir):
    """Trains seed `seed` and evaluates its warm start and export with and without the
    tool (what is already done is kept). Returns `{"train_seconds": ..., "evals": ...}`."""
    run = os.path.join(workdir, f"seed{seed}")
    os.makedirs(run, exist_ok=True)
    timing_path = os.path.join(run, "timing.json")
    if not os.path.exists(os.path.join(run, "export", "config.json")):
        seconds = _main([f"--config={config}", f"--workdir={run}", f"--config.seed={seed}"],
                        os.path.join(run, "train.log"))
        with open(timing_path, "w") as f:
            json.dump({"train_seconds": seconds}, f)
    with open(os.path.join(run, "config.json")) as f:
        trained = json.load(f)
    paths = {"before": trained["model"]["path"], "after": os.path.join(run, "export")}
    environment = trained["environment"]["name"]
    evals = {}
    for stage in STAGES:
        for tool in TOOLS:
            out = os.path.join(run, f"eval_{stage}_{tool}")
            if not os.path.exists(os.path.join(out, "eval.json")):
                _main([f"--config={config}", f"--config.seed={seed}", "--config.mode=eval",
                       f"--config.model.path={paths[stage]}", "--config.model.name=",
                       f"--config.environment.name={environment if tool == 'with' else ''}",
                       f"--workdir={out}"], out + ".log")
            with open(os.path.join(out, "eval.json")) as f:
                evals[stage, tool] = json.load(f)
    with open(timing_path) as f:
        timing = json.load(f)
    # the RL steps: from the run's config (written once the warm start is ready) to its export
    rl_seconds = (os.path.getmtime(os.path.join(run, "export", "config.json"))
                  - os.path.getmtime(os.path.join(run, "config.json")))
    return {"seed": seed, "evals": evals, "rollouts": rollout_ends(run),
            "train_seconds": timing["train_seconds"], "rl_seconds": rl_seconds}


def rollout_ends(run):
    """`ROLLOUT_KEYS` of the run's first and last training step, and the environment's
    failures summed over all steps."""
    from grpo_jax import run_files
    rows = [r for r in run_files.read_metrics(run) if "accuracy" in r]
    return {
        "first": {k: rows[0][k] for k in ROLLOUT_KEYS},
        "last": {k: rows[-1][k] for k in ROLLOUT_KEYS},
        "steps": (rows[0]["step"], rows[-1]["step"]),
        "environment_failures": sum(r.get("environment_failures", 0) for r in rows),
    }


def _spread(values):
    if len(values) == 1:
        return f"{values[0]:.3f}"
    return f"{statistics.mean(values):.3f} ± {statistics.stdev(values):.3f}"


def format_table(results, header):
    """The table: one line per (stage, tool), mean ± std over seeds; then per seed."""
    lines = [*header, f"{'stage':8s} {'tool':8s} {'pass@1 (greedy)':>16s} {'mean@k':>16s} "
                      f"{'pass@k':>16s} {'greedy episodes calling':>24s}"]
    for stage in STAGES:
        for tool in TOOLS:
            cell = lambda key: [r["evals"][stage, tool][key] for r in results]
            calling = (_spread(cell("eval_tool_use_rate")) if tool == "with" else "-")
            lines.append(f"{stage:8s} {tool:8s} {_spread(cell('eval_accuracy')):>16s} "
                         f"{_spread(cell('eval_mean_at_k')):>16s} "
                         f"{_spread(cell('eval_pass_at_k')):>16s} {calling:>24s}")
    first, last = results[0]["rollouts"]["steps"]
    lines += [
        "", f"training rollouts (sampled at the rollout temperature): step {first} -> step {last}",
    ]
    for r in results:
        ends = r["rollouts"]
        lines.append(f"seed {r['seed']}: " + ", ".join(
            f"{k} {ends['first'][k]:.3f} -> {ends['last'][k]:.3f}" for k in ROLLOUT_KEYS)
            + f", environment_failures {ends['environment_failures']:.0f} over all steps")
    lines.append("")
    for r in results:
        parts = []
        for stage in STAGES:
            for tool in TOOLS:
                e = r["evals"][stage, tool]
                part = f"{stage} {tool}: pass@1 {e['eval_accuracy']:.3f}"
                if tool == "with":
                    part += (f", calls in {e['eval_tool_use_rate']:.3f}, "
                             f"{e['eval_tool_calls_per_episode']:.2f} calls per episode")
                parts.append(part)
        lines.append(f"seed {r['seed']} per run: " + "; ".join(parts))
    lines.append("times: " + "; ".join(
        f"seed {r['seed']} {r['train_seconds'] / 60:.1f} min whole training command, "
        f"RL steps {r['rl_seconds'] / 60:.1f} min" for r in results))
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--config", required=True, help="a tool recipe, e.g. configs/tool_countdown.py"
    )
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--out", help="also write the table here")
    args = parser.parse_args()
    sys.path.insert(0, REPO)   # the commit named is this checkout's, which the runs import
    from grpo_jax import sweep   # imports no JAX
    workdir = os.path.abspath(args.workdir)
    load = os.getloadavg()[0]
    header = [f"# {args.config}: held-out accuracy with the tool vs the same model and budget "
              "without it (--config.environment.name=), before RL (the SFT warm start) and after,",
              f"# seeds {' '.join(map(str, args.seeds))}, one at a time, each its own warm start. "
              f"commit {sweep.source_commit()}, {sweep.machine_description(os.cpu_count())}, "
              f"load {load:.1f} at the start.",
              f"# python experiments/tool_vs_no_tool.py --config {args.config} --seeds "
              f"{' '.join(map(str, args.seeds))} --workdir W (the commands it runs: its docstring)"]
    results = [run_seed(args.config, seed, workdir) for seed in args.seeds]
    table = format_table(results, header)
    print(table)
    if args.out:
        with open(args.out, "w") as f:
            f.write(table + "\n")


if __name__ == "__main__":
    main()
