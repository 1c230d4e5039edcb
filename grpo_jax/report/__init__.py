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
  heat maps (`grpo_jax.report.frontier`).

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
unadjusted and its reading marked so (`grpo_jax.report.stats`).
A plot's x is "step", a metric whose running sum over steps is the x
(``"generated_tokens"``), or a tuple of metrics whose per-step sum is accumulated. At
each step the curve is the mean over seeds of x and of y, over the steps that every seed
of the entry logged.

Only finished runs enter the table and the plots: those whose metrics.jsonl reaches the
config's last step. The others are listed. Nothing in the output depends on anything but
the runs' files and the config's `get_report()`: rows follow the sweep's entry order,
PNGs are drawn by Agg in matplotlib's default style with no software or time metadata,
so the same runs give the same bytes (with the same matplotlib and FreeType).

The package's modules, each importing only modules named before it:

- `runs`: the runs' files read (`load_runs`, through `grpo_jax.run_files`) and collected
  (`collect_runs`);
- `stats`: the statistics, numpy alone; `frontier`: the stability frontier;
- `spec`: `get_report()` found and checked; `tables`: the measures and the tables;
  `paired`: the paired comparisons; `plots`: the PNGs;
- `markdown`: report.md (`render`, `write_report`); `cli`: ``python -m grpo_jax.report``.

Every public name of these modules but the statistics' and the frontier's is importable
from ``grpo_jax.report`` itself.
"""

from grpo_jax import _extras

_extras.require("grpo_jax.report")   # before the imports it guards

from grpo_jax.report import frontier, stats  # noqa: E402
from grpo_jax.report.cli import main  # noqa: E402
from grpo_jax.report.markdown import entry_names, render, write_report  # noqa: E402
from grpo_jax.report.paired import (  # noqa: E402
    Comparison,
    compare,
    comparison_lines,
    comparison_row,
    paired_lines,
    paired_note,
    tuned_lines,
    tuned_pick,
)
from grpo_jax.report.plots import (  # noqa: E402
    curve,
    draw_plot,
    plot_bands,
    plot_file,
    seed_band,
    x_name,
)
from grpo_jax.report.runs import (  # noqa: E402
    RunData,
    collect_runs,
    entries_of,
    load_runs,
    read_metrics,
    run_records,
)
from grpo_jax.report.spec import (  # noqa: E402
    COLLAPSE,
    CURVE_REDUCTIONS,
    DEFAULT_GAPS,
    DEFAULT_LAST_K,
    DEFAULT_PAIRED,
    DEFAULT_PRIMARY,
    DEFAULT_REPORT,
    REDUCTIONS,
    REPO,
    SUMMARY_METRIC,
    ReportSpec,
    TunedSpec,
    WindowSpec,
    config_module,
    parse_primary,
    parse_tuned,
    parse_windows,
    report_spec,
    with_summary,
)
from grpo_jax.report.tables import (  # noqa: E402
    decimals_for,
    eval_noise_lines,
    field_headers,
    format_cell,
    format_interval_cell,
    mean_and_spread,
    measure_name,
    override_text,
    reduce_run,
    seed_values,
    summary_note,
    table_header,
    table_lines,
    window_lines,
    window_mean,
)

__all__ = [
    "COLLAPSE", "CURVE_REDUCTIONS", "DEFAULT_GAPS", "DEFAULT_LAST_K", "DEFAULT_PAIRED",
    "DEFAULT_PRIMARY", "DEFAULT_REPORT", "REDUCTIONS", "REPO", "SUMMARY_METRIC", "Comparison",
    "ReportSpec", "RunData", "TunedSpec", "WindowSpec", "collect_runs", "compare",
    "comparison_lines", "comparison_row", "config_module", "curve", "decimals_for", "draw_plot",
    "entries_of", "entry_names", "eval_noise_lines", "field_headers", "format_cell",
    "format_interval_cell", "frontier", "load_runs", "main", "mean_and_spread", "measure_name",
    "override_text", "paired_lines", "paired_note", "parse_primary", "parse_tuned",
    "parse_windows", "plot_bands", "plot_file", "read_metrics", "reduce_run", "render",
    "report_spec", "run_records", "seed_band", "seed_values", "stats", "summary_note",
    "table_header", "table_lines", "tuned_lines", "tuned_pick", "window_lines", "window_mean",
    "with_summary", "write_report", "x_name",
]
