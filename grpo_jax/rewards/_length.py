"""Length shaping: DAPO's soft overlong penalty on completion lengths in tokens.

Only the trainer knows token lengths, so this reward reads `example["completion_length"]`
(an int, in tokens), which `score_batch(..., completion_lengths=...)` fills in, and by
default takes its limit from `example["max_new_tokens"]` (`score_batch(...,
max_new_tokens=...)`, the run's completion budget), so the penalty follows the budget when
it is overridden. It is a "batch" reward: one call of `objectives.overlong_penalty` on the
`[B]` lengths, not B dispatches of a JAX function. Combine it with a correctness reward by
weight, e.g. `[("math", 1.0), ("overlong", 1.0, {"cache_fraction": 0.2})]` as in DAPO
(4,096 of 20,480 tokens).
"""

import numpy as np

from grpo_jax import objectives
from grpo_jax.rewards._registry import register


@register("overlong", where="batch")
def overlong_reward(
    prompts, completions, examples, *, max_len: int | None = None, cache_len: int | None = None,
    cache_fraction: float | None = None,
) -> np.ndarray:
    """`[B]` penalties in [-1, 0]: 0 up to `max_len - cache_len` tokens, then a linear ramp
    to -1 at `max_len`, and -1 beyond (DAPO, Yu et al., arXiv:2503.14476, eq. 13).

    Options:
      max_len: L_max in tokens, the longest completion that is not cut off; default: the
        run's budget, `example["max_new_tokens"]`.
      cache_len: L_cache in tokens, the width of the warning zone before `max_len`;
      cache_fraction: or L_cache as a fraction of L_max (DAPO: 4,096 / 20,480 = 0.2).
        Give exactly one of the two.
    """
    del prompts, completions
    try:
        lengths = [example["completion_length"] for example in examples]
        if max_len is None:
            max_len = examples[0]["max_new_tokens"] if examples else 1
    except KeyError as missing:
        raise KeyError(
            f"example[{missing}] is missing; pass completion_lengths= (tokens) and "
            "max_new_tokens= (or the option max_len) to score_batch") from None
    if (cache_len is None) == (cache_fraction is None):
        raise ValueError(
            "the overlong reward takes exactly one of the options cache_len "
            f"(tokens) and cache_fraction (of max_len); got {cache_len=}, {cache_fraction=}"
        )
    if cache_len is None:
        cache_len = max(1, round(cache_fraction * max_len))
    return np.asarray(
        objectives.overlong_penalty(np.asarray(lengths), max_len=max_len, cache_len=cache_len)
    )


@register("length_budget", where="batch")
def length_budget_reward(prompts, completions, examples, *, budget: int | None = None,
                         budget_fraction: float | None = None) -> np.ndarray:
    """`[B]` 1.0 for completions of at most `budget` tokens, else 0.0: GDPO's length reward
    (Liu et al., arXiv:2601.05242, sec. 4.2: a 4,000-token budget for 8,000-token answers).

    Options (exactly one):
      budget: the budget in tokens.
      budget_fraction: the budget as a fraction of the run's completion budget,
        `example["max_new_tokens"]`, so it follows `rollout.max_new_tokens`.
    """
    del prompts, completions
    if (budget is None) == (budget_fraction is None):
        raise ValueError("the length_budget reward takes exactly one of the options budget "
                         f"(tokens) and budget_fraction; got {budget=}, {budget_fraction=}")
    try:
        lengths = np.asarray([example["completion_length"] for example in examples])
        if budget is None:
            budget = budget_fraction * (examples[0]["max_new_tokens"] if examples else 1)
    except KeyError as missing:
        raise KeyError(f"example[{missing}] is missing; pass completion_lengths= and "
                       "max_new_tokens= to score_batch") from None
    return (lengths <= budget).astype(np.float32)
