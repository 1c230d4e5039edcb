"""A sweep's report settings: the sweep config's `get_report()` (or `DEFAULT_REPORT`),
found beside the config (`config_module`), checked and in full form (`report_spec`).

The keys and their meaning are told in `grpo_jax.report`'s docstring.
"""

import dataclasses
import pathlib
from typing import Any

import numpy as np

from grpo_jax import config_lib
from grpo_jax.report import frontier as report_frontier

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
REPO = pathlib.Path(__file__).resolve().parents[2]   # the checkout: grpo_jax/report/spec.py


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
    def pair(item, default):
        return (item, default) if isinstance(item, str) else tuple(item)
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
