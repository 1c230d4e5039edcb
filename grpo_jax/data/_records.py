"""The example contract: TFDS features for it, decoding records back to it, splits.

Every example is a dict with at least ``task``, ``question``, ``answer`` and
``solution`` (all ``str``; ``solution`` is a complete SFT target that ends in the
task's answer format). Countdown adds ``numbers`` (list of int) and ``target``
(int); RPT adds ``context`` and ``continuation``; MATH-500 adds ``subject``,
``level`` and ``unique_id``; code tasks add ``tests`` (JSON, see ``rewards._code``).
"""

import hashlib
import itertools
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np
import tensorflow_datasets as tfds

SPLITS = ("train", "test")


def example_features(**extra: tfds.features.FeatureConnector) -> tfds.features.FeaturesDict:
    """TFDS features of the shared example contract plus task-specific ``extra`` ones."""
    text = tfds.features.Text
    return tfds.features.FeaturesDict({
        "task": text(),
        "question": text(),
        "answer": text(),
        "solution": text(),
        **extra,
    })


def decode_example(record: dict[str, Any]) -> dict[str, Any]:
    """Turns a record read from an array_record data source into plain Python values.

    TFDS hands back ``bytes`` for text, numpy scalars for ints and lists of numpy
    scalars for sequences; the rest of the project sees ``str``, ``int`` and ``list``.

    >>> decode_example({"task": b"countdown", "target": np.int64(24)})
    {'task': 'countdown', 'target': 24}
    """
    return {key: _to_python(value) for key, value in record.items()}


def _to_python(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.decode("utf-8")
    if isinstance(value, np.ndarray):
        return [_to_python(v) for v in value.tolist()]
    if isinstance(value, (list, tuple)):
        return [_to_python(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    return value


def split_of(key: str, test_fraction: float) -> str:
    """``"test"`` for a stable fraction of problem keys, ``"train"`` for the rest.

    The split is a function of the problem alone (sha256 of its canonical key), so a
    problem can never appear in both splits, whatever the seed or the sizes asked for.
    """
    bucket = int.from_bytes(hashlib.sha256(key.encode("utf-8")).digest()[:8], "big")
    return "test" if bucket < test_fraction * 2**64 else "train"


def select_split(
    candidates: Iterable[dict[str, Any]],
    split: str,
    *,
    num: int,
    test_fraction: float,
    key: Callable[[dict[str, Any]], str],
) -> Iterator[dict[str, Any]]:
    """The first ``num`` distinct candidates whose key falls in ``split``.

    Args:
      candidates: a deterministic, possibly infinite stream of examples.
      split: ``"train"`` or ``"test"``.
      num: how many examples to yield.
      test_fraction: share of the key space that belongs to ``"test"``.
      key: the canonical form of a problem; equal keys are the same problem.

    Raises:
      ValueError: when the stream runs out of distinct problems for this split
        (a task too small for the sizes asked for).
    """
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    if num == 0:
        return
    share = test_fraction if split == "test" else 1.0 - test_fraction
    budget = int(20 * num / share) + 1000
    seen = set()
    for example in itertools.islice(candidates, budget):
        k = key(example)
        if k in seen or split_of(k, test_fraction) != split:
            continue
        seen.add(k)
        yield example
        if len(seen) == num:
            return
    raise ValueError(
        f"found only {len(seen)} distinct {split} problems in {budget} candidates, "
        f"fewer than num_{split}={num}; lower num_{split} or make the task larger "
        "(e.g. more digits)")
