"""A sweep's runs as the report reads them: each run's ``sweep_run.json`` and metric rows
(`load_runs`), grouped by sweep entry (`entries_of`), and the copy of those small files that
a sweep commits (`collect_runs`).
"""

import dataclasses
import functools
import gzip
import io
import json
import math
from typing import Any

import ml_collections

from grpo_jax import paths, run_files, sweep
from grpo_jax.run_files import read_metrics


def recorded_config(record: dict[str, Any]) -> dict[str, Any]:
    """A run record's config, with ``critic.pretrain_steps`` 0 where the record predates
    the field: a run recorded before value pre-training existed had none, and the committed
    ablations' records are read as they were written."""
    config = dict(record["config"])
    critic = dict(config.get("critic") or {})
    critic.setdefault("pretrain_steps", 0)
    config["critic"] = critic
    return config


@dataclasses.dataclass(frozen=True)
class RunData:
    """One run's record (``sweep_run.json``) and metric rows, in step order."""

    path: str                     # its workdir, relative to the sweep's root
    record: dict[str, Any]
    rows: tuple[dict[str, float], ...]

    @functools.cached_property   # building the ConfigDict is most of a report's time
    def final_step(self):
        return sweep.final_step(ml_collections.ConfigDict(recorded_config(self.record)))

    @property
    def finished(self):
        return bool(self.rows) and self.rows[-1]["step"] == self.final_step

    def values(self, metric):
        """`(steps, values)` of the rows that logged `metric`; a NaN counts as not logged
        (the metric is undefined at that step: ``explained_variance`` when every return of
        the batch is equal). ``"a - b"`` is the difference of two metrics at the steps that
        logged both (e.g. ``"response_length_wrong - response_length_correct"``)."""
        names = metric.split(" - ")
        if len(names) == 2:
            rows = [r for r in self.rows if all(n in r and not _is_nan(r[n]) for n in names)]
            return [r["step"] for r in rows], [r[names[0]] - r[names[1]] for r in rows]
        rows = [r for r in self.rows if metric in r and not _is_nan(r[metric])]
        return [r["step"] for r in rows], [r[metric] for r in rows]


def _is_nan(value):
    return isinstance(value, float) and math.isnan(value)


def run_records(root):
    """The ``sweep_run.json`` files at any depth under `root` (local or in a bucket), in
    path order; the runs' checkpoints are not looked into."""
    records = []
    for folder, folders, files in paths.walk(root):
        if run_files.RUN_RECORD in files:
            records.append(folder / run_files.RUN_RECORD)
        if run_files.CHECKPOINTS in folders:
            folders.remove(run_files.CHECKPOINTS)
    return sorted(records, key=str)


def collect_runs(root, dest):
    """Copies what the report reads, each run's sweep_run.json and its metrics.jsonl
    (gzipped, with no name or time in the header, so the same rows give the same bytes),
    from `root` into `dest` with the same layout: the small part of a sweep, to commit."""
    for record_path in run_records(root):
        target = paths.path(dest) / record_path.parent.relative_to(paths.path(root))
        paths.write_whole(target / run_files.RUN_RECORD, record_path.read_bytes())
        metrics = record_path.parent / run_files.METRICS
        if metrics.exists():
            packed = io.BytesIO()
            with gzip.GzipFile(filename="", mode="wb", fileobj=packed, mtime=0) as f:
                f.write(metrics.read_bytes())
            paths.write_whole(target / run_files.METRICS_GZ, packed.getvalue())


def load_runs(root):
    """Every run under `root` with a ``sweep_run.json``, by (entry, seed)."""
    runs = []
    for record_path in run_records(root):
        record = json.loads(record_path.read_text(encoding="utf-8"))
        runs.append(RunData(str(record_path.parent.relative_to(paths.path(root))), record,
                            read_metrics(record_path.parent)))
    if not runs:
        raise FileNotFoundError(f"no {run_files.RUN_RECORD} under {root}: point at the "
                                "--workdir_root of a grpo_jax.sweep run")
    configs = sorted({run.record["sweep_config"] for run in runs})
    if len(configs) > 1:
        raise ValueError(f"{root} holds runs of several sweep configs {configs}; report one "
                         "sweep's root at a time")
    return sorted(runs, key=lambda run: (run.record["entry"], run.record["seed"]))


def entries_of(runs):
    """`[(entry index, entry name, overrides, [its runs])]` in the sweep's order."""
    entries = {}
    for run in runs:
        r = run.record
        entry = entries.setdefault(r["entry"], (r["entry"], r["entry_name"], r["overrides"], []))
        entry[3].append(run)
    return [entries[k] for k in sorted(entries)]
