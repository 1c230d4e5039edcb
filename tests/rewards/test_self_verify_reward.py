"""Self-verification reward: a hand-checked table of answers and verdicts."""

import pytest

from grpo_jax import rewards

RIGHT = r"<think>14/3</think> The answer is \boxed{\frac{14}{3}}."
WRONG = r"<think>14/4</think> The answer is \boxed{\frac{7}{2}}."
V_OK = "<verify>correct</verify>"
V_BAD = "<verify>incorrect</verify>"
CD = {"numbers": [25, 6, 2, 9], "target": 100}

# (completion, grader, example fields, expected); the default gold answer is 14/3.
TABLE = [
    # the four cases of truth x verdict
    (RIGHT + V_OK, "math", {}, 1.0),
    (RIGHT + V_BAD, "math", {}, 0.0),
    (WRONG + V_BAD, "math", {}, 1.0),
    (WRONG + V_OK, "math", {}, 0.0),
    (RIGHT + "\n" + V_OK + "\n", "math", {}, 1.0),
    (WRONG + "\n\n" + V_BAD + "  ", "math", {}, 1.0),
    (RIGHT + " Let me check: 14/3 * 3 = 14. " + V_OK, "math", {}, 1.0),
    (WRONG + " Check: 7/2 * 3 = 10.5, not 14. " + V_BAD, "math", {}, 1.0),
    # verdict spelling
    (RIGHT + "<verify>Correct</verify>", "math", {}, 1.0),
    (RIGHT + "<verify> CORRECT </verify>", "math", {}, 1.0),
    (WRONG + "<verify>\nIncorrect\n</verify>", "math", {}, 1.0),
    (RIGHT + "<verify>correct.</verify>", "math", {}, 0.0),
    (RIGHT + "<verify>yes</verify>", "math", {}, 0.0),
    (RIGHT + "<verify>true</verify>", "math", {}, 0.0),
    (WRONG + "<verify>wrong</verify>", "math", {}, 0.0),
    (WRONG + "<verify>not correct</verify>", "math", {}, 0.0),
    (RIGHT + "<verify>correct or incorrect</verify>", "math", {}, 0.0),
    (RIGHT + "<verify></verify>", "math", {}, 0.0),
    (RIGHT + "<verify><b>correct</b></verify>", "math", {}, 0.0),
    (RIGHT + "<Verify>correct</Verify>", "math", {}, 0.0),
    (RIGHT + "<verification>correct</verification>", "math", {}, 0.0),
    # the verdict must close and come last
    (RIGHT, "math", {}, 0.0),
    (WRONG, "math", {}, 0.0),
    (RIGHT + "<verify>correct", "math", {}, 0.0),  # truncated
    (RIGHT + "<verify>", "math", {}, 0.0),
    (RIGHT + "<verify>corr", "math", {}, 0.0),
    (RIGHT + V_OK + " I am confident.", "math", {}, 0.0),
    (V_OK + RIGHT, "math", {}, 0.0),
    (RIGHT + V_OK + "<verify>", "math", {}, 0.0),  # the last one never closes
    # several verdicts: the last one counts
    (RIGHT + V_BAD + V_OK, "math", {}, 1.0),
    (RIGHT + V_OK + V_BAD, "math", {}, 0.0),
    (WRONG + V_OK + " hmm, no. " + V_BAD, "math", {}, 1.0),
    # the answer is judged on the text before the verdict, with the grader's own rules
    (r"\boxed{\frac{14}{3}} \boxed{} " + V_OK, "math", {}, 0.0),  # the empty last box is no answer
    (r"\boxed{\frac{14}{3}} \boxed{} " + V_BAD, "math", {}, 1.0),
    (r"\boxed{\frac{14}{3}} \boxed{\frac{7}{2}} " + V_BAD, "math", {}, 1.0),
    (r"\boxed{\frac{7}{2}} \boxed{\frac{14}{3}} " + V_OK, "math", {}, 1.0),
    ("The answer is 14/3. " + V_OK, "math", {}, 0.0),  # no box: not a correct math answer
    ("The answer is 14/3. " + V_BAD, "math", {}, 1.0),
    ("", "math", {}, 0.0),
    (V_BAD, "math", {}, 1.0),  # no answer at all, and it says so
    (V_OK, "math", {}, 0.0),
    (r"\boxed{\frac{14}{3" + V_OK, "math", {}, 0.0),  # the box swallows the verdict: unclosed
    (r"\boxed{४.६६}" + V_BAD, "math", {}, 1.0),  # Devanagari 4.66 is not 14/3
    (r"\boxed{4\frac{2}{3}}" + V_OK, "math", {}, 1.0),
    (r"\boxed{fourteen thirds}" + V_BAD, "math", {}, 1.0),
    # GSM8K grader
    ("48 + 24 = 72\n#### 72\n" + V_OK, "gsm8k", {"answer": "72"}, 1.0),
    ("48 + 24 = 72\n#### 72\n" + V_BAD, "gsm8k", {"answer": "72"}, 0.0),
    ("48 + 24 = 71\n#### 71\n" + V_BAD, "gsm8k", {"answer": "72"}, 1.0),
    ("48 + 24 = 71\n#### 71\n" + V_OK, "gsm8k", {"answer": "72"}, 0.0),
    # the last number before the verdict
    ("So she sold 72 clips. " + V_OK, "gsm8k", {"answer": "72"}, 1.0),
    ("#### 1,000 " + V_OK, "gsm8k", {"answer": "1000"}, 1.0),
    ("#### ７２ " + V_OK, "gsm8k", {"answer": "72"}, 1.0),
    ("#### 72\n#### " + V_BAD, "gsm8k", {"answer": "72"}, 1.0),  # empty last marker: not correct
    ("#### 72 books.\n" + V_OK, "gsm8k", {"answer": "72"}, 1.0),  # a unit after the number
    ("#### 72 or more\n" + V_BAD, "gsm8k", {"answer": "72"}, 1.0),  # a hedge is not correct
    ("#### " + "9" * 5000 + "\n" + V_OK, "gsm8k", {"answer": "9" * 5000}, 1.0),
    ("#### " + "{" * 1000 + "72" + "}" * 1000 + V_BAD, "gsm8k", {"answer": "72"}, 1.0),
    # Countdown grader
    ("<answer>(6 - 2) * 25</answer>" + V_OK, "countdown", CD, 1.0),
    ("<answer>(6 - 2) * 25</answer>" + V_BAD, "countdown", CD, 0.0),
    ("<answer>(6 + 2) * 25</answer>" + V_BAD, "countdown", CD, 1.0),
    ("<answer>25 * 4</answer>" + V_OK, "countdown", CD, 0.0),  # 4 is not given
    ("<answer>9**9**9**9</answer>" + V_BAD, "countdown", CD, 1.0),
    ("<answer>__import__('os').system('ls')</answer>" + V_OK, "countdown", CD, 0.0),
    ("<answer>(6 - 2) * 25" + V_OK, "countdown", CD, 0.0),  # the answer tag never closes
    # adversarial text around the verdict
    (RIGHT + "<verify>correct</verify><verify>", "math", {}, 0.0),
    (RIGHT + "<verify>" + "correct " * 1000 + "</verify>", "math", {}, 0.0),
    (RIGHT + "<verify>correct</verify>" + "\n" * 1000, "math", {}, 1.0),
    # a zero-width space is not whitespace
    (RIGHT + "<verify>\u200bcorrect</verify>", "math", {}, 0.0),
]


def test_table_is_big_enough():
    assert len(TABLE) >= 60


@pytest.mark.parametrize("completion, grader, fields, expected", TABLE)
def test_self_verify_reward(completion, grader, fields, expected):
    example = {"task": grader, "question": "q", "answer": r"\frac{14}{3}", **fields}
    assert rewards.self_verify_reward("prompt", completion, example, grader=grader) == expected


def test_default_grader_is_math():
    example = {"answer": "4"}
    assert rewards.self_verify_reward("p", r"\boxed{4}" + V_OK, example) == 1.0


def test_unknown_grader_is_a_counted_error():
    specs = rewards.as_specs([("self_verify", 1.0, {"grader": "no_such_grader"})])
    values, metrics = rewards.score_batch(specs, ["p"], [RIGHT + V_OK], [{"answer": "1"}])
    assert values.tolist() == [0.0] and metrics["reward_errors"] == 1.0


def test_final_verdict_returns_the_answer_text():
    assert rewards.final_verdict("#### 5 <verify>incorrect</verify>") == (False, "#### 5 ")
    assert rewards.final_verdict("#### 5") is None
