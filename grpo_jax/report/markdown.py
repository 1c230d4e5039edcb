"""report.md: the sections of a sweep's report in order (`render`), written with its
plots (`write_report`).
"""

import inspect

from grpo_jax import paths
from grpo_jax.report import frontier as report_frontier
from grpo_jax.report.paired import paired_lines, tuned_lines
from grpo_jax.report.plots import draw_plot, plot_bands, plot_file, x_name
from grpo_jax.report.runs import entries_of, load_runs
from grpo_jax.report.spec import COLLAPSE, config_module, report_spec
from grpo_jax.report.tables import (
    eval_noise_lines,
    measure_name,
    override_text,
    summary_note,
    table_lines,
    window_lines,
)


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
