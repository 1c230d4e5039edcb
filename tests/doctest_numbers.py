"""Docstring examples checked to the precision their numbers are written in.

A docstring example prints what the library computes, and the last digit of a float32
printed to eight significant digits can move with any jax or XLA release (a different
fusion, the same value to one unit in the last place). `run_examples` runs a module's
examples as `doctest.testmod` does, but where the text does not match exactly it compares
the two outputs number by number: the text between the numbers must be the same (spaces
aside), and each number must agree with the one written to half a unit of its last written
digit plus four float32 units in the last place (``4 * 2**-23`` relative). A one-ulp change
passes; a value off by 1e-3 (or by one unit of a written digit that matters) fails.
"""

import doctest
import math
import re
from types import ModuleType
from typing import Any

# A decimal number as numpy and Python print it: 3, -0.5, 1., .5, 1.2e-05, nan, inf.
NUMBER = re.compile(r"(?<![\w.])[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?|[-+]?\b(?:nan|inf)\b")
FLOAT32_SLACK = 4 * 2.0 ** -23   # relative: a few units in the last place of a float32


def written_tolerance(text: str) -> float:
    """Half a unit of the last digit written in `text` (a number as printed): 0.5 for
    '3', 5e-9 for '-0.10536057', 5e-8 for '1.5e-07'."""
    mantissa, _, exponent = text.lower().partition("e")
    decimals = len(mantissa.partition(".")[2])
    return 0.5 * 10.0 ** (-(decimals - int(exponent or 0)))


def numbers_agree(want: str, got: str) -> bool:
    """Whether the printed number `got` is `want` to the precision `want` is written in."""
    w, g = float(want), float(got)
    if w != w or g != g:                                  # nan only equals nan
        return w != w and g != g
    if w == g or math.isinf(w) or math.isinf(g):
        return w == g
    return abs(w - g) <= written_tolerance(want) + FLOAT32_SLACK * abs(w)


class WrittenPrecisionChecker(doctest.OutputChecker):
    """doctest's checker, with numbers compared to their written precision where the exact
    comparison fails (`NUMBER` above; an expected output using ``...`` is compared as
    doctest compares it)."""

    def check_output(self, want: str, got: str, optionflags: int) -> bool:
        if super().check_output(want, got, optionflags):
            return True
        if (optionflags & doctest.ELLIPSIS) and doctest.ELLIPSIS_MARKER in want:
            return False
        want_numbers, got_numbers = NUMBER.findall(want), NUMBER.findall(got)
        if len(want_numbers) != len(got_numbers) or not want_numbers:
            return False
        if _skeleton(want) != _skeleton(got):
            return False
        return all(numbers_agree(w, g) for w, g in zip(want_numbers, got_numbers))


def _skeleton(text: str) -> str:
    """`text` with every number replaced by '#' and every space removed."""
    return re.sub(r"\s+", "", NUMBER.sub("#", text))


def run_examples(module: ModuleType, *, optionflags: int = doctest.NORMALIZE_WHITESPACE,
                 extraglobs: dict[str, Any] | None = None) -> doctest.TestResults:
    """`doctest.testmod(module, ...)` with `WrittenPrecisionChecker`: (failed, attempted)."""
    runner = doctest.DocTestRunner(checker=WrittenPrecisionChecker(), optionflags=optionflags)
    for test in doctest.DocTestFinder().find(module, module.__name__, extraglobs=extraglobs):
        runner.run(test)
    return runner.summarize(verbose=False)
