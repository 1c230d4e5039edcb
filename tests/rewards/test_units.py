"""Unit words after a final answer: which are dropped, which hedges are refused (hand-checked)."""

import pytest

from grpo_jax.rewards import _units

# (answer, prose, expected): prose is the `####` line, otherwise a box's LaTeX; None is a hedge.
TABLE = [
    # a number and words: the words are its unit
    ("18 dollars", True, "18"),
    ("72 books.", True, "72"),
    ("5 apples!", True, "5"),
    ("$1,200 per month", True, "$1200"),
    ("1/2 cup", True, "1/2"),
    ("50% off", True, "50%"),
    ("-5 degrees", True, "-5"),
    ("3.5 hours", True, "3.5"),
    ("18 km/h", True, "18"),
    ("18 sq. ft.", True, "18"),
    ("18 o'clock", True, "18"),
    ("18dollars", True, "18"),
    ("１８ dollars", True, "18"),
    (r"18 \text{dollars}", True, "18"),
    # in a box only text mode is prose
    (r"\text{18 dollars}", False, "18"),
    (r"18 \text{ dollars}", False, "18"),
    (r"18\ \text{cm}", False, "18"),
    (r"\mbox{5 apples}", False, "5"),
    (r"\textbf{18} \text{ apples}", False, "18"),
    ("18 dollars", False, "18 dollars"),
    ("3 x", False, "3 x"),
    ("2 pi", False, "2 pi"),
    (r"\textbf{18} dollars", False, r"\textbf{18} dollars"),
    (r"5 \text{ inches}^2", False, r"5 \text{ inches}^2"),  # math after the unit: math-verify's
    # hedges: a word of HEDGES after the number, in any case
    ("18 or 19", True, None),
    ("18 or more", True, None),
    ("18 Dollars OR LESS", True, None),
    ("18 dollars at most", True, None),
    ("18 degrees below zero", True, None),
    ("18, approximately", True, None),
    (r"18 \text{ or more}", False, None),
    (r"\text{18 or 19}", False, None),
    (r"18 \text{dollars or 19}", False, None),
    # not a number followed by words: unchanged
    ("about 18", True, "about 18"),
    ("3 + 69", True, "3 + 69"),
    ("5!", True, "5!"),
    ("18", True, "18"),
    ("", True, ""),
    ("seventy-two", True, "seventy-two"),
    (r"\text{neither}", False, r"\text{neither}"),  # a hedge word without a number
    (r"1 \over 2", False, r"1 \over 2"),  # LaTeX commands are not words
    (r"1 \over 2", True, r"1 \over 2"),
    ("18 " + "apples " * 40, True, "18 " + "apples " * 40),  # longer than MAX_UNIT_ANSWER_CHARS
]


@pytest.mark.parametrize("answer, prose, expected", TABLE)
def test_strip_units(answer, prose, expected):
    assert _units.strip_units(answer, prose=prose) == expected


def test_long_answers_are_not_searched():
    assert len("18 " + "apples " * 40) > _units.MAX_UNIT_ANSWER_CHARS
    assert len("18 " + "apples " * 28) <= _units.MAX_UNIT_ANSWER_CHARS
    assert _units.strip_units("18 " + "apples " * 28, prose=True) == "18"
