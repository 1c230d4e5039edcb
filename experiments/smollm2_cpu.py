"""SmolLM2-135M-Instruct on CPU: held-out accuracy before and after a wall-time budget of RL.

    python experiments/smollm2_cpu.py --checkpoint ~/ckpt/smollm2 --minutes 45 \\
        --workdir /tmp/smollm2_cpu --out experiments/results/smollm2_cpu.txt

Runs `configs/smollm2.py` (DAPO, 2-digit addition in chat, see its docstring) in three
stages, each resumable (re-running the command skips what is done):

1. the base checkpoint's greedy answers on the held-out prompts;
2. RL from it for `--minutes` of wall time (`rl.train(..., seconds=)`: the run ends after
   the first step that finishes past the budget, and exports);
3. the exported policy's greedy answers on the same prompts.

Per stage it reports accuracy (the recipe's `reward.correct`, ``gsm8k``: the number after
the last ``####``, else the last number written), strict accuracy (``integer_answer``:
exactly the right integer after the last ``####``), format adherence (``integer_format``:
an integer after the last ``####``, right or wrong), the mean response length in tokens
and the share of answers cut at the token budget. Timing needs a quiet machine.
"""

import argparse
import json
import os
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
            out = rollout.sample_on_mesh(
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


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--checkpoint", required=True, help="the converted SmolLM2 directory")
    parser.add_argument("--minutes", type=float, default=45.0, help="RL wall-time budget")
    parser.add_argument("--workdir", default="/tmp/smollm2_cpu")
    parser.add_argument("--out", default=None, help="also write the table here")
    parser.add_argument("--config", default=os.path.join(ROOT, "configs", "smollm2.py"))
    args = parser.parse_args()

    from grpo_jax import parallel
    parallel.use_cpu_cores()
    from grpo_jax import config_lib, sweep
    from grpo_jax.training import rl

    checkpoint = os.path.abspath(os.path.expanduser(args.checkpoint))
    workdir = os.path.abspath(os.path.expanduser(args.workdir))
    os.makedirs(workdir, exist_ok=True)
    config = config_lib.load_config(f"{args.config}:path={checkpoint},steps=100000")
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
    trained = stage(os.path.join(workdir, "rl.json"), lambda: {
        "steps": rl.train(config, rl_dir, seconds=args.minutes * 60)})

    print("3/3 the trained policy: the same prompts", flush=True)
    after = stage(os.path.join(workdir, "after.json"),
                  lambda: held_out_answers(config, os.path.join(rl_dir, "export")))
    table = format_table(args, base, after, trained, machine)
    print(table, flush=True)
    if args.out:
        with open(args.out, "w") as f:
            f.write(table)


def format_table(args, base, after, trained, machine):
    lines = [
        f"# python experiments/smollm2_cpu.py --checkpoint DIR --minutes {args.minutes:g}",
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
