"""avg@k, pass@k and maj@k against hand values and an exact binomial computation."""

import fractions
import math

import numpy as np
import pytest

from grpo_jax.training.evaluation import avg_at_k, maj_at_k, mean_pass_at_k, pass_at_k
from grpo_jax.training import at_k


def exact_pass_at_k(n, c, k):
    """1 - C(n - c, k) / C(n, k) in exact rational arithmetic (Chen et al.'s eq. 1)."""
    return float(1 - fractions.Fraction(math.comb(n - c, k), math.comb(n, k)))


class TestPassAtK:

    @pytest.mark.parametrize("n, c, k, expected", [
        (1, 0, 1, 0.0), (1, 1, 1, 1.0),
        (2, 1, 1, 0.5),                 # one of two correct, one try
        (4, 2, 2, 1 - 1 / 6),           # the 6 pairs of 4, one pair all wrong
        (5, 2, 3, 0.9),                 # 1 of the 10 triples of 5 is the 3 wrong ones
        (5, 3, 3, 1.0),                 # any 3 of 5 hold one of the 3 correct (n - c < k)
        (10, 3, 1, 0.3),                # k = 1 is c / n
        (10, 1, 5, 0.5),                # one correct sample, half of the 5-subsets hold it
        (16, 0, 8, 0.0),
    ])
    def test_hand_values(self, n, c, k, expected):
        assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-15)

    def test_every_small_case_equals_the_binomial_ratio(self):
        for n in range(1, 21):
            for c in range(n + 1):
                for k in range(1, n + 1):
                    assert pass_at_k(n, c, k) == pytest.approx(exact_pass_at_k(n, c, k),
                                                               abs=1e-12), (n, c, k)

    @pytest.mark.parametrize("n, c, k", [(1024, 1, 1), (1024, 7, 32), (5000, 2500, 1000),
                                         (2000, 3, 1999)])
    def test_large_n_is_stable(self, n, c, k):
        # C(5000, 1000) has over 1,000 digits: a float binomial overflows, the product does not.
        assert pass_at_k(n, c, k) == pytest.approx(exact_pass_at_k(n, c, k), rel=1e-10)

    @pytest.mark.parametrize("n, c, k", [(0, 0, 1), (4, 5, 1), (4, -1, 1), (4, 2, 0), (4, 2, 5)])
    def test_out_of_range(self, n, c, k):
        with pytest.raises(ValueError, match="pass_at_k needs n >= 1"):
            pass_at_k(n, c, k)

    def test_mean_over_problems(self):
        correct = np.array([[1, 0, 0, 0], [1, 1, 0, 0], [0, 0, 0, 0]], bool)
        expected = (exact_pass_at_k(4, 1, 2) + exact_pass_at_k(4, 2, 2) + 0.0) / 3
        assert mean_pass_at_k(correct, 2) == pytest.approx(expected)


class TestAvgAtK:

    def test_is_the_mean_accuracy_of_the_samples(self):
        correct = np.array([[1, 1, 0, 0], [1, 0, 0, 0], [1, 1, 1, 1]], bool)
        assert avg_at_k(correct) == pytest.approx((2 / 4 + 1 / 4 + 4 / 4) / 3)

    def test_k_one_is_accuracy(self):
        assert avg_at_k([[True], [False], [False], [True]]) == 0.5

    def test_needs_a_matrix(self):
        with pytest.raises(ValueError, match=r"\[P, k\]"):
            avg_at_k([True, False])


class TestMajAtK:

    def test_majority_after_normalising(self):
        # "4", "4." and " 4 " are one answer (3 votes) against "5" (2 votes).
        answers = ["5", "4", "4.", " 4 ", "5"]
        assert maj_at_k(answers, [False, True, True, True, False]) == 1.0
        assert maj_at_k(answers, [True, False, False, False, True]) == 0.0

    def test_tie_goes_to_the_answer_seen_first(self):
        assert at_k.majority_index(["5", "4", "4", "5"]) == 0
        assert maj_at_k(["5", "4", "4", "5"], [False, True, True, False]) == 0.0
        assert maj_at_k(["4", "5", "5", "4"], [True, False, False, True]) == 1.0

    def test_samples_without_an_answer_do_not_vote(self):
        assert maj_at_k([None, None, "7"], [False, False, True]) == 1.0
        assert maj_at_k([None, None], [False, False]) == 0.0

    def test_math_equal_forms_vote_apart(self):
        # 0.5 and \frac{1}{2} are graded equal but vote separately: 1/2 wins 2 to 1.
        answers = ["0.5", "\\frac{1}{2}", "\\frac{1}{2}"]
        assert at_k.majority_index(answers) == 1

    def test_lengths_must_agree(self):
        with pytest.raises(ValueError, match="maj_at_k needs k >= 1 answers"):
            maj_at_k(["1", "2"], [True])
