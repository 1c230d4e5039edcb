"""A run's files: their names in its workdir, and the one reader of its metrics.

A run's workdir (``python -m grpo_jax.main --workdir=DIR``, local or ``gs://``) holds:

- `METRICS` (``metrics.jsonl``): one JSON row a logged step, ``{"step": N, name: value}``,
  appended by `grpo_jax.training.metrics.MetricWriter`; a sweep's collected copy of it is
  `METRICS_GZ` (gzipped, `grpo_jax.report.collect_runs`);
- `CONFIG`, the run's config; `CHECKPOINTS`, `EXPORT`, `ROLLOUTS` and `TENSORBOARD`, folders;
- `EVAL` and `EVAL_SUITE` / `EVAL_SUITE_TABLE`: the held-out evaluation of a run's export;
- for a run started by `grpo_jax.sweep`: `RUN_RECORD` (its entry, seed, command and config)
  and `LOG` (its output).

`read_metrics` and `last_logged_step` are how the sweep, the report, the tests and the
experiments read a metrics file; `parse_rows` is the rule they and the trainer's resume
share for a line that is not a row. This module imports no jax, so the sweep and the report
stay light.
"""

import dataclasses
import gzip
import json
import os
from typing import Any

from grpo_jax import _extras

_extras.require("grpo_jax.run_files")   # before the imports it guards

from grpo_jax import paths  # noqa: E402

METRICS = "metrics.jsonl"
METRICS_GZ = METRICS + ".gz"
CONFIG = "config.json"
CHECKPOINTS = "checkpoints"
EXPORT = "export"
ROLLOUTS = "rollouts"
TENSORBOARD = "tensorboard"
EVAL = "eval.json"
EVAL_SUITE = "eval_suite.json"
EVAL_SUITE_TABLE = "eval_suite.md"
RUN_RECORD = "sweep_run.json"
LOG = "train.log"


@dataclasses.dataclass(frozen=True)
class TornLine:
    """A metrics file's last line that is not a whole row: an append cut short."""

    number: int   # 1-based line number
    line: str
    error: str    # the parse error's type name, e.g. "JSONDecodeError"


def parse_rows(text: str | None, name: str = METRICS) -> tuple[list, TornLine | None]:
    """The rows of a metrics file's `text` (read from the file `name`), in file order.

    Blank lines are skipped. A last line that is not a whole row (an append cut short: a
    killed run, a full disk, a lost machine) is returned apart as a `TornLine` and not
    parsed: the trainer drops it on resume and redoes its step. Any other line that is not
    a row is an error naming the file and the line.

    Returns:
      `([(line, row)], torn last line or None)`: each row a dict with at least "step".
    """
    lines = (text or "").splitlines()
    rows = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            row["step"]   # a row names its step (KeyError, or TypeError for a non-dict)
        except (ValueError, TypeError, KeyError) as error:
            if number == len(lines):
                return rows, TornLine(number, line, type(error).__name__)
            raise ValueError(
                f"{name}:{number} is not a metrics row ({type(error).__name__}: {error}); "
                f"fix or delete that line, or move {name} aside, and re-run") from error
        rows.append((line, row))
    return rows, None


def _metrics_file(path_or_workdir):
    """`(the metrics file to read, or None, whether it is gzipped)`."""
    location = paths.path(path_or_workdir)
    if location.name.endswith((".jsonl", ".jsonl.gz")):
        return location, location.name.endswith(".gz")
    for name in (METRICS, METRICS_GZ):
        if (location / name).exists():
            return location / name, name == METRICS_GZ
    return None, False


def read_metrics(path_or_workdir: str | os.PathLike) -> tuple[dict[str, Any], ...]:
    """The metric rows of a run, in step order (a stable sort: file order within a step).

    Args:
      path_or_workdir: a metrics file (a name ending in ``.jsonl``, or ``.jsonl.gz`` for a
        gzipped one) or a run's workdir, whose `METRICS`, else `METRICS_GZ`, is read; local
        or in a bucket.

    Returns:
      The rows; () for a workdir with neither file, and for an empty file. A torn last line
      (a killed run's cut append, `parse_rows`) is left out, as the trainer's resume drops
      it. FileNotFoundError for a named file that does not exist; ValueError naming the
      file and line for a line before the last that is not a row.
    """
    path, gzipped = _metrics_file(path_or_workdir)
    if path is None:
        return ()
    text = (gzip.decompress(path.read_bytes()).decode("utf-8") if gzipped
            else path.read_text(encoding="utf-8"))
    rows, _ = parse_rows(text, os.fspath(path))
    return tuple(sorted((row for _, row in rows), key=lambda r: r["step"]))


def last_logged_step(path_or_workdir: str | os.PathLike) -> int | None:
    """The step of the run's last metrics row (`read_metrics`), or None when it has none."""
    rows = read_metrics(path_or_workdir)
    return rows[-1]["step"] if rows else None
