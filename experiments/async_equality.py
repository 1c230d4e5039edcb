"""The asynchronous pipeline against the synchronous loop, on the command line: a fixed
staleness of k steps must give every metric of every step that ``rollout.policy_lag=k``
gives.

    python experiments/async_equality.py --workdir workdirs/async_equality \\
        [--config configs/dapo.py:runlocal=True] [--k 1] [--override key=value ...]

Runs the two commands below (each `python -m grpo_jax.main`, its own process, the same
config and seed; the SFT warm start is built by the first and found by the second):

    --config.async_rl.enabled=True --config.async_rl.max_staleness=k --config.async_rl.fixed=True
    --config.rollout.policy_lag=k

then compares, step by step, every metric both runs logged except timings (names with
"time", "tokens_per_s" or "s/step": wall clocks differ between any two runs), and the
exported parameters tensor by tensor. It prints one line per metric (the steps where the
two are equal, the largest difference) and a verdict, writes them to
``<workdir>/table.txt``, and exits with 1 when anything differs. ``staleness`` is
compared too: min(k, t - 1) in both. A run that finished in ``<workdir>/<name>_k<k>``
(its export written) is kept and compared again; delete it to run it again.
"""

import argparse
import os
import shlex
import subprocess
import sys

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TIMING = ("time", "tokens_per_s", "s/step")


def variants(k):
    """The two runs: name -> command-line overrides."""
    return {
        "async": ["--config.async_rl.enabled=True", f"--config.async_rl.max_staleness={k}",
                  "--config.async_rl.fixed=True"],
        "policy_lag": [f"--config.rollout.policy_lag={k}"],
    }


def compare_metrics(got, want):
    """Per metric (timings left out): (name, steps compared, steps equal, max |difference|);
    a metric logged at a step by only one run counts as a step that differs (inf)."""
    names = sorted({k for row in [*got.values(), *want.values()] for k in row
                    if not any(t in k for t in TIMING)})
    table = []
    for name in names:
        compared = equal = 0
        largest = 0.0
        for step in sorted(set(got) | set(want)):
            a, b = got.get(step, {}).get(name), want.get(step, {}).get(name)
            if a is None and b is None:
                continue
            compared += 1
            if a is None or b is None:
                largest = float("inf")
                continue
            if a == b or (np.isnan(a) and np.isnan(b)):
                equal += 1
            else:
                largest = max(largest, abs(a - b))
        table.append((name, compared, equal, largest))
    return table


def compare_exports(got_dir, want_dir):
    """(tensors, tensors equal bit for bit, names in only one of the two)."""
    from safetensors.numpy import load_file
    got = load_file(os.path.join(got_dir, "export", "model.safetensors"))
    want = load_file(os.path.join(want_dir, "export", "model.safetensors"))
    shared = got.keys() & want.keys()
    same = sum(np.array_equal(got[n], want[n]) for n in shared)
    return len(shared), same, sorted(got.keys() ^ want.keys())


def format_report(table, exports, header):
    lines = [*header, f"{'metric':40s} {'steps':>5s} {'equal':>5s} {'max |diff|':>11s}"]
    for name, compared, equal, largest in table:
        lines.append(f"{name:40s} {compared:5d} {equal:5d} {largest:11.3g}")
    differing = [name for name, compared, equal, _ in table if equal != compared]
    tensors, same, unmatched = exports
    lines.append(f"exported parameters: {same} of {tensors} tensors equal bit for bit"
                 + (f"; only in one export: {unmatched}" if unmatched else ""))
    steps = max((compared for _, compared, _, _ in table), default=0)
    if differing or same != tensors or unmatched:
        lines.append(f"DIFFERENT: {len(differing)} metrics differ ({', '.join(differing)})")
    else:
        lines.append(f"EQUAL: {len(table)} metrics over {steps} steps, every value the same, "
                     f"and the exported parameters")
    return "\n".join(lines), not differing and same == tensors and not unmatched


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/dapo.py:runlocal=True")
    parser.add_argument("--k", type=int, default=1, help="the staleness (policy lag)")
    parser.add_argument("--workdir", default="workdirs/async_equality")
    parser.add_argument("--override", action="append", default=[],
                        help="config field=value for both runs (e.g. train.steps=5)")
    args = parser.parse_args()
    os.makedirs(args.workdir, exist_ok=True)
    common = [f"--config={args.config}", *[f"--config.{o}" for o in args.override]]
    from grpo_jax import run_files, sweep   # the runs are their own processes
    header = ["# python " + " ".join(shlex.quote(a) for a in sys.argv),
              f"# commit {sweep.source_commit()}, {sweep.machine_description(os.cpu_count())}"]
    workdirs, kept = {}, []
    for name, flags in variants(args.k).items():
        workdir = workdirs[name] = os.path.abspath(os.path.join(args.workdir,
                                                                 f"{name}_k{args.k}"))
        command = [sys.executable, "-m", "grpo_jax.main", *common, f"--workdir={workdir}", *flags]
        shown = [*command[1:-len(flags) - 1], f"--workdir={os.path.relpath(workdir)}", *flags]
        header.append("# python " + " ".join(shlex.quote(a) for a in shown))
        if os.path.exists(os.path.join(workdir, "export", "model.safetensors")):
            print(f"{name}: finished in {workdir}, kept", flush=True)
            kept.append(name)
            continue
        print(f"{name}: {' '.join(command[1:])}", flush=True)
        with open(f"{workdir}.log", "w") as log:
            subprocess.run(command, check=True, stdout=log, stderr=subprocess.STDOUT,
                           cwd=REPO, env={**os.environ, "PYTHONPATH": REPO})
    if kept:   # the commit above is this comparison's, not necessarily those runs'
        header.insert(2, f"# kept from an earlier invocation (not run again): {', '.join(kept)}")
    by_step = lambda workdir: {row["step"]: row for row in run_files.read_metrics(workdir)}
    table = compare_metrics(by_step(workdirs["async"]), by_step(workdirs["policy_lag"]))
    exports = compare_exports(workdirs["async"], workdirs["policy_lag"])
    text, equal = format_report(table, exports, header)
    with open(os.path.join(args.workdir, "table.txt"), "w") as f:
        f.write(text + "\n")
    print(text)
    sys.exit(0 if equal else 1)


if __name__ == "__main__":
    main()
