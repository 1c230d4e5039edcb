"""MBPP: 974 crowd-sourced Python problems with three assert tests each (Austin et al.
2021, "Program Synthesis with Large Language Models", arXiv:2108.07732).

Official files, from github.com/google-research/google-research (``mbpp/``), read from
``task.manual_dir``:

* ``mbpp``: ``mbpp.jsonl``, one JSON object per line with ``task_id`` (int, 1-974),
  ``text`` (the problem), ``code`` (the reference solution, CRLF line ends),
  ``test_list`` (three ``assert`` statements), ``test_setup_code`` (code the tests need,
  mostly empty) and ``challenge_test_list`` (harder asserts for a few problems; not used,
  as in the paper's evaluation).
* ``mbpp_sanitized``: ``sanitized-mbpp.json``, a JSON list of the 427 problems whose
  text the authors verified, with ``source_file``, ``task_id``, ``prompt`` (the
  problem), ``code``, ``test_imports`` (import lines the tests need) and ``test_list``.

Splits by ``task_id``, as the paper defines them: ``prompt`` 1-10 (the few-shot
examples), ``test`` 11-510, ``validation`` 511-600, ``train`` 601-974.

An example's ``question`` is the problem followed by its tests (the paper's prompt, which
fixes the function's name and signature), ``answer`` the reference code (LF line ends),
``solution`` it fenced, and ``tests`` the assert-style tests of ``code_tests``: the setup
code and one case per assert of ``test_list``.
"""

import json
from collections.abc import Iterator, Sequence
from typing import Any

import tensorflow_datasets as tfds

from grpo_jax.data import _release
from grpo_jax.data import prompts

HOMEPAGE = "https://github.com/google-research/google-research/tree/master/mbpp"
# (split, first task_id, last task_id), the paper's sec. 2.1.
SPLIT_RANGES = (("prompt", 1, 10), ("test", 11, 510), ("validation", 511, 600),
                ("train", 601, 974))
FIELDS = ("task_id", "text", "code", "test_list", "test_setup_code")
SANITIZED_FIELDS = ("task_id", "prompt", "code", "test_imports", "test_list")


def split_of_task(task_id: int) -> str | None:
    """The split of MBPP problem `task_id`, or None outside 1-974.

    >>> split_of_task(11), split_of_task(600), split_of_task(975)
    ('test', 'validation', None)
    """
    for split, first, last in SPLIT_RANGES:
        if first <= task_id <= last:
            return split
    return None


def to_example(task: str, *, task_id: int, text: str, code: str, test_list: Sequence[str],
               setup: str) -> dict[str, Any]:
    """An MBPP problem as a project example of `task` (module docstring).

    Raises:
      ValueError: `test_list` is not a non-empty list of strings.
    """
    if (not isinstance(test_list, list) or not test_list
            or not all(isinstance(t, str) for t in test_list)):
        raise ValueError(f"{task}: task {task_id}'s test_list must be a non-empty list of "
                         f"assert strings, got {test_list!r:.200}")
    program = code.replace("\r\n", "\n").rstrip() + "\n"
    asserts = [t.replace("\r\n", "\n").strip() for t in test_list]
    question = f"{text.strip()} Your code should pass these tests:\n\n" + "\n".join(asserts)
    tests = {"kind": "assert", "setup": setup.replace("\r\n", "\n"), "cases": asserts}
    return {"task": task, "question": question, "answer": program,
            "solution": prompts.render_answer(task, program), "tests": json.dumps(tests),
            "task_id": str(task_id)}


class Mbpp(_release.ReleaseBuilder):
    """MBPP: 974 Python problems with assert tests (train 374, test 500, validation 90,
    prompt 10)."""

    name = "mbpp"
    SPLITS = tuple(split for split, _, _ in SPLIT_RANGES)
    FILES = (_release.ReleaseFile("mbpp.jsonl", HOMEPAGE),)
    HOMEPAGE = HOMEPAGE

    def extra_features(self):
        return {"tests": tfds.features.Text(), "task_id": tfds.features.Text()}

    @classmethod
    def examples(cls, path, split):
        for row in _release.read_rows(path):
            _release.require_fields(row, FIELDS, dataset=cls.name, path=path)
            if split_of_task(int(row["task_id"])) == split:
                yield to_example(cls.name, task_id=int(row["task_id"]), text=row["text"],
                                 code=row["code"], test_list=row["test_list"],
                                 setup=row["test_setup_code"] or "")


class MbppSanitized(Mbpp):
    """MBPP's sanitized subset: 427 problems with verified text (same task_id splits)."""

    name = "mbpp_sanitized"
    FILES = (_release.ReleaseFile("sanitized-mbpp.json", HOMEPAGE),)

    @classmethod
    def examples(cls, path, split):
        for row in _release.read_rows(path):
            _release.require_fields(row, SANITIZED_FIELDS, dataset=cls.name, path=path)
            if split_of_task(int(row["task_id"])) == split:
                yield to_example(cls.name, task_id=int(row["task_id"]), text=row["prompt"],
                                 code=row["code"], test_list=row["test_list"],
                                 setup="\n".join(row["test_imports"]))


def problem_texts(path) -> Iterator[str]:
    """The problem text of every row of an official MBPP file (either variant), every
    split: what a training set is decontaminated against."""
    for row in _release.read_rows(path):
        yield row["text"] if "text" in row else row["prompt"]


RELEASE_BUILDERS = (Mbpp, MbppSanitized)
