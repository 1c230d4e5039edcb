"""Rollouts for training: sample G completions per prompt, score them, keep groups with signal.

DAPO's dynamic sampling draws prompt batches until the train batch holds
`prompts_per_batch` groups whose rewards differ (or `max_gen_batches` draws were made).
Groups stay whole, so the train batch keeps the P x G layout. If the draws run out, the
batch is topped up with groups whose masks are zeroed: they add nothing to the loss or
to any count, and `row_valid` says which rows are real.
"""

import math
import time

import jax
import numpy as np

from grpo_jax import objectives, sampling
from grpo_jax.training import task as task_lib

ROW_FIELDS = ("prompt_tokens", "prompt_mask", "tokens", "mask", "behaviour_logp", "lengths",
              "truncated", "rewards", "correct")


def _sampler_ways(mesh):
    """Rows the sampler splits over: every mesh axis but "tensor" (the sampling rules)."""
    return mesh.devices.size // mesh.shape.get("tensor", 1)


def sample_groups(policy, examples, *, rng, method, group_size, max_new_tokens):
    """Samples G completions for each example; returns host arrays and completion strings.

    Prompts are topped up (repeating the last one) to a count the mesh can split; the
    extra rows are dropped from what is returned.
    """
    task_cfg, tokenizer = policy.task_cfg, policy.tokenizer
    count = len(examples)
    prompts_multiple = _sampler_ways(policy.mesh) // math.gcd(_sampler_ways(policy.mesh), group_size)
    examples = list(examples) + [examples[-1]] * (-count % prompts_multiple)
    texts, ids = task_lib.encode_prompts(task_cfg, examples, tokenizer)
    prompt_tokens, prompt_mask = sampling.pad_prompts(ids, pad_id=tokenizer.pad_token_id,
                                                      buckets=task_lib.PROMPT_BUCKETS)
    with jax.set_mesh(policy.mesh):
        rollout = sampling.generate(
            policy.graphdef, policy.params, prompt_tokens, prompt_mask, rng=rng, method=method,
            group_size=group_size, max_new_tokens=max_new_tokens,
            stop_tokens=[tokenizer.eos_token_id], pad_id=tokenizer.pad_token_id,
            max_len_bucket=max_new_tokens, rules=policy.sampling_rules)   # fixed: one compile
    rows = count * group_size
    host = jax.tree.map(lambda x: x[:rows], sampling.to_host(rollout))
    completions = task_lib.decode_completions(tokenizer, host.tokens, host.mask)
    repeated = [x for x in texts[:count] for _ in range(group_size)]
    return host, repeated, completions


def _left_pad(x, width, value):
    return np.pad(x, ((0, 0), (width - x.shape[1], 0)), constant_values=value)


def _concat(parts, pad_id):
    """Joins row dicts whose prompts have different bucket widths (left-padding more)."""
    width = max(p["prompt_tokens"].shape[1] for p in parts)
    out = {}
    for key in ROW_FIELDS:
        pieces = [p[key] for p in parts]
        if key in ("prompt_tokens", "prompt_mask"):
            fill = pad_id if key == "prompt_tokens" else 0
            pieces = [_left_pad(x, width, fill) for x in pieces]
        out[key] = np.concatenate(pieces)
    return out


def collect(run, step):
    """One train batch of P x G rows, with the rollout metrics."""
    cfg, G = run.config, run.config.objective.group_size
    P = cfg.rollout.prompts_per_batch
    draws_allowed = cfg.filtering.max_gen_batches if cfg.filtering.dynamic_sampling else 1
    kept, leftovers, metrics = [], [], _RolloutStats()
    for draw in range(draws_allowed):
        examples = next(run.train_iter)
        start = time.time()
        host, prompts, completions = sample_groups(
            run.policy, examples, rng=jax.random.fold_in(run.rollout_rng(step), draw),
            method=run.method, group_size=G, max_new_tokens=cfg.rollout.max_new_tokens)
        rollout_time = time.time() - start
        repeated = [ex for ex in examples for _ in range(G)]
        values, correct, reward_metrics = run.scorer(prompts, completions, repeated, host.lengths)
        rows = {"prompt_tokens": host.prompt_tokens, "prompt_mask": host.prompt_mask,
                "tokens": host.tokens, "mask": host.mask, "behaviour_logp": host.logp,
                "lengths": host.lengths, "truncated": host.truncated, "rewards": values,
                "correct": correct}
        signal = np.asarray(objectives.group_has_signal(
            correct.astype(np.float32) if values.ndim > 1 else values, G))
        metrics.add(rows, signal, reward_metrics, rollout_time)
        keep = signal if cfg.filtering.dynamic_sampling else np.ones_like(signal)
        keep_rows, drop_rows = np.repeat(keep, G), np.repeat(~keep, G)
        kept.append({k: v[keep_rows] for k, v in rows.items()})
        leftovers.append({k: v[drop_rows] for k, v in rows.items()})
        if sum(len(p["lengths"]) for p in kept) >= P * G:
            break
    batch = _concat(kept + leftovers, run.policy.tokenizer.pad_token_id)
    batch = {k: v[:P * G] for k, v in batch.items()}
    real_rows = min(sum(len(p["lengths"]) for p in kept), P * G)
    batch["row_valid"] = np.arange(P * G) < real_rows
    batch["mask"] = batch["mask"] * batch["row_valid"][:, None]
    return batch, metrics.summary(draw + 1, real_rows / (P * G))


class _RolloutStats:
    """Accumulates the rollout metrics over the draws of one step."""

    def __init__(self):
        self.rows, self.signal, self.reward_metrics, self.time = [], [], [], 0.0

    def add(self, rows, signal, reward_metrics, seconds):
        self.rows.append(rows)
        self.signal.append(signal)
        self.reward_metrics.append(reward_metrics)
        self.time += seconds

    def summary(self, draws, filled):
        rewards = np.concatenate([r["rewards"] for r in self.rows])
        correct = np.concatenate([r["correct"] for r in self.rows])
        lengths = np.concatenate([r["lengths"] for r in self.rows]).astype(np.float64)
        truncated = np.concatenate([r["truncated"] for r in self.rows])
        signal = np.concatenate(self.signal)
        out = {
            "reward_mean": float(np.mean(rewards.sum(-1) if rewards.ndim > 1 else rewards)),
            "accuracy": float(np.mean(correct)),
            "response_length_mean": float(lengths.mean()),
            "response_length_max": float(lengths.max()),
            "response_length_correct": float(lengths[correct].mean()) if correct.any() else 0.0,
            "response_length_wrong": float(lengths[~correct].mean()) if (~correct).any() else 0.0,
            "truncation_rate": float(np.mean(truncated)),
            "groups_without_signal": float(1.0 - np.mean(signal)),
            "gen_batches": float(draws),
            "batch_filled": float(filled),
            "time_rollout": self.time,
            "rollout_tokens_per_s": float(lengths.sum() / max(self.time, 1e-9)),
        }
        for name in self.reward_metrics[0]:
            out[name] = float(np.mean([m[name] for m in self.reward_metrics]))
        return out
