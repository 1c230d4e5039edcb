"""Multi-digit arithmetic for the tiny CPU models, with a scratchpad and a noisy teacher.

A problem is ``a <op> b`` with ``0 <= a, b < 10**digits``; subtraction is ordered so
the result is never negative. The question is ``"478+256"``, the plain prompt
``"478+256="`` and the answer ``"734"``. With ``scratchpad=True`` the solution works
column by column from the least significant digit, carrying (or borrowing) explicitly:

  ``478+256``  ->  ``8+6+0=14 7+5+1=13 4+2+1=7 #### 734``
  ``503-78``   ->  ``3-8-0=-5 0-7-1=-8 5-0-1=4 #### 425``
  ``47*26``    ->  ``47*6=282 47*20=940 #### 1222``

Each column reads ``digit + digit + carry_in = column_sum`` (``-`` and ``borrow_in``
for subtraction); the result digit is the column sum mod 10 and the carry (borrow)
out is whether it left 0..9. Without the scratchpad the solution is ``#### 734``.

With ``extra_columns = k`` each addition or subtraction solution works 0..k (uniformly
drawn) more columns past the operands' digits, on zeros: ``478+256`` ->
``8+6+0=14 7+5+1=13 4+2+1=7 0+0+0=0 #### 734``. Same answer, more tokens: a policy
trained on such targets can change the length of its answers without changing their
correctness, which is what length claims need to be measurable. With
``ramble_columns = r`` the forgetful teacher's solutions (below) work 0..r more columns
on top of those: its answers, wrong whenever it dropped a carry, are longer, so answer
length and error are correlated, as wrong reasoning that rambles is in large models.

SFT targets from an imperfect teacher: with probability ``teacher_fraction`` an
example's ``solution`` is written by a teacher that drops each carry (or borrow) with
probability ``forget_carry_p``; its scratchpad and final answer then agree with each
other but not with ``answer``, which is always correct. Multiplication targets are
always correct. With ``calculator_fraction = f`` a share f of the solutions call the
calculator tool instead of working the problem (``grpo_jax.environments``, whose reply
they include, as the model reads it in a multi-turn rollout):

  ``478*256``  ->  ``<calculator>478*256</calculator><result>122368</result> #### 122368``

so a warm start learns the call's format. The known-good recipe for the trainer demo is
3-digit addition, ``teacher_fraction=0.5``, ``forget_carry_p=1.0``.
"""

import dataclasses
import functools
import itertools
from collections.abc import Callable, Iterator
from typing import Any, ClassVar

import numpy as np
import tensorflow_datasets as tfds

from grpo_jax.data import _procedural
from grpo_jax.data import _records
from grpo_jax.data import prompts

OPS = ("+", "-", "*")


def sample_problem(rng: np.random.Generator, *, digits: int, ops: tuple[str, ...],
                   min_digits: int = 0) -> tuple[int, str, int]:
    """Draws ``(a, op, b)``; for ``"-"`` the operands are ordered so ``a >= b``.

    With ``min_digits`` > 0 each operand first draws its number of digits uniformly from
    ``min_digits..digits``, then its value among the numbers of exactly that many digits
    (0..9 for one): problems of several sizes, the longer ones with more carries."""
    op = ops[rng.integers(len(ops))]
    if min_digits:
        sizes = rng.integers(min_digits, digits + 1, size=2)
        a, b = (int(rng.integers(10 ** (n - 1) if n > 1 else 0, 10**n)) for n in sizes)
    else:
        a, b = (int(x) for x in rng.integers(0, 10**digits, size=2))
    if op == "-" and a < b:
        a, b = b, a
    return a, op, b


def problem_key(a: int, op: str, b: int) -> str:
    """Canonical form: commutative operands sorted, so ``3+5`` and ``5+3`` are one problem."""
    if op in "+*":
        a, b = sorted((a, b))
    return f"{a}{op}{b}"


def column_steps(a: int, b: int, op: str, forget: Callable[[], bool], *,
                 extra_columns: int = 0) -> tuple[list[str], int]:
    """Column-by-column addition or subtraction, least significant digit first.

    Args:
      a, b: non-negative operands (``a >= b`` for ``"-"``).
      op: ``"+"`` or ``"-"``.
      forget: called once per carry (borrow) produced; when it returns True the carry
        is dropped, which is how the imperfect teacher errs.
      extra_columns: columns worked past the operands' digits (on zeros; the first one
        takes a final carry).

    Returns:
      The scratchpad steps (``"8+6+0=14"``) and the result they add up to.
    """
    sign = 1 if op == "+" else -1
    width = max(len(str(a)), len(str(b))) + extra_columns
    steps, digits, carry = [], [], 0
    for i in range(width):
        da, db = a // 10**i % 10, b // 10**i % 10
        column = da + sign * db + sign * carry
        steps.append(f"{da}{op}{db}{op}{carry}={column}")
        digits.append(column % 10)
        carry = int(not 0 <= column <= 9)
        if carry and forget():
            carry = 0
    if carry and op == "+":
        digits.append(carry)
    return steps, sum(d * 10**i for i, d in enumerate(digits))


def product_steps(a: int, b: int) -> tuple[list[str], int]:
    """Long multiplication as shifted partial products: ``47*20=940``."""
    steps = [f"{a}*{b // 10**i % 10 * 10**i}={a * (b // 10**i % 10) * 10**i}"
             for i in range(len(str(b)))]
    return steps, a * b


def solve(a: int, op: str, b: int, *, scratchpad: bool, forget: Callable[[], bool],
          extra_columns: int = 0) -> tuple[str, int]:
    """The SFT target for ``a op b`` and the result it states.

    ``forget`` drops carries and ``extra_columns`` adds columns as in ``column_steps``
    (multiplication has neither); pass ``lambda: False`` for the correct target.
    """
    if op == "*":
        steps, result = product_steps(a, b)
    else:
        steps, result = column_steps(a, b, op, forget, extra_columns=extra_columns)
    final = prompts.render_answer("arithmetic", str(result))
    return (" ".join(steps + [final]) if scratchpad else final), result


# A calculator call and the environment's reply to it (`environments.ToolEnvironment.reply`).
CALCULATOR_CALL = "<calculator>{}</calculator><result>{}</result>"


def make_example(a: int, op: str, b: int, *, scratchpad: bool, forget: Callable[[], bool],
                 verdict: bool = False, extra_columns: int = 0,
                 calculator: bool = False) -> dict[str, Any]:
    """One arithmetic example; ``answer`` is exact, ``solution`` comes from ``solve``, or
    with ``calculator`` is a `CALCULATOR_CALL` of the question and the exact answer.

    With ``verdict``, the solution ends with the teacher's honest judgement of its own
    result, ``<verify>correct</verify>`` or ``<verify>incorrect</verify>`` (the
    self-verification format of ``grpo_jax.rewards``' ``self_verify``).
    """
    exact = {"+": a + b, "-": a - b, "*": a * b}[op]
    if calculator:
        solution = CALCULATOR_CALL.format(f"{a}{op}{b}", exact) + " " + prompts.render_answer(
            "arithmetic", str(exact))
        result = exact
    else:
        solution, result = solve(a, op, b, scratchpad=scratchpad, forget=forget,
                                 extra_columns=extra_columns)
    if verdict:
        solution += f" <verify>{'correct' if result == exact else 'incorrect'}</verify>"
    return {"task": "arithmetic", "question": f"{a}{op}{b}", "answer": str(exact),
            "solution": solution}


@dataclasses.dataclass(eq=False)
class ArithmeticConfig(_procedural.ProceduralConfig):
    """Knobs of the arithmetic task.

    Attributes:
      digits: operands are drawn uniformly from ``[0, 10**digits)``.
      ops: operators to draw from, a subset of ``("+", "-", "*")``.
      scratchpad: whether ``solution`` shows the column-by-column work.
      teacher_fraction: share of examples whose ``solution`` comes from the teacher
        that forgets carries (``answer`` stays exact).
      forget_carry_p: probability that teacher drops each carry or borrow.
      verdicts: end every solution with the teacher's honest verdict on its own result
        (``<verify>correct</verify>`` or ``<verify>incorrect</verify>``), so a warm start
        learns the self-verification format.
      extra_columns: each addition or subtraction solution works 0..extra_columns
        (uniformly drawn per example) more columns, on zeros: longer answers, same result.
      calculator_fraction: share of solutions that call the calculator tool
        (`CALCULATOR_CALL`) instead of working the problem.
      ramble_columns: the forgetful teacher's addition or subtraction solutions work
        0..ramble_columns (uniformly drawn) more columns on top of ``extra_columns``'.
      min_digits: > 0 draws each operand's number of digits uniformly from
        ``min_digits..digits`` (`sample_problem`): answers whose length follows the
        problem's size, and errors that follow its carries; 0: operands uniform in
        ``[0, 10**digits)``.
    """

    PREFIX: ClassVar[str] = "arithmetic"

    def knobs(self) -> dict[str, Any]:
        return knobs_digest_stable(super().knobs())

    digits: int = 3
    ops: tuple[str, ...] = ("+",)
    scratchpad: bool = True
    teacher_fraction: float = 0.0
    forget_carry_p: float = 1.0
    verdicts: bool = False
    extra_columns: int = 0
    calculator_fraction: float = 0.0
    ramble_columns: int = 0
    min_digits: int = 0

    def __post_init__(self):
        self.ops = tuple(self.ops)
        if self.digits < 1:
            raise ValueError(f"arithmetic.digits must be >= 1, got {self.digits}")
        if not 0 <= self.min_digits <= self.digits:
            raise ValueError(f"arithmetic.min_digits must be in 0..digits ({self.digits}), "
                             f"got {self.min_digits}")
        for field in ("extra_columns", "ramble_columns"):
            if getattr(self, field) < 0:
                raise ValueError(f"arithmetic.{field} must be >= 0, got {getattr(self, field)}")
        if not self.ops or not set(self.ops) <= set(OPS):
            raise ValueError(f"arithmetic.ops must be a non-empty subset of {OPS}, got {self.ops}")
        for field in ("teacher_fraction", "forget_carry_p", "calculator_fraction"):
            if not 0.0 <= getattr(self, field) <= 1.0:
                raise ValueError(
                    f"arithmetic.{field} must be in [0, 1], got {getattr(self, field)}"
                )
        super().__post_init__()


def generate(config: ArithmeticConfig) -> Iterator[dict[str, Any]]:
    """The infinite candidate stream: candidate ``i`` depends only on ``(seed, i)``."""
    for index in itertools.count():
        rng = np.random.default_rng([config.seed, index])
        a, op, b = sample_problem(rng, digits=config.digits, ops=config.ops,
                                  min_digits=config.min_digits)
        noisy = rng.random() < config.teacher_fraction
        # Drawn only when asked for, so the streams without extra columns stay as they were.
        extra = int(rng.integers(config.extra_columns + 1)) if config.extra_columns else 0
        forget = functools.partial(_coin, rng, config.forget_carry_p if noisy else 0.0)
        calculator = _coin(rng, config.calculator_fraction)
        if noisy and config.ramble_columns:   # drawn last: the other draws stay as they were
            extra += int(rng.integers(config.ramble_columns + 1))
        yield make_example(a, op, b, scratchpad=config.scratchpad, forget=forget,
                           verdict=config.verdicts, extra_columns=extra, calculator=calculator)


def _coin(rng: np.random.Generator, p: float) -> bool:
    """True with probability ``p``; draws nothing when ``p == 0``."""
    return p > 0 and rng.random() < p


def knobs_digest_stable(knobs: dict[str, Any]) -> dict[str, Any]:
    """`knobs` without ``min_digits`` at its default 0, so the configs that leave it off
    keep the dataset names (and cached warm starts) they had before it existed."""
    return {k: v for k, v in knobs.items() if not (k == "min_digits" and v == 0)}


def example_key(example: dict[str, Any]) -> str:
    """``problem_key`` of an example's question."""
    question = example["question"]
    op = next(c for c in question[1:] if c in OPS)
    a, b = question.split(op, 1)
    return problem_key(int(a), op, int(b))


class Arithmetic(_procedural.ProceduralBuilder):
    """Multi-digit arithmetic with an optional scratchpad (see ``grpo_jax.data.arithmetic``)."""

    # add3_teacher is the SFT warm start of the trainer demo's known-good recipe.
    BUILDER_CONFIGS = [
        ArithmeticConfig(name="add3", digits=3, num_train=20000, num_test=1000),
        ArithmeticConfig(name="add3_teacher", digits=3, num_train=20000, num_test=1000,
                         teacher_fraction=0.5, forget_carry_p=1.0),
    ]

    def features(self) -> tfds.features.FeaturesDict:
        return _records.example_features()

    def candidates(self) -> Iterator[dict[str, Any]]:
        return generate(self.builder_config)

    def key(self, example: dict[str, Any]) -> str:
        return example_key(example)
