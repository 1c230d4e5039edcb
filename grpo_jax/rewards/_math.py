"""Math answer correctness: our extraction and normalisation, math-verify for equivalence.

The final answer is the last marker (see `_answers`), rewritten by
`_normalise.normalise_answer`, and compared with `example["answer"]` (rewritten the
same way) by math-verify, so `\\frac{1}{2}`, `0.5` and `1/2` agree, as do `x = 3`
and `3`. Answers written in words (`twelve`) do not parse to a number and score 0.

math-verify's own signal-based timeouts are switched off: they only work in a main
thread, and the `GraderPool` already enforces (and counts) a time budget per call.
"""

import math_verify

from grpo_jax.rewards import _answers
from grpo_jax.rewards import _normalise
from grpo_jax.rewards._registry import register


def _parse(answer: str) -> list:
    return math_verify.parse(f"${_normalise.normalise_answer(answer)}$", parsing_timeout=None)


def answers_match(predicted: str, gold: str) -> bool:
    """Whether two final answers are mathematically equal, after normalisation.

    Raises:
      ValueError: the gold answer does not parse; the dataset row needs fixing.

    Example:
      >>> answers_match("10\\\\,080", "10080"), answers_match("50\\\\%", "0.5")
      (True, False)
    """
    gold_parsed = _parse(gold)
    if not gold_parsed:
        raise ValueError(f"example['answer'] = {gold!r} does not parse as math; fix the dataset row")
    predicted_parsed = _parse(predicted)
    return bool(predicted_parsed) and math_verify.verify(gold_parsed, predicted_parsed, timeout_seconds=None)


def _score(answer: str | None, example: dict) -> float:
    return float(answer is not None and answers_match(answer, example["answer"]))


@register("math", where="pool")
def math_reward(prompt: str, completion: str, example: dict) -> float:
    """1.0 if the last `\\boxed{...}` equals `example["answer"]`, else 0.0.

    No box, or an empty or unclosed last box, scores 0 (MATH-500 style).
    """
    del prompt  # the answer alone decides
    return _score(_answers.final_boxed_answer(completion), example)


@register("gsm8k", where="pool")
def gsm8k_reward(prompt: str, completion: str, example: dict) -> float:
    """1.0 if the final GSM8K answer equals `example["answer"]`, else 0.0.

    The final answer is the later of the last `#### X` and the last `\\boxed{}`;
    without either, the last number in the completion.
    """
    del prompt
    return _score(_answers.final_gsm8k_answer(completion), example)
