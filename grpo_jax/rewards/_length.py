"""Length shaping: DAPO's soft overlong penalty on completion lengths in tokens.

Only the trainer knows token lengths, so this reward reads `example["completion_length"]`
(an int, in tokens), which `score_batch(..., completion_lengths=...)` fills in. It is a
"batch" reward: one call of `objectives.overlong_penalty` on the `[B]` lengths, not B
dispatches of a JAX function. Combine it with a correctness reward by weight, e.g.
`[("math", 1.0), ("overlong", 1.0, {"max_len": 20480, "cache_len": 4096})]` as in DAPO.
"""

import numpy as np

from grpo_jax import objectives
from grpo_jax.rewards._registry import register


@register("overlong", where="batch")
def overlong_reward(prompts, completions, examples, *, max_len: int, cache_len: int) -> np.ndarray:
    """`[B]` penalties in [-1, 0]: 0 up to `max_len - cache_len` tokens, then a linear ramp
    to -1 at `max_len`, and -1 beyond (DAPO, Yu et al. 2025, eq. 13).

    Options:
      max_len: L_max in tokens, the longest completion that is not cut off.
      cache_len: L_cache in tokens, the width of the warning zone before `max_len`.
    """
    del prompts, completions
    try:
        lengths = [example["completion_length"] for example in examples]
    except KeyError:
        raise KeyError(
            "example['completion_length'] is missing; pass completion_lengths= (tokens) to score_batch"
        ) from None
    return np.asarray(objectives.overlong_penalty(np.asarray(lengths), max_len=max_len, cache_len=cache_len))
