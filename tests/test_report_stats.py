"""grpo_jax.report_stats against hand-computed values, an exact enumeration of every
bootstrap resample of 3 seeds, and scipy's normal quantiles."""

import itertools
import math

import numpy as np
import pytest

from grpo_jax import report_stats as rs


def test_summaries_by_hand():
    assert rs.last_k_mean([0.9, 0.6, 0.8, 0.7], 3) == pytest.approx(0.7)
    assert rs.last_k_mean([0.5], 3) == 0.5
    # Trapezoids over steps 0, 10, 30: (0+1)/2*10 + (1+1)/2*20 = 25, / 30.
    assert rs.area_under_curve([0, 10, 30], [0.0, 1.0, 1.0]) == pytest.approx(25 / 30)
    with pytest.raises(ValueError, match="last_k must be >= 1"):
        rs.last_k_mean([1.0], 0)


def test_paired_differences_keep_the_common_seeds_in_order():
    seeds, diffs = rs.paired_differences({0: 0.5, 1: 0.6, 2: 0.7}, {2: 0.1, 0: 0.2, 3: 0.9})
    assert seeds == [0, 2]
    np.testing.assert_allclose(diffs, [-0.3, -0.6])


def test_bootstrap_matches_the_exact_enumeration_of_3_seeds():
    diffs = np.array([-0.1, 0.05, 0.3])
    exact = np.array([diffs[list(p)].mean() for p in itertools.product(range(3), repeat=3)])
    lo, hi = rs.bootstrap_ci(diffs, resamples=200_000)
    # The exact 2.5% / 97.5% points: each all-one-seed mean has mass 1/27 > 2.5%.
    assert lo == pytest.approx(np.quantile(exact, 0.025, method="inverted_cdf")) == pytest.approx(-0.1)
    assert hi == pytest.approx(np.quantile(exact, 0.975, method="inverted_cdf")) == pytest.approx(0.3)
    means = rs.bootstrap_means(diffs, resamples=200_000)
    assert means.mean() == pytest.approx(exact.mean(), abs=2e-3)
    assert means.std() == pytest.approx(exact.std(), abs=2e-3)
    # Narrower levels interpolate inside: the 50% interval of the exact distribution.
    lo50, hi50 = rs.bootstrap_ci(diffs, resamples=200_000, level=0.5)
    assert lo50 == pytest.approx(np.quantile(exact, 0.25, method="inverted_cdf"), abs=0.02)
    assert hi50 == pytest.approx(np.quantile(exact, 0.75, method="inverted_cdf"), abs=0.02)
    assert rs.bootstrap_ci(diffs) == rs.bootstrap_ci(diffs)   # seeded


def test_seeds_needed_against_scipy_and_by_hand():
    stats = pytest.importorskip("scipy.stats")
    z = stats.norm.ppf(0.975) + stats.norm.ppf(0.8)
    assert z == pytest.approx(2.8016, abs=1e-4)
    assert rs.seeds_needed(0.05, 0.05) == math.ceil(z ** 2) == 8
    assert rs.seeds_needed(0.1, 0.05) == math.ceil((2 * z) ** 2) == 32
    assert rs.seeds_needed(0.0, 0.05) == 1 and rs.seeds_needed(None, 0.05) is None
    with pytest.raises(ValueError, match="gap to detect must be > 0"):
        rs.seeds_needed(0.1, 0)


def test_binomial_se_and_wording():
    assert rs.binomial_se(0.8, 500) == pytest.approx(math.sqrt(0.16 / 500))
    assert rs.binomial_se(0.5, 200) == pytest.approx(0.035355, abs=1e-6)
    assert rs.verdict("B", "A", 0.01, -0.02, 0.04) == "no difference detected (CI [-0.020, 0.040])"
    assert rs.verdict("B", "A", 0.1, 0.05, 0.15) == "B higher than A by 0.100 (CI [0.050, 0.150])"
    assert rs.verdict("B", "A", -0.1, -0.15, -0.05) == "B lower than A by 0.100 (CI [-0.150, -0.050])"
