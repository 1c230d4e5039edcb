"""The rewards agree with grpo_jax.data: its answer formats and the official solutions score 1.0."""

import json
import pathlib

import pytest

from grpo_jax import rewards

FIXTURES = pathlib.Path(__file__).parents[1] / "data" / "fixtures"


def _rows(name):
    with open(FIXTURES / name / "test.jsonl", encoding="utf-8") as f:
        return [json.loads(line) for line in f]


@pytest.mark.parametrize("row", _rows("math500"), ids=lambda row: row["answer"])
def test_math500_solution_scores_one(row):
    example = {"task": "math500", "question": row["problem"], "answer": row["answer"]}
    assert rewards.math_reward("p", row["solution"], example) == 1.0
    assert rewards.math_reward("p", row["solution"], dict(example, answer="999")) == 0.0


@pytest.mark.parametrize("row", _rows("gsm8k"), ids=lambda row: row["answer"][-8:])
def test_gsm8k_solution_scores_one(row):
    gold = row["answer"].rsplit("####", 1)[1].strip()
    example = {"task": "gsm8k", "question": row["question"], "answer": gold}
    assert rewards.gsm8k_reward("p", row["answer"], example) == 1.0
    assert rewards.gsm8k_reward("p", row["answer"], dict(example, answer=str(int(gold) + 1))) == 0.0


# (task, the reward that grades it, a canonical answer, extra example fields)
TASK_REWARDS = [
    ("arithmetic", "integer_answer", "734", {}),
    ("chain_sum", "integer_answer", "-12", {}),
    ("basic_arithmetic", "gsm8k", "-3.5", {}),
    ("gsm_symbolic", "gsm8k", "1000", {}),
    ("gsm8k", "gsm8k", "72", {}),
    ("math500", "math", r"\left( 4, \frac{3 \pi}{2} \right)", {}),
    ("countdown", "countdown", "(6 - 2) * 25", {"numbers": [25, 6, 2, 9], "target": 100}),
    ("countdown_compact", "countdown", "3*(7+9)", {"numbers": [3, 7, 9], "target": 48}),
    ("rpt", "rpt", "brown fox", {"continuation": "brown fox"}),
    ("math", "math", r"9\pi", {}),
    ("dapo_math_17k", "math", "34", {}),
    ("deepscaler", "math", r"\frac{1}{2}", {}),
    ("aime24", "math", "33", {}),
    ("aime25", "math", "70", {}),
    ("amc23", "math", "1.5", {}),
    ("minerva_math", "math", r"1.3 \times 10^{-3}", {}),
    ("olympiadbench", "math", r"\frac{1}{2}, -\frac{1}{2}", {}),
    ("humaneval", "code_tests", "def f():\n    return 1\n",
     {"tests": '{"kind": "assert", "setup": "", "cases": ["assert f() == 1"]}'}),
    ("code_tasks", "code_tests", "def f(x):\n    return x\n",
     {"tests": '{"kind": "assert", "setup": "", "cases": ["assert f(2) == 2"]}'}),
    ("mbpp", "code_tests", "def f(x):\n    return x\n",
     {"tests": '{"kind": "assert", "setup": "", "cases": ["assert f(2) == 2"]}'}),
    ("mbpp_sanitized", "code_tests", "def f(x):\n    return x\n",
     {"tests": '{"kind": "assert", "setup": "", "cases": ["assert f(2) == 2"]}'}),
    ("apps", "code_tests", "print(int(input()) + 1)\n",
     {"tests": '{"kind": "stdio", "cases": [{"input": "2\\n", "output": "3\\n"}]}'}),
]


@pytest.mark.slow
@pytest.mark.parametrize("task, name, answer, fields", TASK_REWARDS)
def test_rendered_answer_format_scores_one(task, name, answer, fields):
    from grpo_jax.data import prompts

    example = {"task": task, "question": "q", "answer": answer, **fields}
    completion = "Let me think.\n" + prompts.render_answer(task, answer)
    assert rewards.get_reward(name).fn("p", completion, example) == 1.0


@pytest.mark.slow
def test_every_data_task_has_a_grading_reward():
    from grpo_jax.data import prompts

    assert sorted(prompts.TASK_FORMATS) == sorted(task for task, *_ in TASK_REWARDS)
