"""code_tests: the program's extraction and format checks, the two test forms, the score."""

import json

import pytest

from grpo_jax import rewards
from grpo_jax.rewards import _code

ADD = json.dumps({"kind": "stdio", "cases": [{"input": "1 2\n", "output": "3\n"},
                                            {"input": "10 -4\n", "output": "6"},
                                            {"input": "0 0\n", "output": "0\n\n"}]})
ADD_PROGRAM = "a, b = map(int, input().split())\nprint(a + b)"
# MBPP's shape: a setup line and one assert per case.
SQUARES = json.dumps({"kind": "assert", "setup": "import math",
                      "cases": ["assert squares(3) == [0, 1, 4]",
                                "assert squares(0) == []",
                                "assert math.isclose(sum(squares(4)), 14)"]})


def fenced(program, language="python"):
    return f"Let me write it.\n```{language}\n{program}\n```\nDone."


class TestExtractProgram:

    def test_the_last_python_block_counts(self):
        completion = "```python\nx = 1\n```\ntext\n```bash\nls\n```\n```python\nprint(2)\n```"
        assert _code.extract_program(completion) == "print(2)\n"

    @pytest.mark.parametrize("language", ["python", "py", "Python3", "PY"])
    def test_language_tags(self, language):
        assert _code.extract_program(fenced("pass", language)) == "pass\n"

    @pytest.mark.parametrize("completion", ["print(1)", "```python\nprint(1)",
                                            "```\nprint(1)\n```", "```js\nf()\n```"])
    def test_no_closed_python_block(self, completion):
        assert _code.extract_program(completion) is None


class TestFormatChecks:

    @pytest.mark.parametrize("program, ok", [
        ("print(1)\n", True), (None, False), ("  \n", False), ("def f(:\n", False),
        ("x = '\0'", False), ("x = 1\n" * 5000, False)])
    def test_format(self, program, ok):
        assert _code.program_format_ok(program) is ok

    def test_format_failures_score_zero_without_running(self, monkeypatch):
        def fail(*args, **kwargs):
            raise AssertionError("ran a program that failed the format checks")

        monkeypatch.setattr(_code, "run_tests", fail)
        for completion in ["print(3)", fenced("def f(:"), fenced("")]:
            assert rewards.code_tests_reward("p", completion, {"tests": ADD}) == 0.0


class TestOutputs:

    @pytest.mark.parametrize("actual, expected, same", [
        (b"3\n", "3", True), (b"3  \n\n\n", "3\n", True), (b"1\n2\n", "1\n2", True),
        (b"1 2\n", "1  2", False), (b"12\n", "1\n2", False), (b"", "0", False),
        (b"\n3\n", "3", False)])
    def test_outputs_match(self, actual, expected, same):
        assert _code.outputs_match(actual, expected) is same

    def test_verdicts_need_the_token_and_a_known_case(self):
        out = b"tok 0 pass\ntok 2 pass\n0 pass\ntok 1  pass\nTOK 1 pass\ntok 9 pass\ntok done\n"
        assert _code.harness_verdicts(out, "tok", 3) == [True, False, True]


class TestCodeTests:

    @pytest.mark.parametrize("options, expected", [({}, 1.0), ({"all_or_nothing": False}, 1.0)])
    def test_correct_stdio_program(self, options, expected):
        reward = rewards.code_tests_reward("p", fenced(ADD_PROGRAM), {"tests": ADD}, **options)
        assert reward == expected

    def test_share_or_all_of_the_cases(self):
        wrong_on_negatives = "a, b = map(int, input().split())\nprint(abs(a) + abs(b))"
        example = {"tests": ADD}
        completion = fenced(wrong_on_negatives)
        assert rewards.code_tests_reward("p", completion, example, all_or_nothing=False) == 2 / 3
        assert rewards.code_tests_reward("p", completion, example) == 0.0

    def test_assert_tests(self):
        right = "def squares(n):\n    return [i * i for i in range(n)]"
        off_by_one = "def squares(n):\n    return [i * i for i in range(n + 1)][:max(n, 1)]"
        assert rewards.code_tests_reward("p", fenced(right), {"tests": SQUARES}) == 1.0
        assert rewards.code_tests_reward("p", fenced(off_by_one), {"tests": SQUARES},
                                         all_or_nothing=False) == 2 / 3

    def test_a_hung_case_fails_that_case_only(self):
        slow_on_zero = ("import time\ndef squares(n):\n    while n == 0:\n        time.sleep(1)\n"
                        "    return [i * i for i in range(n)]")
        passed = rewards.run_tests(slow_on_zero, json.loads(SQUARES), case_s=0.5, program_s=4.0)
        assert passed == [True, False, False]   # the harness stops at the hung case

    def test_program_budget_stops_stdio_cases(self):
        slow = "import time\ntime.sleep(0.6)\nprint(sum(map(int, input().split())))"
        passed = rewards.run_tests(slow, json.loads(ADD), case_s=1.5, program_s=1.0)
        # the first case runs; cases after the budget is spent fail without running
        assert passed[0] and not passed[2] and passed == sorted(passed, reverse=True)

    def test_unknown_tests_kind_names_the_forms(self):
        with pytest.raises(ValueError, match="tests kind must be 'stdio' or 'assert', got 'io'"):
            rewards.run_tests("print(1)", {"kind": "io", "cases": [{}]})

    def test_in_score_batch_through_the_pool(self):
        specs = rewards.as_specs([("code_tests", 1.0, {"all_or_nothing": False})])
        completions = [fenced(ADD_PROGRAM), fenced("print(3)"), "no code"]
        with rewards.GraderPool(1, timeout_s=10.0) as pool:
            values, metrics = rewards.score_batch(specs, ["p"] * 3, completions,
                                                  [{"tests": ADD}] * 3, pool=pool)
        assert values.tolist() == pytest.approx([1.0, 1 / 3, 0.0])
        assert metrics["reward_errors"] == metrics["reward_timeouts"] == 0.0


def test_sandbox_lines_say_the_backend_of_each_code_reward():
    specs = rewards.as_specs([("code_tests", 1.0, {"backend": "subprocess"}), ("format", 0.1)])
    assert rewards.sandbox_lines(specs) == [
        rewards.describe_sandbox(rewards.get_sandbox("subprocess"))]
    assert rewards.sandbox_lines(rewards.as_specs([("math", 1.0)])) == []
