"""MATH-500 from the official ``test.jsonl`` in a local directory (TFDS ``manual_dir``).

Official format (github.com/openai/prm800k, ``prm800k/math_splits/test.jsonl``, also
HuggingFaceH4/MATH-500): one JSON object per line with ``problem``, ``solution``
(ending in ``\\boxed{...}``), ``answer``, ``subject``, ``level`` (1..5) and
``unique_id`` (e.g. ``test/algebra/1004.json``). Only a ``test`` split exists.
"""

from typing import Any

import numpy as np
import tensorflow_datasets as tfds

from grpo_jax.data import _manual
from grpo_jax.data import _records

FIELDS = {"problem", "solution", "answer", "subject", "level", "unique_id"}


def to_example(row: dict[str, Any]) -> dict[str, Any]:
    """An official MATH-500 row as a project example."""
    return {"task": "math500", "question": row["problem"], "answer": row["answer"],
            "solution": row["solution"], "subject": row["subject"],
            "level": int(row["level"]), "unique_id": row["unique_id"]}


class Math500(tfds.core.GeneratorBasedBuilder):
    """MATH-500: the 500-problem MATH test subset of "Let's Verify Step by Step"."""

    VERSION = tfds.core.Version("1.0.0")
    RELEASE_NOTES = {"1.0.0": "First release."}
    # The official files; the build is keyed on their contents (`_manual.files_config`).
    MANUAL_FILES = ("test.jsonl",)
    MANUAL_DOWNLOAD_INSTRUCTIONS = (
        "Copy test.jsonl of MATH-500 (prm800k/math_splits/test.jsonl of "
        "https://github.com/openai/prm800k, or HuggingFaceH4/MATH-500) into manual_dir.")

    def _info(self) -> tfds.core.DatasetInfo:
        return tfds.core.DatasetInfo(
            builder=self, description=type(self).__doc__,
            features=_records.example_features(
                subject=tfds.features.Text(), level=np.int32,
                unique_id=tfds.features.Text()),
            homepage="https://github.com/openai/prm800k")

    def _split_generators(self, dl_manager):
        return {"test": self._generate_examples(dl_manager.manual_dir)}

    def _generate_examples(self, manual_dir):
        rows = _manual.read_jsonl(manual_dir, "test.jsonl", dataset="math500", fields=FIELDS,
                                  convert=to_example)
        for _, row, example in rows:
            yield row["unique_id"], example
