"""Countdown: is the expression in `<answer>...</answer>` a valid way to reach the target?

Valid means: only integer literals, binary `+ - * /` and parentheses; the literals form a
sub-multiset of `example["numbers"]` (each given number at most once, not all need be
used); and the value equals `example["target"]` exactly in rational arithmetic, so
`(1 + 2) / 3` is 1 and `7 / 2 * 2` is 7.

Rules chosen here and why:

- No unary operators, not even a leading minus. Countdown combines the given numbers
  with the four binary operations; `-3 + 10` is written `10 - 3`, and `--5` or `-(-5)`
  tricks would otherwise pass as "using 5".
- No `=`: the answer is the expression alone, as reasoning-gym's prompt asks.
- `×` and `÷` are read as `*` and `/`, Unicode digits as ASCII digits, line breaks as spaces.
- The text is parsed by Python's `ast` but never evaluated by Python: characters are
  whitelisted first (no letters, `_`, `^`, `.`, `,`), the tree is whitelisted node by node
  (no `**`, `//`, `%`, names, calls, attributes), and the literals are checked against the
  given numbers BEFORE anything is computed. So the arithmetic has at most
  `len(numbers) - 1` operations on the given numbers: `9**9**9**9` and a thousand-digit
  literal are rejected without work, and `MAX_EXPRESSION_CHARS` bounds the parser itself
  (so at most 127 nested parentheses, under Python's parser limit of 200).

So the work is bounded by construction and the grader runs inline without a timer:
microseconds on any completion (the time-bound test feeds it 10,000-character ones).
"""

import ast
import collections
import fractions
import re

from grpo_jax.rewards import _answers
from grpo_jax.rewards import _normalise
from grpo_jax.rewards._registry import register

MAX_EXPRESSION_CHARS = 256
_ALLOWED_CHARS = re.compile(r"[0-9+\-*/()\s]+")
_OPERATORS = {
    ast.Add: lambda a, b: a + b,
    ast.Sub: lambda a, b: a - b,
    ast.Mult: lambda a, b: a * b,
    ast.Div: lambda a, b: a / b,
}


class InvalidExpression(ValueError):
    """The answer is not a well-formed Countdown expression (a wrong answer, not a grader bug)."""


def _check_tree(node: ast.expr) -> list[int]:
    """Checks every node against the whitelist; returns the integer literals in order."""
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return [node.value]
    if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
        return _check_tree(node.left) + _check_tree(node.right)
    raise InvalidExpression(
        f"{type(node).__name__} is not allowed; use integers, + - * / and parentheses"
    )


def parse_expression(text: str) -> tuple[ast.expr, list[int]]:
    """Parses a Countdown expression; returns its tree and its integer literals.

    Raises:
      InvalidExpression: too long, a character or construct outside the grammar, or a syntax error.

    Example:
      >>> parse_expression("(25 - 5) × 3")[1]
      [25, 5, 3]
    """
    if len(text) > MAX_EXPRESSION_CHARS:  # checked first, so no work scales with the input
        raise InvalidExpression(
            f"expression has {len(text)} characters, more than {MAX_EXPRESSION_CHARS}"
        )
    text = _normalise.normalise_digits(text).replace("×", "*").replace("÷", "/")
    text = " ".join(text.split())  # a line break inside the answer is just a space
    if not _ALLOWED_CHARS.fullmatch(text):
        raise InvalidExpression(
            f"{text!r} has characters other than digits, + - * / and parentheses"
        )
    try:
        tree = ast.parse(text, mode="eval").body
    except (SyntaxError, ValueError, MemoryError, RecursionError) as error:
        raise InvalidExpression(f"{text!r} does not parse: {error}") from None
    return tree, _check_tree(tree)


def evaluate(node: ast.expr) -> fractions.Fraction:
    """Exact value of a tree that passed `parse_expression`; ZeroDivisionError on `/ 0`."""
    if isinstance(node, ast.Constant):
        return fractions.Fraction(node.value)
    return _OPERATORS[type(node.op)](evaluate(node.left), evaluate(node.right))


def is_valid_solution(expression: str, numbers: list[int], target: int) -> bool:
    """Whether `expression` reaches `target` using each of `numbers` at most once.

    Example:
      >>> is_valid_solution("(6 - 2) * 25", [25, 6, 2, 9], 100)
      True
    """
    try:
        tree, literals = parse_expression(expression)
    except InvalidExpression:
        return False
    if collections.Counter(literals) - collections.Counter(numbers):
        return False  # a literal that was not given, or a given number used twice
    try:
        return evaluate(tree) == target
    except ZeroDivisionError:
        return False


@register("countdown")
def countdown_reward(prompt: str, completion: str, example: dict) -> float:
    """1.0 if the last `<answer>...</answer>` is a valid solution (see module docstring), else 0.0.

    Reads `example["numbers"]` (list of ints) and `example["target"]` (int). An empty or
    unclosed last `<answer>` scores 0.
    """
    del prompt
    marker = _answers.last_tag(completion, "answer")
    if marker is None or marker.content is None:
        return 0.0
    return float(is_valid_solution(marker.content, example["numbers"], example["target"]))
