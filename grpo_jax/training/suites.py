"""Named evaluation suites, their per-benchmark metrics, macro average and results table.

A suite names its benchmarks, the sampling its protocol evaluates at and the reward that
grades them; ``mode=eval`` with ``eval.suite`` draws k = ``eval.samples`` answers per
problem of each benchmark (``evaluation.evaluate_suite``). Per benchmark, from each
problem's count of correct samples c (of n = k) and whether its majority answer is correct:

* ``avg@n``: the mean correctness of the samples (sampled pass@1);
* ``pass@j``: the unbiased pass@j (``at_k.pass_at_k``) for j = 1, 2, 4, ... up to n;
* ``maj@n``: the share of problems whose majority answer is correct (``at_k.maj_at_k``).

The ``macro`` row averages each of them over the suite's benchmarks, each counting once.
"""

import dataclasses

import numpy as np

from grpo_jax.training import at_k


@dataclasses.dataclass(frozen=True)
class Suite:
    """Benchmarks (``grpo_jax.data`` names, each a ``test`` split), the sampling of the
    protocol they are evaluated with, and the reward that grades every answer (``math``:
    the last ``\\boxed{}``, its majority vote over those answers; ``code_tests``: the
    last python block run against the problem's tests in the sandbox, its majority vote
    over the programs, ``rewards.program_answer``)."""

    benchmarks: tuple[str, ...]
    temperature: float
    top_p: float
    grader: str = "math"


SUITES = {
    # The six benchmarks of DAPO, Dr. GRPO and SimpleRL-Zoo's tables, sampled as
    # DeepSeek-R1's evaluation does (Guo et al., arXiv:2501.12948, sec. 3.1: temperature
    # 0.6, top-p 0.95, pass@1 averaged over k samples).
    "math_reasoning": Suite(
        ("aime24", "aime25", "amc23", "math500", "minerva_math", "olympiadbench"),
        temperature=0.6, top_p=0.95),
    # DAPO's reported metric (Yu et al., arXiv:2503.14476, sec. 4.1): AIME 2024 avg@32 at
    # temperature 1.0 and top-p 0.7 (set eval.samples = 32).
    "dapo_aime24": Suite(("aime24",), temperature=1.0, top_p=0.7),
    # Dr. GRPO's five benchmarks for Oat-Zero (Liu et al., arXiv:2503.20783), greedy: one
    # answer per problem (set eval.samples = 1).
    "oat_zero": Suite(("aime24", "amc23", "math500", "minerva_math", "olympiadbench"),
                      temperature=0.0, top_p=1.0),
    # HumanEval and MBPP's test split graded by running each program against the
    # problem's tests (code_tests, all-or-nothing), sampled as the code-RL papers report
    # pass@1: DeepSeek-R1's protocol for its code benchmarks (Guo et al.,
    # arXiv:2501.12948, sec. 3.1: temperature 0.6, top-p 0.95, pass@1 averaged over k
    # samples, k from 4 to 64), which DeepCoder's evaluation keeps (Luo et al. 2025,
    # "DeepCoder: A Fully Open-Source 14B Coder at O3-mini Level", Agentica).
    "code": Suite(("humaneval", "mbpp"), temperature=0.6, top_p=0.95, grader="code_tests"),
}


def get_suite(name: str) -> Suite:
    """The suite `name`, or an error naming ``eval.suite`` and the suites there are."""
    if name not in SUITES:
        raise ValueError(f"eval.suite must be '' or one of {sorted(SUITES)}, got {name!r}")
    return SUITES[name]


def pass_budgets(n: int) -> list[int]:
    """The j of the reported pass@j: powers of two below n, and n.

    >>> pass_budgets(32), pass_budgets(6), pass_budgets(1)
    ([1, 2, 4, 8, 16, 32], [1, 2, 4, 6], [1])
    """
    return [2**i for i in range(n.bit_length()) if 2**i < n] + [n]


def benchmark_metrics(correct_counts: np.ndarray, majority_correct: np.ndarray,
                      n: int) -> dict[str, float]:
    """One benchmark's metrics (module docstring) from its problems' results.

    Args:
      correct_counts: `[P]` correct samples of each problem, each in 0..n.
      majority_correct: `[P]` whether each problem's majority answer is correct.
      n: samples per problem.

    Returns:
      ``problems``, ``samples``, ``avg@n``, ``pass@j`` for `pass_budgets(n)`, ``maj@n``.
    """
    counts = np.asarray(correct_counts, np.int64)
    if counts.size == 0:
        raise ValueError("a benchmark with no problems has no metrics; check its release file")
    metrics = {"problems": float(counts.size), "samples": float(n),
               f"avg@{n}": float(counts.sum() / (counts.size * n))}
    for j in pass_budgets(n):
        metrics[f"pass@{j}"] = float(np.mean([at_k.pass_at_k(n, int(c), j) for c in counts]))
    metrics[f"maj@{n}"] = float(np.mean(np.asarray(majority_correct, np.float64)))
    return metrics


def macro_average(results: dict[str, dict[str, float]]) -> dict[str, float]:
    """Each metric's mean over the benchmarks (``problems``: their total)."""
    rows = list(results.values())
    macro = {key: float(np.mean([row[key] for row in rows])) for key in rows[0]}
    macro["problems"] = float(sum(row["problems"] for row in rows))
    return macro


def results_table(results: dict[str, dict[str, float]]) -> str:
    """A markdown table: a row per benchmark (and ``macro``), the metrics in percent."""
    keys = [key for key in next(iter(results.values())) if key not in ("problems", "samples")]
    lines = ["| benchmark | problems | " + " | ".join(keys) + " |",
             "|---|---:|" + "---:|" * len(keys)]
    for name, row in results.items():
        cells = [f"{100 * row[key]:.1f}" for key in keys]
        lines.append(f"| {name} | {int(row['problems'])} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
