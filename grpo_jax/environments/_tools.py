"""Tools a model calls during a rollout: module-level functions `(argument text, example) -> text`.

They run in worker processes of a `rewards.GraderPool` (a tool that hangs or crashes is a
failed call, never a hung run), so they must be importable by name. Each returns the
text the model reads back; bad input is an answer ("error: ..."), not an exception.
"""

import collections
import dataclasses
import fractions

from grpo_jax import rewards
from grpo_jax.environments._interface import ToolEnvironment

MAX_DIGITS = 200   # a result longer than this is refused (a tool's reply is read by the model)


def _number(value: fractions.Fraction) -> str:
    """An exact value as the model reads it: an integer, or a fraction in lowest terms."""
    text = (
        str(value.numerator) if value.denominator == 1 else f"{value.numerator}/{value.denominator}"
    )
    if len(text) > MAX_DIGITS:
        return f"error: the result has more than {MAX_DIGITS} digits"
    return text


def calculator(argument: str, example: dict) -> str:
    """The exact value of an arithmetic expression (integers, + - * /, parentheses).

    Example:
      >>> calculator("(478 + 256) * 12", {}), calculator("7 / 2", {}), calculator("2 ** 9", {})[:5]
      ('8808', '7/2', 'error')
    """
    del example
    try:
        tree, _ = rewards.parse_expression(argument.strip())
        return _number(rewards.evaluate_expression(tree))
    except rewards.InvalidExpression as error:
        return f"error: {error}"
    except ZeroDivisionError:
        return "error: division by zero"


def countdown_check(argument: str, example: dict) -> str:
    """Whether an expression is a valid Countdown answer for the example's numbers, and
    what it equals: the check a solver would run before answering.

    Example:
      >>> countdown_check("(6 - 2) * 25", {"numbers": [25, 6, 2, 9], "target": 100})
      '100 (reaches the target)'
      >>> countdown_check("6 * 6", {"numbers": [25, 6, 2, 9], "target": 100})
      'error: 6 is used more often than given'
    """
    try:
        tree, literals = rewards.parse_expression(argument.strip())
    except rewards.InvalidExpression as error:
        return f"error: {error}"
    extra = collections.Counter(literals) - collections.Counter(example["numbers"])
    if extra:
        return f"error: {min(extra)} is used more often than given"
    try:
        value = rewards.evaluate_expression(tree)
    except ZeroDivisionError:
        return "error: division by zero"
    verdict = "reaches the target" if value == example["target"] else "not the target"
    return f"{_number(value)} ({verdict})"


TOOLS = {"calculator": calculator, "check": countdown_check}


def _calculator(max_calls):
    return ToolEnvironment(tools={"calculator": calculator}, max_calls=max_calls)


def _countdown(max_calls):
    return ToolEnvironment(tools={"check": countdown_check}, max_calls=max_calls)


# The environments a run names (``environment.name``): name -> `(max_calls) -> Environment`.
# Register another by adding its function here (or to this dict before the run starts).
ENVIRONMENTS = {"calculator": _calculator, "countdown": _countdown}


def make(name, *, max_calls, reply=None):
    """The environment registered as `name` (`ENVIRONMENTS`), `max_calls` calls per episode;
    with `reply` (a format string, e.g. `chat_reply`'s), its tools' outputs shown that way."""
    if name not in ENVIRONMENTS:
        raise ValueError(f"environment.name={name!r} is not one of {sorted(ENVIRONMENTS)} "
                         "(\"\": no environment)")
    environment = ENVIRONMENTS[name](max_calls)
    if reply is None:
        return environment
    if not isinstance(environment, ToolEnvironment):
        raise ValueError(f"environment.name={name!r} writes its own observations (it is no "
                         "ToolEnvironment), so environment.chat_role cannot format them; set "
                         "environment.chat_role=''")
    return dataclasses.replace(environment, reply=reply)
