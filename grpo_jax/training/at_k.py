"""The sampled-evaluation protocols of the RL papers: avg@k, pass@k and maj@k.

Over n samples of one problem, c of them correct:

* avg@k: the mean correctness of k samples (DAPO reports AIME 2024 avg@32), an
  estimate of sampled pass@1;
* pass@k: the chance that at least one of k samples drawn from the n is correct, by the
  unbiased estimator of Chen et al. 2021 (arXiv:2107.03374, sec. 2.1);
* maj@k: whether the answer most of k samples give is correct (majority vote, or
  self-consistency: Wang et al. 2022, arXiv:2203.11171).

Each is averaged over a benchmark's problems, and a suite's benchmarks are
macro-averaged (each benchmark counts once, whatever its size).
"""

import collections
import re
from collections.abc import Sequence

import numpy as np

from grpo_jax import rewards

_SPACE = re.compile(r"\s+")


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased pass@k estimate from `n` samples of which `c` are correct.

    pass@k = 1 - C(n - c, k) / C(n, k) (Chen et al. 2021, arXiv:2107.03374, eq. 1),
    computed in their numerically stable product form
    1 - prod_{i = n - c + 1}^{n} (1 - k / i), which never forms the binomials.

    Args:
      n: samples drawn for the problem, >= 1.
      c: how many of them are correct, 0 <= c <= n.
      k: the budget of attempts, 1 <= k <= n.

    Returns:
      A float in [0, 1]; exactly 1.0 when every k-subset holds a correct sample
      (n - c < k) and 0.0 when c = 0.

    Example:
      >>> round(pass_at_k(4, 2, 2), 6)   # 1 - C(2, 2) / C(4, 2) = 1 - 1/6
      0.833333
    """
    if n < 1 or not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass_at_k needs n >= 1, 0 <= c <= n and 1 <= k <= n; "
                         f"got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1, dtype=np.float64)))


def avg_at_k(correct_pk: np.ndarray) -> float:
    """avg@k: the mean correctness of every sample of every problem.

    Args:
      correct_pk: `[P, k]` booleans, sample j of problem p correct.

    Returns:
      The mean over problems of each problem's share of correct samples (every problem
      has k samples, so this is the mean of all P k entries).
    """
    correct_pk = np.asarray(correct_pk, dtype=bool)
    if correct_pk.ndim != 2 or correct_pk.size == 0:
        raise ValueError(f"avg_at_k needs [P, k] correctness with P, k >= 1, got shape "
                         f"{correct_pk.shape}")
    return float(correct_pk.mean())


def mean_pass_at_k(correct_pn: np.ndarray, k: int) -> float:
    """The mean over problems of `pass_at_k(n, c_p, k)`, from `[P, n]` correctness."""
    correct_pn = np.asarray(correct_pn, dtype=bool)
    n = correct_pn.shape[1]
    return float(np.mean([pass_at_k(n, int(c), k) for c in correct_pn.sum(axis=1)]))


def vote_key(answer: str) -> str:
    """The form of an answer that votes: `rewards.normalise_answer` (digits, ``$``,
    ``%``, a trailing period) without whitespace. Forms that are equal only as math
    (``0.5`` and ``\\frac{1}{2}``) vote separately."""
    return _SPACE.sub("", rewards.normalise_answer(answer))


def majority_index(answers: Sequence[str | None]) -> int | None:
    """The sample whose answer wins the vote, or None when no sample has an answer.

    Samples without an answer (None) do not vote. A tie goes to the tied answer that
    appears first among the samples; the index returned is that answer's first sample.

    >>> majority_index(["5", "4", "4.", None, "5"])   # 5 and 4 tie at 2; 5 came first
    0
    """
    counts = collections.Counter()
    first = {}
    for index, answer in enumerate(answers):
        if answer is None:
            continue
        key = vote_key(answer)
        counts[key] += 1
        first.setdefault(key, index)
    if not counts:
        return None
    top = max(counts.values())
    return min(first[key] for key, count in counts.items() if count == top)


def maj_at_k(answers: Sequence[str | None], correct: Sequence[bool]) -> float:
    """maj@k of one problem: 1.0 when the majority answer of its k samples is correct.

    Args:
      answers: `[k]` the final answer each sample gave (None: no answer).
      correct: `[k]` whether each sample was graded correct; the majority answer's
        correctness is that of its first sample (`majority_index`).

    Returns:
      1.0 or 0.0 (0.0 when no sample has an answer).
    """
    if len(answers) != len(correct) or not answers:
        raise ValueError(f"maj_at_k needs k >= 1 answers and as many correctness flags, got "
                         f"{len(answers)} and {len(correct)}")
    index = majority_index(answers)
    return float(index is not None and bool(correct[index]))
