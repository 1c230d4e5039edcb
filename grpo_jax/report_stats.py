"""The statistics `grpo_jax.report` prints: pure numpy, no state, no I/O.

Variants of one seed start from the same SFT warm start, so the report compares them
pairwise (per-seed differences), not by unpaired means; each run is summarised by the mean
of its last k held-out evaluations rather than by its final one.

- `last_k_mean`: a run's summary over its last k evaluations;
- `area_under_curve`: the trapezoid mean of an eval curve over its steps;
- `paired_differences`: per-seed `b - a` over the seeds both variants finished;
- `bootstrap_ci`: the percentile bootstrap interval of the mean difference (Efron and
  Tibshirani, "An Introduction to the Bootstrap", 1993, ch. 13), seeded, so the same
  differences give the same interval;
- `seeds_needed`: seeds for a paired two-sided z-test to detect a gap (normal
  approximation, e.g. Chow, Shao and Wang, "Sample Size Calculations in Clinical
  Research", 2008, sec. 3.1);
- `binomial_se`: an evaluation's own standard error, sqrt(p (1 - p) / N);
- `verdict`: the sentence the report prints for one comparison.
"""

import math
import statistics

import numpy as np

RESAMPLES = 10_000   # bootstrap resamples of the seeds
LEVEL = 0.95         # two-sided confidence level of every interval
BOOTSTRAP_SEED = 0   # the resampling's seed: the same runs give the same intervals


def last_k_mean(values, k):
    """The mean of the last `k` of `values` (all of them when there are fewer).

    values: [num_evaluations] in step order. Averages out the evaluation-to-evaluation
    swing of one run that a single final evaluation keeps."""
    if k < 1:
        raise ValueError(f"last_k must be >= 1, got {k}")
    values = np.asarray(values, np.float64)
    if values.size == 0:
        raise ValueError("last_k_mean of no values")
    return float(values[-k:].mean())


def area_under_curve(steps, values):
    """The curve's trapezoid area divided by its step range: its mean height over the
    steps, in the metric's units (the value itself for one point).

    steps, values: [num_evaluations], steps increasing."""
    steps = np.asarray(steps, np.float64)
    values = np.asarray(values, np.float64)
    if steps.size == 1:
        return float(values[0])
    area = np.sum((values[1:] + values[:-1]) / 2 * np.diff(steps))
    return float(area / (steps[-1] - steps[0]))


def paired_differences(a, b):
    """`(seeds, differences)`: `b[s] - a[s]` for every seed s in both dicts, in seed
    order. a, b: {seed: value}."""
    seeds = sorted(set(a) & set(b))
    return seeds, np.array([b[s] - a[s] for s in seeds], np.float64)


def bootstrap_means(differences, resamples=RESAMPLES, seed=BOOTSTRAP_SEED):
    """[resamples] means of `differences` resampled with replacement, the seeds drawn
    with numpy's PCG64 from `seed`."""
    differences = np.asarray(differences, np.float64)
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, differences.size, size=(resamples, differences.size))
    return differences[picks].mean(axis=1)


def bootstrap_ci(differences, resamples=RESAMPLES, level=LEVEL, seed=BOOTSTRAP_SEED):
    """`(lo, hi)`: the percentile bootstrap interval of the mean of `differences`.

    differences: [num_seeds]. The (1 - level) / 2 and (1 + level) / 2 quantiles of
    `bootstrap_means` (numpy's default linear interpolation). With n seeds the interval
    lies inside [min, max] of the differences; for small n it is narrower than a
    t-interval (it ignores that the spread is itself estimated)."""
    differences = np.asarray(differences, np.float64)
    if differences.size == 0:
        raise ValueError("bootstrap_ci of no differences")
    if not 0 < level < 1:
        raise ValueError(f"the confidence level must be in (0, 1), got {level}")
    means = bootstrap_means(differences, resamples, seed)
    lo, hi = np.quantile(means, [(1 - level) / 2, (1 + level) / 2])
    return float(lo), float(hi)


def seeds_needed(sd_diff, gap, alpha=0.05, power=0.8):
    """Seeds for a paired two-sided test at `alpha` with `power` to detect a mean
    difference `gap`: n = ceil(((z_{1-alpha/2} + z_{power}) * sd_diff / gap)^2), with
    sd_diff the sample standard deviation (ddof=1) of the per-seed differences. None when
    sd_diff is unknown (one seed); 1 when it is 0."""
    if gap <= 0:
        raise ValueError(f"the gap to detect must be > 0, got {gap}")
    if sd_diff is None or not math.isfinite(sd_diff):
        return None
    normal = statistics.NormalDist()
    z = normal.inv_cdf(1 - alpha / 2) + normal.inv_cdf(power)
    return max(1, math.ceil((z * sd_diff / gap) ** 2 - 1e-9))


def binomial_se(p, n):
    """The standard error of an accuracy `p` measured on `n` independent prompts."""
    if n < 1:
        raise ValueError(f"binomial_se needs n >= 1 prompts, got {n}")
    p = min(max(float(p), 0.0), 1.0)
    return math.sqrt(p * (1 - p) / n)


def format_ci(lo, hi, digits=3):
    """``CI [lo, hi]`` with `digits` decimals."""
    return f"CI [{lo:.{digits}f}, {hi:.{digits}f}]"


def verdict(name_b, name_a, mean, lo, hi, digits=3):
    """The report's sentence for `b - a`: "no difference detected (CI [lo, hi])" when the
    interval holds 0, else "B higher than A by d (CI [lo, hi])" (or "lower")."""
    ci = format_ci(lo, hi, digits)
    if lo <= 0 <= hi:
        return f"no difference detected ({ci})"
    direction = "higher" if mean > 0 else "lower"
    return f"{name_b} {direction} than {name_a} by {abs(mean):.{digits}f} ({ci})"
