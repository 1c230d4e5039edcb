"""Recipes (or settings of one) at equal wall time: held-out accuracy, steps, time and
memory, per seed; VAPO beside DAPO by default.

    python experiments/vapo_vs_dapo.py --seconds 900 --seeds 0 1 2 \\
        --workdir workdirs/vapo_vs_dapo [--recipes dapo vapo] [--override key=value ...]
    python experiments/vapo_vs_dapo.py --seconds 240 --workdir workdirs/async_cpu \\
        --run sync=dapo --run async_k1=dapo,async_rl.enabled=True,async_rl.max_staleness=1

``--run NAME=RECIPE[,key=value...]`` names a row and its own overrides (after the
``--override`` ones every run gets); ``--recipes R`` is ``--run R=R``. A RECIPE with its
own argument, ``RECIPE:ARG``, loads ``configs/<recipe>.py:ARG`` instead of runlocal's
(SmolLM2 from a converted checkpoint, ``--run sync=smollm2:path=$HOME/ckpt/smollm2``).

Each (run, seed) trains `configs/<recipe>.py:runlocal=True` (the tiny model on 3-digit
addition, from the seed's cached SFT warm start) for `--seconds` of wall time, counted
from the first RL step (VAPO's value pre-training, compilation and everything else the
loop does included; the warm start, built once per seed, is not; with dynamic sampling
a batch short of groups with signal is padded: ``filtering.short_batch="pad"``), then
its exported policy is evaluated on the held-out prompts (`eval.num_prompts`, greedy pass@1 and
mean@k / pass@k). Each run is its own process, so its wall time and peak memory are its
own: the memory columns are the accelerator's peak bytes in use (device 0, where JAX
reports it: GPU, TPU) and the process's peak resident memory (on CPU the devices' memory
is the host's). Finished runs are kept in ``<workdir>/results.jsonl`` and not re-run; the
table (mean and spread over seeds) is printed and written to ``<workdir>/table.txt``,
headed by the command, the commit and the machine.

Timing needs a quiet machine: every run gets the same number of seconds, so anything
else running steals steps from one recipe and not the other.
"""

import argparse
import ast
import json
import os
import shlex
import statistics
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _parse_override(text):
    key, _, value = text.partition("=")
    try:
        return key, ast.literal_eval(value)
    except (ValueError, SyntaxError):
        return key, value


def parse_run(text):
    """``NAME=RECIPE[,key=value...]`` -> (name, recipe, [key=value, ...])."""
    name, _, rest = text.partition("=")
    recipe, *overrides = rest.split(",")
    if not name or not recipe or not all("=" in o for o in overrides):
        raise SystemExit(f"--run {text!r}: expected NAME=RECIPE[,key=value...], e.g. "
                         "async_k1=dapo,async_rl.enabled=True")
    return name, recipe, overrides


def config_spec(recipe):
    """``RECIPE`` -> configs/RECIPE.py:runlocal=True; ``RECIPE:ARG`` -> configs/RECIPE.py:ARG."""
    name, colon, arg = recipe.partition(":")
    return os.path.join(REPO, "configs", f"{name}.py:{arg if colon else 'runlocal=True'}")


def run_one(args):
    """One (run, seed) run in this process; prints its result as the last JSON line."""
    from grpo_jax import config_lib, parallel
    parallel.use_cpu_cores()
    import jax
    from grpo_jax.training import evaluation, rl, warm_start
    config = config_lib.load_config(config_spec(args.recipe))
    config_lib.apply_overrides(config, {
        "seed": args.seed, "train.steps": 10**6, "train.eval_every": 10**9,
        "train.checkpoint_every": 10**9, "train.export": True,
        # A run against the clock outlives the prompts with signal (DAPO solves nearly all
        # of them within minutes): with dynamic sampling, a short batch trains on the
        # groups found instead of stopping the run.
        "filtering.short_batch": "pad"})
    config_lib.apply_overrides(config, dict(_parse_override(o) for o in args.override))
    workdir = os.path.join(os.path.abspath(args.workdir), f"{args.name}_seed{args.seed}")
    config, workdir = config_lib.resolve_run_paths(config, workdir)   # as rl.train does first
    config = warm_start.prepared(config)   # built (or found) before the clock starts
    begin = time.time()
    steps = rl.train(config, workdir, seconds=args.seconds)
    seconds = time.time() - begin
    metrics = evaluation.evaluate_export(config, os.path.join(workdir, "export"))
    device = jax.devices()[0].memory_stats() or {}
    pretrain = min(steps, config.critic.pretrain_steps)
    print(json.dumps({"recipe": args.name, "config": args.recipe, "seed": args.seed,
                      "overrides": args.override, "budget_seconds": args.seconds,
                      "rl_steps": steps - pretrain,
                      "value_pretrain_steps": pretrain, "seconds": round(seconds, 1),
                      "device_peak_bytes": device.get("peak_bytes_in_use"), **metrics}))


def _child(args, run, seed):
    """Runs `run_one` in a fresh process; returns its result with its peak RSS."""
    name, recipe, overrides = run
    command = [sys.executable, os.path.abspath(__file__), "--one", recipe, str(seed),
               "--name", name, "--seconds", str(args.seconds), "--workdir", args.workdir,
               *[f"--override={o}" for o in [*args.override, *overrides]]]
    env = {**os.environ, "PYTHONPATH": REPO}
    log_path = os.path.join(args.workdir, f"{name}_seed{seed}.log")
    with open(log_path, "w") as log:
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=log, env=env, text=True)
        out = process.stdout.read()
        _, status, usage = os.wait4(process.pid, 0)
    if status:
        raise RuntimeError(f"{name} seed {seed} failed (status {status}); see {log_path}")
    with open(log_path, "a") as log:
        log.write(out)
    result = json.loads(out.strip().splitlines()[-1])
    result["peak_rss_bytes"] = usage.ru_maxrss * 1024   # Linux reports KiB
    return result


def _describe_machine():
    from grpo_jax import sweep   # imports no JAX: use_cpu_cores still comes first in run_one
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return (f"commit {sweep.source_commit()}, {sweep.machine_description(os.cpu_count())}, "
            f"load {load:.1f} at the start")


def _spread(values):
    values = [v for v in values if v is not None]
    if not values:
        return "n/a"
    mean = statistics.mean(values)
    return f"{mean:.3f} ± {statistics.stdev(values):.3f}" if len(values) > 1 else f"{mean:.3f}"


def format_table(results, header):
    width = max([8, *(len(r["recipe"]) for r in results)])
    lines = [*header,
             f"{'run':{width}s} {'seeds':>5s} {'pass@1':>15s} {'mean@k':>15s} {'pass@k':>15s} "
             f"{'RL steps':>9s} {'s/step':>7s} {'seconds':>8s} {'device GiB':>10s} {'RSS GiB':>8s}",
             "(s/step: the budget over the RL steps it held; seconds: the whole training "
             "call, set-up and export included; the budget counts from the first step)"]
    for recipe in dict.fromkeys(r["recipe"] for r in results):
        rows = [r for r in results if r["recipe"] == recipe]
        gib = lambda key: [r[key] / 2**30 if r.get(key) else None for r in rows]
        rl_steps = statistics.mean(r["rl_steps"] for r in rows)
        per_step = statistics.mean(r.get("budget_seconds", float("nan")) / max(r["rl_steps"], 1)
                                   for r in rows)
        lines.append(
            f"{recipe:{width}s} {len(rows):5d} {_spread([r['eval_accuracy'] for r in rows]):>15s} "
            f"{_spread([r.get('eval_mean_at_k') for r in rows]):>15s} "
            f"{_spread([r.get('eval_pass_at_k') for r in rows]):>15s} "
            f"{rl_steps:9.1f} {per_step:7.2f} "
            f"{statistics.mean(r['seconds'] for r in rows):8.0f} "
            f"{_spread(gib('device_peak_bytes')):>10s} {_spread(gib('peak_rss_bytes')):>8s}")
    lines.append("per run: " + "; ".join(
        f"{r['recipe']} seed {r['seed']}: pass@1 {r['eval_accuracy']:.3f}, {r['rl_steps']} RL "
        f"steps after {r['value_pretrain_steps']} of value pre-training" for r in results))
    return "\n".join(lines)


# Per-step timings, where a run logs them: the rollout, the old log-probs, the update, the
# learner's wait for an asynchronous producer, the staleness, and split meshes' copies.
STEP_METRICS = ("time_rollout", "time_old_logp", "time_update", "time_rollout_wait",
                "staleness", "time_weight_transfer", "time_batch_transfer")
FROM_STEP = 6   # the first steps compile (--from_step: 2 for a run of a few long steps)


def format_step_table(results, workdir, from_step=FROM_STEP):
    """Each run's per-step `STEP_METRICS` (those it logs), the mean over steps from
    `from_step` on, one column per metric, one value per seed."""
    from grpo_jax import run_files
    names = list(dict.fromkeys(r["recipe"] for r in results))
    means = {}
    for r in results:
        rows = [row for row in run_files.read_metrics(
            os.path.join(workdir, f"{r['recipe']}_seed{r['seed']}")) if row["step"] >= from_step]
        means[r["recipe"], r["seed"]] = {
            key: statistics.mean(row[key] for row in rows) for key in STEP_METRICS
            if rows and all(key in row for row in rows)}
    keys = [k for k in STEP_METRICS if any(k in m for m in means.values())]
    seeds = lambda name: [r["seed"] for r in results if r["recipe"] == name]
    lines = [f"# per step, mean over steps {from_step}.. of each run, per seed "
             f"{' / '.join(map(str, seeds(names[0])))} (seconds; from metrics.jsonl):",
             f"{'run':14s}" + "".join(f"{k:>24s}" for k in keys)]
    for name in names:
        cells = [" / ".join(f"{means[name, s][k]:.2f}" if k in means[name, s] else "-"
                            for s in seeds(name)) for k in keys]
        lines.append(f"{name:14s}" + "".join(f"{c:>24s}" for c in cells))
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=900.0, help="wall time per run")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--recipes", nargs="+", default=None, help="default: dapo vapo")
    parser.add_argument("--run", action="append", default=[], metavar="NAME=RECIPE[,k=v...]",
                        help="a row of its own: a recipe with its own overrides")
    parser.add_argument("--name", help=argparse.SUPPRESS)
    parser.add_argument("--workdir", default="workdirs/vapo_vs_dapo")
    parser.add_argument("--override", action="append", default=[],
                        help="config field=value for every run (e.g. eval.num_prompts=100)")
    parser.add_argument("--from_step", type=int, default=FROM_STEP,
                        help="the per-step table's first step (the steps before compile)")
    parser.add_argument("--one", nargs=2, metavar=("RECIPE", "SEED"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        args.recipe, args.seed = args.one[0], int(args.one[1])
        args.name = args.name or args.recipe
        return run_one(args)
    runs = [parse_run(r) for r in args.run]
    runs += [(r, r, []) for r in (args.recipes or ([] if runs else ["dapo", "vapo"]))]

    os.makedirs(args.workdir, exist_ok=True)
    header = ["# python " + " ".join(shlex.quote(a) for a in sys.argv),
              "# " + _describe_machine(),
              f"# configs/<recipe>.py:runlocal=True (or :ARG), {args.seconds:.0f} s of wall "
              "time per run from the first RL step; held-out accuracy of the exported policy "
              "(mean ± std over seeds)"]
    record = os.path.join(args.workdir, "results.jsonl")
    done = []
    if os.path.exists(record):
        with open(record) as f:
            done = [json.loads(line) for line in f if line.strip()]
    results = []
    for seed in args.seeds:
        for run in runs:
            name = run[0]
            previous = [r for r in done if r["recipe"] == name and r["seed"] == seed]
            if previous:
                results.append(previous[-1])
                continue
            print(f"{name} seed {seed}: training for {args.seconds:.0f} s", flush=True)
            result = _child(args, run, seed)
            results.append(result)
            with open(record, "a") as f:
                f.write(json.dumps(result) + "\n")
            print(json.dumps(result), flush=True)
    table = format_table(results, header) + "\n\n" + format_step_table(results, args.workdir,
                                                                args.from_step)
    with open(os.path.join(args.workdir, "table.txt"), "w") as f:
        f.write(table + "\n")
    print(table)


if __name__ == "__main__":
    main()
