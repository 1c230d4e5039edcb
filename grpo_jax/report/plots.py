"""The report's plots: each entry's mean over seeds of a metric against the step or a
running sum of metrics (`seed_band`), drawn by matplotlib's Agg with no metadata
(`draw_plot`), so the same runs give the same PNG bytes.
"""

import io
import re

import numpy as np


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
