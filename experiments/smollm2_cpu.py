"""SmolLM2-135M-Instruct on CPU: held-out accuracy before and after a wall-time budget of RL.

    python experiments/smollm2_cpu.py --checkpoint ~/ckpt/smollm2 --minutes 45 \\
        --workdir /tmp/smollm2_cpu --out experiments/results/smollm2_cpu.txt

Runs `configs/smollm2.py` (DAPO, 2-digit addition in chat, see its docstring) in three
stages, each resumable (re-running the command skips what is done):

1. the base checkpoint's greedy answers on the held-out prompts;
2. RL from it for `--minutes` of wall time (`rl.train(..., seconds=)`: the run ends after
   the first step that finishes past the budget, and exports);
3. the exported policy's greedy answers on the same prompts.

``--recipe lora=True`` (or ``lora=True,quantize=int8``) runs the recipe's LoRA (QLoRA)
variant; ``--results DIR`` keeps the run's answers, metrics and measurements there, and
``--compare NAME=DIR ...`` prints one table over several such directories (LoRA and QLoRA
against full fine-tuning in docs/models.md):

    python experiments/smollm2_cpu.py --compare full=experiments/results/smollm2_cpu \
        lora=experiments/results/smollm2_cpu_lora qlora_int8=experiments/results/smollm2_cpu_qlora

``--compare`` grades the kept answers again with the current graders (the recipe's held-out
golds are regenerated from its config, no model is loaded), so runs kept before a grader
changed stay comparable.

Per stage it reports accuracy (the recipe's `reward.correct`, ``gsm8k``: the number after
the last ``####``, else the last number written), strict accuracy (``integer_answer``:
exactly the right integer after the last ``####``), format adherence (``integer_format``:
an integer after the last ``####``, right or wrong), the mean response length in tokens
and the share of answers cut at the token budget. Timing needs a quiet machine.
"""

import argparse
import gzip
import json
import os
import shutil
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

def held_out_answers(config, checkpoint):
    """Greedy answers of `checkpoint` to the held-out prompts -> a dict of per-answer lists."""
    import numpy as np

    from grpo_jax import parallel, sampling
    from grpo_jax.training import evaluation, rollout, steps, task as task_lib

    mesh, policy, source = evaluation.load_for_evaluation(config, checkpoint)
    tokenizer = policy.tokenizer
    examples, real = evaluation.own_examples(source, config.eval.num_prompts)
    scorer = task_lib.Scorer(config.reward, separate=True,
                             max_new_tokens=config.rollout.max_new_tokens)
    names = [spec.name for spec in scorer.specs]
    rows = {"correct": [], "strict": [], "format": [], "length": [], "truncated": [],
            "completion": []}
    try:
        for start in range(0, real, evaluation.EVAL_CHUNK):
            chunk = examples[start:min(start + evaluation.EVAL_CHUNK, real)]
            padded = evaluation._padded(chunk, mesh)
            texts, tokens, mask = task_lib.prompt_rows(config.task, padded, tokenizer)
            prompts = parallel.global_rows(mesh, {"tokens": tokens, "mask": mask})
            out, _ = rollout.sample_on_mesh(
                policy, mesh, prompts, rng=steps.step_rng(config.seed, "eval", 0),
                method=sampling.Greedy(), group_size=1,
                max_new_tokens=config.rollout.max_new_tokens,
                rules=config.rollout.rules)
            columns, _, _ = rollout.score_own_rows(out, texts, padded, scorer, tokenizer, 1)
            completions = task_lib.decode_completions(tokenizer, out.tokens, out.mask)
            n = len(chunk)
            rows["correct"] += (columns[:n, names.index("gsm8k")] >= 1).tolist()
            rows["strict"] += (columns[:n, names.index("integer_answer")] >= 1).tolist()
            rows["format"] += (columns[:n, names.index("integer_format")] >= 1).tolist()
            rows["length"] += np.asarray(out.lengths)[:n].tolist()
            rows["truncated"] += np.asarray(out.truncated)[:n].astype(bool).tolist()
            rows["completion"] += completions[:n]
    finally:
        scorer.close()
    return rows


def held_out_examples(config):
    """The recipe's held-out examples, the golds of `held_out_answers` (no model loaded)."""
    from grpo_jax.training import evaluation, task as task_lib
    source = task_lib.data_source(config.task, config.task.eval_split)
    examples, real = evaluation.own_examples(source, config.eval.num_prompts)
    return examples[:real]


def regrade(rows, examples):
    """`rows` (kept `held_out_answers`) with correct / strict / format scored again by the
    current graders on the kept completions and `examples`' golds."""
    from grpo_jax import rewards
    if len(rows["completion"]) != len(examples):
        raise ValueError(f"{len(rows['completion'])} kept answers for {len(examples)} held-out "
                         "examples: the results come from another recipe or eval.num_prompts")
    graders = {"correct": rewards.gsm8k_reward, "strict": rewards.integer_answer_reward,
               "format": rewards.integer_format_reward}
    return {**rows, **{key: [grader(e["question"], c, e) >= 1
                             for c, e in zip(rows["completion"], examples)]
                       for key, grader in graders.items()}}


def summary(rows):
    mean = lambda xs: float(sum(xs)) / max(len(xs), 1)
    return {"prompts": len(rows["correct"]), "accuracy": mean(rows["correct"]),
            "strict_accuracy": mean(rows["strict"]), "format": mean(rows["format"]),
            "mean_length": mean(rows["length"]), "truncated": mean(rows["truncated"])}


def stage(path, fn):
    """Runs `fn` once; its JSON result is kept at `path` (re-runs read it back)."""
    if not os.path.exists(path):
        begin = time.time()
        result = fn()
        result["seconds"] = round(time.time() - begin, 1)
        with open(path, "w") as f:
            json.dump(result, f, indent=1)
    with open(path) as f:
        return json.load(f)


def reset_peak_rss():
    """Resets the kernel's record of this process's peak resident memory (Linux: VmHWM)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def peak_rss_bytes():
    """The process's peak resident memory since the last `reset_peak_rss` (or its start)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024   # Linux reports KiB


def directory_bytes(path):
    return sum(os.path.getsize(os.path.join(root, name))
               for root, _, names in os.walk(path) for name in names)


def last_checkpoint_bytes(rl_dir):
    """Bytes of the newest step directory under ``rl_dir/checkpoints`` (0 when none)."""
    root = os.path.join(rl_dir, "checkpoints")
    steps = sorted(int(name) for name in os.listdir(root) if name.isdigit()) \
        if os.path.isdir(root) else []
    return directory_bytes(os.path.join(root, str(steps[-1]))) if steps else 0


def train_measured(config, rl_dir, seconds):
    """`rl.train` for `seconds` of wall time -> steps, peak resident memory of the training
    call (the evaluation before it excluded where the kernel allows a reset) and the
    newest checkpoint's bytes."""
    from grpo_jax.training import rl
    reset = reset_peak_rss()
    steps = rl.train(config, rl_dir, seconds=seconds)
    return {"steps": steps, "peak_rss_bytes": peak_rss_bytes(), "peak_rss_reset": reset,
            "checkpoint_bytes": last_checkpoint_bytes(rl_dir)}


def median_step_seconds(metrics):
    """Median wall time between consecutive steps' metric rows (the first step, which
    compiles, has no predecessor and is left out)."""
    times = [row["time"] for row in metrics]
    gaps = [b - a for a, b in zip(times, times[1:])]
    return statistics.median(gaps) if gaps else float("nan")


def keep_results(workdir, results, recipe):
    """Copies the answers, metrics and measurements of a finished run to `results`."""
    from grpo_jax import run_files
    os.makedirs(results, exist_ok=True)
    shutil.copy(os.path.join(workdir, "base.json"), os.path.join(results, "base_answers.json"))
    shutil.copy(os.path.join(workdir, "after.json"), os.path.join(results, "after_answers.json"))
    with open(os.path.join(workdir, "rl", run_files.METRICS), "rb") as src, \
            gzip.open(os.path.join(results, run_files.METRICS_GZ), "wb") as dst:
        shutil.copyfileobj(src, dst)
    with open(os.path.join(workdir, "rl.json")) as f:
        run = json.load(f)
    with open(os.path.join(workdir, "machine.json")) as f:   # its own stage's seconds left out
        run.update({k: v for k, v in json.load(f).items() if k != "seconds"})
    run["recipe"] = recipe
    with open(os.path.join(results, "run.json"), "w") as f:
        json.dump(run, f, indent=1)


def compare_table(entries, examples=None):
    """One table over ``NAME=DIR`` results directories (see `keep_results`); with
    `examples` (the held-out golds) the kept answers are graded again (`regrade`)."""
    from grpo_jax import run_files
    lines = [
        "# python experiments/smollm2_cpu.py --compare " + " ".join(entries),
        "# SmolLM2-135M-Instruct, configs/smollm2.py (DAPO, 2-digit addition in chat), greedy",
        "# answers to the same held-out prompts; RL for the same wall-time budget on 2 cores.",
        "# s/step: median wall time between steps; peak RSS: the training call's peak",
        "# resident host memory; checkpoint: the newest checkpoint's bytes on disk;",
        "# acc: the gsm8k grader; strict: exactly the right integer after the last ####"
        + ("; the kept answers graded again by the current graders." if examples else "."),
        f"{'run':<14s} {'commit':<13s} {'steps':>5s} {'s/step':>6s} {'peak RSS':>9s} "
        f"{'checkpoint':>10s} {'base acc':>8s} {'after acc':>9s} {'strict':>6s} {'length':>6s}",
    ]
    grade = (lambda rows: regrade(rows, examples)) if examples else (lambda rows: rows)
    notes = []
    for entry in entries:
        name, _, directory = entry.partition("=")
        run = {}
        if os.path.exists(os.path.join(directory, "run.json")):
            with open(os.path.join(directory, "run.json")) as f:
                run = json.load(f)
        with open(os.path.join(directory, "base_answers.json")) as f:
            base = summary(grade(json.load(f)))
        with open(os.path.join(directory, "after_answers.json")) as f:
            after = summary(grade(json.load(f)))
        metrics = run_files.read_metrics(os.path.join(directory, run_files.METRICS_GZ))
        gib = lambda key: f"{run[key] / 2**30:.2f} GiB" if key in run else "n/a"
        mib = lambda key: f"{run[key] / 2**20:.0f} MiB" if key in run else "n/a"
        lines.append(
            f"{name:<14s} {run.get('commit', 'n/a'):<13s} {len(metrics):5d} "
            f"{median_step_seconds(metrics):6.1f} {gib('peak_rss_bytes'):>9s} "
            f"{mib('checkpoint_bytes'):>10s} {base['accuracy']:8.3f} {after['accuracy']:9.3f} "
            f"{after['strict_accuracy']:6.3f} {after['mean_length']:6.1f}")
        if run:
            notes.append(f"# {name}: {run.get('machine', 'n/a')}, load {run.get('load', 'n/a')} "
                         f"at the start, recipe arguments '{run.get('recipe', '')}'")
        else:
            notes.append(f"# {name}: no run.json (a run kept before the memory was measured)")
    return "\n".join(lines + notes) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--checkpoint", help="the converted SmolLM2 directory")
    parser.add_argument("--minutes", type=float, default=45.0, help="RL wall-time budget")
    parser.add_argument("--workdir", default="/tmp/smollm2_cpu")
    parser.add_argument("--out", default=None, help="also write the table here")
    parser.add_argument("--config", default=os.path.join(ROOT, "configs", "smollm2.py"))
    parser.add_argument("--recipe", default="",
                        help="more recipe arguments, e.g. lora=True or lora=True,quantize=int8")
    parser.add_argument("--results", default=None,
                        help="copy the answers, metrics and measurements here when done")
    parser.add_argument("--compare", nargs="+", metavar="NAME=DIR", default=None,
                        help="print one table over results directories and exit")
    args = parser.parse_args()
    if args.compare:
        from grpo_jax import config_lib
        config = config_lib.resolve_paths(config_lib.load_config(
            f"{args.config}:path=/unused" + (f",{args.recipe}" if args.recipe else "")))
        table = compare_table(args.compare, held_out_examples(config))
        print(table, end="")
        if args.out:
            with open(args.out, "w") as f:
                f.write(table)
        return
    if not args.checkpoint:
        parser.error("--checkpoint is required (unless --compare)")

    from grpo_jax import parallel
    parallel.use_cpu_cores()
    from grpo_jax import config_lib, sweep

    checkpoint = os.path.abspath(os.path.expanduser(args.checkpoint))
    workdir = os.path.abspath(os.path.expanduser(args.workdir))
    os.makedirs(workdir, exist_ok=True)
    recipe = f"path={checkpoint},steps=100000" + (f",{args.recipe}" if args.recipe else "")
    config = config_lib.resolve_paths(config_lib.load_config(f"{args.config}:{recipe}"))
    machine = stage(os.path.join(workdir, "machine.json"), lambda: {   # where RL runs
        "commit": sweep.source_commit(), "machine": sweep.machine_description(os.cpu_count()),
        "load": round(os.getloadavg()[0], 1)})

    print(f"1/3 base model: greedy answers to {config.eval.num_prompts} held-out prompts",
          flush=True)
    base = stage(os.path.join(workdir, "base.json"),
                 lambda: held_out_answers(config, checkpoint))
    print(json.dumps(summary(base)), flush=True)

    print(f"2/3 DAPO for {args.minutes:g} minutes of wall time", flush=True)
    rl_dir = os.path.join(workdir, "rl")
    trained = stage(os.path.join(workdir, "rl.json"),
                    lambda: train_measured(config, rl_dir, args.minutes * 60))
    print(f"peak resident memory {trained['peak_rss_bytes'] / 2**30:.2f} GiB, newest checkpoint "
          f"{trained['checkpoint_bytes'] / 2**20:.1f} MiB", flush=True)

    print("3/3 the trained policy: the same prompts", flush=True)
    after = stage(os.path.join(workdir, "after.json"),
                  lambda: held_out_answers(config, os.path.join(rl_dir, "export")))
    table = format_table(args, base, after, trained, machine)
    print(table, flush=True)
    if args.out:
        with open(args.out, "w") as f:
            f.write(table)
    if args.results:
        keep_results(workdir, args.results, args.recipe)


def format_table(args, base, after, trained, machine):
    lines = [
        f"# python experiments/smollm2_cpu.py --checkpoint DIR --minutes {args.minutes:g}"
        + (f" --recipe {args.recipe}" if args.recipe else ""),
        f"# commit {machine['commit']}, {machine['machine']}, load {machine['load']} at the start",
        "# SmolLM2-135M-Instruct (Q4_1 GGUF, converted to float32), configs/smollm2.py: DAPO,",
        "# 2-digit addition in chat, greedy answers to the same held-out prompts before/after;",
        "# accuracy: gsm8k grader (number after the last ####, else the last number);",
        "# strict: exactly the right integer after the last ####; format: an integer after the",
        "# last ####, right or wrong; length: mean tokens; cut: answers that hit the budget.",
        f"{'model':<28s} {'prompts':>7s} {'accuracy':>8s} {'strict':>7s} {'format':>7s} "
        f"{'length':>7s} {'cut':>6s} {'seconds':>8s}",
    ]
    for name, rows, seconds in (("base", base, base["seconds"]),
                                (f"after {trained['steps']} RL steps", after, trained["seconds"])):
        s = summary(rows)
        lines.append(f"{name:<28s} {s['prompts']:7d} {s['accuracy']:8.3f} "
                     f"{s['strict_accuracy']:7.3f} {s['format']:7.3f} {s['mean_length']:7.1f} "
                     f"{s['truncated']:6.3f} {seconds:8.0f}")
    lines.append("# seconds: the base row's evaluation; the RL row's training call (rollouts,")
    lines.append("# updates, checkpoints, export; it ends after the step that passes the budget).")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
