"""The stability frontier in a sweep's report: which runs collapsed, the share of seeds
that did in each cell of a grid, and one heat map per value of the first panel field.

A sweep config turns it on with a ``"frontier"`` entry in its `get_report()`::

    "frontier": {"collapse": {"metric": "eval_accuracy", "below": 0.5, "evaluations": 2},
                 "rows": "optimizer.learning_rate", "columns": "train.minibatches",
                 "panels": ("objective.loss.kind", "optimizer.warmup_steps")}

A run **collapsed** when `evaluations` consecutive values of `metric` after its first are
below `below` times that first value, which must be the starting policy's (step 0:
``train.eval_at_start``); its collapse step is the first of them. Each cell of the grid
(one value of every field in `rows`, `columns` and `panels`, all swept fields) shows
``k/n``: k of its n finished seeds collapsed. The first panel field gets a heat map each
(``frontier_<value>.png``: one panel per value of the other panel fields, the share of
seeds collapsed as the colour, ``k/n`` and the seeds' mean final `metric` written in each
cell), and report.md a table each with the same numbers and the median collapse step.
A panel may be a tuple of fields, whose values together name it (``("objective.loss.kind",
"objective.loss.eps_high")``: one panel per loss and clip, e.g. ``ppo_clip, 0.02``); every
other panel value is paired with the first's runs of the same cell and seed.
"""

import dataclasses
import io
import itertools
import re
import statistics
from typing import Any

import numpy as np

from grpo_jax.report import stats as report_stats


@dataclasses.dataclass(frozen=True)
class Collapse:
    """When a run has collapsed: `evaluations` consecutive values of `metric` below
    `below` x its step-0 value."""

    metric: str
    below: float
    evaluations: int


@dataclasses.dataclass(frozen=True)
class Frontier:
    """`get_report()`'s "frontier" entry, checked."""

    collapse: Collapse
    rows: str
    columns: str
    panels: tuple


def parse(raw):
    """The "frontier" entry of `get_report()` as a `Frontier`; ValueError naming the key."""
    if not isinstance(raw, dict) or set(raw) != {"collapse", "rows", "columns", "panels"}:
        raise ValueError("get_report() frontier: give a dict with the keys collapse, rows, "
                         f"columns and panels, got {raw!r}")
    collapse = raw["collapse"]
    if not isinstance(collapse, dict) or set(collapse) != {"metric", "below", "evaluations"}:
        raise ValueError("get_report() frontier.collapse: give {'metric': ..., 'below': ..., "
                         f"'evaluations': ...}}, got {collapse!r}")
    below, evaluations = collapse["below"], collapse["evaluations"]
    if not isinstance(below, (int, float)) or not 0 < below <= 1:
        raise ValueError(f"get_report() frontier.collapse.below={below!r}: give the fraction "
                         "of the starting value, in (0, 1]")
    if not isinstance(evaluations, int) or isinstance(evaluations, bool) or evaluations < 1:
        raise ValueError(f"get_report() frontier.collapse.evaluations={evaluations!r}: give "
                         "the number of consecutive evaluations, an int >= 1")
    panels = (raw["panels"],) if isinstance(raw["panels"], str) else tuple(
        tuple(p) if isinstance(p, (list, tuple)) else p for p in raw["panels"])
    if not panels:
        raise ValueError("get_report() frontier.panels: name at least one swept field")
    return Frontier(Collapse(collapse["metric"], float(below), evaluations), raw["rows"],
                    raw["columns"], panels)


def collapse_step(steps, values, collapse):
    """The step at which the run's collapse begins, or None when it did not collapse.

    steps, values: [num_evaluations] of `collapse.metric` in step order; the first must be
    of step 0 (the starting policy). Collapse: `collapse.evaluations` consecutive values
    after the first below `collapse.below` x the first; the step of the first of them.

    Example (below 0.5, 2 evaluations; the start scores 0.6, so the threshold is 0.3):
      >>> collapse_step([0, 3, 6, 9, 12], [0.6, 0.2, 0.7, 0.1, 0.0], Collapse("a", 0.5, 2))
      9
    """
    if not steps or steps[0] != 0:
        raise ValueError(f"the collapse of {collapse.metric!r} is measured against the "
                         "starting policy's value, a row of step 0: run with "
                         "--config.train.eval_at_start=True")
    threshold = collapse.below * values[0]
    streak = []
    for step, value in zip(steps[1:], values[1:]):
        streak = streak + [step] if value < threshold else []
        if len(streak) == collapse.evaluations:
            return streak[0]
    return None


@dataclasses.dataclass(frozen=True)
class Outcome:
    """One finished run of a cell: its seed, its collapse step (None: it did not
    collapse), its final value of the collapse metric, the step of that value (where a run
    that did not collapse is censored) and the area under its curve of the metric
    (`report_stats.area_under_curve`)."""

    seed: int
    collapse_step: Any
    final: float
    last_step: int = 0
    auc: float = float("nan")


@dataclasses.dataclass(frozen=True)
class Cell:
    """One grid cell's finished runs, in the order the report read them."""

    outcomes: tuple = ()

    @property
    def seeds(self):
        return len(self.outcomes)

    @property
    def collapse_steps(self):
        return tuple(o.collapse_step for o in self.outcomes if o.collapse_step is not None)

    @property
    def finals(self):
        return tuple(o.final for o in self.outcomes)

    @property
    def collapsed(self):
        return len(self.collapse_steps)

    @property
    def share(self):
        return self.collapsed / self.seeds if self.seeds else float("nan")

    def text(self):
        """``2/3 · 0.41``: collapsed of finished seeds, and their mean final value."""
        if not self.seeds:
            return "–"
        return f"{self.collapsed}/{self.seeds} · {np.mean(self.finals):.2f}"


def cells(entries, frontier):
    """``{(panel values..., row value, column value): Cell}`` over `entries`
    (`report.entries_of`), and the values of each field in sweep order."""
    fields = (*frontier.panels, frontier.rows, frontier.columns)
    grid, values = {}, {field: [] for field in fields}
    for _, name, overrides, runs in entries:
        missing = [f for field in fields for f in _fields(field) if f not in overrides]
        if missing:
            raise ValueError(f"get_report() frontier names {missing}, which entry {name} does "
                             "not sweep; rows, columns and panels must be swept fields")
        key = tuple(_value(overrides, field) for field in fields)
        for field, value in zip(fields, key):
            if value not in values[field]:
                values[field].append(value)
        outcomes = []
        for run in runs:
            if run.finished:
                steps, scores = run.values(frontier.collapse.metric)
                outcomes.append(Outcome(run.record["seed"],
                                        collapse_step(steps, scores, frontier.collapse),
                                        scores[-1], steps[-1],
                                        report_stats.area_under_curve(steps, scores)))
        grid[key] = Cell(grid.get(key, Cell()).outcomes + tuple(outcomes))
    return grid, values


def _hashable(value):
    return tuple(value) if isinstance(value, list) else value


def _fields(field):
    """The swept fields of a frontier field: itself, or a compound panel's fields."""
    return field if isinstance(field, tuple) else (field,)


def _value(overrides, field):
    """An entry's value of a frontier field; a compound panel's (a tuple of fields, e.g.
    the loss and its clip) is its fields' values joined: ``ppo_clip, 0.02``."""
    if isinstance(field, tuple):
        return ", ".join(str(_hashable(overrides[f])) for f in field)
    return _hashable(overrides[field])


def _leaf(field):
    if isinstance(field, tuple):
        return ", ".join(_leaf(f) for f in field)
    return field.rsplit(".", 1)[-1]


def lines(entries, frontier, write_png):
    """report.md's "Stability frontier" section; calls ``write_png(file_name, bytes)`` for
    each heat map it links."""
    grid, values = cells(entries, frontier)
    first, others = frontier.panels[0], frontier.panels[1:]
    sub_panels = list(itertools.product(*(values[field] for field in others)))
    rows, columns = values[frontier.rows], values[frontier.columns]
    c = frontier.collapse
    out = ["## Stability frontier", "",
           f"A run collapsed when {c.evaluations} consecutive evaluations of `{c.metric}` fell "
           f"below {c.below:g} x its starting value (step 0: the policy before the first "
           f"update). Each cell: k/n = k of its n finished seeds collapsed · the seeds' mean "
           f"final `{c.metric}`. Median collapse step: over the seeds that collapsed.", ""]
    out += summary_lines(grid, values[first], first)
    for panel in values[first]:
        title = f"`{_leaf(first)}` = `{panel}`"
        file_name = "frontier_" + re.sub(r"[^A-Za-z0-9._-]+", "-", str(panel)) + ".png"
        write_png(file_name, heat_map(grid, panel, sub_panels, rows, columns, frontier))
        out += ([f"### {title}", ""] + panel_table(grid, panel, sub_panels, rows, columns, frontier)
                + ["", f"![{title}]({file_name})", ""])
    return out


def panel_table(grid, panel, sub_panels, rows, columns, frontier):
    """One value of the first panel field as a markdown table: a line per `rows` value, a
    column per (`columns` value, other panel values); each cell `Cell.text` and the
    median collapse step."""
    others = frontier.panels[1:]
    header = [f"{_leaf(frontier.rows)} \\ " + ", ".join(
        [_leaf(frontier.columns)] + [_leaf(f) for f in others])]
    for sub in sub_panels:
        header += [", ".join(map(str, (column, *sub))) for column in columns]
    table = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        texts = [str(row)]
        for sub in sub_panels:
            for column in columns:
                cell = grid.get((panel, *sub, row, column), Cell())
                median = (f" (step {statistics.median(cell.collapse_steps):g})"
                          if cell.collapsed else "")
                texts.append(cell.text() + median)
        table.append("| " + " | ".join(texts) + " |")
    return table


def paired_outcomes(grid, panel, reference, value):
    """`[(seed, value(run of panel), value(run of reference))]` over the runs of `panel`
    and `reference` at the same other fields and seed, in grid order; `value` maps an
    `Outcome` to a number."""
    pairs = []
    for key in grid:
        if key[0] != panel or (reference, *key[1:]) not in grid:
            continue
        mine = {o.seed: o for o in grid[key].outcomes}
        theirs = {o.seed: o for o in grid[(reference, *key[1:])].outcomes}
        pairs += [(s, value(mine[s]), value(theirs[s])) for s in sorted(set(mine) & set(theirs))]
    return pairs


def seed_clustered_p(pairs):
    """`(per-seed mean differences, exact sign-flip p)`: the pairs' differences averaged
    within each seed first (a seed's cells share its warm start and data order, so they
    are not independent), then the sign-flip test over seeds."""
    by_seed = {}
    for seed, mine, theirs in pairs:
        by_seed.setdefault(seed, []).append(mine - theirs)
    means = np.array([np.mean(by_seed[s]) for s in sorted(by_seed)], np.float64)
    return means, (report_stats.sign_flip_p(means) if means.size else None)


def _collapsed(outcome):
    return float(outcome.collapse_step is not None)


def summary_lines(grid, panels, field):
    """Per value of the first panel field against the first (the control), paired by cell
    and seed: collapses (exact McNemar over the pairs, and a seed-clustered sign-flip test,
    the primary test, Holm-adjusted across the values), time to collapse with runs that
    did not collapse censored at their last evaluation (Kaplan-Meier median, restricted
    mean), and the area under the collapse metric's curve (seed-clustered)."""
    reference = panels[0]
    table = [f"| {_leaf(field)} | runs collapsed | cells where no seed collapsed | pairs with "
             f"`{reference}`: only it collapsed / only `{reference}` | exact McNemar p | "
             "seed-clustered p | Holm p |", "|---|---|---|---|---|---|---|"]
    rows, clustered = [], []
    for panel in panels:
        mine = [cell for key, cell in grid.items() if key[0] == panel]
        runs = sum(cell.seeds for cell in mine)
        collapsed = sum(cell.collapsed for cell in mine)
        stable = sum(1 for cell in mine if cell.seeds and not cell.collapsed)
        pairs = paired_outcomes(grid, panel, reference, _collapsed) if panel != reference else []
        only_it = sum(1 for _, a, b in pairs if a > b)
        only_ref = sum(1 for _, a, b in pairs if b > a)
        _, p = seed_clustered_p(pairs) if pairs else (None, None)
        clustered.append(p)
        rows.append((panel, collapsed, runs, stable, len(mine), pairs, only_it, only_ref))
    adjusted = report_stats.holm(clustered)
    for (panel, collapsed, runs, stable, cells_, pairs, only_it, only_ref), p, holm_p in zip(
            rows, clustered, adjusted):
        versus = (f"{only_it} / {only_ref} of {len(pairs)}", report_stats.format_p(
            report_stats.mcnemar_exact(only_it, only_ref)), report_stats.format_p(p),
            report_stats.format_p(holm_p)) if pairs else ("–", "–", "–", "–")
        table.append(f"| `{panel}` | {collapsed}/{runs} | {stable}/{cells_} | "
                     + " | ".join(versus) + " |")
    table += ["", f"Pairs: each run and the `{reference}` run of the same cell (every other swept "
              "field equal) and seed. Exact McNemar p: the two-sided binomial test of the "
              "discordant pairs, which treats the pairs as independent. Seed-clustered p: each "
              "seed's mean difference (1 when only the run collapsed, -1 when only the "
              f"`{reference}` run did) over its cells, then the exact sign-flip test over the "
              "seeds (a seed's cells share its warm start; with n seeds its smallest value is "
              "2/2^n); Holm p: that p adjusted across the rows, the frontier's primary test.",
              ""]
    return table + time_lines(grid, panels, field)


def time_lines(grid, panels, field):
    """Per value of the first panel field: the Kaplan-Meier median collapse step and the
    restricted mean steps without collapse up to the longest run's last evaluation, and
    its area under the curve paired with the control's, clustered by seed."""
    reference = panels[0]
    outcomes = [o for cell in grid.values() for o in cell.outcomes]
    if not outcomes:
        return []
    horizon = max(o.last_step for o in outcomes)
    table = [f"| {_leaf(field)} | Kaplan-Meier median collapse step | restricted mean steps "
             f"without collapse (to step {horizon}) | area under the curve − `{reference}`'s "
             "(mean over seeds) | seed-clustered p |", "|---|---|---|---|---|"]
    for panel in panels:
        runs = [o for key, cell in grid.items() if key[0] == panel for o in cell.outcomes]
        times = [o.collapse_step if o.collapse_step is not None else o.last_step for o in runs]
        events = [o.collapse_step is not None for o in runs]
        median = report_stats.km_median(times, events) if runs else None
        mean_steps = report_stats.restricted_mean(times, events, horizon) if runs else None
        auc = ("–", "–")
        if panel != reference:
            means, p = seed_clustered_p(paired_outcomes(grid, panel, reference,
                                                        lambda o: o.auc))
            if means.size:
                auc = (f"{means.mean():+.3f} over {means.size} seeds", report_stats.format_p(p))
        table.append(f"| `{panel}` | {'not reached' if median is None else f'{median:g}'} | "
                     f"{'–' if mean_steps is None else f'{mean_steps:.1f}'} | {auc[0]} | "
                     f"{auc[1]} |")
    return table + ["", "Time to collapse: a run that did not collapse is censored at its last "
                    "evaluation; the median is the first collapse step where the Kaplan-Meier "
                    "share of runs not yet collapsed is at most one half (\"not reached\" when "
                    "more than half outlast their runs); the restricted mean is the area under "
                    "that curve up to the horizon. Area under the curve: the collapse metric's "
                    "trapezoid mean over each run's evaluations, paired by cell and seed, "
                    "averaged within each seed, then tested over seeds by exact sign flips.",
                    ""]


def heat_map(grid, panel, sub_panels, rows, columns, frontier):
    """PNG bytes: one heat map per sub-panel, rows x columns, coloured by the share of
    seeds collapsed (0 white to 1 dark red), each cell labelled `Cell.text`."""
    import matplotlib
    matplotlib.use("Agg")
    from matplotlib import pyplot as plt
    others = frontier.panels[1:]
    with matplotlib.style.context("default"):
        figure, axes = plt.subplots(1, len(sub_panels), squeeze=False, dpi=100,
                                    figsize=(1.0 + 2.6 * len(sub_panels), 3.2))
        for axis, sub in zip(axes[0], sub_panels):
            found = [[grid.get((panel, *sub, row, column), Cell()) for column in columns]
                     for row in rows]
            shares = np.array([[cell.share for cell in line] for line in found])
            axis.imshow(shares, cmap="Reds", vmin=0.0, vmax=1.0, aspect="auto")
            for i, line in enumerate(found):
                for j, cell in enumerate(line):
                    axis.text(j, i, cell.text().replace(" · ", "\n"), ha="center",
                              va="center", fontsize="small",
                              color="white" if cell.share > 0.6 else "black")
            axis.set_xticks(range(len(columns)), [str(c) for c in columns])
            axis.set_yticks(range(len(rows)), [str(r) for r in rows])
            axis.set_xlabel(frontier.columns)
            axis.set_ylabel(frontier.rows)
            axis.set_title(", ".join(f"{_leaf(f)}={v}" for f, v in zip(others, sub))
                           or str(panel), fontsize="medium")
        figure.suptitle(f"{_leaf(frontier.panels[0])}={panel}: seeds collapsed, mean final "
                        f"{frontier.collapse.metric}", fontsize="medium")
        figure.tight_layout()
        png = io.BytesIO()
        figure.savefig(png, format="png", metadata={"Software": None})
        plt.close(figure)
    return png.getvalue()
