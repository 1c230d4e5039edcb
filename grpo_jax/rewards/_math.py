"""Math answer correctness: our extraction and normalisation, math-verify for equivalence.

The final answer is the last marker (see `_answers`), without its unit words (see
`_units`: `#### 18 dollars` is 18, `#### 18 or more` no answer), rewritten by
`_normalise.normalise_answer`, and compared with `example["answer"]` (rewritten the
same way):

- two integers are compared as digit strings, at any length (a 9,000-digit gold
  included, past Python's int-string limit), without math-verify;
- anything else goes to math-verify, so `\\frac{1}{2}`, `0.5` and `1/2` agree, as do
  `x = 3` and `3`, within the bounds of `_limits` (answer length and nesting, the size
  of the numbers and expansions sympy would build, a time limit). An integer gold too
  long for sympy (over `LONGEST_SYMBOLIC_INTEGER` digits) is matched by integers only.

Answers written in words (`twelve`) do not parse to a number and score 0.

`gsm8k` also wants the answer's value, not arithmetic still to do: a final answer that
is an expression over numbers (`#### 98+99`, `#### 144/2`, `#### 5!`, `\\boxed{2^{10}}`)
scores 0 even when it equals the gold, since a policy can otherwise copy the question's
sum after `####` and be paid for it (a SmolLM2-135M LoRA run on an int8 base learned
exactly that on two-digit addition within 15 RL steps). A fraction in lowest terms
(`1/2`, `\\frac{3}{4}`) is a number; in an equation only the right-hand side counts
(`#### 48 + 24 = 72` is 72). `math` keeps plain equivalence: MATH's answers are
expressions (`2\\sqrt{3}`).

math-verify's own timeouts stay off: they are `signal.alarm` with whole seconds of wall
time per call (up to three calls per answer), a timeout while parsing the gold would
read as an unparseable dataset row, and they raise outside the main thread.
`_limits.time_limit` bounds the whole comparison instead (`_limits.TIME_LIMIT_S` of CPU
time, main thread), and the `GraderPool` still kills a worker stuck in C.
"""

import functools
import logging
import math
import re

import math_verify

from grpo_jax.rewards import _answers
from grpo_jax.rewards import _limits
from grpo_jax.rewards import _normalise
from grpo_jax.rewards import _units
from grpo_jax.rewards._registry import register

# Python refuses str -> int past 4300 digits (sys.get_int_max_str_digits), so sympy
# cannot read a longer integer; stay below it.
LONGEST_SYMBOLIC_INTEGER = 4000

# math-verify warns once per process that its timeouts are off; they are off on purpose
# (see above), and every grader process would print the warning into the training log.
for _module in ("math_verify.grader", "math_verify.parser"):
    logging.getLogger(_module).setLevel(logging.ERROR)


# An operator between two operands: `98+99`, `3 \\times 4`, `2^{10}`, `(1+2)`, `5!`.
_OPERAND_END = r"(?:[0-9.)}\]]|!)"
_OPERATOR = r"(?:[-+*/^\u00d7\u00f7\u00b7]|\\times|\\cdot|\\div|\\ast)"
_ARITHMETIC = re.compile(rf"{_OPERAND_END}\s*{_OPERATOR}\s*[-+]?\s*[0-9.({{\\]|[0-9)}}]\s*!")
_SIMPLE_FRACTION = re.compile(r"[-+]?([0-9]+)\s*/\s*([0-9]+)|[-+]?\\d?frac\{([0-9]+)\}\{([0-9]+)\}")


def is_arithmetic_to_evaluate(answer: str) -> bool:
    """Whether a (normalised) final answer is arithmetic over numbers rather than a value.

    In an equation only the last right-hand side counts; a fraction in lowest terms is a
    value, a reducible one (`144/2`) arithmetic.

    Example:
      >>> [is_arithmetic_to_evaluate(a) for a in ("197", "-3", "98+99", "48+24 = 72", "5!")]
      [False, False, True, False, True]
      >>> [is_arithmetic_to_evaluate(a) for a in ("1/2", "144/2", "\\\\frac{2}{4}", "x - 1")]
      [False, True, True, False]
    """
    value = answer.rsplit("=", 1)[-1].strip()
    fraction = _SIMPLE_FRACTION.fullmatch(value)
    if fraction:
        numerator, denominator = (int(g) for g in fraction.groups() if g is not None)
        return denominator <= 1 or math.gcd(numerator, denominator) != 1
    return _ARITHMETIC.search(value) is not None


def _parse(answer: str) -> list:
    return math_verify.parse(f"${answer}$", parsing_timeout=None)


@functools.cache
def _warm_up() -> None:
    """math-verify builds its parser and sympy its caches on first use (tenths of a
    second); done once, outside any answer's time limit."""
    math_verify.verify(_parse("1"), _parse("1"), timeout_seconds=None)


def answers_match(predicted: str, gold: str) -> bool:
    """Whether two final answers are mathematically equal, after normalisation.

    Raises:
      ValueError: the gold answer does not parse; the dataset row needs fixing.
      TimeoutError: math-verify used more than `_limits.TIME_LIMIT_S` of CPU (main thread only).

    Example:
      >>> answers_match("10\\\\,080", "10080"), answers_match("50\\\\%", "0.5")
      (True, False)
      >>> answers_match("1" * 5000, "1" * 5000), answers_match("1" * 5000, "1" * 4999 + "2")
      (True, False)
    """
    predicted, gold = _normalise.normalise_answer(predicted), _normalise.normalise_answer(gold)
    gold_integer = _normalise.canonical_integer(gold)
    if gold_integer is not None:
        predicted_integer = _normalise.canonical_integer(predicted)
        if predicted_integer is not None:
            return predicted_integer == gold_integer
        if len(gold_integer.lstrip("-")) > LONGEST_SYMBOLIC_INTEGER:
            return False
    if not _limits.text_within_limits(predicted, gold):
        return False
    _warm_up()
    with _limits.time_limit(_limits.TIME_LIMIT_S, "math-verify"):
        gold_parsed = _parse(gold)
        if not gold_parsed:
            raise ValueError(
                f"example['answer'] = {gold!r} does not parse as math; fix the dataset row"
            )
        predicted_parsed = _parse(predicted)
        return (
            bool(predicted_parsed)
            and _limits.expression_within_limits(predicted_parsed)
            and math_verify.verify(gold_parsed, predicted_parsed, timeout_seconds=None)
        )


def _answer(marker: _answers.Marker | None) -> str | None:
    """A marker's answer without its unit words; None when it has none or hedges."""
    if marker is None or marker.content is None:
        return None
    return _units.strip_units(marker.content, prose=marker.kind == "hash")


def _score(answer: str | None, example: dict) -> float:
    return float(answer is not None and answers_match(answer, example["answer"]))


@register("math", where="pool")
def math_reward(prompt: str, completion: str, example: dict) -> float:
    """1.0 if the last `\\boxed{...}` equals `example["answer"]`, else 0.0.

    No box, or an empty or unclosed last box, scores 0 (MATH-500 style).
    """
    del prompt  # the answer alone decides
    return _score(_answer(_answers.last_boxed(completion)), example)


@register("gsm8k", where="pool")
def gsm8k_reward(prompt: str, completion: str, example: dict) -> float:
    """1.0 if the final GSM8K answer equals `example["answer"]`, else 0.0.

    The final answer is the later of the last `#### X` and the last `\\boxed{}`;
    without either, the last number in the completion. Arithmetic left to do in the
    answer (`#### 98+99`) scores 0, see the module's docstring.
    """
    del prompt
    marker = _answers.final_gsm8k_marker(completion)
    answer = _answer(marker) if marker else _answers.last_number(completion)
    if answer is not None and is_arithmetic_to_evaluate(_normalise.normalise_answer(answer)):
        return 0.0
    return _score(answer, example)
