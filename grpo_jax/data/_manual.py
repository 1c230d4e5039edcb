"""Reading official files from a TFDS ``manual_dir`` (nothing downloads at run time)."""

import gzip
import json
from collections.abc import Iterator
from typing import Any

from etils import epath


def read_jsonl(manual_dir: epath.PathLike, filename: str, *, dataset: str,
               fields: set[str]) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yields ``(line_number, row)`` for each non-empty line of ``manual_dir/filename``
    (gzip-compressed when the name ends in ``.gz``).

    Raises:
      FileNotFoundError: the file is not in ``manual_dir``.
      ValueError: a row lacks one of ``fields`` (not the official format).
    """
    path = epath.Path(manual_dir) / filename
    if not path.exists():
        raise FileNotFoundError(
            f"{dataset}: {path} not found; copy the official {filename} into the "
            f"manual_dir passed to data_source(..., manual_dir=...)")
    data = path.read_bytes()
    text = (gzip.decompress(data) if filename.endswith(".gz") else data).decode("utf-8")
    for line_number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        row = json.loads(line)
        missing = fields - row.keys()
        if missing:
            raise ValueError(
                f"{dataset}: {path}:{line_number} lacks {sorted(missing)}; expected the "
                f"official format with fields {sorted(fields)}")
        yield line_number, row
