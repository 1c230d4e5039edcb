"""SmolLM2-135M-Instruct with controls: is RL's gain more than learning to stop, or than SFT?

    python experiments/smollm2_controls.py --checkpoint ~/ckpt/smollm2 --minutes 20 \\
        --seeds 0,1,2 --workdir /tmp/smollm2_controls \\
        --results experiments/results/smollm2_controls \\
        --out experiments/results/smollm2_controls.txt

`configs/smollm2.py` (DAPO, 2-digit addition in chat; see its docstring) takes greedy
held-out accuracy from 7% to 79% in 45 minutes, but the base model's score is held down by
its grader: greedy base answers often get the sum right on their first line and then
repeat themselves until the budget cuts them, and the ``gsm8k`` grader reads the last
number written. This script measures the controls that separate the gains:

1. the base model's greedy answers, graded whole (the recipe's grader) and graded on their
   first non-empty line only (a stop at the first answer line: what the base model knows
   before it learns to stop);
2. the base model with a one-shot prompt (`task.shots`: one worked example, ``12+30``
   answered ``12+30=42`` then ``#### 42``, as an earlier chat turn): what a prompt buys;
3. per seed, two runs at the same time, each pinned to its own CPU core for the same wall
   time (`--minutes`): DAPO (the recipe), and an SFT control from the same base model on
   the task's reference solutions (``#### <sum>``, the format the reward asks for) with the
   RL run's optimizer, learning rate and update size (32 answers); each ends after its
   first step past the budget. Equal wall time on equal cores is the equal compute.

Every model is evaluated greedily on the same `--prompts` held-out prompts (500: the
binomial standard error of an accuracy near 0.5 is 0.022, under the seeds' spread) and
graded whole and on its first line. The table gives each seed, the mean, and RL minus SFT
paired by seed with its t-interval (5 seeds or more; else the range) and its exact
sign-flip p. Each stage is kept in
`--workdir` as JSON, so re-running the command resumes where it stopped.
"""

import argparse
import gzip
import json
import os
import shutil
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import smollm2_cpu   # noqa: E402  (held-out answers, stages, summaries)

CHILDREN = ("rl", "sft")   # run side by side, one core each
LABELS = {"rl": "DAPO (RL)", "sft": "SFT control"}


def recipe_config(checkpoint, prompts, seed, recipe=""):
    """The recipe (with `recipe`'s arguments, e.g. ``strict=True``) with `prompts` held-out
    prompts (the test split sized to match)."""
    from grpo_jax import config_lib
    extra = f",{recipe}" if recipe else ""
    config = config_lib.resolve_paths(config_lib.load_config(
        f"{os.path.join(ROOT, 'configs', 'smollm2.py')}:path={checkpoint},steps=100000{extra}"))
    return config_lib.replaced(config, {"task.knobs.num_test": prompts,
                                        "eval.num_prompts": prompts, "seed": seed})


def sft_control_config(config):
    """The SFT control: the recipe's base model, optimizer and update size (the RL run's
    answers per update), trained until its time budget ends."""
    from grpo_jax import config_lib
    answers_per_update = (config.rollout.prompts_per_batch * config.objective.group_size
                          // config.train.minibatches)
    changes = {"sft.steps": 10**9, "sft.eval_every": 10**9, "sft.log_every": 1,
               "sft.checkpoint_every": 5, "sft.batch_size": answers_per_update}
    changes.update({f"sft.optimizer.{key}": value for key, value in config.optimizer.items()})
    return config_lib.replaced(config, changes)


def first_line(completion):
    """The completion's first non-empty line (the whole text when it has none)."""
    return next((line for line in completion.splitlines() if line.strip()), completion)


def graded(rows, examples):
    """`rows` (kept answers) with ``first_line``: each first line graded by ``gsm8k``."""
    from grpo_jax import rewards
    return {**rows, "first_line": [rewards.gsm8k_reward(e["question"], first_line(c), e) >= 1
                                   for c, e in zip(rows["completion"], examples)]}


def child(args):
    """One side of a seed's pair: trains for the budget, then answers the held-out prompts."""
    os.sched_setaffinity(0, {args.core})   # before JAX starts its threads
    from grpo_jax import parallel
    parallel.use_cpu_cores()
    from grpo_jax.training import rl, sft
    config = recipe_config(args.checkpoint, args.prompts, args.seed, args.recipe)
    directory = os.path.join(args.workdir, f"seed-{args.seed}", args.child)
    train = (lambda: rl.train(config, directory, seconds=args.minutes * 60)) \
        if args.child == "rl" else \
        (lambda: sft.train(sft_control_config(config), directory, seconds=args.minutes * 60))
    trained = smollm2_cpu.stage(directory + ".json", lambda: {"steps": train()})
    smollm2_cpu.stage(directory + "_answers.json", lambda: smollm2_cpu.held_out_answers(
        config, os.path.join(directory, "export")))
    print(f"{args.child} seed {args.seed}: {trained['steps']} steps", flush=True)


def run_pair(args, seed):
    """Starts the RL run and the SFT control of `seed` side by side, one core each."""
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        raise SystemExit("smollm2_controls: the pair needs 2 cores (one per run); "
                         f"this process may use {len(cores)}")
    processes = []
    for name, core in zip(CHILDREN, cores):
        directory = os.path.join(args.workdir, f"seed-{seed}")
        os.makedirs(directory, exist_ok=True)
        log = open(os.path.join(directory, f"{name}.log"), "a")
        command = [sys.executable, os.path.abspath(__file__), "--child", name,
                   "--core", str(core), "--seed", str(seed), "--checkpoint", args.checkpoint,
                   "--minutes", str(args.minutes), "--prompts", str(args.prompts),
                   "--workdir", args.workdir, "--recipe", args.recipe]
        processes.append((name, log, subprocess.Popen(command, stdout=log,
                                                      stderr=subprocess.STDOUT)))
        print(f"seed {seed}: {name} on core {core}, log {log.name}", flush=True)
    for name, log, process in processes:
        if process.wait() != 0:
            raise SystemExit(f"smollm2_controls: the {name} run of seed {seed} failed "
                             f"(exit {process.returncode}); see {log.name}")
        log.close()


def load(path):
    with open(path) as f:
        return json.load(f)


def summarised(rows, examples):
    """`smollm2_cpu.summary` of kept answers, with the first lines' accuracy."""
    return {**smollm2_cpu.summary(rows), "first_line": mean(graded(rows, examples)["first_line"])}


def seed_rows(args, seed, examples):
    """{child: (summary with first_line, steps)} of one seed's finished pair."""
    out = {}
    for name in CHILDREN:
        base = os.path.join(args.workdir, f"seed-{seed}", name)
        out[name] = (summarised(load(base + "_answers.json"), examples),
                     load(base + ".json")["steps"])
    return out


def mean(values):
    return float(sum(values)) / max(len(values), 1)


def format_table(args, machine, base_rows, per_seed):
    """The table: base controls, each seed's RL and SFT, means, and the paired RL - SFT."""
    from grpo_jax.report import stats as report_stats
    head = (f"{'model':<30s} {'steps':>5s} {'accuracy':>8s} {'first line':>10s} "
            f"{'strict':>6s} {'format':>6s} {'length':>6s} {'cut':>5s}")
    line = lambda name, s, steps="": (
        f"{name:<30s} {str(steps):>5s} {s['accuracy']:8.3f} {s['first_line']:10.3f} "
        f"{s['strict_accuracy']:6.3f} {s['format']:6.3f} {s['mean_length']:6.1f} "
        f"{s['truncated']:5.3f}")
    lines = [
        "# python experiments/smollm2_controls.py --checkpoint DIR "
        f"--minutes {args.minutes:g} --seeds {args.seeds} --prompts {args.prompts}"
        + (f" --recipe {args.recipe}" if args.recipe else ""),
        f"# commit {machine['commit']}, {machine['machine']}, load {machine['load']} at the start",
        "# SmolLM2-135M-Instruct (Q4_1 GGUF, converted to float32), configs/smollm2.py"
        + (f":{args.recipe}" if args.recipe else "") + " (DAPO,",
        f"# 2-digit addition in chat); greedy answers to the same {args.prompts} held-out prompts.",
        "# accuracy: the recipe's gsm8k grader (number after the last ####, else the last",
        "# number); first line: the same grader on the answer's first non-empty line only;",
        "# strict: exactly the right integer after the last ####; format: an integer after the",
        "# last ####; length: mean tokens; cut: answers that hit the 96-token budget.",
        f"# RL and SFT control of a seed ran side by side, one core each, {args.minutes:g} minutes",
        "# of wall time each (each ends after its first step past the budget).",
        head]
    lines += [line(name, s) for name, s in base_rows]
    for seed, pair in sorted(per_seed.items()):
        for name in CHILDREN:
            s, steps = pair[name]
            lines.append(line(f"{LABELS[name]}, seed {seed}", s, steps))
    for name in CHILDREN:
        keys = ("accuracy", "first_line", "strict_accuracy", "format", "mean_length", "truncated")
        avg = {k: mean([pair[name][0][k] for pair in per_seed.values()]) for k in keys}
        steps = round(mean([pair[name][1] for pair in per_seed.values()]))
        lines.append(line(f"{LABELS[name]}, mean of {len(per_seed)}", avg, steps))
    lines.append("# RL - SFT control, paired by seed (the 95% t-interval with 5 seeds or more, "
                 "else the range; the exact sign-flip p):")
    for key in ("accuracy", "first_line", "strict_accuracy", "mean_length"):
        diffs = [pair["rl"][0][key] - pair["sft"][0][key] for _, pair in sorted(per_seed.items())]
        p = report_stats.sign_flip_p(diffs)
        lines.append(f"#   {key:<11s} {' '.join(f'{d:+.3f}' for d in diffs)}  mean "
                     f"{mean(diffs):+.3f}, {report_stats.interval_text(diffs)}, p "
                     f"{report_stats.format_p(p)}: "
                     + report_stats.verdict("RL", "SFT", mean(diffs), p, len(diffs),
                                            adjusted=False))
    se = report_stats.binomial_se(0.5, args.prompts)
    lines.append(f"# evaluation noise: an accuracy near 0.5 on {args.prompts} prompts has a "
                 f"binomial standard error of {se:.3f}")
    return "\n".join(lines) + "\n"


def keep_results(args, seeds, results):
    """Copies every kept answer file and each run's metrics to `results`."""
    from grpo_jax import run_files
    os.makedirs(results, exist_ok=True)
    for name in ("base.json", "base_one_shot.json", "machine.json"):
        shutil.copy(os.path.join(args.workdir, name), os.path.join(results, name))
    for seed in seeds:
        for name in CHILDREN:
            source = os.path.join(args.workdir, f"seed-{seed}", name)
            target = os.path.join(results, f"seed-{seed}_{name}")
            shutil.copy(source + "_answers.json", target + "_answers.json")
            with open(os.path.join(source, run_files.METRICS), "rb") as src, \
                    gzip.open(f"{target}_{run_files.METRICS_GZ}", "wb") as dst:
                shutil.copyfileobj(src, dst)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--checkpoint", required=True, help="the converted SmolLM2 directory")
    parser.add_argument("--minutes", type=float, default=20.0,
                        help="wall-time budget of each run (RL and SFT alike)")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--recipe", default="",
                        help="configs/smollm2.py's arguments for every run, e.g. strict=True "
                             "(strict grading paid, the one-shot prompt)")
    parser.add_argument("--prompts", type=int, default=500, help="held-out prompts")
    parser.add_argument("--workdir", default="/tmp/smollm2_controls")
    parser.add_argument("--out", default=None, help="also write the table here")
    parser.add_argument("--results", default=None,
                        help="copy the answers and metrics here when done")
    parser.add_argument("--child", choices=CHILDREN, help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--core", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.checkpoint = os.path.abspath(os.path.expanduser(args.checkpoint))
    args.workdir = os.path.abspath(os.path.expanduser(args.workdir))
    if args.child:
        return child(args)

    from grpo_jax import parallel
    parallel.use_cpu_cores()
    from grpo_jax import config_lib, sweep
    os.makedirs(args.workdir, exist_ok=True)
    seeds = [int(s) for s in args.seeds.split(",")]
    config = recipe_config(args.checkpoint, args.prompts, seeds[0], args.recipe)
    machine = smollm2_cpu.stage(os.path.join(args.workdir, "machine.json"), lambda: {
        "commit": sweep.source_commit(), "machine": sweep.machine_description(os.cpu_count()),
        "load": round(os.getloadavg()[0], 1)})
    print(f"base model, greedy, {args.prompts} held-out prompts", flush=True)
    base = smollm2_cpu.stage(os.path.join(args.workdir, "base.json"),
                             lambda: smollm2_cpu.held_out_answers(config, args.checkpoint))
    print("base model, one-shot prompt", flush=True)
    recipe = config_lib.load_module(os.path.join(ROOT, "configs", "smollm2.py"))
    one_shot = config_lib.replaced(config, {"task.shots": recipe.ONE_SHOT})
    base_one_shot = smollm2_cpu.stage(
        os.path.join(args.workdir, "base_one_shot.json"),
        lambda: smollm2_cpu.held_out_answers(one_shot, args.checkpoint))
    for seed in seeds:
        begin = time.time()
        if not all(os.path.exists(os.path.join(args.workdir, f"seed-{seed}", f"{n}_answers.json"))
                   for n in CHILDREN):
            run_pair(args, seed)
        print(f"seed {seed} done in {time.time() - begin:.0f} s", flush=True)

    examples = smollm2_cpu.held_out_examples(config)
    base_rows = [("base", summarised(base, examples)),
                 ("base, one-shot prompt", summarised(base_one_shot, examples))]
    per_seed = {seed: seed_rows(args, seed, examples) for seed in seeds}
    table = format_table(args, machine, base_rows, per_seed)
    print(table, end="", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            f.write(table)
    if args.results:
        keep_results(args, seeds, args.results)


if __name__ == "__main__":
    main()
