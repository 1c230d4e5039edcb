"""SmolLM2-135M-Instruct through the math evaluation suite and 2 RL steps on MATH, on CPU.

    python experiments/smollm2_math_suite.py --checkpoint ~/ckpt/smollm2 \\
        --workdir /tmp/smollm2_math_suite --out experiments/results/smollm2_math_suite.txt

A pipeline check of the paper-scale math path with a real pretrained model (the GGUF
converted as in configs/smollm2.py's docstring), on the tests' sample files in each
release's official schema (``tests/data/release_samples.py``: 2-3 problems per
benchmark, 3 MATH training problems), laid out as an ``eval.suite_dir``:

1. ``mode=eval`` with ``eval.suite=math_reasoning`` (AIME 2024 and 2025, AMC 2023,
   MATH-500, Minerva Math, OlympiadBench at temperature 0.6, top-p 0.95): the first
   ``--problems`` of each benchmark, ``--samples`` answers each, ``--max_new_tokens``;
2. 2 RL steps of configs/smollm2.py (DAPO) with ``task.name=math`` reading the MATH
   sample's ``MATH.tar``: ``--prompts`` x ``--group_size`` answers, one update a step,
   graded by the ``math`` reward (the last ``\\boxed{}``).

Prompts are SmolLM2's own chat template (``task.chat_template=True``, ChatML with its
default system turn) over the question and the task's instruction, "Think step by step,
then put the final answer in \\boxed{}.": the format the model was instruction-tuned in,
asking for the ``\\boxed{}`` answer the suite grades. The numbers are a few sample
problems, not a benchmark score.
"""

import argparse
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

# The RL steps' metrics the output keeps (docs/metrics.md).
RL_METRICS = ("reward_mean", "accuracy", "response_length_mean", "truncation_rate",
              "groups_without_signal", "loss", "entropy", "kl_old", "time_rollout",
              "time_update")


def eval_config(args, checkpoint, suite_dir, workdir):
    """``mode=eval`` over the math suite: base.py with the run's sizes."""
    from grpo_jax import config_lib
    config = config_lib.load_config(os.path.join(ROOT, "configs", "base.py"))
    return config_lib.replaced(config, {
        "mode": "eval", "model.path": checkpoint, "model.name": "",
        "task.chat_template": True, "task.data_dir": os.path.join(workdir, "tfds"),
        "eval.suite": "math_reasoning", "eval.suite_dir": suite_dir,
        "eval.suite_problems": args.problems, "eval.samples": args.samples,
        "rollout.max_new_tokens": args.max_new_tokens})


def rl_config(args, checkpoint, suite_dir, workdir):
    """configs/smollm2.py (DAPO) on the MATH sample, `args.steps` steps of one update."""
    from grpo_jax import config_lib
    config = config_lib.load_config(
        f"{os.path.join(ROOT, 'configs', 'smollm2.py')}:path={checkpoint},steps={args.steps}")
    return config_lib.replaced(config, {
        "task.name": "math", "task.knobs": {},
        "task.manual_dir": os.path.join(suite_dir, "math"),
        "task.data_dir": os.path.join(workdir, "tfds"),
        "rollout.prompts_per_batch": args.prompts, "objective.group_size": args.group_size,
        "train.minibatches": 1, "train.micro_batches": 1,
        "rollout.max_new_tokens": args.rl_tokens,
        # One generation batch a step: the sample's 3 problems rarely give a group signal,
        # and drawing again would only lengthen the check.
        "filtering.max_gen_batches": 1,
        "reward.specs": (("math", 1.0),), "reward.correct": "math",
        # The sample's test split is one problem; no held-out evaluation runs (eval_every).
        "eval.num_prompts": 1, "train.log_rollouts_every": 1,
        "train.checkpoint_every": args.steps})


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--checkpoint", required=True, help="the converted SmolLM2 directory")
    parser.add_argument("--workdir", default="/tmp/smollm2_math_suite")
    parser.add_argument("--out", default=None, help="also write the printed output here")
    parser.add_argument("--problems", type=int, default=2, help="problems per benchmark")
    parser.add_argument("--samples", type=int, default=2, help="answers per problem (k)")
    parser.add_argument("--max_new_tokens", type=int, default=256)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--prompts", type=int, default=2)
    parser.add_argument("--group_size", type=int, default=4)
    parser.add_argument("--rl_tokens", type=int, default=192)
    args = parser.parse_args()

    from grpo_jax import parallel
    parallel.use_cpu_cores()
    import time

    from grpo_jax import run_files, sweep
    from grpo_jax.training import evaluation, rl
    from tests.data import release_samples

    checkpoint = os.path.abspath(os.path.expanduser(args.checkpoint))
    workdir = os.path.abspath(os.path.expanduser(args.workdir))
    suite_dir = str(release_samples.write_all(__import__("pathlib").Path(workdir) / "suite"))
    lines = [f"# python experiments/smollm2_math_suite.py --checkpoint DIR --problems "
             f"{args.problems} --samples {args.samples} --max_new_tokens {args.max_new_tokens}"
             f" --steps {args.steps} --prompts {args.prompts} --group_size {args.group_size}"
             f" --rl_tokens {args.rl_tokens}",
             f"# commit {sweep.source_commit()}, {sweep.machine_description(os.cpu_count())}, "
             f"load average {os.getloadavg()[0]:.1f}", ""]

    eval_dir = os.path.join(workdir, "eval")
    table_path = os.path.join(eval_dir, run_files.EVAL_SUITE_TABLE)
    if not os.path.exists(table_path):   # a rerun in the same workdir keeps a finished eval
        evaluation.evaluate_to_file(eval_config(args, checkpoint, suite_dir, workdir), eval_dir)
    with open(table_path) as f:
        table = f.read().rstrip("\n")
    seconds = os.path.getmtime(table_path) - os.path.getmtime(
        os.path.join(eval_dir, run_files.CONFIG))
    lines += [f"## mode=eval, eval.suite=math_reasoning ({seconds:.0f} s)", "", table, ""]

    start = time.time()
    rl_dir = os.path.join(workdir, "rl")
    rl.train(rl_config(args, checkpoint, suite_dir, workdir), rl_dir)
    rows = run_files.read_metrics(rl_dir)
    lines += [f"## {args.steps} RL steps (DAPO) on the MATH sample ({time.time() - start:.0f} s)",
              "", "| step | " + " | ".join(RL_METRICS) + " |",
              "|---" * (len(RL_METRICS) + 1) + "|"]
    for row in rows:
        if "loss" in row:
            lines.append(f"| {row['step']} | " + " | ".join(
                f"{row[name]:.4g}" if name in row else "-" for name in RL_METRICS) + " |")
    text = "\n".join(lines) + "\n"
    print(text, end="", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    print(json.dumps({"export": os.path.isdir(os.path.join(rl_dir, "export")),
                      "rollouts": os.path.join(rl_dir, "rollouts")}))


if __name__ == "__main__":
    main()
