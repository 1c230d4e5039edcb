"""Shared base for procedurally generated tasks: knobs in a BuilderConfig, splits by hash.

A procedural builder supplies an infinite, seeded stream of candidate examples and a
canonical key per problem; this base turns that into ``train`` and ``test`` splits
that are disjoint by construction (see ``_records.split_of``) and identical on every
build.
"""

import abc
import dataclasses
import hashlib
import json
from collections.abc import Iterator
from typing import Any, ClassVar

import tensorflow_datasets as tfds

from grpo_jax.data import _records

_BASE_FIELDS = frozenset(f.name for f in dataclasses.fields(tfds.core.BuilderConfig))


@dataclasses.dataclass(eq=False)
class KnobConfig(tfds.core.BuilderConfig):
    """A BuilderConfig named after its knobs.

    Attributes:
      name: left empty, it is derived from the knobs (``<PREFIX>_<digest>``), so two
        configs that differ in any knob never share a directory under ``data_dir``.
      test_fraction: share of the problems (or documents) reserved for ``test``.
    """

    name: str = ""
    test_fraction: float = 0.2

    PREFIX: ClassVar[str] = "knob"

    def __post_init__(self):
        if not 0.0 < self.test_fraction < 1.0:
            raise ValueError(
                f"{self.PREFIX}.test_fraction must be in (0, 1), got {self.test_fraction}")
        if not self.name:
            self.name = f"{self.PREFIX}_{self.digest()}"

    def knobs(self) -> dict[str, Any]:
        """Every field that changes the generated data (the TFDS bookkeeping left out)."""
        return {k: v for k, v in dataclasses.asdict(self).items() if k not in _BASE_FIELDS}

    def digest(self) -> str:
        """A short stable hash of ``knobs()``."""
        blob = json.dumps(self.knobs(), sort_keys=True, default=str)
        return hashlib.sha256(blob.encode("utf-8")).hexdigest()[:10]


@dataclasses.dataclass(eq=False)
class ProceduralConfig(KnobConfig):
    """Sizes and seed shared by every procedural task.

    Attributes:
      num_train: examples in the ``train`` split.
      num_test: examples in the ``test`` split.
      seed: seed of the candidate stream.
    """

    num_train: int = 1000
    num_test: int = 100
    seed: int = 0

    def __post_init__(self):
        for field in ("num_train", "num_test"):
            if getattr(self, field) < 0:
                raise ValueError(
                    f"{self.PREFIX}.{field} must be >= 0, got {getattr(self, field)}")
        super().__post_init__()


def info(builder: tfds.core.GeneratorBasedBuilder,
         features: tfds.features.FeaturesDict) -> tfds.core.DatasetInfo:
    """DatasetInfo that records the config's knobs in the dataset's metadata."""
    knobs = json.loads(json.dumps(builder.builder_config.knobs(), default=str))
    return tfds.core.DatasetInfo(
        builder=builder, description=type(builder).__doc__, features=features,
        metadata=tfds.core.MetadataDict(knobs=knobs))


class ProceduralBuilder(tfds.core.GeneratorBasedBuilder, skip_registration=True):
    """A builder whose subclasses define ``features``, ``candidates`` and ``key``."""

    VERSION = tfds.core.Version("1.0.0")
    RELEASE_NOTES = {"1.0.0": "First release."}

    @abc.abstractmethod
    def features(self) -> tfds.features.FeaturesDict:
        """The TFDS features of one example (``_records.example_features`` plus extras)."""

    @abc.abstractmethod
    def candidates(self) -> Iterator[dict[str, Any]]:
        """An infinite deterministic stream of examples for ``self.builder_config``."""

    @abc.abstractmethod
    def key(self, example: dict[str, Any]) -> str:
        """The canonical form of an example's problem; equal keys are the same problem."""

    def _info(self) -> tfds.core.DatasetInfo:
        return info(self, self.features())

    def _split_generators(self, dl_manager):
        del dl_manager  # Nothing to download: the examples are generated.
        return {split: self._generate_examples(split) for split in _records.SPLITS}

    def _generate_examples(self, split: str):
        config = self.builder_config
        selected = _records.select_split(
            self.candidates(),
            split,
            num=getattr(config, f"num_{split}"),
            test_fraction=config.test_fraction,
            key=self.key,
        )
        for index, example in enumerate(selected):
            yield index, example
