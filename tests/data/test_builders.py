"""Builders: a second build gives identical records; reasoning-gym tasks offline."""

import pathlib
import re

import pytest

from grpo_jax import data
from grpo_jax.data import prompts
from grpo_jax.data import reasoning_gym_tasks


def build(name, config, data_dir):
    """All records of both splits, decoded."""
    return {split: [data.decode_example(r) for r in data.data_source(
        name, split=split, data_dir=str(data_dir), config=config)]
            for split in ("train", "test")}


def array_record_bytes(data_dir):
    return {p.relative_to(data_dir).as_posix().split("/")[-1]: p.read_bytes()
            for p in sorted(pathlib.Path(data_dir).rglob("*.array_record*"))}


@pytest.mark.parametrize("name, config", [
    ("arithmetic", data.ArithmeticConfig(digits=3, ops=("+", "-", "*"), num_train=120,
                                         num_test=30, teacher_fraction=0.5)),
    ("reasoning_gym", data.ReasoningGymConfig(
        task="countdown", num_train=16, num_test=4,
        task_kwargs={"min_numbers": 3, "max_numbers": 3})),
])
def test_second_build_is_identical(tmp_path, name, config):
    first = build(name, config, tmp_path / "a")
    second = build(name, config, tmp_path / "b")
    assert first == second
    assert (len(first["train"]), len(first["test"])) == (config.num_train, config.num_test)
    files_a, files_b = array_record_bytes(tmp_path / "a"), array_record_bytes(tmp_path / "b")
    assert len(files_a) == 2
    assert files_a == files_b


def signed_sum(expression):
    """Value of a chain of additions and subtractions such as ' 71 - 43 ='."""
    return sum(int(term.replace(" ", "")) for term in re.findall(r"[-+]?\s*\d+", expression))


TASK_CHECKS = {
    # task: (difficulty knobs, check of one example)
    "basic_arithmetic": ({"min_terms": 2, "max_terms": 3, "max_digits": 2},
                         lambda e: re.fullmatch(r"-?\d+", e["answer"])),
    "chain_sum": ({"min_terms": 2, "max_terms": 2, "max_digits": 2},
                  lambda e: int(e["answer"]) == signed_sum(e["question"].rsplit(":", 1)[1])),
    "countdown": ({"min_numbers": 3, "max_numbers": 4},
                  lambda e: sorted(map(int, re.findall(r"\d+", e["answer"])))
                  == sorted(e["numbers"]) and 100 <= e["target"] <= 999),
    "gsm_symbolic": ({}, lambda e: e["solution"].endswith(f"#### {e['answer']}")),
}


@pytest.mark.parametrize("task", sorted(TASK_CHECKS))
def test_reasoning_gym_task(data_dir, task):
    kwargs, check = TASK_CHECKS[task]
    config = data.ReasoningGymConfig(task=task, num_train=24, num_test=8, seed=1,
                                     task_kwargs=kwargs)
    splits = build("reasoning_gym", config, data_dir)
    keys = {split: {reasoning_gym_tasks.example_key(e) for e in examples}
            for split, examples in splits.items()}
    assert (len(keys["train"]), len(keys["test"])) == (24, 8)  # distinct problems
    assert not keys["train"] & keys["test"]
    for example in splits["train"] + splits["test"]:
        assert example["task"] == task
        assert example["question"] and example["answer"]
        assert example["solution"].endswith(prompts.render_answer(task, example["answer"]))
        assert check(example), example


def test_countdown_fields_and_question(data_dir):
    config = data.ReasoningGymConfig(task="countdown", num_train=3, num_test=1,
                                     task_kwargs={"min_numbers": 3, "max_numbers": 3})
    example = build("reasoning_gym", config, data_dir)["train"][0]
    assert set(example) == {"task", "question", "answer", "solution", "numbers", "target"}
    assert isinstance(example["target"], int) and len(example["numbers"]) == 3
    assert example["question"] == reasoning_gym_tasks.countdown_question(
        example["numbers"], example["target"])
    assert example["solution"] == f"<answer>{example['answer']}</answer>"


def test_split_of_is_stable_and_near_the_fraction():
    assert data.split_of("478+256", 0.2) == data.split_of("478+256", 0.2)
    share = sum(data.split_of(str(i), 0.2) == "test" for i in range(5000)) / 5000
    assert 0.18 < share < 0.22


@pytest.mark.parametrize("kwargs, message", [
    ({"task": "sudoku"}, "reasoning_gym.task must be one of"),
    ({"task_kwargs": {"seed": 3}}, "reasoning_gym.task_kwargs may not set ['seed']"),
])
def test_reasoning_gym_config_errors(kwargs, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        data.ReasoningGymConfig(**kwargs)


def test_unknown_dataset_name():
    with pytest.raises(ValueError, match="data name must be one of"):
        data.data_source("gsm9k", split="train", data_dir="/nonexistent")


def test_unprepared_source_without_prepare_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="is not prepared; call data_source"):
        data.data_source("arithmetic", split="train", data_dir=str(tmp_path),
                         config=data.ArithmeticConfig(num_train=5), prepare=False)
    assert not list(tmp_path.rglob("*.array_record*"))
