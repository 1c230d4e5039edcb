"""The report's paired comparisons: per-seed differences of one variant against another
on a measure (`compare`), their statistics and reading (`comparison_lines`), every entry
against the first (`paired_lines`), and methods each at its own best setting (`tuned_lines`).
"""

import dataclasses

import numpy as np

from grpo_jax.report import stats as report_stats
from grpo_jax.report.spec import COLLAPSE
from grpo_jax.report.tables import _markdown_cell, decimals_for, measure_name, seed_values


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
