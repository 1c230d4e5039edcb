"""Reading official files from a TFDS ``manual_dir`` (nothing downloads at run time)."""

import dataclasses
import hashlib
import json
from collections.abc import Iterator, Sequence
from typing import Any

import tensorflow_datasets as tfds
from etils import epath


@dataclasses.dataclass(eq=False)
class FilesConfig(tfds.core.BuilderConfig):
    """The builder config of a dataset read from official files: named after their
    contents (``files_<digest>``), so a build is reused only for the same files, and
    other or edited files in ``manual_dir`` build anew beside it under ``data_dir``."""


def files_config(manual_dir: epath.PathLike, filenames: Sequence[str]) -> FilesConfig:
    """The `FilesConfig` of `filenames` in `manual_dir`: a SHA-256 of each file's name and
    bytes (a missing file counts as missing; the build then says which).

    >>> files_config("/nonexistent", ["test.jsonl"]).name
    'files_e06155fc39a0'
    """
    digest = hashlib.sha256()
    for filename in sorted(filenames):
        path = epath.Path(manual_dir) / filename
        digest.update(filename.encode("utf-8") + b"\0")
        digest.update(hashlib.sha256(path.read_bytes()).digest() if path.exists() else b"-")
    return FilesConfig(name=f"files_{digest.hexdigest()[:12]}",
                       description=f"built from {', '.join(sorted(filenames))} of {manual_dir}")


def read_jsonl(manual_dir: epath.PathLike, filename: str, *, dataset: str,
               fields: set[str]) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yields ``(line_number, row)`` for each non-empty line of ``manual_dir/filename``.

    Raises:
      FileNotFoundError: the file is not in ``manual_dir``.
      ValueError: a row lacks one of ``fields`` (not the official format).
    """
    path = epath.Path(manual_dir) / filename
    if not path.exists():
        raise FileNotFoundError(
            f"{dataset}: {path} not found; copy the official {filename} into the "
            f"manual_dir passed to data_source(..., manual_dir=...)")
    for line_number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        row = json.loads(line)
        missing = fields - row.keys()
        if missing:
            raise ValueError(
                f"{dataset}: {path}:{line_number} lacks {sorted(missing)}; expected the "
                f"official format with fields {sorted(fields)}")
        yield line_number, row
