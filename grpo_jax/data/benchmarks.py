"""The math reasoning benchmarks, each from its published file (a ``test`` split only).

Every example is ``task`` (the benchmark's name), ``question``, ``answer`` (the final
answer the ``math`` reward compares, normalised below) and ``solution`` (the published
solution, if any, ending in ``\\boxed{answer}``). The schemas, as published:

* ``aime24``: AIME 2024 I and II, 30 problems; HuggingFaceH4/aime_2024 on the Hugging
  Face hub, ``data/train-00000-of-00001.parquet``: ``id`` (int), ``problem``,
  ``solution``, ``answer`` (str), ``url``, ``year`` (its dataset card).
* ``aime25``: AIME 2025 I and II, 30 problems; MathArena/aime_2025,
  ``data/train-00000-of-00001.parquet``: ``problem_idx`` (int), ``problem``, ``answer``
  (int) (MathArena's dataset cards).
* ``amc23``: AMC 2023, the 40 problems of AI-MO/aimo-validation-amc (83 problems of
  AMC 2022 and 2023) whose ``url`` names a 2023 contest; ``data/train-00000-of-00001.parquet``:
  ``id``, ``problem``, ``answer`` (float), ``url``.
* ``minerva_math``: the 272 OCW problems of Minerva (Lewkowycz et al., arXiv:2206.14858)
  as math-ai/minervamath publishes them, ``test.jsonl``: ``question``, ``answer``.
* ``olympiadbench``: OlympiadBench's English, text-only, open-ended math competition
  subset (He et al., arXiv:2402.14008), ``OE_TO_maths_en_COMP.json`` of the
  OpenBMB/OlympiadBench data release (a JSON list; also Hothan/OlympiadBench's
  ``OE_TO_maths_en_COMP`` config): ``id``, ``question``, ``context`` (or null),
  ``solution`` (a list), ``final_answer`` (a list of ``$...$`` strings),
  ``is_multiple_answer``, ``unit``, ``answer_type``.

MATH-500 (``math500``) is the sixth benchmark of the suite (``grpo_jax.data.math500``).
Integer answers are written without leading zeros or a decimal part (``"033"``, ``4.0``
-> ``33``, ``4``); OlympiadBench's answers lose their ``$`` delimiters and several join
with ``", "``.
"""

from collections.abc import Iterator
from typing import Any

from etils import epath

from grpo_jax.data import _manual
from grpo_jax.data import _release
from grpo_jax.data import math500

HUB = "https://huggingface.co/datasets"
HUB_PARQUET = "train-00000-of-00001.parquet"
# The suite's benchmarks, in the order results tables list them.
BENCHMARKS = ("aime24", "aime25", "amc23", "math500", "minerva_math", "olympiadbench")


def _example(task: str, question: str, answer: str, solution: str | None = None) -> dict:
    return {"task": task, "question": question.strip(), "answer": answer,
            "solution": _release.with_final_answer(solution, answer)}


def _rows(path: epath.Path, fields: tuple[str, ...], dataset: str) -> Iterator[dict[str, Any]]:
    for row in _release.read_rows(path):
        _release.require_fields(row, fields, dataset=dataset, path=path)
        yield row


class Aime24(_release.ReleaseBuilder):
    """AIME 2024 (I and II): 30 problems with integer answers 0..999."""

    name = "aime24"
    FILES = (_release.ReleaseFile(HUB_PARQUET, f"{HUB}/HuggingFaceH4/aime_2024 (data/)"),)
    HOMEPAGE = f"{HUB}/HuggingFaceH4/aime_2024"

    @classmethod
    def examples(cls, path, split):
        for row in _rows(path, ("problem", "solution", "answer"), cls.name):
            yield _example(cls.name, row["problem"], _release.number_answer(row["answer"]),
                           row["solution"])


class Aime25(_release.ReleaseBuilder):
    """AIME 2025 (I and II): 30 problems with integer answers 0..999."""

    name = "aime25"
    FILES = (_release.ReleaseFile(HUB_PARQUET, f"{HUB}/MathArena/aime_2025 (data/)"),)
    HOMEPAGE = f"{HUB}/MathArena/aime_2025"

    @classmethod
    def examples(cls, path, split):
        for row in _rows(path, ("problem_idx", "problem", "answer"), cls.name):
            yield _example(cls.name, row["problem"], _release.number_answer(row["answer"]))


class Amc23(_release.ReleaseBuilder):
    """AMC 2023 (12A and 12B): the 40 problems of 2023 in AI-MO's AMC validation set."""

    name = "amc23"
    FILES = (_release.ReleaseFile(HUB_PARQUET, f"{HUB}/AI-MO/aimo-validation-amc (data/)"),)
    HOMEPAGE = f"{HUB}/AI-MO/aimo-validation-amc"

    @classmethod
    def examples(cls, path, split):
        found = 0
        for row in _rows(path, ("problem", "answer", "url"), cls.name):
            if "2023_AMC" in row["url"]:
                found += 1
                yield _example(cls.name, row["problem"], _release.number_answer(row["answer"]))
        if not found:
            raise ValueError(f"amc23: no row of {path} has a url naming a 2023 AMC contest "
                             "('.../2023_AMC_12A_Problems/...'); is it AI-MO/aimo-validation-amc?")


class MinervaMath(_release.ReleaseBuilder):
    """Minerva's 272 undergraduate science and engineering problems (MIT OCW)."""

    name = "minerva_math"
    FILES = (_release.ReleaseFile("test.jsonl", f"{HUB}/math-ai/minervamath"),)
    HOMEPAGE = f"{HUB}/math-ai/minervamath"

    @classmethod
    def examples(cls, path, split):
        for row in _rows(path, ("question", "answer"), cls.name):
            yield _example(cls.name, row["question"], str(row["answer"]).strip())


class OlympiadBench(_release.ReleaseBuilder):
    """OlympiadBench's English text-only open-ended math competition problems (675)."""

    name = "olympiadbench"
    FILES = (_release.ReleaseFile(
        "OE_TO_maths_en_COMP.json",
        "https://github.com/OpenBMB/OlympiadBench (its data release, data/; also "
        f"{HUB}/Hothan/OlympiadBench)"),)
    HOMEPAGE = "https://github.com/OpenBMB/OlympiadBench"

    @classmethod
    def examples(cls, path, split):
        for row in _rows(path, ("question", "solution", "final_answer"), cls.name):
            context = (row.get("context") or "").strip()
            question = f"{context}\n{row['question']}" if context else row["question"]
            answer = ", ".join(a.strip().strip("$").strip() for a in row["final_answer"])
            yield _example(cls.name, question, answer, (row["solution"] or [None])[0])


RELEASE_BUILDERS = (Aime24, Aime25, Amc23, MinervaMath, OlympiadBench)
_BY_NAME = {builder.name: builder for builder in RELEASE_BUILDERS}


def benchmark_files(benchmarks_dir: str) -> list[epath.Path]:
    """The release file of each of ``BENCHMARKS`` under ``benchmarks_dir/<name>/``.

    Raises:
      FileNotFoundError: a benchmark's file is missing (named, with where it is published).
    """
    root = epath.Path(benchmarks_dir).expanduser()
    files = []
    for name in BENCHMARKS:
        if name == "math500":
            path = root / name / "test.jsonl"
            if not path.exists():
                raise FileNotFoundError(
                    "math500: expected test.jsonl (published at https://github.com/openai/"
                    f"prm800k, prm800k/math_splits/) in {root / name}; copy the official "
                    "file there")
            files.append(path)
        else:
            files.append(_BY_NAME[name].release_file(root / name))
    return files


def benchmark_problems(benchmarks_dir: str) -> set[str]:
    """``problem_key``s of every problem of ``BENCHMARKS`` (see ``benchmark_files``)."""
    keys = set()
    for name, path in zip(BENCHMARKS, benchmark_files(benchmarks_dir)):
        if name == "math500":
            rows = _manual.read_jsonl(path.parent, path.name, dataset=name,
                                      fields=math500.FIELDS, convert=math500.to_example)
            questions = (example["question"] for _, _, example in rows)
        else:
            builder = _BY_NAME[name]
            questions = (e["question"] for e in builder.examples(path, "test"))
        keys.update(_release.problem_key(q) for q in questions)
    return keys
