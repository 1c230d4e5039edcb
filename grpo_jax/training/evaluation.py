"""Held-out evaluation: greedy pass@1, and mean@k / pass@k over k samples per prompt."""

import jax
import numpy as np

from grpo_jax import sampling
from grpo_jax.training import rollouts

EVAL_CHUNK = 256   # prompts per sampler call


def _score(policy, scorer, examples, *, rng, method, group_size, max_new_tokens):
    """`[len(examples) * group_size]` bool correctness, in chunks of prompts."""
    correct = []
    for start in range(0, len(examples), EVAL_CHUNK):
        chunk = examples[start:start + EVAL_CHUNK]
        host, prompts, completions = rollouts.sample_groups(
            policy, chunk, rng=jax.random.fold_in(rng, start), method=method,
            group_size=group_size, max_new_tokens=max_new_tokens)
        repeated = [ex for ex in chunk for _ in range(group_size)]
        correct.append(scorer(prompts, completions, repeated, host.lengths)[1])
    return np.concatenate(correct)


def evaluate(policy, scorer, examples, config, *, rng):
    """Accuracy on held-out `examples`: ``config.eval.samples`` samples per prompt at
    ``config.rollout.temperature``, at most ``config.rollout.max_new_tokens`` tokens.

    Returns:
      ``eval_accuracy`` (greedy pass@1), ``eval_mean_at_k`` (mean correctness of k
      samples at `temperature`, an estimate of sampled pass@1), ``eval_pass_at_k``
      (share of prompts with at least one correct sample), and ``eval_k``.
    """
    samples = config.eval.samples
    kwargs = dict(max_new_tokens=config.rollout.max_new_tokens)
    greedy = _score(policy, scorer, examples, rng=rng, method=sampling.Greedy(), group_size=1,
                    **kwargs)
    metrics = {"eval_accuracy": float(greedy.mean())}
    if samples > 0:
        sampled = _score(policy, scorer, examples, rng=jax.random.fold_in(rng, 1),
                         method=sampling.Temperature(config.rollout.temperature),
                         group_size=samples, **kwargs)
        per_prompt = sampled.reshape(len(examples), samples)
        metrics.update(eval_mean_at_k=float(per_prompt.mean()),
                       eval_pass_at_k=float(per_prompt.any(axis=1).mean()), eval_k=float(samples))
    return metrics
