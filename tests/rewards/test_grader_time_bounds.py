"""Every registered grader returns in a bounded CPU time on any completion of up to
10,000 characters, with and without the GraderPool.

A correctness bound on adversarial inputs, not a benchmark: 3 s of CPU is far above what
the size bounds of `_limits` allow (0.56 s at most on the 2-core CI machine class, spent by
math-verify's parser on superscripts at the nesting cap; a virtual machine under load
charged the same call 1.1-1.6 s, under `_limits.TIME_LIMIT_S`) and far below what the same
inputs cost without them (10 s for 1,000 nested braces, minutes for `9^{9^{9^{9}}}`). The
bound is on CPU time (a row grader's: its thread's), which load stretches far less than wall
time; wall time gets a loose hang guard. Every row must also be decided by the size bounds,
not by the time limit: an "ok" outcome, never "timeout" (in the pool, where the worker's CPU
is not visible, "ok" is the CPU bound).
"""

import time

import pytest

from grpo_jax import rewards
from grpo_jax.rewards import _pool

BOUND_S = 3.0  # CPU seconds per call, above the 2 s timer, which must not be what returns
HANG_S = 10.0  # wall seconds per call, even on a loaded machine
LONGEST = 10_000
VERDICT = "<verify>correct</verify>"

# label -> completion of at most LONGEST characters
ADVERSARIAL = {
    "5,000 nested braces in a box": "\\boxed{" + "{" * 4990 + "5" + "}" * 4991,
    "1,000 nested braces in a box": "\\boxed{" + "{" * 1000 + "5" + "}" * 1001,
    "1,000 nested braces after ####": "#### " + "{" * 1000 + "5" + "}" * 1000,
    "1,000 nested boxes": "\\boxed{" * 1000 + "5" + "}" * 1000,
    "unclosed box chain": "\\boxed{" * 1420,
    "1,100 boxes in a row": "\\boxed{5}" * 1100,
    "unclosed box of text": "\\boxed{" + "x" * 9990,
    "digits": "7" * LONGEST,
    "#### then digits": "#### " + "7" * (LONGEST - 5),
    "#### repeated": "####" * 2500,
    "#### 5 on every line": "#### 5\n" * 1400,
    "#### and a long line of words": "#### 5 " + "apples " * 1400,
    "LaTeX noise in a box": "\\boxed{" + "\\frac{\\sqrt{2}}{3}+" * 520 + "1}",
    "LaTeX noise": "\\frac{\\sqrt{2}}{3}+" * 520,
    "nested parentheses": "(" * 5000 + ")" * 5000,
    "unclosed answer tags": "<answer>" * 1250,
    "countdown: 4,990 nested parentheses": "<answer>" + "(" * 4990 + "9" + ")" * 4990 + "</answer>",
    "countdown: 127 nested parentheses": "<answer>" + "(" * 127 + "25" + ")" * 127 + "</answer>",
    "countdown: power tower": "<answer>9**9**9**9</answer>",
    "countdown: caret tower": "<answer>" + "9^" * 4990 + "9</answer>",
    "countdown: 10,000-digit literal": "<answer>" + "9" * 9980 + "</answer>",
    "power tower": "\\boxed{9^{9^{9^{9}}}}",
    "power tower after ####": "#### 10^{10^{10}}",
    "tiny power": "\\boxed{10^{-10^{7}}}",
    "factorial of a power": "\\boxed{(10^{10})!}",
    "huge binomial": "\\boxed{\\binom{10^{8}}{5 \\cdot 10^{7}}}",
    "matrix of a power tower": "\\boxed{\\begin{pmatrix} 9^{9^{9}} & 1 \\end{pmatrix}}",
    "product of ten sums": "\\boxed{(a+b)(c+d)(e+f)(g+h)(i+j)(k+l)(m+n)(o+p)(q+r)(s+t)}",
    "polynomial power": "\\boxed{(x+y+1)^{30}}",
    # the most math-verify is asked to parse: at the length, depth and nesting caps
    "parenthesised sum at the nesting cap": "\\boxed{(" + "1+" * 30 + "1)}",
    "parentheses at the depth cap": "\\boxed{" + "(" * 5 + "1+1" + ")" * 5 + "}",
    "braces at the depth cap": "\\boxed{" + "{" * 5 + "5" + "}" * 5 + "}",
    "superscripts at the nesting cap": "\\boxed{" + "x^{" * 5 + "1" + "}" * 5 + "}",
    "set at the nesting cap": "\\boxed{\\{" + "1," * 30 + "1\\}}",
    "flat sum at the length cap": "\\boxed{" + "x+" * 99 + "1}",
    "verify tags": "<verify>" * 1100,
    "think tags": "<think>" * 1400,
}
BENIGN = "<think>4</think> #### 5 \\boxed{5} <answer>25</answer>"
EXAMPLE = {
    "task": "t",
    "question": "q",
    "answer": "5",
    "numbers": [25, 6, 2, 9, 9, 9, 9],
    "target": 100,
    "continuation": "brown fox",
    "completion_length": 10,
}
OPTIONS = {"overlong": {"max_len": 20, "cache_len": 5}, "length_budget": {"budget": 20}}


def _completions(name):
    """The adversarial completions; self_verify's end in a verdict, so its grader runs."""
    if name != "self_verify":
        return ADVERSARIAL
    return {label: text[: LONGEST - len(VERDICT)] + VERDICT for label, text in ADVERSARIAL.items()}


def _call(reward, completion) -> tuple[float, float, _pool.Outcome]:
    """(CPU seconds, wall seconds, outcome) of one call in this process. A row grader's CPU
    is that of the thread calling it (the other threads of a test process, XLA's pools or a
    checkpoint writer an earlier test left, are not the grader's); a batch grader's is the
    whole process's, as it may compute with JAX on XLA's threads."""
    options = OPTIONS.get(reward.name, {})
    clock = time.process_time if reward.where == "batch" else time.thread_time
    cpu, wall = clock(), time.perf_counter()
    if reward.where == "batch":
        outcome = _pool.to_outcome(reward.fn(["p"], [completion], [EXAMPLE], **options)[0])
    else:
        outcome = _pool.run_contained(reward.fn, ("p", completion, EXAMPLE), options)
    return clock() - cpu, time.perf_counter() - wall, outcome


def test_inputs_are_long_and_many():
    assert all(
        len(text) <= LONGEST
        for name in ("math", "self_verify")
        for text in _completions(name).values()
    )
    assert sum(len(text) > 9_000 for text in ADVERSARIAL.values()) >= 15


@pytest.mark.slow
@pytest.mark.parametrize("name", rewards.reward_names())
def test_grader_returns_fast_without_the_pool(name):
    reward = rewards.get_reward(name)
    # first-use costs (math-verify's parser, a JAX compile) are not the input's
    _call(reward, BENIGN)
    failures = {}
    for label, completion in _completions(name).items():
        cpu, wall, outcome = _call(reward, completion)
        if cpu >= BOUND_S or wall >= HANG_S or outcome.status != "ok":
            failures[label] = (round(cpu, 3), round(wall, 3), outcome)
    assert not failures


@pytest.fixture(scope="module")
def pool():
    """A budget above the hang guard, so a slow row shows as slow, not as a pool timeout."""
    with rewards.GraderPool(2, timeout_s=2 * HANG_S) as grader_pool:
        yield grader_pool


@pytest.mark.slow
@pytest.mark.parametrize(
    "name", [name for name in rewards.reward_names() if rewards.get_reward(name).where == "pool"]
)
def test_pool_grader_returns_fast_in_the_pool(pool, name):
    reward = rewards.get_reward(name)
    pool.map(reward.fn, [("p", BENIGN, EXAMPLE)] * 2)  # both workers, once each, before timing
    failures = {}
    for label, completion in _completions(name).items():
        start = time.perf_counter()
        [outcome] = pool.map(reward.fn, [("p", completion, EXAMPLE)])
        wall = time.perf_counter() - start
        if wall >= HANG_S or outcome.status != "ok":
            failures[label] = (round(wall, 3), outcome)
    assert not failures
