"""The math training sets of the RL papers, each from its published file.

Every example is ``task`` (the data set's name), ``question``, ``answer`` (the final
answer the ``math`` reward compares) and ``solution`` (the published one, if any,
ending in ``\\boxed{answer}``). Rows repeating an earlier problem (by
``_release.problem_key``) and rows without an answer are dropped; with the knob
``benchmarks_dir`` so are the problems of the benchmarks (``benchmarks.BENCHMARKS``),
and the counts are the dataset's info (``data.metadata``). The schemas, as published:

* ``dapo_math_17k``: DAPO's training set (Yu et al., arXiv:2503.14476);
  BytedTsinghua-SIA/DAPO-Math-17k on the Hugging Face hub, ``data/dapo-math-17k.parquet``
  (1.79M rows, its 17.4k problems each repeated): ``data_source``, ``prompt`` (a chat
  list of ``{"content", "role"}``: the problem inside DAPO's "Solve the following math
  problem step by step ... Answer: $Answer ..." instruction, which is removed here),
  ``ability``, ``reward_model`` (``{"ground_truth", "style"}``), ``extra_info``
  (``{"index"}``) (its dataset card). Answers are integers; no solutions.
* ``math``: MATH (Hendrycks et al., arXiv:2103.03874), 7,500 train and 5,000 test
  problems; ``MATH.tar`` of github.com/hendrycks/math, one JSON file per problem,
  ``MATH/<split>/<subject>/<n>.json``: ``problem``, ``level`` (``"Level 3"``),
  ``type``, ``solution``. The answer is the solution's last ``\\boxed{}`` (or
  ``\\fbox{}``, rewritten as ``\\boxed{}``), as MATH's grader reads it; adds
  ``subject``, ``level`` and ``unique_id`` (``train/algebra/1.json``, MATH-500's form).
* ``deepscaler``: DeepScaleR-Preview's 40k problems (Luo et al., 2025; AIME 1984-2023,
  AMC before 2023, Omni-MATH, STILL); agentica-org/DeepScaleR-Preview-Dataset,
  ``deepscaler.json`` (a JSON list): ``problem``, ``answer``, ``solution``.
"""

import json
import re
import tarfile
from collections.abc import Iterator
from typing import Any

import numpy as np
import tensorflow_datasets as tfds
from etils import epath

from grpo_jax.data import _release
from grpo_jax.data import benchmarks

HUB = benchmarks.HUB
_DAPO_INSTRUCTION = "Solve the following math problem step by step."
_DAPO_REMINDER = '\n\nRemember to put your answer on its own line after "Answer:"'
_MATH_MEMBER = re.compile(r"MATH/(train|test)/([a-z_]+)/(\d+)\.json")


class TrainingSetBuilder(_release.ReleaseBuilder, skip_registration=True):
    """A release builder whose splits are decontaminated against the benchmarks."""

    BUILDER_CONFIG_CLASS = _release.TrainingSetConfig
    SPLITS = ("train",)

    @classmethod
    def input_files(cls, config, manual_dir):
        files = [cls.release_file(manual_dir)]
        if config.benchmarks_dir:
            files += benchmarks.benchmark_files(config.benchmarks_dir)
        return files

    def excluded_problems(self) -> set[str]:
        benchmarks_dir = self.builder_config.benchmarks_dir
        return benchmarks.benchmark_problems(benchmarks_dir) if benchmarks_dir else set()

    def benchmarks(self) -> list[str]:
        return list(benchmarks.BENCHMARKS) if self.builder_config.benchmarks_dir else []


def dapo_problem(prompt: list[dict[str, str]]) -> str:
    """The problem inside a DAPO-Math-17k ``prompt`` (its user turn without DAPO's
    answer-format instruction before it and reminder after it)."""
    text = next(turn["content"] for turn in prompt if turn["role"] == "user").strip()
    if text.startswith(_DAPO_INSTRUCTION) and "\n\n" in text:
        text = text.split("\n\n", 1)[1]
    return text.split(_DAPO_REMINDER, 1)[0].strip()


class DapoMath17k(TrainingSetBuilder):
    """DAPO-Math-17k: 17.4k competition problems with integer answers (DAPO's RL set)."""

    name = "dapo_math_17k"
    FILES = (_release.ReleaseFile(
        "dapo-math-17k.parquet", f"{HUB}/BytedTsinghua-SIA/DAPO-Math-17k (data/)"),)
    HOMEPAGE = f"{HUB}/BytedTsinghua-SIA/DAPO-Math-17k"

    @classmethod
    def examples(cls, path, split):
        for row in _release.read_rows(path):
            _release.require_fields(row, ("prompt", "reward_model"), dataset=cls.name, path=path)
            answer = str(row["reward_model"]["ground_truth"]).strip()
            yield {"task": cls.name, "question": dapo_problem(row["prompt"]), "answer": answer,
                   "solution": _release.with_final_answer(None, answer)}


class Math(TrainingSetBuilder):
    """MATH: 12,500 competition problems in 7 subjects and 5 levels (train 7,500, test 5,000)."""

    name = "math"
    SPLITS = ("train", "test")
    FILES = (_release.ReleaseFile(
        "MATH.tar", "https://people.eecs.berkeley.edu/~hendrycks/MATH.tar "
        "(https://github.com/hendrycks/math)"),)
    HOMEPAGE = "https://github.com/hendrycks/math"

    def extra_features(self):
        return {"subject": tfds.features.Text(), "level": np.int32,
                "unique_id": tfds.features.Text()}

    @classmethod
    def examples(cls, path, split):
        for unique_id, row in _math_rows(path, split):
            _release.require_fields(row, ("problem", "level", "type", "solution"),
                                    dataset=cls.name, path=path)
            level = row["level"].removeprefix("Level ")
            # A few solutions box their answer with \fbox; the math reward reads \boxed.
            solution = row["solution"].replace("\\fbox{", "\\boxed{")
            yield {"task": cls.name, "question": row["problem"].strip(),
                   "answer": _release.boxed_answer(solution),
                   "solution": solution, "subject": row["type"],
                   "level": int(level) if level.isdigit() else 0, "unique_id": unique_id}


def _math_rows(path: epath.Path, split: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """``(unique_id, row)`` of each ``MATH/<split>/<subject>/<n>.json`` in the tar, in
    subject and problem-number order."""
    with path.open("rb") as f, tarfile.open(fileobj=f) as tar:
        members = []
        for member in tar.getmembers():
            match = _MATH_MEMBER.fullmatch(member.name)
            if member.isfile() and match and match.group(1) == split:
                members.append(((match.group(2), int(match.group(3))), member))
        for (subject, number), member in sorted(members, key=lambda m: m[0]):
            row = json.loads(tar.extractfile(member).read().decode("utf-8"))
            yield f"{split}/{subject}/{number}.json", row


class DeepScaler(TrainingSetBuilder):
    """DeepScaleR-Preview: 40k competition problems with answers and solutions."""

    name = "deepscaler"
    FILES = (_release.ReleaseFile(
        "deepscaler.json", f"{HUB}/agentica-org/DeepScaleR-Preview-Dataset"),)
    HOMEPAGE = f"{HUB}/agentica-org/DeepScaleR-Preview-Dataset"

    @classmethod
    def examples(cls, path, split):
        for row in _release.read_rows(path):
            _release.require_fields(row, ("problem", "answer", "solution"), dataset=cls.name,
                                    path=path)
            answer = str(row["answer"] or "").strip()
            yield {"task": cls.name, "question": row["problem"].strip(), "answer": answer,
                   "solution": _release.with_final_answer(row["solution"], answer)}


RELEASE_BUILDERS = (DapoMath17k, Math, DeepScaler)
