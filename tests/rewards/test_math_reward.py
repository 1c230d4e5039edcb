"""Math and GSM8K correctness: hand-checked tables of completions, run through math-verify."""

import pytest

from grpo_jax import rewards

POLAR = r"\left( 3, \frac{\pi}{2} \right)"

# (completion, gold answer as in MATH-500, expected reward)
MATH_TABLE = [
    # correct, in the forms models write
    (r"So the answer is $\boxed{\frac{14}{3}}$.", r"\frac{14}{3}", 1.0),
    (r"\boxed{\dfrac{14}{3}}", r"\frac{14}{3}", 1.0),
    (r"\boxed{14/3}", r"\frac{14}{3}", 1.0),
    (r"\boxed{4\frac{2}{3}}", r"\frac{14}{3}", 1.0),  # math-verify reads a mixed number
    (r"\boxed{4.67}", r"\frac{14}{3}", 0.0),  # rounded is not equal
    (r"\boxed{(3, \frac{\pi}{2})}", POLAR, 1.0),
    (r"\boxed{\left(3,\frac{\pi}{2}\right)}", POLAR, 1.0),
    (r"\boxed{(3, \pi/2)}", POLAR, 1.0),
    (r"\boxed{(3, \pi)}", POLAR, 0.0),
    (r"\boxed{(\frac{\pi}{2}, 3)}", POLAR, 0.0),  # order matters in a tuple
    (r"\boxed{p - q}", "p - q", 1.0),
    (r"\boxed{-q + p}", "p - q", 1.0),
    (r"\boxed{q - p}", "p - q", 0.0),
    (r"\boxed{\text{Evelyn}}", r"\text{Evelyn}", 1.0),
    (r"\boxed{\text{(C)}}", r"\text{(C)}", 1.0),
    (r"\boxed{C}", r"\text{(C)}", 1.0),
    (r"\boxed{D}", r"\text{(C)}", 0.0),
    (r"\boxed{6-5i}", "6 - 5i", 1.0),
    (r"\boxed{6+5i}", "6 - 5i", 0.0),
    (r"\boxed{11\sqrt{2}}", r"11\sqrt2", 1.0),
    (r"\boxed{\sqrt{242}}", r"11\sqrt2", 1.0),
    (r"\boxed{x^2 + 7x + 10}", "x^2+7x+10", 1.0),
    (r"\boxed{(x+2)(x+5)}", "x^2+7x+10", 1.0),
    (r"\boxed{[-2, 7]}", "[-2,7]", 1.0),
    (r"\boxed{(-2, 7)}", "[-2,7]", 0.0),  # open is not closed
    (r"\boxed{\frac{1}{2}}", "0.5", 1.0),
    (r"\boxed{0.5}", r"\frac12", 1.0),
    (r"\boxed{x = 3}", "3", 1.0),
    (r"\boxed{90^\circ}", "90", 1.0),
    (r"\boxed{90}", r"90^\circ", 1.0),
    (r"The angle is \boxed{\pi}.", r"\pi", 1.0),
    (r"\boxed{3.14159}", r"\pi", 0.0),
    # nested braces and nested boxes
    (r"\boxed{\frac{\sqrt{3}}{2}}", r"\frac{\sqrt{3}}{2}", 1.0),
    (r"\boxed{\boxed{5}}", "5", 1.0),
    (r"\boxed{x = \boxed{5}}", "5", 1.0),
    (r"\boxed{\{1, 2\}}", r"\{1,2\}", 1.0),
    (r"\boxed{{5}}", "5", 1.0),
    # the last box decides; empty or unclosed never falls back
    (r"\boxed{4} Wait, recheck: \boxed{5}", "5", 1.0),
    (r"\boxed{5} Wait, recheck: \boxed{4}", "5", 0.0),
    (r"\boxed{5} and finally \boxed{}", "5", 0.0),
    (r"\boxed{5} and finally \boxed{ }", "5", 0.0),
    (r"\boxed{5} and finally \boxed{\frac{1", "5", 0.0),  # truncated mid-box
    (r"\boxed{5} and finally \boxed{", "5", 0.0),
    (r"\boxed{\boxed{5}", "5", 0.0),  # the outer box never closes
    # no box
    ("The answer is 5.", "5", 0.0),
    ("#### 5", "5", 0.0),
    ("<answer>5</answer>", "5", 0.0),
    ("", "5", 0.0),
    (r"\boxed 5", "5", 0.0),  # brace-less box is not a marker
    # thousands separators, currency, periods, units, percent
    (r"\boxed{1,000}", "1000", 1.0),
    (r"\boxed{10\,080}", "10080", 1.0),
    (r"\boxed{10{,}080}", "10080", 1.0),
    (r"\boxed{1\,000\,000}", "1000000", 1.0),
    (r"\boxed{\$32,348}", r"\$32,\!348", 1.0),
    (r"\boxed{$5$}", "5", 1.0),
    (r"\boxed{5.}", "5", 1.0),
    (r"\boxed{5\text{ cm}}", "5", 1.0),
    (r"\boxed{5 \text{ inches}^2}", "5", 1.0),
    (r"\boxed{10\%}", r"10\%", 1.0),
    (r"\boxed{10}", r"10\%", 1.0),  # 10% means 10
    (r"\boxed{0.1}", r"10\%", 0.0),  # ... not 0.1
    (r"\boxed{50%}", "50", 1.0),
    (r"\boxed{50\%}", "0.5", 0.0),
    # Unicode digits and minus
    (r"\boxed{５}", "5", 1.0),
    (r"\boxed{٥}", "5", 1.0),
    (r"\boxed{१२}", "12", 1.0),  # Devanagari
    ("\\boxed{\u22125}", "-5", 1.0),
    ("\\boxed{\u22125}", "5", 0.0),
    # words score 0
    (r"\boxed{five}", "5", 0.0),
    (r"\boxed{\text{five}}", "5", 0.0),
    (r"\boxed{twelve}", "12", 0.0),
    # adversarial
    (r"\boxed{__import__('os').system('echo hi')}", "5", 0.0),
    (r"\boxed{\input{/etc/passwd}}", "5", 0.0),
    (r"\boxed{" + "9" * 400 + "}", "5", 0.0),
    (r"\boxed{" + "9" * 400 + "}", "9" * 400, 1.0),
    (r"\boxed{\infty}", "5", 0.0),
    (r"\boxed{\frac{5}{0}}", "5", 0.0),
]

# (completion, GSM8K gold answer, expected reward)
GSM8K_TABLE = [
    ("Natalia sold 48/2 = 24 clips in May.\n48 + 24 = 72\n#### 72", "72", 1.0),
    ("#### 72", "72", 1.0),
    ("####72", "72", 1.0),
    ("#### 72.", "72", 1.0),
    ("#### 72.0", "72", 1.0),
    ("#### $72", "72", 1.0),
    ("#### \\$72.00", "72", 1.0),
    ("#### 73", "72", 0.0),
    ("#### -72", "72", 0.0),
    ("#### 1,000", "1000", 1.0),
    ("#### 1000", "1,000", 1.0),
    ("#### 1,000,000", "1000000", 1.0),
    ("#### 10\\,080", "10080", 1.0),
    ("#### 50%", "50", 1.0),
    ("#### 0.5", "50", 0.0),
    ("#### ７２", "72", 1.0),
    ("#### ٧٢", "72", 1.0),
    ("#### \u22123", "-3", 1.0),
    ("#### seventy-two", "72", 0.0),
    ("#### 72\nThat is my answer.", "72", 1.0),
    # the last marker decides, whichever kind it is
    ("#### 71\nWait, I made a mistake.\n#### 72", "72", 1.0),
    ("#### 72\nWait, I made a mistake.\n#### 71", "72", 0.0),
    ("#### 72\nActually\n####", "72", 0.0),  # empty last marker
    ("#### 72\nActually\n####   \n", "72", 0.0),
    ("#### 72 ... on reflection \\boxed{71}", "72", 0.0),
    ("\\boxed{71} ... on reflection\n#### 72", "72", 1.0),
    ("So the total is \\boxed{72}.", "72", 1.0),
    ("\\boxed{72} \\boxed{}", "72", 0.0),
    ("\\boxed{72} then \\boxed{7", "72", 0.0),  # unclosed last box
    ("\\boxed{\\boxed{72}}", "72", 1.0),
    ("\\boxed{72 \\text{ dollars}}", "72", 1.0),
    ("\\boxed{\\$1,250}", "1250", 1.0),
    # no marker: the last number
    ("She sold 48 + 24 = 72 clips.", "72", 1.0),
    ("She sold 48 + 24 = 72 clips. 72", "72", 1.0),
    ("The answer is 72, since 24 is half of 48.", "72", 0.0),  # last number is 48
    ("The total is 1,000.", "1000", 1.0),
    ("It costs $5.50.", "5.5", 1.0),
    ("It costs $5.50.", "5", 0.0),
    ("The change is -5 degrees", "-5", 1.0),
    ("The change is \u22125 degrees", "-5", 1.0),
    ("7-3", "3", 1.0),  # a hyphen between numbers is not a sign
    ("Answer: ５", "5", 1.0),
    ("Answer: ٥٠", "50", 1.0),
    ("The answer is 10\\,080", "10080", 1.0),
    ("The answer is seventy-two.", "72", 0.0),
    ("", "72", 0.0),
    ("I do not know.", "72", 0.0),
    # truncated
    ("48 / 2 = 24, then 48 + 24 =", "72", 0.0),  # last number is 24
    ("48 / 2 = 24, then 48 + 24 = 7", "72", 0.0),
    ("#### ", "72", 0.0),
    # adversarial
    ("#### __import__('os').system('ls')", "72", 0.0),
    ("#### 72; __import__('os').system('ls')", "72", 1.0),  # text: math-verify drops the junk, nothing runs
    ("#### __import__('os').system('ls'); 72", "72", 1.0),
    ("#### __import__('os').system('ls'); 71", "72", 0.0),
    ("#### " + "9" * 500, "72", 0.0),
    ("#### 9**9**9**9", "72", 0.0),
    ("#### 72 or 73", "72", 0.0),  # a set {72, 73} is not 72
    ("#### 72; 73", "72", 0.0),
    ("\\boxed{73 \\\\ 72}", "72", 1.0),  # a LaTeX line break: math-verify reads the last line
    ("\\boxed{72 \\\\ 73}", "72", 0.0),
    ("#### 72 \\\\ 73", "72", 0.0),
    ("<answer>72</answer> and the last number is 3", "72", 0.0),
    ("#### 3 + 69", "72", 1.0),  # an expression equal to the gold
    ("#### 144/2", "72", 1.0),
]


def test_tables_are_big_enough():
    assert len(MATH_TABLE) >= 60 and len(GSM8K_TABLE) >= 60


def _example(gold):
    return {"task": "math", "question": "q", "answer": gold}


@pytest.mark.parametrize("completion, gold, expected", MATH_TABLE)
def test_math_reward(completion, gold, expected):
    assert rewards.math_reward("prompt", completion, _example(gold)) == expected


@pytest.mark.parametrize("completion, gold, expected", GSM8K_TABLE)
def test_gsm8k_reward(completion, gold, expected):
    assert rewards.gsm8k_reward("prompt", completion, _example(gold)) == expected


def test_unparseable_gold_raises_naming_the_field():
    with pytest.raises(ValueError, match=r"example\['answer'\]"):
        rewards.math_reward("p", r"\boxed{5}", _example(""))


@pytest.mark.parametrize(
    "answer, normalised",
    [
        ("１２３", "123"),
        ("١٢٣", "123"),
        ("\u22125", "-5"),
        ("1,234,567", "1234567"),
        ("10\\,080", "10080"),
        ("10{,}080", "10080"),
        ("10\u202f080", "10080"),
        ("\\$5", "5"),
        ("$5$", "5"),
        ("50\\%", "50"),
        ("5.", "5"),
        ("3.5", "3.5"),
        ("1,2", "1,2"),  # not a thousands separator: stays a list
        ("(1, 234)", "(1, 234)"),
    ],
)
def test_normalise_answer(answer, normalised):
    assert rewards.normalise_answer(answer) == normalised


HANGING_ANSWERS = [r"\boxed{9^{9^{9^{9}}}}", r"\boxed{10^{10^{10}}}", "#### 10^{10^{10}}", r"\boxed{(10^{10^{10}})!}"]


@pytest.fixture(scope="module")
def pool():
    """A short budget, so hanging answers cost little test time."""
    with rewards.GraderPool(2, timeout_s=1.0) as grader_pool:
        yield grader_pool


@pytest.fixture(scope="module")
def patient_pool():
    """A budget no honest answer reaches, even on a loaded CI machine."""
    with rewards.GraderPool(2, timeout_s=60.0) as grader_pool:
        yield grader_pool


@pytest.mark.slow
def test_answers_that_hang_sympy_time_out_in_the_pool(pool):
    """Towers of powers make sympy compute huge integers for minutes; the pool stops them."""
    specs = rewards.as_specs([("gsm8k", 1.0)])
    n = len(HANGING_ANSWERS) + 1
    completions = HANGING_ANSWERS + ["#### 5"]
    values, metrics = rewards.score_batch(specs, ["p"] * n, completions, [_example("5")] * n, pool=pool)
    assert values.tolist() == [0.0] * len(HANGING_ANSWERS) + [1.0]
    assert metrics["reward_timeouts"] == len(HANGING_ANSWERS)
    assert metrics["reward_errors"] == 0.0


@pytest.mark.slow
def test_pool_gives_the_table_values(patient_pool):
    """The same graders in worker processes give the same rewards as in this process."""
    for name, table in [("math", MATH_TABLE), ("gsm8k", GSM8K_TABLE)]:
        completions, golds, expected = zip(*table)
        n = len(table)
        values, metrics = rewards.score_batch(
            rewards.as_specs([(name, 1.0)]), ["p"] * n, list(completions), [_example(g) for g in golds], pool=patient_pool
        )
        assert values.tolist() == list(expected)
        assert metrics["reward_errors"] == metrics["reward_timeouts"] == 0.0
