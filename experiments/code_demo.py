"""Code RL on a CPU: held-out pass@1 of the SFT warm start, after DAPO, and after an
equal-time SFT control, per seed.

    python experiments/code_demo.py --seeds 0,1,2 --steps 20 --workdir /tmp/code_demo \\
        --out experiments/results/code_demo.md

Per seed, `configs/code.py:runlocal=True` (DAPO on ``code_tasks``, programs graded by
``code_tests`` in the sandbox; the tiny model) runs the CPU demo's three stages,
`grpo_jax.training.demo.run`: an SFT warm start from scratch (the recipe's ``sft``
section, 300 steps), ``--steps`` steps of RL from it, and SFT from the same warm start
for the wall time the RL stage took (the control: is the gain RL's or just more
training?). Each stage's policy is evaluated on the same held-out problems: greedy
pass@1 (every test of the problem passes) and mean@k, the mean correctness of k samples
at the rollout temperature (sampled pass@1).

The table gives each seed, the mean, and RL minus the SFT control (and RL minus the warm
start) paired by seed: the differences, their mean, the 95% t-interval with 5 seeds or
more (else their range) and the exact sign-flip p (`grpo_jax.report.stats`). Each seed's
results are kept in ``--workdir`` as JSON (``seed-S/results.json``, ``seed-S/summary.json``)
and each stage in its own directory, so re-running the command resumes where it stopped
(a stage interrupted mid-way resumes from its last checkpoint, and its recorded wall time
is then the resumed part's). Timing needs a quiet machine: the RL stage's time is what
the control gets. ``--sft-steps`` and ``--prompts`` shrink the warm start and the
held-out set for a smoke run (``--seeds 0 --steps 2 --sft-steps 20 --prompts 8``).

Cost: every RL step runs up to 256 programs in the sandbox (16 prompts x 4 answers, at
most 4 dynamic-sampling draws) and each evaluation 500 (100 problems, greedy and 4
samples), at 5.6-6.9 programs/s on 2 cores (docs/performance.md); with the warm start and
the control, a seed of the default command is about an hour of the 2 cores.
"""

import argparse
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import smollm2_cpu   # noqa: E402  (a stage's result kept as JSON: `stage`)

STAGES = ("warm", "rl", "sft")   # demo.run's rows, in order
LABELS = {"warm": "SFT warm start", "rl": "+ DAPO (RL)", "sft": "+ SFT, same time"}
METRICS = (("pass@1", "eval_accuracy"), ("mean@k", "eval_mean_at_k"))


def recipe_config(seed, steps, sft_steps=None, prompts=None):
    """`configs/code.py:runlocal=True` as the demo's pipeline runs it: `steps` RL steps,
    the warm start as its first stage (`sft_steps`; None: the recipe's), every stage
    evaluated once, at the end, on `prompts` held-out problems (None: the recipe's)."""
    from grpo_jax import config_lib
    config = config_lib.load_config(f"{os.path.join(ROOT, 'configs', 'code.py')}:runlocal=True")
    changes = {"mode": "demo", "seed": seed, "model.sft_warm_start": False,
               "train.steps": steps, "train.eval_every": 10**9, "sft.eval_every": 10**9}
    if sft_steps is not None:
        changes["sft.steps"] = sft_steps
    if prompts is not None:
        changes["eval.num_prompts"] = prompts
    return config_lib.replaced(config, changes)


def summary(results, workdir):
    """One seed's row: per stage its pass@1, mean@k, wall seconds and steps."""
    from grpo_jax import run_files
    row = {}
    for name, result, directory in zip(STAGES, results, ("sft", "rl", "sft_control")):
        row[name] = {key: result[field] for key, field in METRICS}
        row[name]["seconds"] = result["seconds"]
        row[name]["steps"] = run_files.last_logged_step(os.path.join(workdir, directory))
    return row


def run_seed(args, seed):
    """demo.run of `seed` in ``workdir/seed-S``, kept as ``summary.json``."""
    from grpo_jax.training import demo
    directory = os.path.join(args.workdir, f"seed-{seed}")
    config = recipe_config(seed, args.steps, args.sft_steps, args.prompts)
    return smollm2_cpu.stage(os.path.join(directory, "summary.json"),
                             lambda: summary(demo.run(config, directory), directory))


def mean(values):
    return float(sum(values)) / max(len(values), 1)


def paired_line(name, key, differences):
    """``b - a`` of `key` paired by seed: the differences, mean, interval, sign-flip p."""
    from grpo_jax.report import stats
    p = stats.sign_flip_p(differences)
    b, a = name.split(" - ")
    return (f"| {name} | {key} | {' '.join(f'{d:+.3f}' for d in differences)} | "
            f"{mean(differences):+.3f} | {stats.interval_text(differences)} | "
            f"{stats.format_p(p)} | "
            f"{stats.verdict(b, a, mean(differences), p, len(differences), adjusted=False)} |")


def command_line(args):
    """The command that made the table (the workdir and output left out)."""
    line = f"python experiments/code_demo.py --seeds {args.seeds} --steps {args.steps}"
    for flag, value in (("--sft-steps", args.sft_steps), ("--prompts", args.prompts)):
        line += f" {flag} {value}" if value is not None else ""
    return line


def format_table(per_seed, *, command, prompts, k, machine):
    """The markdown table: each seed's stages, their means, and the paired differences.

    Args:
      per_seed: ``{seed: summary}`` (`summary`).
      command: the command line (`command_line`); prompts: held-out problems; k: the
        samples of mean@k.
      machine: ``commit``, ``machine`` and ``load`` of the run.
    """
    from grpo_jax.report import stats
    seeds = sorted(per_seed)
    lines = [
        command,
        "",
        f"Commit {machine['commit']}, {machine['machine']}, load {machine['load']} at the "
        f"start. configs/code.py:runlocal=True (DAPO on code_tasks, the tiny model); "
        f"{prompts} held-out problems: pass@1 greedy, mean@{k} over {k} samples at the "
        "rollout temperature; a problem counts when every test passes. The SFT control "
        "trains from the same warm start for the RL stage's wall time.",
        "",
        "| seed | stage | pass@1 | mean@k | steps | seconds |",
        "|---|---|---:|---:|---:|---:|"]
    for seed in seeds:
        for name in STAGES:
            row = per_seed[seed][name]
            lines.append(f"| {seed} | {LABELS[name]} | {row['pass@1']:.3f} | "
                         f"{row['mean@k']:.3f} | {row['steps']} | {row['seconds']:.0f} |")
    for name in STAGES:
        rows = [per_seed[seed][name] for seed in seeds]
        lines.append(f"| mean of {len(seeds)} | {LABELS[name]} | "
                     f"{mean([r['pass@1'] for r in rows]):.3f} | "
                     f"{mean([r['mean@k'] for r in rows]):.3f} | "
                     f"{mean([r['steps'] for r in rows]):.0f} | "
                     f"{mean([r['seconds'] for r in rows]):.0f} |")
    lines += ["", "Paired by seed (the 95% t-interval with 5 seeds or more, else the range; "
              "the exact sign-flip p):", "",
              "| difference | metric | per seed | mean | interval | p | verdict |",
              "|---|---|---|---:|---|---:|---|"]
    for b, a in (("rl", "sft"), ("rl", "warm")):
        name = f"{'RL' if b == 'rl' else b} - {'SFT' if a == 'sft' else 'warm start'}"
        for key, _ in METRICS:
            lines.append(paired_line(name, key, [per_seed[s][b][key] - per_seed[s][a][key]
                                                 for s in seeds]))
    se = stats.binomial_se(0.5, prompts)
    lines += ["", f"Evaluation noise: a pass@1 near 0.5 on {prompts} problems has a binomial "
              f"standard error of {se:.3f}."]
    return "\n".join(lines) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--steps", type=int, default=20, help="RL steps per seed")
    parser.add_argument("--sft-steps", type=int, default=None,
                        help="the warm start's SFT steps (default: the recipe's, 300)")
    parser.add_argument("--prompts", type=int, default=None,
                        help="held-out problems (default: the recipe's, 100)")
    parser.add_argument("--workdir", default="/tmp/code_demo")
    parser.add_argument("--out", default=None,
                        help="where the table goes (default: WORKDIR/table.md)")
    args = parser.parse_args()
    if args.steps < 1:
        raise SystemExit(f"code_demo: --steps must be >= 1, got {args.steps}")
    args.workdir = os.path.abspath(os.path.expanduser(args.workdir))
    out = os.path.abspath(args.out or os.path.join(args.workdir, "table.md"))

    from grpo_jax import parallel
    parallel.use_cpu_cores()
    from grpo_jax import sweep
    os.makedirs(args.workdir, exist_ok=True)
    seeds = [int(s) for s in args.seeds.split(",")]
    machine = smollm2_cpu.stage(os.path.join(args.workdir, "machine.json"), lambda: {
        "commit": sweep.source_commit(), "machine": sweep.machine_description(os.cpu_count()),
        "load": round(os.getloadavg()[0], 1)})
    per_seed = {}
    for index, seed in enumerate(seeds):
        begin = time.time()
        print(f"code_demo: seed {seed} ({index + 1} of {len(seeds)}): SFT warm start, "
              f"{args.steps} RL steps, SFT control for the RL stage's time", flush=True)
        per_seed[seed] = row = run_seed(args, seed)
        print(f"code_demo: seed {seed} done in {time.time() - begin:.0f} s: pass@1 warm start "
              f"{row['warm']['pass@1']:.3f}, RL {row['rl']['pass@1']:.3f}, SFT control "
              f"{row['sft']['pass@1']:.3f}", flush=True)
    config = recipe_config(seeds[0], args.steps, args.sft_steps, args.prompts)
    table = format_table(per_seed, command=command_line(args), prompts=config.eval.num_prompts,
                         k=config.eval.samples, machine=machine)
    print(table, end="", flush=True)
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w") as f:
        f.write(table)
    print(f"code_demo: table written to {out}", flush=True)


if __name__ == "__main__":
    main()
