"""A sweep's runs -> ``report.md`` and PNG plots, the same bytes every time.

    python -m grpo_jax.report runs/clip_higher [--out OUT]
    python -m grpo_jax.report runs/clip_higher --collect_into experiments/ablations/clip_higher

Reads every run under DIR that `grpo_jax.sweep` started (its ``sweep_run.json`` and
``metrics.jsonl``, or ``metrics.jsonl.gz``; the checkpoints are not needed), groups the
runs by sweep entry and writes to OUT (default DIR). ``--collect_into`` first copies
those small files into a new directory (`collect_runs`) and reports there, so the
directory holds everything needed to regenerate its report. It writes:

- ``report.md``: the sweep config's docstring (the claim), the commands that make the
  runs and the report, the commits and machines the runs ran on, and a table with one
  row per entry: its swept fields, its seeds and, for each measure, the mean over seeds
  ± their sample standard deviation;
- one PNG per plot: each entry's mean over seeds against the step, or against a metric
  accumulated over steps (generated tokens, seconds), with a band from the lowest to the
  highest seed;
- with a ``"tuned"`` entry in ``get_report()``, a comparison of methods each at its own
  best setting: the candidates of each method ranked by a training measure (never a
  held-out one), the pick, and the picks' paired differences (`tuned_lines`);
- with a ``"frontier"`` entry in ``get_report()``, a stability frontier: which runs
  collapsed, the share of seeds that did per cell of a grid of swept fields, as tables and
  heat maps (`report_frontier`).

The measures and plots come from the sweep config's ``get_report()`` (`DEFAULT_REPORT`
when it has none)::

    def get_report():
        return {"table": (("eval_accuracy", "final"), ("clip_high", "mean")),
                "plots": (("entropy", "step"), ("eval_accuracy", "generated_tokens")),
                "labels": ("0.2/0.2", "0.2/0.28"),   # optional: one name per entry
                "primary": ("eval_accuracy", "last_k")}   # the ablation's one primary outcome

A measure reduces one run's metric over the steps that logged it (a NaN, a metric
undefined at its step, counts as not logged): "final" (the last
value), "early" / "late" (the mean of the first / last fifth of the values, rounded up),
"mean", "sum", "std" (the population standard deviation over steps), "cv" (that std over
the mean), "last_k" (the mean of the last ``last_k`` values) or "auc" (the trapezoid mean
over the logged steps). Beside ``("eval_accuracy", "final")`` the table always shows
``("eval_accuracy", "last_k")``, the per-seed value the paired comparisons take, as the
mean over seeds with its t-interval (5 seeds or more) or the seeds' range (fewer).

The **primary outcome** (``"primary"``: one paired measure, default the first of them;
``"collapse"`` for a stability frontier) is named in the sweep config before
its runs. Its rows are tested with the exact sign-flip test, Holm-adjusted across the rows
of the ablation, and read from the adjusted p; every other measure is secondary, its p
unadjusted and its reading marked so (`report_stats`).
A plot's x is "step", a metric whose running sum over steps is the x
(``"generated_tokens"``), or a tuple of metrics whose per-step sum is accumulated. At
each step the curve is the mean over seeds of x and of y, over the steps that every seed
of the entry logged.

Only finished runs enter the table and the plots: those whose metrics.jsonl reaches the
config's last step. The others are listed. Nothing in the output depends on anything but
the runs' files and the config's `get_report()`: rows follow the sweep's entry order,
PNGs are drawn by Agg in matplotlib's default style with no software or time metadata,
so the same runs give the same bytes (with the same matplotlib and FreeType).
"""

import argparse
import dataclasses
import functools
import gzip
import inspect
import json
import math
import io
import pathlib
import re
import sys
from typing import Any

from grpo_jax import _extras

_extras.require("grpo_jax.report")   # before the imports it guards

import ml_collections
import numpy as np

from grpo_jax import config_lib, paths, report_frontier, report_stats, sweep

DEFAULT_REPORT = {
    "table": (("eval_accuracy", "final"), ("accuracy", "final"), ("reward_mean", "mean")),
    "plots": (("eval_accuracy", "step"), ("reward_mean", "step")),
}
# What the paired comparisons take when get_report() leaves them out.
DEFAULT_PAIRED = (("eval_accuracy", "last_k"), ("eval_accuracy", "auc"))
# The primary outcome when get_report() names none (every committed ablation names its own).
DEFAULT_PRIMARY = ("eval_accuracy", "last_k")
COLLAPSE = "collapse"                  # the primary outcome of a stability frontier
DEFAULT_LAST_K = 3                     # evaluations averaged by the "last_k" measure
# The main table summarises this metric, beside its final value, by the mean of each run's
# last k evaluations (the per-seed value the paired comparisons take), with its interval.
SUMMARY_METRIC = "eval_accuracy"
DEFAULT_GAPS = {"eval_accuracy": 0.05}   # gaps the power and seeds-needed are computed for
REDUCTIONS = {
    "final": lambda v: v[-1],
    "early": lambda v: np.mean(v[:-(-len(v) // 5)]),   # the first fifth (rounded up)
    "late": lambda v: np.mean(v[len(v) - -(-len(v) // 5):]),   # the last fifth
    "mean": np.mean,
    "sum": np.sum,
    "std": np.std,
    "cv": lambda v: np.std(v) / np.mean(v),   # std over steps / mean over steps
}
# Measures that need more than the values: the report's last_k, and the steps.
CURVE_REDUCTIONS = ("last_k", "auc")
REPO = pathlib.Path(__file__).resolve().parents[1]


@dataclasses.dataclass(frozen=True)
class RunData:
    """One run's record (``sweep_run.json``) and metric rows, in step order."""

    path: str                     # its workdir, relative to the sweep's root
    record: dict[str, Any]
    rows: tuple[dict[str, float], ...]

    @functools.cached_property   # building the ConfigDict is most of a report's time
    def final_step(self):
        return sweep.final_step(ml_collections.ConfigDict(self.record["config"]))

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


def read_metrics(workdir):
    """The rows of the run's metrics.jsonl, or of its gzipped copy (`collect_runs`), in
    step order; () when it has neither."""
    path = paths.path(workdir) / "metrics.jsonl"
    packed = path.with_suffix(".jsonl.gz")
    if path.exists():
        text = path.read_text(encoding="utf-8")
    elif packed.exists():
        text = gzip.decompress(packed.read_bytes()).decode("utf-8")
    else:
        return ()
    rows = [json.loads(line) for line in text.splitlines() if line.strip()]
    return tuple(sorted(rows, key=lambda r: r["step"]))


def run_records(root):
    """The ``sweep_run.json`` files at any depth under `root` (local or in a bucket), in
    path order; the runs' checkpoints are not looked into."""
    records = []
    for folder, folders, files in paths.walk(root):
        if sweep.RUN_RECORD in files:
            records.append(folder / sweep.RUN_RECORD)
        if "checkpoints" in folders:
            folders.remove("checkpoints")
    return sorted(records, key=str)


def collect_runs(root, dest):
    """Copies what the report reads, each run's sweep_run.json and its metrics.jsonl
    (gzipped, with no name or time in the header, so the same rows give the same bytes),
    from `root` into `dest` with the same layout: the small part of a sweep, to commit."""
    for record_path in run_records(root):
        target = paths.path(dest) / record_path.parent.relative_to(paths.path(root))
        paths.write_whole(target / sweep.RUN_RECORD, record_path.read_bytes())
        metrics = record_path.parent / "metrics.jsonl"
        if metrics.exists():
            packed = io.BytesIO()
            with gzip.GzipFile(filename="", mode="wb", fileobj=packed, mtime=0) as f:
                f.write(metrics.read_bytes())
            paths.write_whole(target / "metrics.jsonl.gz", packed.getvalue())


def load_runs(root):
    """Every run under `root` with a ``sweep_run.json``, by (entry, seed)."""
    runs = []
    for record_path in run_records(root):
        record = json.loads(record_path.read_text(encoding="utf-8"))
        runs.append(RunData(str(record_path.parent.relative_to(paths.path(root))), record,
                            read_metrics(record_path.parent)))
    if not runs:
        raise FileNotFoundError(f"no {sweep.RUN_RECORD} under {root}: point at the "
                                "--workdir_root of a grpo_jax.sweep run")
    configs = sorted({run.record["sweep_config"] for run in runs})
    if len(configs) > 1:
        raise ValueError(f"{root} holds runs of several sweep configs {configs}; report one "
                         "sweep's root at a time")
    return sorted(runs, key=lambda run: (run.record["entry"], run.record["seed"]))


def config_module(spec):
    """The sweep config's module, found from here or from the repository root."""
    path = pathlib.Path(spec.partition(":")[0])
    for candidate in (path, REPO / path):
        if candidate.is_file():
            return config_lib.load_module(candidate)
    raise FileNotFoundError(f"the sweep's config {str(path)!r} is neither here nor in {REPO}; "
                            "run the report from the repository root")


def report_spec(module, num_entries):
    """The module's `get_report()` (or `DEFAULT_REPORT`), checked and in full form."""
    raw = module.get_report() if hasattr(module, "get_report") else DEFAULT_REPORT
    pair = lambda item, default: (item, default) if isinstance(item, str) else tuple(item)
    table = with_summary([pair(item, "final") for item in raw.get("table", ())])
    plots = [pair(item, "step") for item in raw.get("plots", ())]
    paired = [pair(item, "last_k") for item in raw.get("paired", DEFAULT_PAIRED)]
    for key, measures in (("table", table), ("paired", paired)):
        for metric, how in measures:
            if how not in REDUCTIONS and how not in CURVE_REDUCTIONS:
                raise ValueError(f"get_report() {key} measure ({metric!r}, {how!r}): the "
                                 "reduction must be one of "
                                 f"{sorted(REDUCTIONS) + list(CURVE_REDUCTIONS)}")
    last_k = raw.get("last_k", DEFAULT_LAST_K)
    if not isinstance(last_k, int) or isinstance(last_k, bool) or last_k < 1:
        raise ValueError(f"get_report() last_k={last_k!r}: give the number of final "
                         "evaluations to average, an int >= 1")
    gaps = dict(raw.get("gaps", DEFAULT_GAPS))
    for metric, gap in gaps.items():
        if not isinstance(gap, (int, float)) or gap <= 0:
            raise ValueError(f"get_report() gaps[{metric!r}]={gap!r}: give the difference "
                             "to detect, a number > 0")
    labels = raw.get("labels")
    if labels is not None and len(labels) != num_entries:
        raise ValueError(f"get_report() gives {len(labels)} labels for {num_entries} sweep "
                         "entries; give one per entry, in get_sweep() order")
    unknown = set(raw) - {"table", "plots", "labels", "paired", "last_k", "gaps", "frontier",
                          "tuned", "primary", "windows"}
    if unknown:
        raise ValueError(f"get_report() has unknown keys {sorted(unknown)}; it takes table, "
                         "plots, labels, paired, last_k, gaps, frontier, tuned, primary and "
                         "windows")
    windows = parse_windows(raw["windows"]) if "windows" in raw else None
    frontier = report_frontier.parse(raw["frontier"]) if "frontier" in raw else None
    tuned = parse_tuned(raw["tuned"], num_entries) if "tuned" in raw else None
    primary = parse_primary(raw.get("primary", paired[0] if paired else DEFAULT_PRIMARY),
                            paired, frontier)
    return ReportSpec(table, plots, labels, paired, last_k, gaps, frontier, tuned, primary,
                      windows)


def parse_windows(raw):
    """``{"size": steps, "measures": (metric, ...)}`` checked: the mechanism table."""
    if not isinstance(raw, dict) or set(raw) != {"size", "measures"}:
        raise ValueError("get_report() windows: give {'size': steps per window, 'measures': "
                         f"(metric, ...)}}, got {raw!r}")
    size = raw["size"]
    if not isinstance(size, int) or isinstance(size, bool) or size < 1:
        raise ValueError(f"get_report() windows size={size!r}: give the steps per window, an "
                         "int >= 1")
    measures = (raw["measures"],) if isinstance(raw["measures"], str) else tuple(raw["measures"])
    if not measures:
        raise ValueError("get_report() windows: name at least one measure")
    return WindowSpec(size, measures)


def parse_primary(raw, paired, frontier):
    """The primary outcome: ``"collapse"`` (a frontier's) or a (metric, how) pair that is
    one of the paired measures (moved first in `paired`, in place)."""
    if raw == COLLAPSE:
        if frontier is None:
            raise ValueError("get_report() primary='collapse' needs a 'frontier' entry")
        return COLLAPSE
    if isinstance(raw, str) or len(raw) != 2:
        raise ValueError(f"get_report() primary={raw!r}: give one (metric, how) pair of the "
                         "paired measures, e.g. ('eval_accuracy', 'last_k'), or 'collapse'")
    primary = tuple(raw)
    if paired and primary not in paired:
        raise ValueError(f"get_report() primary={primary!r} is not one of the paired measures "
                         f"{paired}: add it to 'paired'")
    if paired:
        paired.insert(0, paired.pop(paired.index(primary)))
    return primary


def parse_tuned(raw, num_entries):
    """``{"by": (metric, how), "methods": ((name, (entry index, ...)), ...)}`` checked."""
    if not isinstance(raw, dict) or set(raw) != {"by", "methods"}:
        raise ValueError("get_report() tuned: give {'by': (metric, how), 'methods': "
                         "((name, (entry index, ...)), ...)}")
    metric, how = raw["by"]
    if how not in REDUCTIONS and how not in CURVE_REDUCTIONS:
        raise ValueError(f"get_report() tuned by ({metric!r}, {how!r}): the reduction must be "
                         f"one of {sorted(REDUCTIONS) + list(CURVE_REDUCTIONS)}")
    if metric.startswith("eval_"):
        raise ValueError(f"get_report() tuned by {metric!r}: pick each method's setting by a "
                         "training measure (e.g. ('reward_mean', 'late')), not by the held-out "
                         "evaluation the comparison then reports")
    methods = tuple((str(name), tuple(int(i) for i in indices))
                    for name, indices in raw["methods"])
    if len(methods) < 2 or any(not indices for _, indices in methods):
        raise ValueError("get_report() tuned methods: give at least two methods, each with "
                         "at least one entry index")
    used = [i for _, indices in methods for i in indices]
    if len(set(used)) != len(used) or not all(0 <= i < num_entries for i in used):
        raise ValueError(f"get_report() tuned methods {methods}: each entry index (0 .. "
                         f"{num_entries - 1}, get_sweep() order) belongs to one method")
    return TunedSpec((metric, how), methods)


def with_summary(table):
    """`table` with (`SUMMARY_METRIC`, "last_k") right after (`SUMMARY_METRIC`, "final"),
    unless the table already lists it (then it stays where it is)."""
    final, summary = (SUMMARY_METRIC, "final"), (SUMMARY_METRIC, "last_k")
    if final not in table or summary in table:
        return table
    at = table.index(final) + 1
    return table[:at] + [summary] + table[at:]


@dataclasses.dataclass(frozen=True)
class ReportSpec:
    """`get_report()` in full form: (metric, how) pairs, and the statistics' settings."""

    table: list
    plots: list
    labels: Any
    paired: list
    last_k: int
    gaps: dict
    frontier: Any = None   # report_frontier.Frontier, or None
    tuned: Any = None      # TunedSpec, or None
    primary: Any = DEFAULT_PRIMARY   # (metric, how), or COLLAPSE
    windows: Any = None    # WindowSpec, or None


@dataclasses.dataclass(frozen=True)
class WindowSpec:
    """The mechanism table: each measure's mean over windows of `size` steps."""

    size: int
    measures: tuple


@dataclasses.dataclass(frozen=True)
class TunedSpec:
    """Methods compared each at its best entry: `by` = the (metric, how) that ranks a
    method's entries (mean over seeds, highest wins, the first on a tie), `methods` =
    ``((name, (entry index, ...)), ...)``; every pick is paired with the first method's."""

    by: tuple
    methods: tuple


# --- numbers ----------------------------------------------------------------------------

def reduce_run(run, metric, how, last_k=DEFAULT_LAST_K):
    """The run's `metric` reduced over its steps, or None when it never logged it:
    a `REDUCTIONS` entry, "last_k" (the mean of its last `last_k` values) or "auc" (its
    trapezoid mean over the logged steps, `report_stats.area_under_curve`)."""
    steps, values = run.values(metric)
    if not values:
        return None
    if how == "last_k":
        return report_stats.last_k_mean(values, last_k)
    if how == "auc":
        return report_stats.area_under_curve(steps, values)
    return float(REDUCTIONS[how](np.asarray(values, np.float64)))


def measure_name(metric, how, last_k):
    """A measure's column name: ``eval_accuracy (last 3)``."""
    return f"{metric} ({f'last {last_k}' if how == 'last_k' else how})"


def table_header(metric, how, last_k):
    """A main-table column's name; a last_k measure names its k and its interval:
    ``eval_accuracy (mean of last 3 evals; t-CI, or range under 5 seeds)``."""
    if how != "last_k":
        return measure_name(metric, how, last_k)
    what = "evals" if metric.startswith("eval_") else "values"
    return (f"{metric} (mean of last {last_k} {what}; t-CI, or range under "
            f"{report_stats.MIN_SEEDS_FOR_CI} seeds)")


def format_interval_cell(values):
    """``0.812 (95% t-CI [0.780, 0.850])`` with 5 seeds or more, ``0.812 (range [0.780,
    0.850] over 3 seeds)`` below: the mean over seeds of `values` [num_seeds] and its
    `report_stats.interval_text`; the mean alone for one seed."""
    if not values:
        return "–"
    mean = float(np.mean(values))
    digits = decimals_for([mean, *values])
    if len(values) == 1:
        return f"{mean:.{digits}f}"
    return f"{mean:.{digits}f} ({report_stats.interval_text(values, digits)})"


def summary_note(spec):
    """The table note's sentence on its last_k columns; "" when it has none."""
    if not any(how == "last_k" for _, how in spec.table):
        return ""
    k = spec.last_k
    return (f" A mean of last {k} column: each seed's mean of its last {k} values (the "
            "per-seed value the paired comparisons take), then the mean over seeds with its "
            f"{report_stats.LEVEL:.0%} t-interval over seeds when "
            f"{report_stats.MIN_SEEDS_FOR_CI} or more finished, else the seeds' range (an "
            "interval over fewer seeds is not a confidence interval).")


def mean_and_spread(values):
    """`(mean, sample std or None for one value)` of the seeds' values."""
    values = np.asarray(values, np.float64)
    return float(values.mean()), (float(values.std(ddof=1)) if len(values) > 1 else None)


def format_cell(values):
    """``0.600 ± 0.10``: the mean to 3 significant digits, the spread to 2."""
    if not values:
        return "–"
    mean, spread = mean_and_spread(values)
    text = _significant(mean, 3)
    return text if spread is None else f"{text} ± {_significant(spread, 2)}"


def _significant(x, digits):
    return f"{x:#.{digits}g}" if math.isfinite(x) and x != 0 else f"{x:g}"


def override_text(value):
    """A swept value as the table shows it."""
    if isinstance(value, (list, dict)):
        return json.dumps(value, separators=(", ", ": "))
    return sweep.flag_value(value)


def _markdown_cell(text):
    return str(text).replace("|", "\\|")


def field_headers(fields):
    """Leaf names for the swept fields, dotted names where two leaves coincide."""
    leaves = [f.rsplit(".", 1)[-1] for f in fields]
    return [leaf if leaves.count(leaf) == 1 else field for leaf, field in zip(leaves, fields)]


# --- the table --------------------------------------------------------------------------

def entries_of(runs):
    """`[(entry index, entry name, overrides, [its runs])]` in the sweep's order."""
    entries = {}
    for run in runs:
        r = run.record
        entry = entries.setdefault(r["entry"], (r["entry"], r["entry_name"], r["overrides"], []))
        entry[3].append(run)
    return [entries[k] for k in sorted(entries)]


def table_lines(entries, spec):
    fields = list(dict.fromkeys(f for _, _, overrides, _ in entries for f in overrides))
    header = (["variant"] if spec.labels else []) + field_headers(fields) + ["seeds"] + [
        table_header(metric, how, spec.last_k) for metric, how in spec.table]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for position, (_, _, overrides, runs) in enumerate(entries):
        done = [run for run in runs if run.finished]
        cells = ([spec.labels[position]] if spec.labels else []) + [
            f"`{override_text(overrides[f])}`" if f in overrides else "" for f in fields]
        cells.append(str(len(done)))
        for metric, how in spec.table:
            values = list(seed_values(done, metric, how, spec.last_k).values())
            cells.append((format_interval_cell if how == "last_k" else format_cell)(values))
        lines.append("| " + " | ".join(_markdown_cell(c) for c in cells) + " |")
    return lines


# --- paired comparisons -----------------------------------------------------------------

def seed_values(runs, metric, how, last_k):
    """``{seed: the measure}`` of the finished runs that logged `metric`."""
    values = {run.record["seed"]: reduce_run(run, metric, how, last_k)
              for run in runs if run.finished}
    return {seed: v for seed, v in values.items() if v is not None}


def decimals_for(values):
    """Decimals that show the largest of `values` to 3 significant digits (3 to 6)."""
    largest = max((abs(v) for v in values if math.isfinite(v)), default=0.0)
    if largest == 0:
        return 3
    return int(min(6, max(3, 2 - math.floor(math.log10(largest)))))


@dataclasses.dataclass(frozen=True)
class Comparison:
    """One paired comparison: `name` minus `reference` per seed on (metric, how)."""

    name: str
    reference: str
    metric: str
    how: str
    seeds: tuple
    differences: np.ndarray   # [len(seeds)], in seed order


def compare(reference_runs, runs, name, reference, metric, how, last_k):
    """The `Comparison` of `runs` minus `reference_runs` per seed on ``(metric, how)``."""
    seeds, diffs = report_stats.paired_differences(
        seed_values(reference_runs, metric, how, last_k), seed_values(runs, metric, how, last_k))
    return Comparison(name, reference, metric, how, tuple(seeds), diffs)


def paired_lines(entries, names, spec):
    """The paired-comparison table: every entry minus the first, per seed, for each of
    ``spec.paired``'s measures (the primary first), with the rows' statistics
    (`comparison_lines`)."""
    if len(entries) < 2 or not spec.paired:
        return []
    comparisons = [compare(entries[0][3], runs, name, names[0], metric, how, spec.last_k)
                   for metric, how in spec.paired
                   for (_, _, _, runs), name in zip(entries[1:], names[1:])]
    return comparison_lines(comparisons, spec) + [
        "", f"Each row: the variant minus {names[0]} on the same seed (a seed's variants start "
        "from the same SFT warm start), for the seeds both finished. " + paired_note(spec), ""]


def comparison_lines(comparisons, spec):
    """A markdown table of `comparisons`: per row its per-seed differences, their mean, the
    interval (a t-CI over 5 or more seeds, else the range), the exact sign-flip p, the
    Holm-adjusted p across the primary outcome's rows, the seeds a t-test needs for the
    metric's gap at the sd pooled over the rows of its measure, and the reading."""
    p_values = [report_stats.sign_flip_p(c.differences) if c.seeds else None
                for c in comparisons]
    is_primary = [(c.metric, c.how) == spec.primary for c in comparisons]
    adjusted = report_stats.holm([p if primary else None
                                  for p, primary in zip(p_values, is_primary)])
    pooled = {}
    for c in comparisons:
        key = (c.metric, c.how)
        if key not in pooled:
            pooled[key] = report_stats.pooled_sd([d.differences for d in comparisons
                                                  if (d.metric, d.how) == key])
    header = ["comparison", "measure", "seeds", "per-seed differences", "mean difference",
              "interval", "sign-flip p", "Holm p", "seeds for the gap", "reading"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for c, p, holm_p, primary in zip(comparisons, p_values, adjusted, is_primary):
        lines.append(comparison_row(c, p, holm_p, primary, pooled[(c.metric, c.how)], spec))
    return lines


def comparison_row(c, p, holm_p, primary, pooled, spec):
    """One markdown row of `comparison_lines`; `pooled` = (sd, df) of its measure's rows."""
    measure = measure_name(c.metric, c.how, spec.last_k) + (" (primary)" if primary else "")
    title = f"{c.name} − {c.reference}"
    if not c.seeds:
        cells = [title, measure, "0", "–", "–", "–", "–", "–", "–", "no seed finished both"]
        return "| " + " | ".join(_markdown_cell(x) for x in cells) + " |"
    diffs, n = c.differences, len(c.seeds)
    mean = float(diffs.mean())
    digits = decimals_for([*diffs, mean])
    gap, (sd, df) = spec.gaps.get(c.metric), pooled
    needed = power = None
    if gap is not None and sd is not None:
        needed = report_stats.seeds_needed(sd, gap)
        power = report_stats.paired_t_power(n, sd, gap) if n >= 2 else None
    reading = report_stats.verdict(c.name, c.reference, mean, holm_p if primary else p, n,
                                   adjusted=primary, power=power, gap=gap, digits=digits)
    cells = [title, measure, ", ".join(map(str, c.seeds)),
             ", ".join(f"{d:+.{digits}f}" for d in diffs), f"{mean:+.{digits}f}",
             report_stats.interval_text(diffs, digits), report_stats.format_p(p),
             report_stats.format_p(holm_p) if primary else "secondary",
             "–" if needed is None and sd is None else (
                 f"{needed or '> 10,000'} (gap {gap:g}, pooled sd {sd:.{digits}f}, df {df})"
                 if gap is not None else "–"),
             reading if primary else f"secondary: {reading}"]
    return "| " + " | ".join(_markdown_cell(x) for x in cells) + " |"


def paired_note(spec):
    """What a comparison row's columns mean."""
    primary = ("a stability frontier's collapse" if spec.primary == COLLAPSE
               else measure_name(*spec.primary, spec.last_k))
    return (f"The primary outcome (the sweep config's get_report()): "
            f"{primary}; every other measure is secondary (its p unadjusted, its reading "
            f"marked so). last {spec.last_k} = the mean of a run's last {spec.last_k} logged "
            "values (its last evaluations, for an eval metric); auc = the trapezoid area under "
            "the run's curve over its logged steps divided by their range. Interval: the "
            f"{report_stats.LEVEL:.0%} paired t-interval of the mean difference with "
            f"{report_stats.MIN_SEEDS_FOR_CI} or more seeds, else the range of the differences "
            "(not a confidence interval). Sign-flip p: the exact two-sided permutation test "
            "of the mean difference over every flip of the differences' signs (its smallest "
            "value with n seeds is 2/2^n: 0.25 at 3 seeds, 0.0625 at 5, 0.031 at 6). Holm p: "
            "that p Holm-adjusted across the primary outcome's rows of this table; a reading "
            f"says higher or lower only where it is below {report_stats.ALPHA:g}. Seeds for the "
            f"gap: the fewest seeds whose paired two-sided t-test at {report_stats.ALPHA:g} has "
            f"power {report_stats.POWER:g} for that gap (the noncentral t), at the sd pooled "
            "over this table's rows of the measure (ddof 1 each, its degrees of freedom "
            "given); power: the same test's power with the seeds at hand.")


def tuned_pick(entries, indices, by, last_k):
    """`(picked index, [(index, mean over seeds or None)])`: the entry of `indices` whose
    finished runs have the highest mean of the `by` measure (the first on a tie)."""
    scores = []
    for i in indices:
        values = list(seed_values(entries[i][3], *by, last_k).values())
        scores.append((i, float(np.mean(values)) if values else None))
    finished = [(i, score) for i, score in scores if score is not None]
    if not finished:
        return None, scores
    best = max(score for _, score in finished)
    return next(i for i, score in finished if score == best), scores


def tuned_lines(entries, names, spec):
    """Each method at its own best entry (ranked by ``spec.tuned.by``, a training measure),
    then every method's pick minus the first method's pick, per seed."""
    tuned = spec.tuned
    metric, how = tuned.by
    by_name = measure_name(metric, how, spec.last_k)
    header = ["method", "candidate", f"{by_name}, mean over seeds", "picked"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    picks = []
    for method, indices in tuned.methods:
        pick, scores = tuned_pick(entries, indices, tuned.by, spec.last_k)
        picks.append((method, pick))
        for i, score in scores:
            cells = [method, names[i], "–" if score is None else f"{score:.4f}",
                     "yes" if i == pick else ""]
            lines.append("| " + " | ".join(_markdown_cell(c) for c in cells) + " |")
    lines += ["", f"Each method's setting is the candidate with the highest {by_name} (a "
              "training measure, so the held-out evaluation below plays no part in the "
              "choice), mean over its finished seeds.", ""]
    (first, first_pick), rest = picks[0], picks[1:]
    if first_pick is None or any(pick is None for _, pick in rest):
        return lines + ["A method has no finished run: no comparison.", ""]
    comparisons = [compare(entries[first_pick][3], entries[pick][3], f"{method} ({names[pick]})",
                           f"{first} ({names[first_pick]})", metric, how, spec.last_k)
                   for metric, how in spec.paired for method, pick in rest]
    return lines + comparison_lines(comparisons, spec) + [
        "", f"Each row: a method at its pick minus {first} at its pick on the same seed. "
        + paired_note(spec), ""]


def window_mean(run, metric, first, last):
    """The mean of `metric` over the run's steps first..last that logged it, or None."""
    steps, values = run.values(metric)
    inside = [v for step, v in zip(steps, values) if first <= step <= last]
    return float(np.mean(inside)) if inside else None


def window_lines(entries, names, windows):
    """Per entry and window of ``windows.size`` steps (1..size, size+1..2 size, ...): each
    measure's per-run mean over the window, then the mean over the finished seeds, so a
    reader sees whether a mechanism still acts late in the run."""
    header = ["variant", "steps"] + list(windows.measures)
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for (_, _, _, runs), name in zip(entries, names):
        done = [run for run in runs if run.finished]
        if not done:
            continue
        last_step = max(run.final_step for run in done)
        for first in range(1, last_step + 1, windows.size):
            last = min(first + windows.size - 1, last_step)
            cells = [name, f"{first}-{last}"]
            for metric in windows.measures:
                means = [m for m in (window_mean(run, metric, first, last) for run in done)
                         if m is not None]
                cells.append(_significant(float(np.mean(means)), 3) if means else "–")
            lines.append("| " + " | ".join(_markdown_cell(c) for c in cells) + " |")
    return lines + ["", f"Each cell: every finished seed's mean of the metric over the window's "
                    f"steps ({windows.size} a window; \"a - b\" is the difference of two metrics "
                    "at the steps that logged both), then the mean over seeds.", ""]


def eval_noise_lines(entries, names, spec):
    """Per entry: the seeds' spread of the final ``eval_accuracy`` beside one
    evaluation's binomial standard error sqrt(p (1 - p) / N), N = the runs'
    ``eval.num_prompts``; [] when no run logged it."""
    rows = []
    for (_, _, _, runs), name in zip(entries, names):
        done = [run for run in runs if run.finished]
        finals = list(seed_values(done, "eval_accuracy", "final", spec.last_k).values())
        lasts = list(seed_values(done, "eval_accuracy", "last_k", spec.last_k).values())
        if not finals:
            continue
        prompts = sorted({int(run.record["config"]["eval"]["num_prompts"]) for run in done
                          if "num_prompts" in run.record.get("config", {}).get("eval", {})})
        mean, spread = mean_and_spread(finals)
        _, last_spread = mean_and_spread(lasts)
        se = (", ".join(f"{report_stats.binomial_se(mean, n):.3f}" for n in prompts)
              if prompts else "–")
        show = lambda x: "–" if x is None else f"{x:.3f}"
        rows.append([name, ", ".join(map(str, prompts)) or "–", f"{mean:.3f}", show(spread),
                     show(last_spread), se])
    if not rows:
        return []
    header = ["variant", "held-out prompts N", "eval_accuracy (final), mean",
              "sd over seeds (final)", f"sd over seeds (last {spec.last_k})",
              "one evaluation's SE"]
    return (["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
            + ["| " + " | ".join(_markdown_cell(c) for c in row) + " |" for row in rows]
            + ["", "One evaluation's SE = sqrt(p (1 − p) / N), the binomial standard error of a "
               "greedy pass@1 measured on N prompts, at p = the mean final accuracy; N is the "
               "runs' eval.num_prompts. Where it is not well below the seeds' sd, the "
               "evaluation's own noise is a large part of that spread.", ""])


# --- the plots --------------------------------------------------------------------------

def x_name(x):
    return x if isinstance(x, str) else " + ".join(x)


def plot_file(metric, x):
    name = metric if x == "step" else f"{metric}_vs_{'_'.join([x] if isinstance(x, str) else x)}"
    return re.sub(r"[^A-Za-z0-9._-]+", "-", name) + ".png"


def curve(run, metric, x):
    """``{step: (x, y)}`` of the steps where the run logged `metric`; x is the step or the
    running sum over all its steps of the x metrics (None when it lacks one of them)."""
    if x == "step":
        xs = {r["step"]: float(r["step"]) for r in run.rows}
    else:
        names = [x] if isinstance(x, str) else list(x)
        if not all(any(n in r for r in run.rows) for n in names):
            return None
        totals = np.cumsum([sum(r.get(n, 0.0) for n in names) for r in run.rows])
        xs = {r["step"]: float(t) for r, t in zip(run.rows, totals)}
    steps, values = run.values(metric)
    return {step: (xs[step], value) for step, value in zip(steps, values)}


def seed_band(runs, metric, x):
    """`(x mean, y mean, y min, y max)` over seeds at the steps every seed logged, or None."""
    curves = [c for c in (curve(run, metric, x) for run in runs) if c]
    if not curves:
        return None
    steps = sorted(set.intersection(*(set(c) for c in curves)))
    if not steps:
        return None
    xs = np.array([[c[s][0] for s in steps] for c in curves])
    ys = np.array([[c[s][1] for s in steps] for c in curves])
    return xs.mean(0), ys.mean(0), ys.min(0), ys.max(0)


def plot_bands(entries, names, metric, x):
    """`[(entry name, seed_band)]` of the entries whose finished runs logged the plot."""
    bands = [(name, seed_band([run for run in runs if run.finished], metric, x))
             for (_, _, _, runs), name in zip(entries, names)]
    return [(name, band) for name, band in bands if band is not None]


def draw_plot(bands, metric, x):
    """One PNG's bytes: each entry's seed mean and band of `metric` against `x`, in the
    colour of its position in the sweep."""
    import matplotlib
    matplotlib.use("Agg")
    from matplotlib import pyplot as plt
    with matplotlib.style.context("default"):
        figure, axes = plt.subplots(figsize=(6.4, 4.0), dpi=100)
        for position, (name, (xs, mean, low, high)) in enumerate(bands):
            color = f"C{position % 10}"
            axes.plot(xs, mean, color=color, label=name, linewidth=1.5,
                      marker="o" if len(xs) <= 30 else None, markersize=3)
            axes.fill_between(xs, low, high, color=color, alpha=0.2, linewidth=0)
        axes.set_xlabel("step" if x == "step" else f"cumulative {x_name(x)}")
        axes.set_ylabel(metric)
        axes.set_title(f"{metric}\nmean over seeds, band from the lowest to the highest seed",
                       fontsize="medium")
        axes.grid(alpha=0.3)
        axes.legend(fontsize="small")
        figure.tight_layout()
        png = io.BytesIO()
        figure.savefig(png, format="png", metadata={"Software": None})
        plt.close(figure)
    return png.getvalue()


# --- report.md --------------------------------------------------------------------------

def entry_names(entries, labels):
    if labels:
        return list(labels)
    return [", ".join(f"{k.rsplit('.', 1)[-1]}={override_text(v)}" for k, v in overrides.items())
            or name for _, name, overrides, _ in entries]


def render(runs, module, *, write_png):
    """The text of report.md; calls ``write_png(file_name, png_bytes)`` for each plot and
    heat map it links."""
    config_path = runs[0].record["sweep_config"]
    entries = entries_of(runs)
    spec = report_spec(module, len(entries))
    plots = spec.plots
    names = entry_names(entries, spec.labels)
    seeds = sorted({run.record["seed"] for run in runs})
    commits = sorted({s["commit"] for run in runs for s in run.record.get("starts", [])})
    machines = sorted({s["machine"] for run in runs for s in run.record.get("starts", [])})
    lines = [f"# Sweep: `{config_path}`", ""]
    if module.__doc__:
        lines += [inspect.cleandoc(module.__doc__), ""]
    lines += ["## Runs", "", "```bash",
              f"python -m grpo_jax.sweep --config {config_path} --workdir_root DIR "
              f"--seeds {','.join(map(str, seeds))}",
              "python -m grpo_jax.report DIR", "```", "",
              f"Commits: {', '.join(commits) or 'unknown'}. Machines: "
              f"{'; '.join(machines) or 'unknown'}.", "",
              "Primary outcome (the sweep config's get_report()): " + (
                  "collapse (stability frontier)" if spec.primary == COLLAPSE
                  else f"{measure_name(*spec.primary, spec.last_k)}, paired by seed") + ".", ""]
    lines += table_lines(entries, spec)
    lines += ["", "Mean over the finished seeds ± their sample standard deviation (ddof=1). "
              "A measure reduces each run's metric over the steps that logged it: final = the "
              "last value; early, late = the mean of the first, last fifth of the values; "
              f"last {spec.last_k} = the mean of the last {spec.last_k} values; auc = the "
              "trapezoid mean over the logged steps; mean; sum; std = the population std over "
              "steps; cv = that std divided by the mean over steps." + summary_note(spec), ""]
    if spec.frontier is not None:
        lines += report_frontier.lines(entries, spec.frontier, write_png)
    paired = paired_lines(entries, names, spec)
    if paired:
        lines += ["## Paired comparisons", ""] + paired
    if spec.tuned is not None:
        lines += ["## Methods at their tuned settings", ""] + tuned_lines(entries, names, spec)
    if spec.windows is not None:
        lines += ["## Mechanisms over the run", ""] + window_lines(entries, names, spec.windows)
    noise = eval_noise_lines(entries, names, spec)
    if noise:
        lines += ["## Evaluation noise", ""] + noise
    unfinished = [run for run in runs if not run.finished]
    if unfinished:
        lines += ["Not finished, left out: " + "; ".join(
            f"{run.path} (at step {run.rows[-1]['step'] if run.rows else 0} of "
            f"{run.final_step})" for run in unfinished) + ".", ""]
    if plots:
        lines += ["## Plots", "", "Lines: the mean over seeds; bands: the lowest to the highest "
                  "seed.", ""]
    for metric, x in plots:
        bands = plot_bands(entries, names, metric, x)
        if not bands:
            needed = f"`{metric}`" + ("" if x == "step" else f" and `{x_name(x)}`")
            lines += [f"No finished run logged {needed}: no plot.", ""]
            continue
        file_name = plot_file(metric, x)
        write_png(file_name, draw_plot(bands, metric, x))
        lines += [f"![{metric} against {x_name(x)}]({file_name})", ""]
    return "\n".join(lines)


def write_report(root, out=None):
    """Writes report.md and the PNGs of the sweep under `root` into `out` (default `root`);
    returns the path of report.md."""
    out = paths.path(out or root)
    runs = load_runs(root)
    module = config_module(runs[0].record["sweep_config"])
    text = render(runs, module, write_png=lambda name, data: paths.write_whole(out / name, data))
    path = out / "report.md"
    paths.write_whole(path, text)
    return path


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m grpo_jax.report", description=(
        "Writes report.md and PNG plots of the runs a grpo_jax.sweep left in DIR."))
    parser.add_argument("root", metavar="DIR", help="the sweep's --workdir_root")
    parser.add_argument("--out", default=None, help="where report.md and the PNGs go "
                        "(default: DIR)")
    parser.add_argument("--collect_into", default=None, metavar="OUT", help=(
        "first copy the runs' sweep_run.json and metrics.jsonl (gzipped) into OUT, then "
        "report there from the copies: a sweep's small files, e.g. to commit"))
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    try:
        for flag, location in (("DIR", args.root), ("--out", args.out),
                               ("--collect_into", args.collect_into)):
            paths.check_reachable(location or "", flag)
        if args.collect_into:
            collect_runs(args.root, args.collect_into)
        path = write_report(args.collect_into or args.root, args.out)
    except (FileNotFoundError, ImportError, ValueError) as error:
        print(f"grpo_jax.report: {error}", file=sys.stderr)
        return 2
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
