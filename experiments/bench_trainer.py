"""Step time split of the RL loop (rollout, behaviour log-probs, update) and tokens/s.

    python experiments/bench_trainer.py [--steps 6] [--checkpoint DIR] [--config configs/demo.py]

Runs `--steps` DAPO steps of the demo's settings (64 prompts x 8 completions, the tiny
model) in a scratch workdir and prints the median of each timing over the steps after
the first (which compiles). With `--checkpoint`, starts from that HF checkpoint (e.g. the
demo's `workdirs/demo/sft/export`, so rewards have signal); otherwise from a random
tiny model. Prints the machine and commit so the table can be quoted. Like
`python -m grpo_jax.main`, it runs on one CPU device per core (`parallel.use_cpu_cores`;
XLA_FLAGS=--xla_force_host_platform_device_count=1 measures a single device).
"""

import argparse
import json
import os
import platform
import statistics
import subprocess
import tempfile

import jax

from grpo_jax import config_lib, parallel
from grpo_jax.training import rl

parallel.use_cpu_cores()   # before JAX runs anything, as grpo_jax.main does

TIMINGS = ("time_rollout", "time_old_logp", "time_update", "rollout_tokens_per_s",
           "update_tokens_per_s", "gen_batches")


def _cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            return next(l.split(":", 1)[1].strip() for l in f if l.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or "unknown"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/demo.py")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--checkpoint", default="")
    parser.add_argument("--data_dir", default="")
    args = parser.parse_args(argv)

    config = config_lib.load_config(args.config)
    config.mode = "rl"
    config.train.steps = args.steps
    config.train.eval_every = 10**9
    config.train.checkpoint_every = 10**9
    config.train.export = False
    if args.checkpoint:
        config.model.path, config.model.name = args.checkpoint, ""
    if args.data_dir:
        config.task.data_dir = args.data_dir
    with tempfile.TemporaryDirectory() as workdir:
        rl.train(config, workdir)
        with open(os.path.join(workdir, "metrics.jsonl")) as f:
            rows = [json.loads(line) for line in f][1:]

    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    print(f"# bench_trainer  commit {commit}  {_cpu_name()}, {os.cpu_count()} cores, "
          f"{jax.devices()[0].platform} x {jax.device_count()}, jax {jax.__version__}, "
          f"load {os.getloadavg()[0]:.1f}")
    print(f"# {args.config}: {config.rollout.prompts_per_batch} prompts x "
          f"{config.objective.group_size}, max {config.rollout.max_new_tokens} new tokens, "
          f"model {config.model.path or config.model.name}; median of steps 2..{args.steps}")
    print(f"{'quantity':24s} {'median':>12s}")
    for name in TIMINGS:
        print(f"{name:24s} {statistics.median(r[name] for r in rows):12.2f}")
    step = statistics.median(r["time_rollout"] + r["time_old_logp"] + r["time_update"] for r in rows)
    print(f"{'step (sum of the three)':24s} {step:12.2f}")


if __name__ == "__main__":
    main()
