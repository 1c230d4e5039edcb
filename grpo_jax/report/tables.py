"""The report's numbers and tables: a run's metric reduced to one measure (`reduce_run`),
the seeds' values of a measure (`seed_values`), their cells, and the main table, the
mechanism table over windows of steps and the evaluation-noise table.
"""

import json
import math

import numpy as np

from grpo_jax import sweep
from grpo_jax.report import stats as report_stats
from grpo_jax.report.spec import DEFAULT_LAST_K, REDUCTIONS


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
        def show(x):
            return "–" if x is None else f"{x:.3f}"
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
