"""The procedural code task: examples, their tests, the knobs, the splits."""

import itertools
import json

import numpy as np
import pytest

from grpo_jax import data
from grpo_jax import rewards
from grpo_jax.data import code_tasks


def test_example_by_hand():
    example = code_tasks.make_example("int", [(0, 3), (2, 2)], [4, -1])
    assert example["question"] == "Write f(x) for an integer x: add 3, then multiply by 2."
    assert example["answer"] == "def f(x):\n    x = x + 3\n    x = x * 2\n    return x\n"
    assert example["solution"] == f"```python\n{example['answer']}```"
    assert json.loads(example["tests"]) == {
        "kind": "assert", "setup": "", "cases": ["assert f(4) == 14", "assert f(-1) == 4"]}


@pytest.mark.parametrize("kind, steps, inputs, cases", [
    ("list", [(2, 5), (4, 0)], [[9, 1, 7, 6]], ["assert f([9, 1, 7, 6]) == [6, 7, 9]"]),
    ("str", [(3, 3), (1, 0)], ["abcab"], ["assert f('abcab') == 'AB'"]),
    ("int", [(3, 4), (4, 0)], [-7], ["assert f(-7) == 1"]),
])
def test_expected_values_by_hand(kind, steps, inputs, cases):
    example = code_tasks.make_example(kind, steps, inputs)
    assert json.loads(example["tests"])["cases"] == cases


def _function(program):
    namespace = {}
    exec(program, namespace)   # generated here, trusted
    return namespace["f"]


def test_references_pass_and_the_tests_tell_a_step_short_program_apart():
    """A program with its first step left out passes the tests only where it computes the
    same function (sort then sort), checked here on 200 fresh inputs."""
    config = code_tasks.CodeTasksConfig(kinds=("int", "list", "str"), min_steps=2, max_steps=3)
    rng = np.random.default_rng(1)
    short_passed = 0
    for example in itertools.islice(code_tasks.generate(config), 10):
        assert rewards.code_tests_reward("p", example["solution"], example) == 1.0
        lines = example["answer"].splitlines()
        short = "\n".join(lines[:1] + lines[2:]) + "\n"   # the first operation left out
        if all(rewards.run_tests(short, json.loads(example["tests"]))):
            short_passed += 1
            kind = next(k for k, (name, _) in code_tasks._NAMES.items()
                        if example["answer"].startswith(f"def f({name}):"))
            inputs = [code_tasks.random_input(rng, kind) for _ in range(200)]
            reference, candidate = _function(example["answer"]), _function(short)
            assert [reference(v) for v in inputs] == [candidate(v) for v in inputs], example
    assert 0 < short_passed < 10   # both kinds of example occur in these ten


def test_knobs_shape_the_problems():
    config = code_tasks.CodeTasksConfig(kinds=("str",), min_steps=3, max_steps=3, num_tests=5)
    for example in itertools.islice(code_tasks.generate(config), 20):
        assert example["question"].startswith("Write f(s) for a string s: ")
        assert example["question"].count(", then ") == 2
        assert len(json.loads(example["tests"])["cases"]) == 5


@pytest.mark.parametrize("knobs, message", [
    ({"kinds": ("float",)},
     r"code_tasks.kinds must be a non-empty subset of \('int', 'list', 'str'\)"),
    ({"min_steps": 3, "max_steps": 2}, "1 <= min_steps <= max_steps, got 3 and 2"),
    ({"num_tests": 1}, "code_tasks.num_tests must be >= 2, got 1"),
])
def test_bad_knobs_are_named(knobs, message):
    with pytest.raises(ValueError, match=message):
        code_tasks.CodeTasksConfig(**knobs)


def test_builds_disjoint_splits(tmp_path):
    config = data.CodeTasksConfig(num_train=60, num_test=12)
    read = lambda split: [data.decode_example(r) for r in data.data_source(
        "code_tasks", split=split, data_dir=str(tmp_path), config=config)]
    train, test = read("train"), read("test")
    assert (len(train), len(test)) == (60, 12)
    assert not {e["question"] for e in train} & {e["question"] for e in test}
    assert all(json.loads(e["tests"])["kind"] == "assert" for e in train + test)
