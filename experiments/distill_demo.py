"""On-policy distillation on the CPU demo: the demo's DAPO export teaches its SFT warm start.

    python -m grpo_jax.main                     # the demo first: workdirs/demo
    python experiments/distill_demo.py --demo workdirs/demo --seeds 0 1 2 \\
        --workdir workdirs/distill_demo [--arms distill mixed rl] [--steps 20]

From the demo's SFT warm start (``<demo>/sft/export``, the student) each arm trains the
demo's RL setting (configs/demo.py: DAPO's runlocal regime, 64 prompts x 8 answers, 4
updates per batch) for ``--steps`` steps, evaluating the held-out prompts every
``--eval-every`` steps:

- ``distill``: pure on-policy distillation from the demo's DAPO export
  (``<demo>/rl/export``, the teacher): ``objective.advantage.estimator="reverse_kl"``,
  no reward read;
- ``mixed``: DAPO's reward advantages plus ``distill.weight`` x the teacher's term;
- ``rl``: DAPO alone from the same start (the demo's RL stage with more evaluations).

The table gives, per arm and seed, the held-out greedy accuracy after each evaluation
and the first step whose accuracy reaches the teacher's (from ``<demo>/results.json``),
and is written to ``<workdir>/table.txt``. Each run is its own process
(``python -m grpo_jax.main``), and a finished run (its metrics.jsonl has the last step)
is not re-run. The same file is the runs' config: ``--config
experiments/distill_demo.py:arm=distill,demo=workdirs/demo,seed=0``.
"""

import argparse
import json
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ARMS = ("distill", "mixed", "rl")


def get_config(arg=None):
    """configs/demo.py's RL stage from the demo's warm start, with the arm's objective."""
    from grpo_jax import config_lib
    arg = config_lib.parse_arg(arg, arm="distill", demo="workdirs/demo", seed=0, steps=20,
                               eval_every=5, weight=1.0, eval_prompts=500)
    if arg.arm not in ARMS:
        raise ValueError(f"arm must be one of {ARMS}, got {arg.arm!r}")
    config = config_lib.load_config(f"{os.path.join(REPO, 'configs', 'demo.py')}:seed={arg.seed}")
    config.mode = "rl"
    config.model.path = os.path.join(arg.demo, "sft", "export")
    config.model.name = ""
    config.train.steps = arg.steps
    config.train.eval_every = arg.eval_every
    config.train.eval_at_start = True
    config.train.export = False
    config.eval.num_prompts = arg.eval_prompts
    if arg.arm != "rl":
        config.distill.teacher_path = os.path.join(arg.demo, "rl", "export")
        config.distill.weight = arg.weight
    if arg.arm == "distill":   # the teacher's term alone: every group has signal
        config.objective.advantage.estimator = "reverse_kl"
        config.distill.weight = 1.0
        config.filtering.dynamic_sampling = False
    return config


def _finished(workdir, steps):
    path = os.path.join(workdir, "metrics.jsonl")
    if not os.path.exists(path):
        return False
    with open(path, encoding="utf-8") as f:
        return any(json.loads(line)["step"] == steps for line in f)


def _accuracies(workdir):
    with open(os.path.join(workdir, "metrics.jsonl"), encoding="utf-8") as f:
        rows = [json.loads(line) for line in f]
    return {r["step"]: r["eval_accuracy"] for r in rows if "eval_accuracy" in r}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--demo", default="workdirs/demo")
    parser.add_argument("--workdir", default="workdirs/distill_demo")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--arms", nargs="+", default=list(ARMS), choices=ARMS)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--eval-every", type=int, default=5)
    parser.add_argument("--weight", type=float, default=1.0, help="distill.weight of 'mixed'")
    args = parser.parse_args()
    demo = os.path.abspath(args.demo)
    with open(os.path.join(demo, "results.json"), encoding="utf-8") as f:
        teacher = next(r for r in json.load(f) if "DAPO" in r["stage"])["eval_accuracy"]
    lines = [f"teacher (<demo>/rl/export) held-out greedy accuracy {teacher:.1%}",
             f"{'arm':8s} {'seed':>4s}  accuracy by step{'':20s} first step >= teacher"]
    for arm in args.arms:
        for seed in args.seeds:
            workdir = os.path.join(os.path.abspath(args.workdir), f"{arm}_seed{seed}")
            if not _finished(workdir, args.steps):
                spec = (f"{os.path.abspath(__file__)}:arm={arm},demo={demo},seed={seed},"
                        f"steps={args.steps},eval_every={args.eval_every},weight={args.weight}")
                subprocess.run([sys.executable, "-m", "grpo_jax.main", f"--config={spec}",
                                f"--workdir={workdir}"], check=True, cwd=REPO)
            accuracy = _accuracies(workdir)
            reached = [s for s, a in sorted(accuracy.items()) if a >= teacher]
            by_step = " ".join(f"{s}:{a:.1%}" for s, a in sorted(accuracy.items()))
            lines.append(f"{arm:8s} {seed:4d}  {by_step:36s} {reached[0] if reached else '-'}")
    table = "\n".join(lines)
    print(table)
    os.makedirs(args.workdir, exist_ok=True)
    with open(os.path.join(args.workdir, "table.txt"), "w", encoding="utf-8") as f:
        f.write(table + "\n")


if __name__ == "__main__":
    main()
