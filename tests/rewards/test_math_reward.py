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
    # a unit in text mode is dropped; bare letters in a box are math; a hedge is no answer
    (r"\boxed{\text{18 dollars}}", "18", 1.0),
    (r"\boxed{\text{18 dollars}}", "19", 0.0),
    (r"\boxed{18 \text{ dollars}}", "18", 1.0),
    (r"\boxed{18\ \mathrm{cm}}", "18", 1.0),
    (r"\boxed{\mbox{5 apples}}", "5", 1.0),
    (r"\boxed{\text{1/2 cup}}", "0.5", 1.0),
    (r"\boxed{\text{\$1,200 per month}}", "1200", 1.0),
    (r"\boxed{3 x}", "3", 0.0),  # 3x
    (r"\boxed{18 dollars}", "18", 0.0),  # 18 d o l l a r s, a product of variables
    (r"\boxed{18 \text{ or more}}", "18", 0.0),  # math-verify alone gives 1.0
    (r"\boxed{\text{18 or 19}}", "18", 0.0),
    (r"\boxed{18 \text{ dollars or 19}}", "18", 0.0),  # math-verify alone gives 1.0
    (r"\boxed{\text{about } 18}", "18", 0.0),
    (r"\boxed{\text{neither}}", r"\text{neither}", 1.0),  # a hedge word with no number is an answer
    (r"\boxed{1 \over 2}", "0.5", 1.0),  # \over is LaTeX, not a word
    # integers of any length, past Python's 4300-digit int-string limit
    (r"\boxed{" + "1" * 5000 + "}", "1" * 5000, 1.0),
    (r"\boxed{" + "1" * 5000 + "}", "1" * 4999 + "2", 0.0),
    (r"\boxed{" + "9" * 9000 + "}", "9" * 9000, 1.0),
    (r"\boxed{" + "9" * 9000 + "}", "9" * 8999, 0.0),
    (r"\boxed{0" + "9" * 9000 + "}", "9" * 9000, 1.0),
    (r"\boxed{-" + "9" * 5000 + "}", "9" * 5000, 0.0),
    (r"\boxed{3 + 69}", "9" * 5000, 0.0),  # a non-integer answer to a huge gold: no raise
    (r"\boxed{10^{5000}}", "1" + "0" * 5000, 0.0),  # golds over 4,000 digits match integers only
    (r"\boxed{2^{1000}}", str(2**1000), 1.0),
    (r"\boxed{2^{1000} + 1}", str(2**1000), 0.0),
    # nesting and length: past the caps scores 0 without parsing
    (r"\boxed{" + "{" * 3 + "5" + "}" * 3 + "}", "5", 1.0),
    (r"\boxed{" + "{" * 6 + "5" + "}" * 6 + "}", "5", 0.0),  # deeper than MAX_DEPTH = 5
    (r"\boxed{(" + "1+" * 20 + "1)}", "21", 1.0),
    (r"\boxed{(" + "1+" * 40 + "1)}", "41", 0.0),  # nesting 83 > MAX_NESTING = 64
    (r"\boxed{" + "{" * 1000 + "5" + "}" * 1001, "5", 0.0),
    (r"\boxed{" + "{" * 4990 + "5" + "}" * 4991, "5", 0.0),
    ("\\boxed{" * 1000 + "5" + "}" * 1000, "5", 1.0),  # nested boxes unwrap in one pass
    ("\\boxed{" * 1400, "5", 0.0),
    ("\\boxed{4}" * 1100 + "\\boxed{5}", "5", 1.0),
    (r"\boxed{" + r"\frac{\sqrt{2}}{3}+" * 520 + "1}", "5", 0.0),  # 9,900 characters of LaTeX
    ("7" * 10_000, "5", 0.0),
    # numbers sympy would build for minutes are refused; small ones are computed
    (r"\boxed{9^{9^{9^{9}}}}", "5", 0.0),
    (r"\boxed{10^{-10^{7}}}", "5", 0.0),
    (r"\boxed{(10^{10})!}", "5", 0.0),
    (r"\boxed{\binom{10^{8}}{5 \cdot 10^{7}}}", "5", 0.0),
    (r"\boxed{(a+b)(c+d)(e+f)(g+h)(i+j)(k+l)(m+n)(o+p)(q+r)(s+t)}", "5", 0.0),  # 1,024 monomials
    (r"\boxed{(x+y+1)^{30}}", "5", 0.0),
    (r"\boxed{2^{10}}", "1024", 1.0),
    (r"\boxed{10!}", "3628800", 1.0),
    (r"\boxed{\binom{10}{5}}", "252", 1.0),
    (r"\boxed{(x+1)^{2}}", "x^2+2x+1", 1.0),
    (r"\boxed{(a+b)(c+d)}", "ac+ad+bc+bd", 1.0),
    (r"\boxed{\begin{pmatrix} 1 & 2 \end{pmatrix}}", r"\begin{pmatrix} 1 & 2 \end{pmatrix}", 1.0),
    (
        r"\boxed{\begin{pmatrix} 9^{9^{9}} & 2 \end{pmatrix}}",
        r"\begin{pmatrix} 1 & 2 \end{pmatrix}", 0.0,
    ),
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
    # text: math-verify drops the junk, nothing runs
    ("#### 72; __import__('os').system('ls')", "72", 1.0),
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
    # arithmetic left to do is not an answer, even when it equals the gold (a policy copying
    # the question's sum after #### would be paid for it); an equation's right-hand side counts
    ("#### 3 + 69", "72", 0.0),
    ("#### 144/2", "72", 0.0),  # reducible: arithmetic
    ("#### 98+99\n#### 98+99", "197", 0.0),
    ("#### x = 98+99", "197", 0.0),
    ("#### 98 \\times 2", "196", 0.0),
    ("#### 2^{10}", "1024", 0.0),
    ("\\boxed{98+99}", "197", 0.0),
    ("#### 98 + 99 = 197", "197", 1.0),
    ("98 + 99 = 197\n\n#### 197", "197", 1.0),
    ("#### x = -3", "-3", 1.0),
    ("#### 2/4", "0.5", 0.0),
    ("#### \\frac{1}{2}", "0.5", 1.0),  # lowest terms: a number
    # unit words after the number are dropped
    ("#### 18 dollars", "18", 1.0),
    ("#### 18 dollars", "19", 0.0),
    ("#### 72 books.", "72", 1.0),
    ("She has 72 books.\n#### 72 books.", "72", 1.0),
    ("#### $1,200 per month", "1200", 1.0),
    ("#### 5 apples!", "5", 1.0),
    ("#### 1/2 cup", "0.5", 1.0),
    ("#### 1/2 cup", "0.25", 0.0),
    ("#### ７２ books", "72", 1.0),
    ("#### -5 degrees", "-5", 1.0),
    ("#### 3.5 hours", "3.5", 1.0),
    ("#### 18 km/h", "18", 1.0),
    ("#### 18 sq. ft.", "18", 1.0),
    ("#### 50% off", "50", 1.0),
    ("\\boxed{\\text{18 dollars}}", "18", 1.0),
    ("\\boxed{18 dollars}", "18", 0.0),  # bare letters in a box are math
    # ... but a hedge after the number is no answer
    ("#### 18 or 19", "18", 0.0),
    ("#### 18 or 19", "19", 0.0),
    ("#### 18 or more", "18", 0.0),  # math-verify alone gives 1.0
    ("#### 18 dollars or less", "18", 0.0),
    ("#### 18 dollars at most", "18", 0.0),
    ("#### 18 degrees below zero", "18", 0.0),
    ("#### about 18", "18", 0.0),
    ("#### 5!", "120", 0.0),  # no words: a factorial, arithmetic left to do
    ("#### 5!", "5", 0.0),
    # integers of any length, past Python's 4300-digit int-string limit
    ("#### " + "9" * 9000, "9" * 9000, 1.0),
    ("#### " + "9" * 9000, "9" * 8999 + "8", 0.0),
    ("#### 1" + "0" * 5000, "1" + "0" * 5000, 1.0),
    ("#### " + "1" * 5000, "1" * 4999, 0.0),
    ("7" * 10_000, "7" * 10_000, 1.0),  # the last number
    ("#### 72", "9" * 5000, 0.0),
    # long and adversarial completions
    ("####" * 2500, "72", 0.0),
    ("#### 72\n" * 1250, "72", 1.0),
    ("#### " + "{" * 1000 + "72" + "}" * 1000, "72", 0.0),
    ("(" * 4995 + ")" * 4995, "72", 0.0),
    ("\\boxed{9^{9^{9^{9}}}}", "72", 0.0),
    ("#### 10^{10^{10}}", "72", 0.0),
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


HANGING_ANSWERS = [
    r"\boxed{9^{9^{9^{9}}}}", r"\boxed{10^{10^{10}}}", "#### 10^{10^{10}}",
    r"\boxed{(10^{10^{10}})!}",
]


@pytest.fixture(scope="module")
def pool():
    """A short budget, so a hanging answer would cost little test time."""
    with rewards.GraderPool(2, timeout_s=1.0) as grader_pool:
        yield grader_pool


@pytest.fixture(scope="module")
def patient_pool():
    """A budget no honest answer reaches, even on a loaded CI machine."""
    with rewards.GraderPool(2, timeout_s=60.0) as grader_pool:
        yield grader_pool


@pytest.mark.slow
def test_answers_that_hung_sympy_are_refused_in_the_pool(pool):
    """Towers of powers made sympy compute huge integers for minutes, until the pool killed
    the worker; the size bounds now refuse them before sympy evaluates anything."""
    specs = rewards.as_specs([("gsm8k", 1.0)])
    n = len(HANGING_ANSWERS) + 1
    completions = HANGING_ANSWERS + ["#### 5"]
    replaced = pool.replaced_workers
    values, metrics = rewards.score_batch(
        specs, ["p"] * n, completions, [_example("5")] * n, pool=pool
    )
    assert values.tolist() == [0.0] * len(HANGING_ANSWERS) + [1.0]
    assert metrics["reward_timeouts"] == metrics["reward_errors"] == 0.0
    assert pool.replaced_workers == replaced


@pytest.mark.slow
def test_pool_gives_the_table_values(patient_pool):
    """The same graders in worker processes give the same rewards as in this process."""
    for name, table in [("math", MATH_TABLE), ("gsm8k", GSM8K_TABLE)]:
        completions, golds, expected = zip(*table)
        n = len(table)
        values, metrics = rewards.score_batch(
            rewards.as_specs([(name, 1.0)]), ["p"] * n, list(completions),
            [_example(g) for g in golds], pool=patient_pool,
        )
        assert values.tolist() == list(expected)
        assert metrics["reward_errors"] == metrics["reward_timeouts"] == 0.0
