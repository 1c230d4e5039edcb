"""Reinforcement Pre-Training (RPT, Dong et al. 2025, arXiv:2506.08007): next-token(s) reward.

The model reasons about a context and puts the text it predicts comes next in the last
`\\boxed{...}` (the answer format of `grpo_jax.data.rpt`). Following the paper's
prefix-matching reward, the prediction scores 1.0 when it is exactly a prefix of the
true continuation `example["continuation"]` that ends on a token boundary, so that
predicting "New" for "New York" counts and "Ne" does not; a prediction longer than the
stored continuation cannot be checked and scores 0.

Tokens are words and single punctuation marks, the same regex as `grpo_jax.data.rpt`
(a test pins that), so the reward does not depend on a model's tokenizer. Whitespace
at either end is ignored and runs of whitespace inside compare as one space; case and
punctuation must match exactly.
"""

import re

from grpo_jax.rewards import _answers
from grpo_jax.rewards._registry import register

TOKEN = re.compile(r"\w+|[^\w\s]")


def _squash_whitespace(text: str) -> str:
    return " ".join(text.split())


def matches_continuation(prediction: str, continuation: str) -> bool:
    """Whether `prediction` is the first k >= 1 tokens of `continuation`, whitespace-normalised.

    Example:
      >>> matches_continuation("New", "New York"), matches_continuation("Ne", "New York")
      (True, False)
    """
    prediction = _squash_whitespace(prediction)
    token_ends = [match.end() for match in TOKEN.finditer(continuation)]
    return any(prediction == _squash_whitespace(continuation[:end]) for end in token_ends)


@register("rpt")
def rpt_reward(prompt: str, completion: str, example: dict) -> float:
    """1.0 if the last `\\boxed{}` holds a token-boundary prefix of `example["continuation"]`."""
    del prompt
    prediction = _answers.final_boxed_answer(completion)
    return float(
        prediction is not None and matches_continuation(prediction, example["continuation"])
    )
