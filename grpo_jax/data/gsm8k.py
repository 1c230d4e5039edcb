"""GSM8K from the official jsonl files in a local directory (TFDS ``manual_dir``).

Official format (github.com/openai/grade-school-math, ``grade_school_math/data/``):
one JSON object per line with ``question`` and ``answer``, where ``answer`` is the
worked solution with calculator annotations ``<<48/2=24>>`` and a last line
``#### 72``. Examples: ``answer`` is the number after the last ``####`` with
thousands separators removed; ``solution`` is the worked solution without the
calculator annotations, its last line rewritten as ``#### <answer>``.
"""

import re
from typing import Any

import tensorflow_datasets as tfds

from grpo_jax.data import _manual
from grpo_jax.data import _records
from grpo_jax.data import prompts

_ANNOTATION = re.compile(r"<<[^<>]*>>")


def to_example(row: dict[str, Any]) -> dict[str, Any]:
    """An official GSM8K row as a project example."""
    worked = row["answer"]
    if "####" not in worked:
        raise ValueError(f"gsm8k: answer has no '#### <number>' line: {worked[-80:]!r}")
    steps, answer = worked.rsplit("####", 1)
    answer = answer.strip().replace(",", "")
    solution = f"{_ANNOTATION.sub('', steps).strip()}\n{prompts.render_answer('gsm8k', answer)}"
    return {"task": "gsm8k", "question": row["question"].strip(), "answer": answer,
            "solution": solution}


class Gsm8k(tfds.core.GeneratorBasedBuilder):
    """GSM8K grade-school math word problems (train 7473, test 1319 in the official files)."""

    VERSION = tfds.core.Version("1.0.0")
    RELEASE_NOTES = {"1.0.0": "First release."}
    # The official files; the build is keyed on their contents (`_manual.files_config`).
    MANUAL_FILES = ("train.jsonl", "test.jsonl")
    MANUAL_DOWNLOAD_INSTRUCTIONS = (
        "Copy train.jsonl and test.jsonl from grade_school_math/data/ of "
        "https://github.com/openai/grade-school-math into manual_dir.")

    def _info(self) -> tfds.core.DatasetInfo:
        return tfds.core.DatasetInfo(
            builder=self, description=type(self).__doc__,
            features=_records.example_features(),
            homepage="https://github.com/openai/grade-school-math")

    def _split_generators(self, dl_manager):
        return {split: self._generate_examples(dl_manager.manual_dir, split)
                for split in _records.SPLITS}

    def _generate_examples(self, manual_dir, split: str):
        rows = _manual.read_jsonl(manual_dir, f"{split}.jsonl", dataset="gsm8k",
                                  fields={"question", "answer"}, convert=to_example)
        for line_number, _, example in rows:
            yield line_number, example
