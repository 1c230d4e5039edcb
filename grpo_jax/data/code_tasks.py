"""Small Python functions to write, with generated reference solutions and unit tests.

A problem is a chain of ``steps`` primitive operations on one input kind (an integer, a
list of integers or a string), described in words; the solution is the function that
applies them in order; the tests are asserts on ``num_tests`` random inputs whose
expected values come from the reference operations themselves (not from running text):

  question: ``Write f(x) for an integer x: add 3, then multiply by 2.``
  answer:   ``def f(x):\\n    x = x + 3\\n    x = x * 2\\n    return x\\n`` (the
            solution is it in a python block)
  tests:    ``assert f(4) == 14``, ``assert f(-1) == 4``, ...

Graded by the ``code_tests`` reward (assert tests). Knobs: the input ``kinds``, the number
of steps (``min_steps`` to ``max_steps``), the constants' range (``max_constant``) and
the tests per problem. Train and test problems are disjoint (a hash of the operations).
"""

import dataclasses
import itertools
import json
from collections.abc import Callable, Iterator
from typing import Any, ClassVar

import numpy as np
import tensorflow_datasets as tfds

from grpo_jax.data import _procedural
from grpo_jax.data import _records
from grpo_jax.data import prompts

KINDS = ("int", "list", "str")
_LETTERS = "abcdefghij"


@dataclasses.dataclass(frozen=True)
class Operation:
    """A primitive: its words, its line of code (``{k}`` the constant) and its value."""

    words: str
    code: str
    apply: Callable[[Any, int], Any]
    takes_constant: bool = True


# Each line assigns the input's own name (x, xs or s), so steps chain line by line.
OPERATIONS = {
    "int": (
        Operation("add {k}", "x = x + {k}", lambda x, k: x + k),
        Operation("subtract {k}", "x = x - {k}", lambda x, k: x - k),
        Operation("multiply by {k}", "x = x * {k}", lambda x, k: x * k),
        Operation("take the remainder modulo {k}", "x = x % {k}", lambda x, k: x % k),
        Operation("square it", "x = x * x", lambda x, k: x * x, takes_constant=False),
    ),
    "list": (
        Operation("add {k} to each element", "xs = [x + {k} for x in xs]",
                  lambda xs, k: [x + k for x in xs]),
        Operation("multiply each element by {k}", "xs = [x * {k} for x in xs]",
                  lambda xs, k: [x * k for x in xs]),
        Operation("keep the elements greater than {k}", "xs = [x for x in xs if x > {k}]",
                  lambda xs, k: [x for x in xs if x > k]),
        Operation("keep the even elements", "xs = [x for x in xs if x % 2 == 0]",
                  lambda xs, k: [x for x in xs if x % 2 == 0], takes_constant=False),
        Operation("reverse it", "xs = xs[::-1]", lambda xs, k: xs[::-1], takes_constant=False),
        Operation("sort it", "xs = sorted(xs)", lambda xs, k: sorted(xs), takes_constant=False),
    ),
    "str": (
        Operation("reverse it", "s = s[::-1]", lambda s, k: s[::-1], takes_constant=False),
        Operation("make it upper case", "s = s.upper()", lambda s, k: s.upper(),
                  takes_constant=False),
        Operation("repeat it {k} times", "s = s * {k}", lambda s, k: s * k),
        Operation("drop its first {k} characters", "s = s[{k}:]", lambda s, k: s[k:]),
        Operation("remove the letter a", "s = s.replace('a', '')",
                  lambda s, k: s.replace("a", ""), takes_constant=False),
    ),
}
_NAMES = {"int": ("x", "an integer x"), "list": ("xs", "a list of integers xs"),
          "str": ("s", "a string s")}


def random_input(rng: np.random.Generator, kind: str) -> Any:
    """A test input of `kind`: an integer in [-20, 20], a list of 2 to 8 of them, or a
    string of 1 to 8 letters from a-j."""
    if kind == "int":
        return int(rng.integers(-20, 21))
    if kind == "list":
        return [int(v) for v in rng.integers(-20, 21, size=int(rng.integers(2, 9)))]
    letters = rng.integers(0, len(_LETTERS), size=int(rng.integers(1, 9)))
    return "".join(_LETTERS[i] for i in letters)


def make_example(kind: str, steps: list[tuple[int, int]],
                 inputs: list[Any]) -> dict[str, Any]:
    """The example of the chain `steps` ((operation index, constant) pairs) on `kind`,
    tested on `inputs` (expected values computed by the operations themselves)."""
    name, described = _NAMES[kind]
    ops = [(OPERATIONS[kind][index], k) for index, k in steps]
    words = ", then ".join(op.words.format(k=k) for op, k in ops)
    body = "".join(f"    {op.code.format(k=k)}\n" for op, k in ops)
    program = f"def f({name}):\n{body}    return {name}\n"
    cases = []
    for value in inputs:
        expected = value
        for op, k in ops:
            expected = op.apply(expected, k)
        cases.append(f"assert f({value!r}) == {expected!r}")
    tests = {"kind": "assert", "setup": "", "cases": cases}
    return {"task": "code_tasks", "question": f"Write f({name}) for {described}: {words}.",
            "answer": program, "solution": prompts.render_answer("code_tasks", program),
            "tests": json.dumps(tests)}


@dataclasses.dataclass(eq=False)
class CodeTasksConfig(_procedural.ProceduralConfig):
    """Knobs of the code task.

    Attributes:
      kinds: input kinds to draw from, a subset of ``("int", "list", "str")``.
      min_steps, max_steps: operations per function, drawn uniformly in this range.
      max_constant: constants are drawn from ``[2, max_constant]``.
      num_tests: asserts per problem.
    """

    PREFIX: ClassVar[str] = "code_tasks"

    kinds: tuple[str, ...] = ("int", "list")
    min_steps: int = 1
    max_steps: int = 2
    max_constant: int = 9
    num_tests: int = 4

    def __post_init__(self):
        self.kinds = tuple(self.kinds)
        if not self.kinds or not set(self.kinds) <= set(KINDS):
            raise ValueError(f"code_tasks.kinds must be a non-empty subset of {KINDS}, "
                             f"got {self.kinds}")
        if not 1 <= self.min_steps <= self.max_steps:
            raise ValueError(f"code_tasks needs 1 <= min_steps <= max_steps, got "
                             f"{self.min_steps} and {self.max_steps}")
        for field in ("max_constant", "num_tests"):
            if getattr(self, field) < 2:
                raise ValueError(f"code_tasks.{field} must be >= 2, got {getattr(self, field)}")
        super().__post_init__()


def generate(config: CodeTasksConfig) -> Iterator[dict[str, Any]]:
    """The infinite candidate stream: candidate ``i`` depends only on ``(seed, i)``."""
    for index in itertools.count():
        rng = np.random.default_rng([config.seed, index])
        kind = config.kinds[rng.integers(len(config.kinds))]
        steps = []
        for _ in range(int(rng.integers(config.min_steps, config.max_steps + 1))):
            op = int(rng.integers(len(OPERATIONS[kind])))
            constant = OPERATIONS[kind][op].takes_constant
            steps.append((op, int(rng.integers(2, config.max_constant + 1)) if constant else 0))
        inputs = [random_input(rng, kind) for _ in range(config.num_tests)]
        yield make_example(kind, steps, inputs)


class CodeTasks(_procedural.ProceduralBuilder):
    """Small Python functions over ints, lists and strings (see ``grpo_jax.data.code_tasks``)."""

    def features(self) -> tfds.features.FeaturesDict:
        return _records.example_features(tests=tfds.features.Text())

    def candidates(self) -> Iterator[dict[str, Any]]:
        return generate(self.builder_config)

    def key(self, example: dict[str, Any]) -> str:
        return example["question"]   # the words name the kind, the operations and constants
