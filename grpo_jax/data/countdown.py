"""Countdown with small numbers for the tiny CPU models, and SFT targets that search with a tool.

A problem is ``count`` numbers drawn from ``1..max_number`` and a target: the value of a
random expression over all of them (random order, random binary tree, operators from
``ops``), an integer in ``1..max_target``. The question is ``"3 7 9 -> 30"`` and the
plain prompt ``"3 7 9 -> 30:"``; a solution is any expression that reaches the target
using each given number at most once (the ``countdown`` reward, which reads the
example's ``numbers`` and ``target``). The SFT target states the generating expression,
written with the fewest parentheses: ``<answer>3*7+9</answer>``.

With ``check_fraction = f`` a share f of the targets search with the ``check`` tool
(``environments.countdown_check``) instead: a few wrong tries (0..``max_misses``,
uniformly drawn), each checked, then the generating expression, checked, and the answer:

  ``<check>(9-3)*7</check><result>42 (not the target)</result>``
  ``<check>3*7+9</check><result>30 (reaches the target)</result><answer>3*7+9</answer>``

Every ``<result>`` is the reply of the registered ``countdown`` environment to that call,
as the model reads it in a multi-turn rollout, so a warm start learns the call, what comes
back and what to do next: try another expression after "not the target", answer after
"reaches the target". The wrong tries are the nearest misses among random expressions
over the same numbers, farthest first, so the first try of a search is a plausible
guess and each revision gets closer to the target.
"""

import dataclasses
import fractions
import itertools
from collections.abc import Iterator
from typing import Any, ClassVar

import numpy as np
import tensorflow_datasets as tfds

from grpo_jax import environments
from grpo_jax.data import _procedural
from grpo_jax.data import _records
from grpo_jax.data import prompts

OPS = ("+", "-", "*", "/")
TASK = "countdown_compact"   # its own plain prompt (``prompts.TASK_FORMATS``), not the sentence
_PRECEDENCE = {"+": 1, "-": 1, "*": 2, "/": 2}
_APPLY = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b,
          "/": lambda a, b: a / b}
_DRAWS = 50   # expressions tried for a target in range (or a miss) before giving up


def random_expression(rng: np.random.Generator, numbers: list[int],
                      ops: tuple[str, ...]) -> tuple[str, fractions.Fraction] | None:
    """A random expression over all of ``numbers`` (each once): shuffled, split into a
    random binary tree, each node a random operator of ``ops``.

    Returns:
      ``(text, exact value)``, the text with the fewest parentheses that keep the tree's
      value (``3*(7+9)``, ``3*7+9``); None where it divides by zero.
    """
    order = [int(n) for n in rng.permutation(numbers)]
    try:
        text, value, _ = _tree(rng, order, ops)
    except ZeroDivisionError:
        return None
    return text, value


def _tree(rng, numbers, ops):
    """``(text, value, precedence)`` of a random tree over ``numbers`` in this order."""
    if len(numbers) == 1:
        return str(numbers[0]), fractions.Fraction(numbers[0]), 3
    split = int(rng.integers(1, len(numbers)))
    op = ops[int(rng.integers(len(ops)))]
    (left, a, left_p), (right, b, right_p) = _tree(rng, numbers[:split], ops), _tree(
        rng, numbers[split:], ops)
    precedence = _PRECEDENCE[op]
    # a - (b + c) and a / (b * c) need their parentheses; a + (b - c) and a * (b / c)
    # have the value of a + b - c and a * b / c, read left to right.
    if left_p < precedence:
        left = f"({left})"
    if right_p < precedence or (right_p == precedence and op in "-/"):
        right = f"({right})"
    return f"{left}{op}{right}", _APPLY[op](a, b), precedence


def sample_problem(rng: np.random.Generator, *, count: int, max_number: int, max_target: int,
                   ops: tuple[str, ...]) -> tuple[list[int], int, str] | None:
    """``(numbers, target, expression)``: ``count`` numbers in ``1..max_number`` and the
    value of a random expression over all of them, an integer in ``1..max_target``; None
    when `_DRAWS` expressions over the numbers all miss that range."""
    numbers = [int(n) for n in rng.integers(1, max_number + 1, size=count)]
    for _ in range(_DRAWS):
        drawn = random_expression(rng, numbers, ops)
        if drawn and drawn[1].denominator == 1 and 1 <= drawn[1] <= max_target:
            return numbers, int(drawn[1]), drawn[0]
    return None


def misses(rng: np.random.Generator, numbers: list[int], target: int, ops: tuple[str, ...],
           count: int) -> list[str]:
    """Up to ``count`` wrong tries at ``target`` with ``numbers``, as a search would make
    them: among `_DRAWS` random expressions over the numbers, the ones with the nearest
    values (by |value - target|; one expression per value, so each check tells something
    new), ordered from the farthest to the nearest (fewer when the draws find fewer)."""
    by_value = {}
    for _ in range(_DRAWS):
        drawn = random_expression(rng, numbers, ops)
        if drawn and drawn[1] != target:
            by_value.setdefault(drawn[1], drawn[0])
    nearest = sorted(by_value, key=lambda v: (abs(v - target), v))[:count]
    return [by_value[v] for v in reversed(nearest)]


def check_trace(example: dict[str, Any], expressions: list[str]) -> str:
    """Each expression called with the ``check`` tool and answered as the registered
    ``countdown`` environment answers it in a rollout, then the last one as the answer."""
    environment = environments.make("countdown", max_calls=len(expressions))
    turns, text = [], ""
    for expression in expressions:
        turns.append(f"<check>{expression}</check>")
        text += turns[-1] + environment.step(example, list(turns)).observation
    return text + prompts.render_answer(TASK, expressions[-1])


def make_example(numbers: list[int], target: int, expression: str, *,
                 tries: list[str] | None = None) -> dict[str, Any]:
    """One example; ``solution`` answers ``expression``, or with ``tries`` (the wrong
    expressions to check first) is the `check_trace` of ``tries + [expression]``."""
    example = {"task": TASK, "question": f"{' '.join(map(str, numbers))} -> {target}",
               "answer": expression, "numbers": numbers, "target": target}
    example["solution"] = (prompts.render_answer(TASK, expression) if tries is None
                           else check_trace(example, [*tries, expression]))
    return example


@dataclasses.dataclass(eq=False)
class CountdownConfig(_procedural.ProceduralConfig):
    """Knobs of the small countdown task.

    Attributes:
      count: numbers per problem (the target uses them all; an answer may use fewer).
      max_number: numbers are drawn uniformly from ``1..max_number``.
      max_target: targets are integers in ``1..max_target``.
      ops: operators of the generating expressions, a subset of ``OPS``.
      check_fraction: share of solutions that search with the ``check`` tool.
      max_misses: a searching solution checks 0..max_misses wrong expressions first.
    """

    PREFIX: ClassVar[str] = "countdown"

    count: int = 3
    max_number: int = 9
    max_target: int = 99
    ops: tuple[str, ...] = ("+", "-", "*")
    check_fraction: float = 0.0
    max_misses: int = 2

    def __post_init__(self):
        self.ops = tuple(self.ops)
        for field, low in (("count", 2), ("max_number", 1), ("max_target", 1), ("max_misses", 0)):
            if getattr(self, field) < low:
                raise ValueError(f"countdown.{field} must be >= {low}, got {getattr(self, field)}")
        if not self.ops or not set(self.ops) <= set(OPS):
            raise ValueError(f"countdown.ops must be a non-empty subset of {OPS}, got {self.ops}")
        if not 0.0 <= self.check_fraction <= 1.0:
            raise ValueError(
                f"countdown.check_fraction must be in [0, 1], got {self.check_fraction}"
            )
        super().__post_init__()


def generate(config: CountdownConfig) -> Iterator[dict[str, Any]]:
    """The infinite candidate stream: candidate ``i`` depends only on ``(seed, i)``."""
    for index in itertools.count():
        rng = np.random.default_rng([config.seed, index])
        problem = sample_problem(rng, count=config.count, max_number=config.max_number,
                                 max_target=config.max_target, ops=config.ops)
        if problem is None:
            continue
        tries = None
        if config.check_fraction > 0 and rng.random() < config.check_fraction:
            tries = misses(rng, problem[0], problem[1], config.ops,
                           int(rng.integers(config.max_misses + 1)))
        yield make_example(*problem, tries=tries)


def example_key(example: dict[str, Any]) -> str:
    """The multiset of numbers and the target, the canonical form of any countdown
    problem (reasoning-gym's too): ``"[3, 7, 9]->30"``."""
    return f"{sorted(example['numbers'])}->{example['target']}"


class Countdown(_procedural.ProceduralBuilder):
    """Countdown with small numbers (see ``grpo_jax.data.countdown``)."""

    BUILDER_CONFIGS = [CountdownConfig(name="three_numbers", num_train=20000, num_test=1000)]

    def features(self) -> tfds.features.FeaturesDict:
        return _records.example_features(numbers=tfds.features.Sequence(np.int64),
                                         target=np.int64)

    def candidates(self) -> Iterator[dict[str, Any]]:
        return generate(self.builder_config)

    def key(self, example: dict[str, Any]) -> str:
        return example_key(example)
