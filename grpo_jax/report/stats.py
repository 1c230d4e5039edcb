"""The statistics `grpo_jax.report` prints: pure numpy and math, no state, no I/O.

Variants of one seed start from the same SFT warm start, so the report compares them
pairwise (per-seed differences), never by unpaired means; each run is summarised by one
number (the mean of its last k held-out evaluations, or the area under its curve).

- `last_k_mean`, `area_under_curve`: a run's summaries;
- `paired_differences`: per-seed `b - a` over the seeds both variants finished;
- `t_interval`, `paired_t_p`: the paired t-interval of the mean difference and the
  t-test's two-sided p (Student, 1908; e.g. Wasserman, "All of Statistics", 2004,
  sec. 10.5), with `t_cdf` / `t_quantile` computed here from the regularised incomplete
  beta function (Press et al., "Numerical Recipes", 3rd ed., 2007, sec. 6.4 and 6.14.9);
- `sign_flip_p`: the exact two-sided permutation p of the mean difference over all 2^n
  sign flips (Fisher, "The Design of Experiments", 1935, sec. 21; Good, "Permutation
  Tests", 2000, sec. 3.1): no distribution assumed; its smallest value with n seeds is
  2 / 2^n, so it cannot reach 0.05 below 6 seeds;
- `holm`: Holm's step-down adjustment of a family of p-values (Holm, Scand. J. Statist.
  6:65-70, 1979);
- `mcnemar_exact`: the exact McNemar test of paired binary outcomes (McNemar,
  Psychometrika 12:153-157, 1947; its exact binomial form);
- `pooled_sd`, `paired_t_power`, `seeds_needed`: the power of a paired two-sided t-test
  from the noncentral t distribution, and the seeds it needs (e.g. Chow, Shao and Wang,
  "Sample Size Calculations in Clinical Research", 2008, sec. 3.2);
- `kaplan_meier`, `km_median`, `restricted_mean`: time to an event with censored runs
  (Kaplan and Meier, JASA 53:457-481, 1958; restricted mean survival time, Royston and
  Parmar, BMC Med. Res. Methodol. 13:152, 2013);
- `binomial_se`: an evaluation's own standard error, sqrt(p (1 - p) / N).

An interval over fewer than `MIN_SEEDS_FOR_CI` seeds is not called a confidence interval:
the report prints the range of the differences there.
"""

import itertools
import math

import numpy as np

LEVEL = 0.95              # two-sided confidence level of every interval
ALPHA = 0.05              # the level of every test and of the power calculation
POWER = 0.8               # the power the "seeds needed" column asks for
MIN_SEEDS_FOR_CI = 5      # below this, the report prints a range, never a "CI"
EXACT_SIGN_FLIPS = 16     # sign_flip_p enumerates every flip up to this many seeds


# --- a run's summaries ------------------------------------------------------------------

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


# --- Student's t ------------------------------------------------------------------------

def _beta_continued_fraction(a, b, x):
    """The continued fraction of the incomplete beta function (modified Lentz)."""
    tiny, c, d = 1e-300, 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 10_000):
        for numerator in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                          -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + numerator / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-15:
            return h
    raise ArithmeticError(f"incomplete beta({a}, {b}, {x}) did not converge")


def regularized_incomplete_beta(a, b, x):
    """I_x(a, b) for a, b > 0 and x in [0, 1] (Numerical Recipes sec. 6.4)."""
    if not 0.0 <= x <= 1.0:
        raise ValueError(f"x must be in [0, 1], got {x}")
    if x in (0.0, 1.0):
        return x
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b)
                     + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _beta_continued_fraction(a, b, x) / a
    return 1.0 - front * _beta_continued_fraction(b, a, 1.0 - x) / b


def t_cdf(t, df):
    """P(T <= t) for Student's t with `df` > 0 degrees of freedom."""
    if df <= 0:
        raise ValueError(f"t_cdf needs df > 0, got {df}")
    if math.isinf(t):
        return 1.0 if t > 0 else 0.0
    tail = 0.5 * regularized_incomplete_beta(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t > 0 else tail


def t_quantile(p, df):
    """The t with t_cdf(t, df) = p, p in (0, 1), by bisection to 1e-12."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"t_quantile needs p in (0, 1), got {p}")
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    lo, hi = 0.0, 1.0
    while t_cdf(hi, df) < p:
        lo, hi = hi, hi * 2.0
    while hi - lo > 1e-12 * max(1.0, hi):
        mid = (lo + hi) / 2.0
        lo, hi = (mid, hi) if t_cdf(mid, df) < p else (lo, mid)
    return (lo + hi) / 2.0


def t_interval(differences, level=LEVEL):
    """`(lo, hi)`: mean ± t_{(1+level)/2, n-1} · sd / sqrt(n), the paired t-interval of
    the mean of `differences` [n], n >= 2, sd with ddof=1."""
    d = np.asarray(differences, np.float64)
    if d.size < 2:
        raise ValueError(f"a t-interval needs at least 2 differences, got {d.size}")
    if not 0 < level < 1:
        raise ValueError(f"the confidence level must be in (0, 1), got {level}")
    half = t_quantile((1 + level) / 2, d.size - 1) * d.std(ddof=1) / math.sqrt(d.size)
    return float(d.mean() - half), float(d.mean() + half)


def paired_t_p(differences):
    """The two-sided p of the paired t-test of mean 0 on `differences` [n], n >= 2 (1 when
    every difference is 0, 0 when they are equal and not 0)."""
    d = np.asarray(differences, np.float64)
    if d.size < 2:
        raise ValueError(f"a t-test needs at least 2 differences, got {d.size}")
    sd = d.std(ddof=1)
    if sd == 0:
        return 1.0 if d.mean() == 0 else 0.0
    t = abs(d.mean()) / (sd / math.sqrt(d.size))
    return 2.0 * (1.0 - t_cdf(t, d.size - 1))


# --- exact and multiplicity -------------------------------------------------------------

def sign_flip_p(differences, *, samples=200_000, seed=0):
    """The two-sided permutation p of the mean of `differences` [n] under the null that
    each difference's sign is + or - with chance 1/2: the share of the 2^n sign flips
    whose |sum| is at least the observed |sum| (the observed one counts). Exact up to
    `EXACT_SIGN_FLIPS` differences; beyond, `samples` flips drawn by numpy's
    default_rng(`seed`) (the observed one added)."""
    d = np.asarray(differences, np.float64)
    if d.size == 0:
        raise ValueError("sign_flip_p of no differences")
    observed = abs(d.sum())
    tolerance = 1e-12 * max(1.0, float(np.abs(d).sum()))
    if d.size <= EXACT_SIGN_FLIPS:
        signs = np.array(list(itertools.product((1.0, -1.0), repeat=d.size)))
        return float(np.mean(np.abs(signs @ d) >= observed - tolerance))
    signs = np.random.default_rng(seed).choice((1.0, -1.0), size=(samples, d.size))
    return float((np.sum(np.abs(signs @ d) >= observed - tolerance) + 1) / (samples + 1))


def holm(p_values):
    """Holm-adjusted p-values, in the order given: the i-th smallest p times (m - i + 1),
    made non-decreasing in that order and capped at 1; None entries stay None and do not
    count in m."""
    indexed = sorted((p, i) for i, p in enumerate(p_values) if p is not None)
    adjusted, running = [None] * len(p_values), 0.0
    for rank, (p, i) in enumerate(indexed):
        running = max(running, min(1.0, (len(indexed) - rank) * p))
        adjusted[i] = running
    return adjusted


def binomial_cdf(k, n, p=0.5):
    """P(X <= k) for X ~ Binomial(n, p), summed exactly."""
    return float(sum(math.comb(n, i) * p ** i * (1 - p) ** (n - i) for i in range(k + 1)))


def mcnemar_exact(only_b, only_a):
    """The exact two-sided McNemar p of paired binary outcomes: `only_b` pairs where only
    B had the event, `only_a` where only A did; min(1, 2 P(X <= min)), X ~ Bin(b + a, 1/2)
    (1 when no pair is discordant)."""
    n = only_b + only_a
    if n == 0:
        return 1.0
    return min(1.0, 2.0 * binomial_cdf(min(only_b, only_a), n))


# --- power -------------------------------------------------------------------------------

def pooled_sd(groups):
    """`(sd, df)`: the pooled sample sd of several groups of differences,
    sqrt(sum (n_i - 1) s_i^2 / sum (n_i - 1)) over the groups of 2 or more, and its degrees
    of freedom sum (n_i - 1); (None, 0) when no group has 2."""
    groups = [np.asarray(g, np.float64) for g in groups]
    usable = [g for g in groups if g.size >= 2]
    df = sum(g.size - 1 for g in usable)
    if df == 0:
        return None, 0
    return math.sqrt(sum((g.size - 1) * g.var(ddof=1) for g in usable) / df), df


def _normal_cdf(x):
    return 0.5 * np.vectorize(math.erfc)(-np.asarray(x, np.float64) / math.sqrt(2.0))


def paired_t_power(n, sd, gap, alpha=ALPHA):
    """The power of a two-sided paired t-test at `alpha` with `n` seeds against a true mean
    difference `gap` when the differences' sd is `sd`: P(|T'| > t_{1-alpha/2, n-1}), T'
    noncentral t with n - 1 degrees of freedom and noncentrality gap sqrt(n) / sd,
    integrated over the chi distribution of the sd estimate (Simpson's rule, 4,001 points)."""
    if n < 2:
        raise ValueError(f"a paired t-test needs n >= 2 seeds, got {n}")
    if sd <= 0:
        return 1.0
    df, delta = n - 1, abs(gap) * math.sqrt(n) / sd
    critical = t_quantile(1 - alpha / 2, df)
    # W = sqrt(V), V ~ chi-square(df): P(T' > c) = E[Phi(delta - c W / sqrt(df))], the
    # lower tail alike; W's density 2^(1 - df/2) w^(df - 1) exp(-w^2 / 2) / Gamma(df / 2)
    # is bounded (V's is not at 0 for df = 1), so Simpson's rule converges.
    w = np.linspace(0.0, math.sqrt(df) + 12.0, 4001)
    with np.errstate(divide="ignore"):   # log 0 at w = 0: density 0 there (df > 1)
        log_w = np.where(w > 0, np.log(w), -np.inf) if df > 1 else np.zeros_like(w)
    pdf = np.exp((1 - df / 2) * math.log(2.0) - w ** 2 / 2 - math.lgamma(df / 2)
                 + (df - 1) * log_w)
    scale = critical * w / math.sqrt(df)
    density = (_normal_cdf(delta - scale) + _normal_cdf(-delta - scale)) * pdf
    weights = np.ones_like(w)
    weights[1:-1:2], weights[2:-1:2] = 4.0, 2.0               # Simpson's rule
    return float(min(1.0, np.sum(weights * density) * (w[1] - w[0]) / 3.0))


def seeds_needed(sd, gap, alpha=ALPHA, power=POWER, most=10_000):
    """The fewest seeds (>= 2) whose paired two-sided t-test at `alpha` has `power` against
    a mean difference `gap` when the differences' sd is `sd` (`paired_t_power`); None when
    sd is unknown, 2 when it is 0, None past `most`."""
    if gap <= 0:
        raise ValueError(f"the gap to detect must be > 0, got {gap}")
    if sd is None or not math.isfinite(sd):
        return None
    if sd == 0:
        return 2
    n = 2
    while paired_t_power(n, sd, gap, alpha) < power:
        n = n + 1 if n < 64 else n * 2
        if n > most:
            return None
    if n > 64:   # refine the doubling back down to the smallest n
        lo = n // 2
        while n - lo > 1:
            mid = (lo + n) // 2
            lo, n = (mid, n) if paired_t_power(mid, sd, gap, alpha) < power else (lo, mid)
    return n


# --- time to an event -------------------------------------------------------------------

def kaplan_meier(times, events):
    """The Kaplan-Meier survival curve: `[(t, S(t))]` at each distinct event time, S the
    probability of no event up to and including t. times: [n] the event step, or the last
    step a run was seen when it had none (censored); events: [n] 1 for an event, 0 for
    censored. A censored time equal to an event time counts as still at risk at it."""
    times, events = np.asarray(times, np.float64), np.asarray(events, bool)
    survival, curve = 1.0, []
    for t in np.unique(times[events]):
        at_risk = np.sum(times >= t)
        survival *= 1.0 - np.sum((times == t) & events) / at_risk
        curve.append((float(t), float(survival)))
    return curve


def km_median(times, events):
    """The first event time at which the Kaplan-Meier S(t) is <= 0.5, or None when it
    never falls that low (more than half the runs outlast their horizon)."""
    return next((t for t, s in kaplan_meier(times, events) if s <= 0.5), None)


def restricted_mean(times, events, horizon):
    """The restricted mean time to the event up to `horizon`: the area under the
    Kaplan-Meier curve from 0 to `horizon` (a step function, 1 before the first event)."""
    area, last_t, last_s = 0.0, 0.0, 1.0
    for t, s in kaplan_meier(times, events):
        if t >= horizon:
            break
        area += last_s * (t - last_t)
        last_t, last_s = t, s
    return float(area + last_s * (horizon - last_t))


# --- an evaluation's noise, and formatting ----------------------------------------------

def binomial_se(p, n):
    """The standard error of an accuracy `p` measured on `n` independent prompts."""
    if n < 1:
        raise ValueError(f"binomial_se needs n >= 1 prompts, got {n}")
    p = min(max(float(p), 0.0), 1.0)
    return math.sqrt(p * (1 - p) / n)


def interval_text(differences, digits=3):
    """``95% t-CI [lo, hi]`` with `MIN_SEEDS_FOR_CI` or more values, else ``range [min,
    max] over N seeds`` (never called a CI); "–" for one value."""
    d = np.asarray(differences, np.float64)
    if d.size < 2:
        return "–"
    if d.size < MIN_SEEDS_FOR_CI:
        return f"range [{d.min():.{digits}f}, {d.max():.{digits}f}] over {d.size} seeds"
    lo, hi = t_interval(d)
    return f"{LEVEL:.0%} t-CI [{lo:.{digits}f}, {hi:.{digits}f}]"


def format_p(p):
    """A p-value to 3 decimals, "<0.001" below."""
    return "–" if p is None else ("<0.001" if p < 0.0005 else f"{p:.3f}")


def verdict(name_b, name_a, mean, p, n, *, adjusted, power=None, gap=None, digits=3):
    """The report's sentence for `b - a` over `n` seeds, read from `p` (Holm-adjusted when
    `adjusted`) at `ALPHA`: "B higher than A by d (Holm p 0.012)", or "no difference
    detected at n seeds" with the power the test had for `gap` where known."""
    which = "Holm p" if adjusted else "p"
    if p is not None and p < ALPHA:
        direction = "higher" if mean > 0 else "lower"
        return (f"{name_b} {direction} than {name_a} by {abs(mean):.{digits}f} "
                f"({which} {format_p(p)})")
    text = f"no difference detected at {n} seed{'s' if n != 1 else ''}"
    if power is not None and gap is not None:
        text += f"; power for a {gap:g} gap {power:.2f}"
    return text
