"""Builders of published data sets, read from their release files in a manual directory.

Nothing downloads: a builder reads the file its publisher released (parquet, json or
jsonl as published, or a tar of per-problem JSON files), copied into ``manual_dir``
(``task.manual_dir``). When that file is missing, ``release_file`` names it and where it
is published. The examples of a split are deduplicated by normalised problem text
(``problem_key``: the first row of a problem is kept) and, for a training set whose
config names a ``benchmarks_dir``, decontaminated against the benchmarks' problems; the
counts are the dataset's ``info.metadata`` (``data.metadata``).

A prepared copy is keyed on the identity of the files it was built from: the config's
name digests each file's path, size and modification time, so an edited or replaced
release file builds a new copy under ``data_dir`` instead of reusing a stale one.
"""

import abc
import dataclasses
import hashlib
import json
import os
import re
import unicodedata
from collections.abc import Iterator, Sequence
from typing import Any, ClassVar

import tensorflow_datasets as tfds
from etils import epath

from grpo_jax.data import _records
from grpo_jax.data import prompts
from grpo_jax.rewards import _answers

_WORD = re.compile(r"[^\W_]+")
PARQUET_BATCH = 8192   # rows per pyarrow batch (DAPO-Math-17k's file holds 1.79M rows)


@dataclasses.dataclass(frozen=True)
class ReleaseFile:
    """One published file: its name in ``manual_dir`` and where it is published."""

    name: str
    url: str


def problem_key(text: str) -> str:
    """A problem's text reduced for deduplication and decontamination: Unicode NFKC,
    case folded, only its letters and digits kept, one space between runs (so spacing,
    punctuation, ``$`` and LaTeX braces do not make two copies of a problem differ).

    >>> problem_key("Find $x$ if  $2x = \\\\frac{1}{2}$.")
    'find x if 2x frac 1 2'
    """
    return " ".join(_WORD.findall(unicodedata.normalize("NFKC", text).casefold()))


def boxed_answer(solution: str) -> str:
    """The content of a solution's last ``\\boxed{}`` (``\\fbox{}`` counts as a box), the
    answer MATH's grader compares (Hendrycks et al., arXiv:2103.03874, its
    ``last_boxed_only_string``). Raises ValueError when the solution has none.

    >>> boxed_answer("so $x = \\\\boxed{\\\\frac{1}{2}}$.")
    '\\\\frac{1}{2}'
    """
    marker = _answers.last_boxed(solution.replace("\\fbox{", "\\boxed{"))
    if marker is None or marker.content is None:
        raise ValueError(f"solution has no closed \\boxed{{}} answer: {solution[-80:]!r}")
    return marker.content


def number_answer(value: Any) -> str:
    """A numeric answer as written in a competition's answer key: ints and integral
    floats without a decimal part or leading zeros (``4.0`` and ``"033"`` -> ``"4"``,
    ``"33"``), other values as their text, stripped.

    >>> number_answer(4.0), number_answer("033"), number_answer(2.5)
    ('4', '33', '2.5')
    """
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    text = str(value).strip()
    return str(int(text)) if text.isdigit() else text


def with_final_answer(solution: str | None, answer: str) -> str:
    """A published solution (or none) made an SFT target that ends in the answer format
    of the math tasks: ``\\boxed{answer}`` appended unless the solution has a box.

    >>> with_final_answer(None, "33")
    '\\\\boxed{33}'
    """
    boxed = prompts.render_answer("math500", answer)
    solution = (solution or "").strip()
    if not solution:
        return boxed
    return solution if _answers.last_boxed(solution) else f"{solution}\n\n{boxed}"


def read_rows(path: epath.Path) -> Iterator[dict[str, Any]]:
    """The rows of a ``.parquet`` (pyarrow, nested columns as dicts and lists),
    ``.jsonl`` (one object a line) or ``.json`` (one list of objects) file."""
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq   # only the builders of parquet releases need it
        with path.open("rb") as f:
            for batch in pq.ParquetFile(f).iter_batches(batch_size=PARQUET_BATCH):
                yield from batch.to_pylist()
    elif path.suffix == ".jsonl":
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.strip():
                yield json.loads(line)
    elif path.suffix == ".json":
        yield from json.loads(path.read_text(encoding="utf-8"))
    else:
        raise ValueError(f"{path}: no reader for {path.suffix!r} files")


def require_fields(row: dict[str, Any], fields: Sequence[str], *, dataset: str,
                   path: epath.Path) -> None:
    """Raises ValueError naming the fields `row` lacks (a file not in the official schema)."""
    missing = sorted(set(fields) - row.keys())
    if missing:
        raise ValueError(f"{dataset}: a row of {path} lacks {missing}; expected the official "
                         f"schema with fields {sorted(fields)}")


@dataclasses.dataclass(eq=False)
class ReleaseConfig(tfds.core.BuilderConfig):
    """A release builder's config, named after the files it is built from.

    Attributes:
      files: digest of the release files' paths, sizes and modification times (set by
        ``ReleaseBuilder.resolve_config``); a new digest is a new prepared copy.
    """

    name: str = ""
    files: str = ""

    def __post_init__(self):
        if not self.name:
            blob = json.dumps(self.knobs(), sort_keys=True)
            self.name = f"release_{hashlib.sha256(blob.encode('utf-8')).hexdigest()[:10]}"

    def knobs(self) -> dict[str, Any]:
        """The fields that change the built data (TFDS's own fields left out)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if f.name not in _TFDS_FIELDS and f.name != "name"}


_TFDS_FIELDS = frozenset(f.name for f in dataclasses.fields(tfds.core.BuilderConfig))


@dataclasses.dataclass(eq=False)
class TrainingSetConfig(ReleaseConfig):
    """A training set's config.

    Attributes:
      benchmarks_dir: a directory with one subdirectory per benchmark of
        ``benchmarks.BENCHMARKS``, each holding that benchmark's release file (the
        layout of ``task.manual_dir`` for each); problems of the training set found in
        any of them are dropped. ``""`` decontaminates against nothing (the info says so).
    """

    benchmarks_dir: str = ""


def fingerprint(paths: Sequence[epath.Path]) -> str:
    """A digest of each file's path, size and modification time (nanoseconds for a
    local file; a remote file system's own resolution otherwise)."""
    identity = []
    for path in paths:
        if "://" in str(path):
            stat = path.stat()
            identity.append((str(path), stat.length, stat.mtime))
        else:
            stat = os.stat(path)
            identity.append((os.path.abspath(path), stat.st_size, stat.st_mtime_ns))
    return hashlib.sha256(json.dumps(identity).encode("utf-8")).hexdigest()[:16]


class ReleaseBuilder(tfds.core.GeneratorBasedBuilder, skip_registration=True):
    """A builder over one release file; subclasses set the class attributes and
    ``examples``.

    Attributes:
      FILES: the accepted release files, the first present is read.
      SPLITS: the splits the release has.
      HOMEPAGE: where the data set is described.
    """

    VERSION = tfds.core.Version("1.0.0")
    RELEASE_NOTES = {"1.0.0": "First release."}
    BUILDER_CONFIG_CLASS: ClassVar[type] = ReleaseConfig
    FILES: ClassVar[tuple[ReleaseFile, ...]] = ()
    SPLITS: ClassVar[tuple[str, ...]] = ("test",)
    HOMEPAGE: ClassVar[str] = ""

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        cls.MANUAL_DOWNLOAD_INSTRUCTIONS = "Copy into manual_dir " + " or ".join(
            f"{f.name} (published at {f.url})" for f in cls.FILES) + "."

    @classmethod
    @abc.abstractmethod
    def examples(cls, path: epath.Path, split: str) -> Iterator[dict[str, Any]]:
        """The examples of `split` read from the release file at `path`."""

    def extra_features(self) -> dict[str, tfds.features.FeatureConnector]:
        """Features beyond the shared example contract (none by default)."""
        return {}

    @classmethod
    def release_file(cls, manual_dir: epath.PathLike | None) -> epath.Path:
        """The release file in `manual_dir`: the first of ``FILES`` present.

        Raises:
          FileNotFoundError: none is there; the message names each accepted file and
            where it is published.
        """
        directory = epath.Path(manual_dir) if manual_dir else None
        for release in cls.FILES:
            if directory is not None and (directory / release.name).exists():
                return directory / release.name
        wanted = " or ".join(f"{f.name} (published at {f.url})" for f in cls.FILES)
        raise FileNotFoundError(
            f"{cls.name}: expected {wanted} in task.manual_dir={str(manual_dir or '')!r}; "
            "copy the official file there (nothing is downloaded at run time)")

    @classmethod
    def input_files(cls, config: ReleaseConfig,
                    manual_dir: epath.PathLike | None) -> list[epath.Path]:
        """Every file a build with `config` reads (the release file; for a training set
        also the benchmarks' files)."""
        del config
        return [cls.release_file(manual_dir)]

    @classmethod
    def resolve_config(cls, config: ReleaseConfig | None,
                       manual_dir: epath.PathLike | None) -> ReleaseConfig:
        """`config` (the default one when None) keyed on the identity of its input files."""
        config = config if config is not None else cls.BUILDER_CONFIG_CLASS()
        knobs = {**config.knobs(), "files": fingerprint(cls.input_files(config, manual_dir))}
        return type(config)(**knobs)

    def _info(self) -> tfds.core.DatasetInfo:
        return tfds.core.DatasetInfo(
            builder=self, description=type(self).__doc__, homepage=self.HOMEPAGE,
            features=_records.example_features(**self.extra_features()),
            metadata=tfds.core.MetadataDict(),
            disable_shuffling=True)   # the published order: eval.num_prompts takes a prefix

    def _split_generators(self, dl_manager):
        path = self.release_file(dl_manager.manual_dir)
        excluded = self.excluded_problems()
        # Only a train split is decontaminated (MATH's test split holds MATH-500).
        return {split: self._generate_examples(path, split,
                                               excluded if split == "train" else None)
                for split in self.SPLITS}

    def _generate_examples(self, path: epath.Path, split: str, excluded: set[str] | None):
        kept, counts = select(self.examples(path, split), excluded or set())
        # Written with the dataset's info once every split is generated.
        against = self.benchmarks() if excluded is not None else []
        self.info.metadata[split] = {**counts, "decontaminated_against": against}
        yield from enumerate(kept)

    def excluded_problems(self) -> set[str]:
        """``problem_key``s of the problems a training split must not hold (none here)."""
        return set()

    def benchmarks(self) -> list[str]:
        """The benchmarks the splits are decontaminated against (none here)."""
        return []


def select(examples: Iterator[dict[str, Any]],
           excluded: set[str]) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """The examples with their first copy of each problem kept, those without an answer
    and the problems in `excluded` dropped, and the counts: ``rows`` read,
    ``duplicates``, ``no_answer`` and ``contaminated`` dropped, ``kept``."""
    kept, seen = [], set()
    counts = {"rows": 0, "duplicates": 0, "no_answer": 0, "contaminated": 0}
    for example in examples:
        counts["rows"] += 1
        key = problem_key(example["question"])
        if not example["answer"]:
            counts["no_answer"] += 1
        elif key in seen:
            counts["duplicates"] += 1
        elif key in excluded:
            counts["contaminated"] += 1
            seen.add(key)
        else:
            seen.add(key)
            kept.append(example)
    counts["kept"] = len(kept)
    return kept, counts
