"""Reading official files from a TFDS ``manual_dir`` (nothing downloads at run time)."""

import dataclasses
import gzip
import hashlib
import json
from collections.abc import Callable, Iterator, Sequence
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


def read_jsonl(manual_dir: epath.PathLike, filename: str, *, dataset: str, fields: set[str],
               convert: Callable[[dict[str, Any]], dict[str, Any]]
               ) -> Iterator[tuple[int, dict[str, Any], dict[str, Any]]]:
    """Yields ``(line_number, row, convert(row))`` for each non-empty line of
    ``manual_dir/filename`` (gzip-compressed when the name ends in ``.gz``).

    Raises:
      FileNotFoundError: the file is not in ``manual_dir``.
      ValueError: the file is not UTF-8, or a line is not a JSON object with ``fields``
        that `convert` takes (not the official format); the message names
        ``path:line``.
    """
    path = epath.Path(manual_dir) / filename
    if not path.exists():
        raise FileNotFoundError(
            f"{dataset}: {path} not found; copy the official {filename} into the "
            f"manual_dir passed to data_source(..., manual_dir=...)")
    data = path.read_bytes()
    try:
        text = (gzip.decompress(data) if filename.endswith(".gz") else data).decode("utf-8")
    except UnicodeDecodeError as error:
        raise ValueError(f"{dataset}: {path} is not UTF-8 text ({error}); copy the official "
                         f"{filename} again") from error
    for line_number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        where = f"{dataset}: {path}:{line_number}"
        try:
            row = json.loads(line)
        except ValueError as error:
            raise ValueError(f"{where} is not JSON ({error}); expected the official "
                             f"format, one object per line") from error
        if not isinstance(row, dict):
            raise ValueError(f"{where} is a JSON {type(row).__name__}, not an object; "
                             f"expected the official format with fields {sorted(fields)}")
        missing = fields - row.keys()
        if missing:
            raise ValueError(
                f"{where} lacks {sorted(missing)}; expected the official format with fields "
                f"{sorted(fields)}")
        try:
            example = convert(row)
        except (ValueError, TypeError, AttributeError, KeyError) as error:
            raise ValueError(f"{where}: {type(error).__name__}: {error}; expected the "
                             "official format") from error
        yield line_number, row, example
