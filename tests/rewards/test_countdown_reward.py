"""Countdown grader: a hand-checked table of completions, then the parser's limits."""

import time

import pytest

from grpo_jax import rewards
from grpo_jax.rewards import _countdown

NUMS = [25, 6, 2, 9]  # target 100 is reached by (6 - 2) * 25
THINK = "<think>6 - 2 = 4, and 4 * 25 = 100.</think>\n"

# (completion, numbers, target, expected reward), each expectation worked out by hand.
TABLE = [
    # correct
    (THINK + "<answer>(6 - 2) * 25</answer>", NUMS, 100, 1.0),
    ("<answer>25 * (6 - 2)</answer>", NUMS, 100, 1.0),
    ("<answer>(6-2)*25</answer>", NUMS, 100, 1.0),
    ("<answer> ( 6 - 2 ) * 25 </answer>", NUMS, 100, 1.0),
    ("<answer>((6 - 2) * 25)</answer>", NUMS, 100, 1.0),
    ("<answer>(((6 - 2))) * 25</answer>", NUMS, 100, 1.0),
    ("<answer>25 * 6 - 25 * 2</answer>", NUMS, 100, 0.0),  # uses 25 twice
    ("<answer>100 - 0</answer>", NUMS, 100, 0.0),  # neither number given
    ("<answer>9 + 6 + 2 + 25</answer>", NUMS, 42, 1.0),  # all four numbers
    ("<answer>25 + 9</answer>", NUMS, 34, 1.0),  # a subset is allowed
    ("<answer>25</answer>", NUMS, 25, 1.0),  # a single number is a subset
    ("<answer>(25 + 2) / 9 * 6</answer>", NUMS, 18, 1.0),  # 27/9*6
    ("<answer>9 / 6 * 2</answer>", NUMS, 3, 1.0),  # fraction 3/2 on the way
    ("<answer>25 / 2 * 2</answer>", [25, 2, 2], 25, 1.0),  # 2 given twice, used twice
    ("<answer>25 / 2 * 2</answer>", NUMS, 25, 0.0),  # 2 given once, used twice
    ("<answer>(25 - 9) / (6 - 2)</answer>", NUMS, 4, 1.0),
    ("<answer>6 / (2 / 25) / 9</answer>", NUMS, 0, 0.0),  # 75/9 is not 0
    ("<answer>2 - 6 + 25 - 9</answer>", NUMS, 12, 1.0),  # negative on the way is fine
    ("<answer>2 - 25</answer>", NUMS, -23, 1.0),
    ("<answer>8 × 3 + 1</answer>", [8, 3, 1], 25, 1.0),  # × read as *
    ("<answer>75 ÷ 3</answer>", [75, 3], 25, 1.0),  # ÷ read as /
    ("<answer>７５ ÷ ３</answer>", [75, 3], 25, 1.0),  # full-width digits
    ("<answer>٧٥ / ٣</answer>", [75, 3], 25, 1.0),  # Arabic-Indic digits
    ("<answer>1,000 - 1</answer>", [1000, 1], 999, 1.0),  # thousands separator
    ("<answer>1000\n- 1</answer>", [1000, 1], 999, 1.0),  # newline inside is whitespace
    # wrong value
    ("<answer>(6 + 2) * 25</answer>", NUMS, 100, 0.0),
    ("<answer>25 * 6 / 2</answer>", NUMS, 100, 0.0),
    ("<answer>9 / 2</answer>", NUMS, 4, 0.0),  # 4.5, no rounding
    ("<answer>9 / 2</answer>", [9, 2], 4.5, 1.0),  # exact rational equality
    ("<answer>7 / 3 * 3</answer>", [7, 3, 3], 7, 1.0),  # exact, no float error
    ("<answer>1 / 3 + 1 / 3 + 1 / 3</answer>", [1, 1, 1, 3, 3, 3], 1, 1.0),
    # number rules
    ("<answer>(6 - 2) * 25 + 0</answer>", NUMS, 100, 0.0),  # 0 not given
    ("<answer>(7 - 3) * 25</answer>", NUMS, 100, 0.0),
    ("<answer>4 * 25</answer>", NUMS, 100, 0.0),  # intermediate result as literal
    ("<answer>(6 - 2) * 025</answer>", NUMS, 100, 0.0),  # leading zero: not Python, not allowed
    ("<answer>(6 - 2) * 2_5</answer>", NUMS, 100, 0.0),  # underscore literal
    ("<answer>(6 - 2) * 25.0</answer>", NUMS, 100, 0.0),  # float literal
    ("<answer>(6 - 2) * 2.5e1</answer>", NUMS, 100, 0.0),
    # unary operators are rejected
    ("<answer>-2 + 6 * 25 - 9</answer>", NUMS, 139, 0.0),
    ("<answer>25 * -(2 - 6)</answer>", NUMS, 100, 0.0),
    ("<answer>25 * +(6 - 2)</answer>", NUMS, 100, 0.0),
    ("<answer>25 - -6</answer>", NUMS, 31, 0.0),
    ("<answer>(6 - 2) * 25 ~ 0</answer>", NUMS, 100, 0.0),
    # other operators
    ("<answer>2 ** 6 + 25 + 9</answer>", NUMS, 98, 0.0),
    ("<answer>2 ^ 6</answer>", NUMS, 4, 0.0),  # xor in Python, power in prose: both out
    ("<answer>25 // 6</answer>", NUMS, 4, 0.0),
    ("<answer>25 % 6</answer>", NUMS, 1, 0.0),
    ("<answer>(6 - 2) * 25 = 100</answer>", NUMS, 100, 0.0),  # expression only
    ("<answer>6 - 2 == 4</answer>", NUMS, 4, 0.0),
    ("<answer>25 < 26</answer>", NUMS, 1, 0.0),
    ("<answer>6, 2</answer>", NUMS, 4, 0.0),  # a tuple, not an expression
    # code injection and huge work
    ("<answer>__import__('os').system('rm -rf /')</answer>", NUMS, 0, 0.0),
    ("<answer>eval('100')</answer>", NUMS, 100, 0.0),
    ("<answer>(lambda: 100)()</answer>", NUMS, 100, 0.0),
    ("<answer>[25][0] * 4</answer>", NUMS, 100, 0.0),
    ("<answer>9**9**9**9</answer>", [9, 9, 9, 9], 0, 0.0),
    ("<answer>9*9*9*9*9*9*9*9*9*9*9*9</answer>", [9] * 4, 6561, 0.0),  # more 9s than given
    ("<answer>" + "9" * 5000 + "</answer>", NUMS, 0, 0.0),
    ("<answer>" + "(" * 500 + "25" + ")" * 500 + "</answer>", NUMS, 25, 0.0),
    ("<answer>" + "25+" * 100 + "0</answer>", NUMS, 2500, 0.0),
    # malformed, truncated, empty
    ("", NUMS, 100, 0.0),
    ("(6 - 2) * 25", NUMS, 100, 0.0),  # no answer tags
    ("<answer></answer>", NUMS, 100, 0.0),
    ("<answer>   </answer>", NUMS, 100, 0.0),
    ("<answer>(6 - 2) * 25", NUMS, 100, 0.0),  # truncated: never closed
    ("<answer>(6 - 2) * 25</answer> <answer>", NUMS, 100, 0.0),  # last opener unclosed
    ("<answer>(6 - 2) * 25</answer> <answer></answer>", NUMS, 100, 0.0),  # last empty, no fallback
    ("<answer>(6 - 2) * 25</answer> <answer>6 + 2</answer>", NUMS, 100, 0.0),  # last is wrong
    ("<answer>6 + 2</answer> <answer>(6 - 2) * 25</answer>", NUMS, 100, 1.0),  # last is right
    ("<answer>(6 - 2) * 25)</answer>", NUMS, 100, 0.0),  # unbalanced
    ("<answer>((6 - 2) * 25</answer>", NUMS, 100, 0.0),
    ("<answer>6 2 25</answer>", NUMS, 100, 0.0),
    ("<answer>(6 - 2)(25)</answer>", NUMS, 100, 0.0),  # implicit product is a call
    ("<answer>1/0</answer>", [1, 0], 0, 0.0),
    ("<answer>25 / (6 - 6)</answer>", [25, 6, 6], 0, 0.0),
    ("<answer>The answer is (6 - 2) * 25</answer>", NUMS, 100, 0.0),
    ("<Answer>(6 - 2) * 25</Answer>", NUMS, 100, 0.0),  # tags are case-sensitive
    # power bombs: powers are not in the grammar, so nothing is computed
    ("<answer>2^2^2^2</answer>", [2, 2, 2, 2], 16, 0.0),
    ("<answer>2 ** 2 ** 2 ** 2</answer>", [2, 2, 2, 2], 65536, 0.0),
    ("<answer>" + "9**" * 60 + "9</answer>", [9] * 61, 0, 0.0),
    ("<answer>" + "9 ** " * 1990 + "9</answer>", [9] * 1991, 0, 0.0),
    # nesting and length, up to MAX_EXPRESSION_CHARS = 256 and past it
    ("<answer>" + "(" * 127 + "25" + ")" * 127 + "</answer>", NUMS, 25, 1.0),
    ("<answer>" + "(" * 128 + "25" + ")" * 128 + "</answer>", NUMS, 25, 0.0),
    ("<answer>" + "(" * 4990 + "25" + ")" * 4990 + "</answer>", NUMS, 25, 0.0),
    ("<answer>" + "1+" * 127 + "1</answer>", [1] * 128, 128, 1.0),
    ("<answer>" + "1+" * 128 + "1</answer>", [1] * 129, 129, 0.0),
    ("<answer>" + "9" * 9980 + "</answer>", NUMS, 0, 0.0),
    # long completions
    ("<answer>" * 1250, NUMS, 100, 0.0),
    ("<answer>(6 - 2) * 25</answer>" * 340, NUMS, 100, 1.0),
    ("<answer>(6 - 2) * 25</answer>" * 339 + "<answer>", NUMS, 100, 0.0),
    ("<think>" + "6 - 2 = 4. " * 900 + "</think><answer>(6 - 2) * 25</answer>", NUMS, 100, 1.0),
]


def test_table_is_big_enough():
    assert len(TABLE) >= 60


@pytest.mark.parametrize("completion, numbers, target, expected", TABLE)
def test_countdown_reward(completion, numbers, target, expected):
    example = {
        "task": "countdown", "question": "", "answer": "", "numbers": numbers, "target": target,
    }
    assert rewards.countdown_reward("prompt", completion, example) == expected


def test_literals_are_returned_in_order():
    _, literals = _countdown.parse_expression("(25 - 5) × 3")
    assert literals == [25, 5, 3]


@pytest.mark.parametrize(
    "text", ["9**9**9**9", "(" * 1000 + "1" + ")" * 1000, "9" * 100_000, "1+" * 100_000 + "1"]
)
def test_adversarial_input_is_rejected_without_hanging(text):
    # A hang guard, not a speed test: evaluating 9**9**9**9 would take forever, so any
    # bound far below that proves the length/whitelist checks ran first, even on a
    # loaded CI machine.
    start = time.perf_counter()
    assert not rewards.is_valid_solution(text, [9, 9, 9, 9, 1], 0)
    assert time.perf_counter() - start < 5.0


def test_registered_inline():
    assert rewards.get_reward("countdown").where == "inline"
