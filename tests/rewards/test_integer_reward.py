"""Exact integer answers for the procedural arithmetic task: a hand-checked table."""

import pytest

from grpo_jax import rewards

PAD = "8+6+0=14 7+5+1=13 4+2+1=7 "  # the arithmetic task's scratchpad

# (completion, gold answer, expected)
TABLE = [
    (PAD + "#### 734", "734", 1.0),
    ("#### 734", "734", 1.0),
    ("####734", "734", 1.0),
    ("#### 734 ", "734", 1.0),
    ("#### 734.", "734", 1.0),
    ("#### 734\n", "734", 1.0),
    ("#### 734\nDone.", "734", 1.0),
    ("#### +734", "734", 1.0),
    ("#### 0734", "734", 1.0),  # leading zero: the same integer
    ("#### 0", "0", 1.0),
    ("#### -0", "0", 1.0),
    ("#### -12", "-12", 1.0),
    ("#### 12", "-12", 0.0),
    ("#### \u221212", "-12", 1.0),  # Unicode minus sign
    ("#### 1,734", "1734", 1.0),
    ("#### 1\\,734", "1734", 1.0),
    ("#### １７３４", "1734", 1.0),  # full-width digits
    ("#### ١٧٣٤", "1734", 1.0),  # Arabic-Indic digits
    ("#### ۱۷۳۴", "1734", 1.0),  # Persian digits
    ("#### 735", "734", 0.0),
    ("#### 733", "734", 0.0),
    ("#### 7340", "734", 0.0),
    ("#### 73", "734", 0.0),
    ("#### 437", "734", 0.0),
    (PAD + "#### 724", "734", 0.0),
    # not an integer
    ("#### 734.0", "734", 0.0),
    ("#### 734.5", "734", 0.0),
    ("#### 7.34e2", "734", 0.0),
    ("#### 1468/2", "734", 0.0),
    ("#### 700 + 34", "734", 0.0),
    ("#### $734", "734", 0.0),
    ("#### 734%", "734", 0.0),
    ("#### 734 apples", "734", 0.0),
    ("#### seven hundred thirty-four", "734", 0.0),
    ("#### 7 3 4", "734", 0.0),
    ("#### 73_4", "734", 0.0),
    ("#### 0x2de", "734", 0.0),
    ("#### \\boxed{734}", "734", 0.0),
    # the last marker decides
    ("#### 733\n#### 734", "734", 1.0),
    ("#### 734\n#### 733", "734", 0.0),
    ("#### 734\n####", "734", 0.0),  # empty last marker: no fallback
    ("#### 734\n####   ", "734", 0.0),
    ("#### 734 #### 733", "734", 0.0),
    ("#### 733 #### 734", "734", 1.0),
    # no marker
    ("734", "734", 0.0),
    (PAD + "734", "734", 0.0),
    ("The answer is 734.", "734", 0.0),
    (r"\boxed{734}", "734", 0.0),
    ("<answer>734</answer>", "734", 0.0),
    ("", "734", 0.0),
    ("### 734", "734", 0.0),
    # truncated
    (PAD, "734", 0.0),
    ("8+6+0=14 7+5+1=13 4+2+", "734", 0.0),
    (PAD + "####", "734", 0.0),
    (PAD + "#### ", "734", 0.0),
    (PAD + "#### 7", "734", 0.0),
    (PAD + "#### 73", "734", 0.0),
    # adversarial
    ("#### __import__('os').system('ls')", "734", 0.0),
    ("#### 734; import os", "734", 0.0),
    ("#### 9**9**9**9", "734", 0.0),
    ("#### " + "9" * 64, "9" * 64, 1.0),  # 64 digits is the longest accepted
    ("#### " + "9" * 65, "9" * 65, 0.0),  # longer numbers are refused, not parsed
    ("#### " + "9" * 100_000, "734", 0.0),
    ("#### 734" + "\u200b", "734", 0.0),  # zero-width space is not whitespace
    # golds of any length compare as digit strings, never through int()
    ("#### 5", "9" * 5000, 0.0),
    ("#### " + "9" * 5000, "9" * 5000, 0.0),  # longer than 64 digits: refused, as above
    ("#### " + "9" * 64, "0" * 10 + "9" * 64, 1.0),
    ("#### " + "9" * 64, "9" * 9000, 0.0),
    ("#### 734", "٧٣٤", 1.0),  # a gold in another digit script, as int() read it
    # long completions
    ("#### 734\n" * 1100, "734", 1.0),
    ("####" * 2500, "734", 0.0),
    ("#### " + "{" * 5000 + "734" + "}" * 4990, "734", 0.0),
]


def test_table_is_big_enough():
    assert len(TABLE) >= 60


@pytest.mark.parametrize("completion, gold, expected", TABLE)
def test_integer_answer_reward(completion, gold, expected):
    example = {"task": "arithmetic", "question": "q", "answer": gold}
    assert rewards.integer_answer_reward("prompt", completion, example) == expected


def test_gold_that_is_not_an_integer_raises_naming_the_field():
    with pytest.raises(ValueError, match=r"example\['answer'\] = '7.5' is not an integer"):
        rewards.integer_answer_reward("p", "#### 7", {"answer": "7.5"})


def test_registered_inline():
    assert rewards.get_reward("integer_answer").where == "inline"


# (completion, expected) for the format alone: an integer in the last marker, right or wrong
FORMAT_TABLE = [
    (PAD + "#### 734", 1.0),
    (PAD + "#### 724", 1.0),     # wrong, but in the format
    ("#### -12", 1.0),
    ("#### 1,734", 1.0),
    ("#### 734.", 1.0),
    ("#### 0", 1.0),
    ("#### 734.5", 0.0),
    ("#### 734 apples", 0.0),
    ("#### 734\n####", 0.0),     # the last marker is empty
    ("#### 734 #### x", 0.0),
    ("The answer is 734.", 0.0),
    ("", 0.0),
    (PAD + "#### ", 0.0),
    ("#### " + "9" * 65, 0.0),
]


@pytest.mark.parametrize("completion, expected", FORMAT_TABLE)
def test_integer_format_reward(completion, expected):
    example = {"task": "arithmetic", "question": "q", "answer": "734"}
    assert rewards.integer_format_reward("prompt", completion, example) == expected


@pytest.mark.parametrize("completion, gold, expected", TABLE)
def test_a_right_answer_is_always_in_the_format(completion, gold, expected):
    example = {"task": "arithmetic", "question": "q", "answer": gold}
    if expected:
        assert rewards.integer_format_reward("prompt", completion, example) == 1.0


def test_integer_format_registered_inline():
    assert rewards.get_reward("integer_format").where == "inline"
