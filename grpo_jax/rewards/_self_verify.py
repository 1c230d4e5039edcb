"""Self-verification (DeepSeek V3.2, after DeepSeekMath-V2): reward an honest verdict.

The completion ends with a verdict on its own answer, `<verify>correct</verify>` or
`<verify>incorrect</verify>` (case-insensitive, surrounding whitespace ignored, nothing
but whitespace after it). The reward is 1.0 when the verdict agrees with the truth, as
judged by a correctness grader on the text before the verdict, else 0.0; a missing,
unclosed or unrecognised verdict scores 0.

On its own this rewards saying "incorrect" about a wrong answer; combined with the
correctness reward (`[("math", 1.0), ("self_verify", 0.5)]`) the best policy is a right
answer judged "correct", and a model that cannot solve a problem still gains by saying so.
"""

import re

from grpo_jax.rewards import _answers
from grpo_jax.rewards._registry import get_reward
from grpo_jax.rewards._registry import register

VERDICTS = {"correct": True, "incorrect": False}
_VERDICT_AT_END = re.compile(r"<verify>([^<]*)</verify>\s*\Z")


def final_verdict(completion: str) -> tuple[bool, str] | None:
    """`(claims_correct, text before the verdict)`, or None without a final valid verdict.

    Example:
      >>> final_verdict("\\\\boxed{4} <verify>Correct</verify>")
      (True, '\\\\boxed{4} ')
    """
    marker = _answers.last_tag(completion, "verify")
    if marker is None or marker.content is None:
        return None
    match = _VERDICT_AT_END.match(completion, marker.start)
    verdict = VERDICTS.get(match.group(1).strip().lower()) if match else None
    if verdict is None:
        return None
    return verdict, completion[: marker.start]


@register("answer_before_verdict", where="pool")
def answer_before_verdict_reward(prompt: str, completion: str, example: dict, *,
                                 grader: str = "math") -> float:
    """The `grader`'s score of the answer before a final `<verify>` verdict (the whole
    completion when it has none): correctness for a self-verifying policy, whose answer
    is not at the end of its completion.

    Options:
      grader: the registered correctness reward ("math", "gsm8k", "integer_answer", ...).

    Example:
      >>> answer_before_verdict_reward("", "#### 7 <verify>correct</verify>", {"answer": "7"},
      ...                              grader="integer_answer")
      1.0
    """
    verdict = final_verdict(completion)
    text = completion if verdict is None else verdict[1]
    return float(get_reward(grader).fn(prompt, text, example))


@register("self_verify", where="pool")
def self_verify_reward(
    prompt: str, completion: str, example: dict, *, grader: str = "math"
) -> float:
    """1.0 if the final `<verify>` verdict matches whether the answer is right, else 0.0.

    Options:
      grader: the registered correctness reward that judges the answer ("math",
        "gsm8k", "countdown", ...); a value above 0.5 counts as correct.
    """
    verdict = final_verdict(completion)
    if verdict is None:
        return 0.0
    claims_correct, answer_text = verdict
    is_correct = get_reward(grader).fn(prompt, answer_text, example) > 0.5
    return float(claims_correct == is_correct)
