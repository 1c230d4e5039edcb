"""Held-out evaluation: greedy pass@1, and mean@k / pass@k over k samples per prompt."""

import jax
import numpy as np

from grpo_jax import sampling
from grpo_jax.training import rollouts

EVAL_CHUNK = 256   # prompts per sampler call


def _score(policy, scorer, examples, *, rng, method, group_size, max_new_tokens, completion_len):
    """`[len(examples) * group_size]` bool correctness, in chunks of prompts."""
    correct = []
    for start in range(0, len(examples), EVAL_CHUNK):
        chunk = examples[start:start + EVAL_CHUNK]
        host, prompts, completions = rollouts.sample_groups(
            policy, chunk, rng=jax.random.fold_in(rng, start), method=method,
            group_size=group_size, max_new_tokens=max_new_tokens, completion_len=completion_len)
        repeated = [ex for ex in chunk for _ in range(group_size)]
        correct.append(scorer(prompts, completions, repeated, host.lengths)[1])
    return np.concatenate(correct)


def evaluate(policy, scorer, examples, *, rng, samples, temperature, max_new_tokens, completion_len):
    """Accuracy on held-out `examples`.

    Returns:
      ``eval_accuracy`` (greedy pass@1), ``eval_mean_at_k`` (mean correctness of k
      samples at `temperature`, an estimate of sampled pass@1), ``eval_pass_at_k``
      (share of prompts with at least one correct sample), and ``eval_k``.
    """
    kwargs = dict(max_new_tokens=max_new_tokens, completion_len=completion_len)
    greedy = _score(policy, scorer, examples, rng=rng, method=sampling.Greedy(), group_size=1,
                    **kwargs)
    metrics = {"eval_accuracy": float(greedy.mean())}
    if samples > 0:
        sampled = _score(policy, scorer, examples, rng=jax.random.fold_in(rng, 1),
                         method=sampling.Temperature(temperature), group_size=samples, **kwargs)
        per_prompt = sampled.reshape(len(examples), samples)
        metrics.update(eval_mean_at_k=float(per_prompt.mean()),
                       eval_pass_at_k=float(per_prompt.any(axis=1).mean()), eval_k=float(samples))
    return metrics
