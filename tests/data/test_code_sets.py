"""MBPP and APPS: the builders read the official schemas, split and bound them, and the
code_tests reward passes the reference programs and fails broken ones."""

import json

import pytest

from grpo_jax import data
from grpo_jax import rewards
from grpo_jax.data import apps
from tests.data import code_samples as samples
from tests.data.conftest import read_built as read


@pytest.fixture(scope="module")
def root(tmp_path_factory, fixtures_dir):
    return samples.write_all(tmp_path_factory.mktemp("code_sets"),
                             fixtures_dir / "humaneval" / "HumanEval.jsonl.gz")



def score(example, program):
    return rewards.code_tests_reward("p", f"```python\n{program}```", example)


class TestMbpp:

    def test_splits_by_task_id(self, root, out):
        ids = {split: [e["task_id"] for e in read("mbpp", split, out, root / "mbpp")]
               for split in ("prompt", "test", "validation", "train")}
        assert ids == {"prompt": ["2"], "test": ["11"], "validation": ["600"],
                       "train": ["602", "700"]}

    def test_example_schema(self, root, out):
        (example,) = read("mbpp", "test", out, root / "mbpp")
        assert example["task"] == "mbpp"
        assert example["question"] == (
            "Write a python function to remove first and last occurrence of a given character "
            "from the string. Your code should pass these tests:\n\n"
            'assert remove_Occ("hello","l") == "heo"\nassert remove_Occ("abcda","a") == "bcd"\n'
            'assert remove_Occ("PHP","P") == "H"')
        assert "\r" not in example["answer"] and example["answer"].endswith("    return s\n")
        assert example["solution"] == f"```python\n{example['answer']}```"
        tests = json.loads(example["tests"])   # test_list only: not the challenge tests
        assert tests == {"kind": "assert", "setup": "",
                         "cases": samples.MBPP[1]["test_list"]}

    @pytest.mark.parametrize("name", ["mbpp", "mbpp_sanitized"])
    @pytest.mark.parametrize("split", ["prompt", "test", "validation", "train"])
    def test_reference_passes_and_without_last_line_fails(self, root, out, name, split):
        for example in read(name, split, out, root / "mbpp"):
            assert rewards.code_tests_reward("p", example["solution"], example) == 1.0
            truncated = example["answer"].rstrip().rsplit("\n", 1)[0] + "\n"
            assert score(example, truncated) == 0.0, example["task_id"]

    def test_setup_code_runs_before_the_tests(self, root, out):
        by_id = {e["task_id"]: e for e in read("mbpp", "train", out, root / "mbpp")}
        tests = json.loads(by_id["700"]["tests"])
        assert tests["setup"] == "import math"
        # The program imports nothing: the tests' math comes from the setup.
        assert score(by_id["700"], "def circle_area(r):\n  return 3.14159265 * r * r\n") == 1.0

    def test_sanitized_schema(self, root, out):
        (example,) = read("mbpp_sanitized", "train", out, root / "mbpp")
        assert example["task"] == "mbpp_sanitized" and example["task_id"] == "700"
        assert json.loads(example["tests"])["setup"] == "import math"
        assert [e["task_id"] for e in read("mbpp_sanitized", "prompt", out, root / "mbpp")] \
            == ["2"]

    def test_missing_file_names_it_and_where(self, tmp_path):
        with pytest.raises(FileNotFoundError, match=r"mbpp: expected mbpp.jsonl \(published at "
                                                    r"https://github.com/google-research/"):
            read("mbpp", "test", str(tmp_path / "out"), tmp_path)

    def test_file_in_another_schema_is_named(self, tmp_path):
        samples.write_jsonl(tmp_path / "mbpp.jsonl", [{"task_id": 11, "prompt": "p"}])
        with pytest.raises(ValueError, match=r"lacks \['code', 'test_list', 'test_setup_code', "
                                             r"'text'\]"):
            read("mbpp", "test", str(tmp_path / "out"), tmp_path)


def apps_config(root=None, **knobs):
    knobs = {"max_cases": 4, "max_case_chars": 1000, **knobs}
    if root is not None:
        knobs["benchmarks_dir"] = str(root)
    return data.builder_config("apps", knobs)


class TestApps:

    def test_counts_every_skip(self, root, out):
        train = read("apps", "train", out, root / "apps", apps_config(root))
        assert [e["task_id"] for e in train] == ["0", "1", "2", "3", "4"]
        info = data.metadata("apps", data_dir=out, config=apps_config(root),
                             manual_dir=str(root / "apps"))
        assert info["train"] == {
            "rows": 15, "malformed": 2, "bad_tests": 3, "oversized": 0, "no_tests": 1,
            "truncated": 2, "contaminated": 2, "duplicates": 1, "no_answer": 1, "kept": 5,
            "decontaminated_against": ["humaneval", "mbpp"]}
        assert info["test"]["kept"] == 1 and info["test"]["decontaminated_against"] == []

    def test_without_benchmarks_the_copy_stays(self, root, out):
        train = read("apps", "train", out, root / "apps", apps_config())
        assert [e["task_id"] for e in train] == ["0", "1", "2", "3", "4", "12", "13"]

    def test_stdio_row(self, root, out):
        by_id = {e["task_id"]: e for e in read("apps", "train", out, root / "apps",
                                               apps_config(root))}
        example = by_id["0"]
        assert example["question"] == (
            "You are given two integers a and b on one line. Print a + b.\n\nRead the input "
            "from standard input and print the answer to standard output.")
        assert example["answer"] == "a, b = map(int, input().split())\nprint(a + b)\n"
        assert example["difficulty"] == "introductory"
        assert json.loads(example["tests"]) == {"kind": "stdio", "cases": [
            {"input": "1 2\n", "output": "3\n"}, {"input": "10 -3\n", "output": "7\n"}]}
        lines = json.loads(by_id["3"]["tests"])["cases"]   # lists of lines joined; 4 kept
        assert lines[2] == {"input": "3\n", "output": "1\n2\n3"} and len(lines) == 4
        assert json.loads(by_id["4"]["tests"])["cases"] == [{"input": "ab\n", "output": "2\n"}]

    def test_call_based_rows(self, root, out):
        by_id = {e["task_id"]: e for e in read("apps", "train", out, root / "apps",
                                               apps_config(root))}
        tests = json.loads(by_id["1"]["tests"])
        assert tests["kind"] == "assert" and tests["setup"] == apps.CALL_SETUP
        assert tests["cases"][0] == "assert _apps_case('multiply_all', '[[[1, 2, 3]], [6]]')"
        assert by_id["1"]["question"].endswith(
            "Complete this starter code (`multiply_all` is called):\n\n```python\n"
            "def multiply_all(xs):\n```")
        assert by_id["2"]["answer"].startswith(apps.CALL_IMPORTS + "\nclass Solution:")

    @pytest.mark.parametrize("task_id, broken", [
        ("0", "a, b = map(int, input().split())\nprint(a - b)\n"),
        ("1", "def multiply_all(xs):\n    return len(xs)\n"),
        ("2", "class Solution:\n    def twoSum(self, nums, target):\n        return [0, 1]\n"),
        ("3", "n = int(input())\nprint(*range(1, n + 1))\n"),
    ])
    def test_reference_passes_and_broken_fails(self, root, out, task_id, broken):
        by_id = {e["task_id"]: e for e in read("apps", "train", out, root / "apps",
                                               apps_config(root))}
        example = by_id[task_id]
        assert rewards.code_tests_reward("p", example["solution"], example) == 1.0
        assert score(example, broken) == 0.0

    def test_call_based_comparison(self, root, out):
        example = read("apps", "train", out, root / "apps", apps_config(root))[1]
        # APPS wraps outputs in a list: the wrapped value and the bare one both match.
        wrapped = "def multiply_all(xs):\n    p = 1\n    for x in xs:\n        p *= x\n" \
                  "    return [p]\n"
        assert score(example, wrapped) == 1.0
        # A tuple reads as a list.
        two_sum = read("apps", "train", out, root / "apps", apps_config(root))[2]
        as_tuple = ("class Solution:\n    def twoSum(self, nums, target):\n"
                    "        return tuple(next([i, j] for i in range(len(nums))\n"
                    "                     for j in range(i + 1, len(nums))\n"
                    "                     if nums[i] + nums[j] == target))\n")
        assert score(two_sum, as_tuple) == 1.0
        # An object equal to everything is not a plain value, even from a method.
        always = ("class Any:\n    def __eq__(self, other):\n        return True\n"
                  "class Solution:\n    def twoSum(self, nums, target):\n        return Any()\n")
        assert score(two_sum, always) == 0.0

    def test_parse_tests_bounds(self, monkeypatch):
        config = apps.AppsConfig()
        big = json.dumps({"inputs": ["1\n"], "outputs": ["1\n"]})
        monkeypatch.setattr(apps, "MAX_IO_CHARS", len(big) - 1)
        assert apps.parse_tests(big, config) == (None, "oversized", None)
        monkeypatch.undo()
        nested = '{"inputs": ' + "[" * 100_000 + "]" * 100_000 + ', "outputs": []}'
        assert apps.parse_tests(nested, config)[1] == "bad_tests"
        assert apps.parse_tests("", config) == (None, "bad_tests", None)
        assert apps.parse_tests('["a"]', config) == (None, "bad_tests", None)

    def test_missing_files_name_both_and_where(self, tmp_path):
        with pytest.raises(FileNotFoundError,
                           match=r"apps: expected train.jsonl \(published at https://"
                                 r"huggingface.co/datasets/codeparrot/apps\) or test.jsonl"):
            read("apps", "train", str(tmp_path / "out"), tmp_path)

    def test_file_in_another_schema_is_named(self, tmp_path):
        samples.write_jsonl(tmp_path / "train.jsonl", [{"id": 1, "prompt": "p"}])
        with pytest.raises(ValueError, match=r"apps: no usable row in .*'malformed': 1.*fields "
                                             r"\['problem_id', 'question', 'solutions', "
                                             r"'input_output'\]"):
            read("apps", "train", str(tmp_path / "out"), tmp_path)

    def test_knobs_are_checked(self):
        with pytest.raises(ValueError, match=r"apps.max_cases must be >= 1, got 0"):
            apps.AppsConfig(max_cases=0)
