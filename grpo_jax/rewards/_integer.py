"""Exact integer answers (`#### 734`) for the procedural arithmetic tasks.

Cheap and bounded (a regex and a comparison of digit strings), so it runs inline: the
tiny CPU models score hundreds of completions per step with it. Golds of any length
compare without `int()` (no int-string limit); answers longer than 64 digits score 0.
"""

import re

from grpo_jax.rewards import _normalise
from grpo_jax.rewards._answers import last_hash_answer
from grpo_jax.rewards._registry import register

_INTEGER = re.compile(r"[+-]?\d{1,64}")


def final_integer(completion: str) -> str | None:
    """The integer X of the completion's last `#### X` marker (ASCII digits), or None where
    there is no marker or X is not an integer and nothing else (a final period allowed)."""
    marker = last_hash_answer(completion)
    if marker is None or marker.content is None:
        return None
    text = _normalise.normalise_digits(marker.content).strip().rstrip(".")
    return text if _INTEGER.fullmatch(text) else None


@register("integer_format")
def integer_format_reward(prompt: str, completion: str, example: dict) -> float:
    """1.0 if the completion's last `#### X` marker holds an integer, right or wrong: the
    answer format alone, for a model that must first learn to use it."""
    del prompt, example
    return float(final_integer(completion) is not None)


@register("integer_answer")
def integer_answer_reward(prompt: str, completion: str, example: dict) -> float:
    """1.0 if the last `#### X` marker holds exactly the integer `example["answer"]`.

    The last marker decides (an earlier correct one does not count); X may use any
    digit script and thousands separators, but must be an integer and nothing else.
    """
    text = final_integer(completion)
    if text is None:
        return 0.0
    gold = _normalise.canonical_integer(_normalise.normalise_digits(str(example["answer"])).strip())
    if gold is None:
        raise ValueError(
            f"example['answer'] = {example['answer']!r} is not an integer; integer_answer needs one"
        )
    return float(_normalise.canonical_integer(text) == gold)
