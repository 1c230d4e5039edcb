"""grpo_jax.report.stats against hand-computed values and scipy.stats (in the test only):
the t distribution, the paired t-interval and test, the exact sign-flip p for n = 3..8,
Holm, exact McNemar, the noncentral-t power and seeds needed, Kaplan-Meier."""

import itertools
import math

import numpy as np
import pytest

from grpo_jax.report import stats as rs

stats = pytest.importorskip("scipy.stats")


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


@pytest.mark.parametrize("df", [1, 2, 3, 4, 7, 19, 120])
def test_t_distribution_against_scipy(df):
    for t in (-7.5, -2.1, -0.3, 0.0, 0.4, 1.96, 12.0):
        assert rs.t_cdf(t, df) == pytest.approx(stats.t.cdf(t, df), abs=1e-12)
    for p in (0.005, 0.025, 0.2, 0.5, 0.8, 0.975, 0.995):
        assert rs.t_quantile(p, df) == pytest.approx(stats.t.ppf(p, df), rel=1e-9, abs=1e-12)
    # By hand: t_{0.975, 1} = tan(0.475 pi) (the Cauchy), t_{0.975, 2} = 4.30265...
    assert rs.t_quantile(0.975, 1) == pytest.approx(math.tan(0.475 * math.pi), rel=1e-10)
    assert rs.t_quantile(0.975, 2) == pytest.approx(4.302652729911275, rel=1e-10)


def test_paired_t_interval_and_test_against_scipy():
    d = np.array([0.03, -0.01, 0.05, 0.02, 0.04, 0.0])
    lo, hi = rs.t_interval(d)
    want = stats.t.interval(0.95, d.size - 1, loc=d.mean(), scale=stats.sem(d))
    assert (lo, hi) == pytest.approx(want, abs=1e-12)
    assert rs.paired_t_p(d) == pytest.approx(stats.ttest_1samp(d, 0.0).pvalue, abs=1e-12)
    assert rs.paired_t_p([0.0, 0.0]) == 1.0 and rs.paired_t_p([0.1, 0.1]) == 0.0
    with pytest.raises(ValueError, match="at least 2"):
        rs.t_interval([0.1])


@pytest.mark.parametrize("n", [3, 4, 5, 6, 7, 8])
def test_sign_flip_p_is_the_exact_permutation_p(n):
    rng = np.random.default_rng(n)
    d = rng.normal(0.02, 0.05, size=n)
    # By enumeration here, and by scipy's exact permutation test of the mean.
    sums = [abs(sum(s * x for s, x in zip(signs, d)))
            for signs in itertools.product((1, -1), repeat=n)]
    assert rs.sign_flip_p(d) == pytest.approx(np.mean(np.array(sums) >= abs(d.sum()) - 1e-12))
    scipy_p = stats.permutation_test((d,), np.mean, permutation_type="samples",
                                     n_resamples=np.inf, alternative="two-sided").pvalue
    assert rs.sign_flip_p(d) == pytest.approx(scipy_p)
    # All one sign: the smallest p, 2 / 2^n (0.25 at 3 seeds: never below 0.05 under 6).
    assert rs.sign_flip_p(np.abs(d) + 0.01) == pytest.approx(2 / 2 ** n)


def test_sign_flip_p_samples_beyond_the_exact_limit():
    # 20 differences of size 0.1, 14 positive: a flip's sum is 0.1 (2B - 20), B ~ Bin(20,
    # 1/2), so the exact p is P(|2B - 20| >= 8) = P(B >= 14) + P(B <= 6).
    n = rs.EXACT_SIGN_FLIPS + 4
    d = np.array([0.1] * (n - 6) + [-0.1] * 6)
    exact = stats.binom.sf(n - 7, n, 0.5) + stats.binom.cdf(6, n, 0.5)
    assert rs.sign_flip_p(d) == pytest.approx(exact, abs=3e-3)   # 200,000 draws: SE 7e-4
    assert rs.sign_flip_p(d) == rs.sign_flip_p(d)   # seeded


def test_holm_by_hand():
    # Sorted 0.01, 0.03, 0.04, 0.2 (m = 4): x4, x3, x2, x1 = 0.04, 0.09, 0.08 -> 0.09, 0.2.
    assert rs.holm([0.01, 0.04, None, 0.03, 0.2]) == pytest.approx(
        [0.04, 0.09, None, 0.09, 0.2])
    assert rs.holm([0.5, 0.6]) == [1.0, 1.0]
    assert rs.holm([None]) == [None]


def test_mcnemar_exact_against_the_binomial_test():
    for only_b, only_a in ((5, 0), (3, 1), (0, 2), (7, 6), (12, 3)):
        want = stats.binomtest(min(only_b, only_a), only_b + only_a, 0.5).pvalue
        assert rs.mcnemar_exact(only_b, only_a) == pytest.approx(want)
    assert rs.mcnemar_exact(5, 0) == pytest.approx(2 / 32)   # by hand
    assert rs.mcnemar_exact(0, 0) == 1.0


def test_pooled_sd_by_hand():
    a, b = [0.1, 0.3], [0.0, 0.2, 0.4]
    # (1 * 0.02 + 2 * 0.04) / 3 = 0.1 / 3
    sd, df = rs.pooled_sd([a, b, [0.5]])
    assert df == 3 and sd == pytest.approx(math.sqrt(0.1 / 3))
    assert rs.pooled_sd([[0.5]]) == (None, 0)


@pytest.mark.parametrize("n", [2, 3, 7, 19, 200])
def test_power_is_the_noncentral_t_power(n):
    for sd, gap in ((0.036, 0.05), (0.073, 0.05), (0.05, 0.02)):
        critical = stats.t.ppf(0.975, n - 1)
        delta = gap * math.sqrt(n) / sd
        want = stats.nct.sf(critical, n - 1, delta) + stats.nct.cdf(-critical, n - 1, delta)
        assert rs.paired_t_power(n, sd, gap) == pytest.approx(want, abs=1e-8)


def test_seeds_needed_is_the_fewest_with_power_0_8():
    # The long-answer testbed's pooled sd 0.036 and runlocal's 0.073, gaps 0.05 and 0.02.
    for sd, gap, want in ((0.036, 0.05, 7), (0.073, 0.05, 19), (0.036, 0.02, 28),
                          (0.073, 0.02, 107)):
        n = rs.seeds_needed(sd, gap)
        assert n == want
        power = lambda k: stats.nct.sf(stats.t.ppf(0.975, k - 1), k - 1, gap * math.sqrt(k) / sd) \
            + stats.nct.cdf(-stats.t.ppf(0.975, k - 1), k - 1, gap * math.sqrt(k) / sd)
        assert power(n) >= 0.8 > power(n - 1)
    assert rs.seeds_needed(0.0, 0.05) == 2 and rs.seeds_needed(None, 0.05) is None
    with pytest.raises(ValueError, match="gap to detect must be > 0"):
        rs.seeds_needed(0.1, 0)


def test_kaplan_meier_with_censoring_by_hand():
    times, events = [3, 5, 5, 8, 10, 10], [1, 1, 0, 1, 0, 0]
    # At 3: 6 at risk, 1 event -> 5/6. At 5: 5 at risk (the censored 5 counts), 1 event ->
    # 5/6 * 4/5 = 2/3. At 8: 3 at risk -> 2/3 * 2/3 = 4/9.
    curve = rs.kaplan_meier(times, events)
    assert [t for t, _ in curve] == [3, 5, 8]
    assert [s for _, s in curve] == pytest.approx([5 / 6, 2 / 3, 4 / 9])
    assert rs.km_median(times, events) == 8
    # Area to 10: 3 * 1 + 2 * 5/6 + 3 * 2/3 + 2 * 4/9.
    assert rs.restricted_mean(times, events, 10) == pytest.approx(3 + 5 / 3 + 2 + 8 / 9)
    assert rs.km_median([4, 9], [1, 0]) == 4            # S(4) = 1/2: the median
    assert rs.km_median([4, 9, 9], [1, 0, 0]) is None   # S stays at 2/3
    assert rs.restricted_mean([4, 9], [0, 0], 9) == 9.0


def test_interval_text_and_readings():
    assert rs.interval_text([0.1, 0.2, 0.3]) == "range [0.100, 0.300] over 3 seeds"
    d = [0.03, -0.01, 0.05, 0.02, 0.04]
    lo, hi = stats.t.interval(0.95, 4, loc=np.mean(d), scale=stats.sem(d))
    assert rs.interval_text(d) == f"95% t-CI [{lo:.3f}, {hi:.3f}]"
    assert rs.interval_text([0.1]) == "–"
    assert (
        rs.verdict("B", "A", 0.1, 0.01, 8, adjusted=True)
        == "B higher than A by 0.100 (Holm p 0.010)"
    )
    assert (
        rs.verdict("B", "A", -0.1, 0.0001, 8, adjusted=False)
        == "B lower than A by 0.100 (p <0.001)"
    )
    assert (rs.verdict("B", "A", 0.1, 0.25, 3, adjusted=True, power=0.34, gap=0.05)
            == "no difference detected at 3 seeds; power for a 0.05 gap 0.34")
    assert rs.binomial_se(0.8, 500) == pytest.approx(math.sqrt(0.16 / 500))
