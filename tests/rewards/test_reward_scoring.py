"""The batch scorer and the grader pool: combining rewards, containing graders that hang or fail."""

import os
import pathlib
import subprocess
import sys
import time

import numpy as np
import pytest

from grpo_jax import rewards
from grpo_jax.rewards import _limits


# Graders for the pool must be importable by name, so they live at module level.
def hanging_grader(prompt, completion, example):
    if completion == "hang":
        time.sleep(3600)
    return 1.0


def spinning_grader(prompt, completion, example):
    if completion == "hang":
        while True:  # holds the GIL, deaf to signals, like a runaway sympy power
            pass
    return 1.0


def self_limited_grader(prompt, completion, example):
    with _limits.time_limit(0.1, "self-limited grader"):
        while completion == "slow":  # Python code, so the grader's own time limit stops it
            pass
    return 1.0


def raising_grader(prompt, completion, example):
    if completion == "raise":
        raise RuntimeError("grader bug")
    return 1.0


def crashing_grader(prompt, completion, example):
    if completion == "crash":
        os._exit(3)  # the worker process dies mid-call
    return 1.0


def greedy_grader(prompt, completion, example):
    if completion == "greedy":
        return len(bytearray(8 * 2**30))  # 8 GiB, over the pool's 1 GiB limit
    return 1.0


def nan_grader(prompt, completion, example):
    return float("nan") if completion == "nan" else 1.0


def exiting_grader(prompt, completion, example):
    if completion == "exit":
        sys.exit(3)   # a grader's own sys.exit, inline in the trainer
    return 1.0


def huge_grader(prompt, completion, example):
    return 1e39 if completion == "huge" else 1.0   # finite in float64, inf in float32


def forking_grader(prompt, completion, example):
    """Starts a child that would outlive its worker, writes its pid, then hangs."""
    if completion.startswith("fork "):
        child = subprocess.Popen(["sleep", "600"])
        with open(completion[len("fork "):], "w") as f:
            f.write(str(child.pid))
        time.sleep(3600)
    return 1.0


def length_grader(prompt, completion, example, *, scale=1.0):
    return scale * len(completion)


@pytest.fixture
def registered():
    """Registers the test graders for the duration of one test."""
    entries = {
        "test_hanging": (hanging_grader, "pool"),
        "test_spinning": (spinning_grader, "pool"),
        "test_self_limited": (self_limited_grader, "pool"),
        "test_self_limited_inline": (self_limited_grader, "inline"),
        "test_raising": (raising_grader, "pool"),
        "test_raising_inline": (raising_grader, "inline"),
        "test_crashing": (crashing_grader, "pool"),
        "test_greedy": (greedy_grader, "pool"),
        "test_nan": (nan_grader, "inline"),
        "test_exiting_inline": (exiting_grader, "inline"),
        "test_huge": (huge_grader, "inline"),
        "test_forking": (forking_grader, "pool"),
        "test_length": (length_grader, "inline"),
        "test_batch_raising": (lambda prompts, completions, examples: 1 / 0, "batch"),
        "test_batch_wrong_shape": (lambda prompts, completions, examples: np.ones(3), "batch"),
    }
    for name, (fn, where) in entries.items():
        rewards.register(name, where=where)(fn)
    yield
    for name in entries:
        rewards.unregister(name)


@pytest.fixture(scope="module")
def pool():
    # 2 s: a fresh worker imports this test module on its first call, even on a loaded machine.
    with rewards.GraderPool(2, timeout_s=2.0, memory_limit_gb=1.0) as grader_pool:
        yield grader_pool


def _score(names_weights, completions, **kwargs):
    n = len(completions)
    return rewards.score_batch(
        rewards.as_specs(names_weights), ["p"] * n, completions, [{"answer": "1"}] * n, **kwargs
    )


class TestContainment:
    @pytest.mark.slow
    @pytest.mark.parametrize("name", ["test_hanging", "test_spinning"])
    def test_hung_grader_times_out_and_pool_survives(self, registered, pool, name):
        replaced = pool.replaced_workers
        start = time.monotonic()
        values, metrics = _score([(name, 1.0)], ["ok", "hang", "ok", "hang", "ok"], pool=pool)
        # one budget of 2 s on 2 workers plus restarts, not 3600 s
        assert time.monotonic() - start < 30.0
        np.testing.assert_array_equal(values, [1.0, 0.0, 1.0, 0.0, 1.0])
        assert metrics["reward_timeouts"] == 2.0 and metrics[f"reward_timeouts/{name}"] == 2.0
        assert metrics["reward_errors"] == 0.0
        assert pool.replaced_workers == replaced + 2
        # The replaced workers serve the next batch normally.
        values, metrics = _score([(name, 1.0)], ["ok"] * 4, pool=pool)
        np.testing.assert_array_equal(values, [1.0] * 4)
        assert metrics["reward_timeouts"] == 0.0

    @pytest.mark.parametrize("name", ["test_self_limited", "test_self_limited_inline"])
    def test_grader_time_limit_is_a_counted_timeout_without_replacing_a_worker(
        self, registered, pool, name
    ):
        replaced = pool.replaced_workers
        values, metrics = _score([(name, 1.0)], ["ok", "slow", "ok"], pool=pool)
        np.testing.assert_array_equal(values, [1.0, 0.0, 1.0])
        assert metrics["reward_timeouts"] == 1.0 and metrics[f"reward_timeouts/{name}"] == 1.0
        assert metrics["reward_errors"] == 0.0
        assert pool.replaced_workers == replaced

    @pytest.mark.parametrize("name", ["test_raising", "test_raising_inline"])
    def test_raising_grader_scores_zero_and_counts(self, registered, pool, name):
        values, metrics = _score([(name, 1.0)], ["ok", "raise", "raise"], pool=pool)
        np.testing.assert_array_equal(values, [1.0, 0.0, 0.0])
        assert metrics["reward_errors"] == 2.0 and metrics[f"reward_errors/{name}"] == 2.0
        assert metrics["reward_timeouts"] == 0.0

    def test_raising_pool_grader_without_pool_is_contained(self, registered):
        values, metrics = _score([("test_raising", 1.0)], ["raise", "ok"])
        np.testing.assert_array_equal(values, [0.0, 1.0])
        assert metrics["reward_errors"] == 1.0

    def test_an_inline_grader_calling_sys_exit_scores_zero_and_counts(self, registered):
        values, metrics = _score([("test_exiting_inline", 1.0)], ["ok", "exit"])
        np.testing.assert_array_equal(values, [1.0, 0.0])
        assert metrics["reward_errors"] == 1.0

    def test_a_reward_past_float32_is_an_error_not_inf(self, registered):
        values, metrics = _score([("test_huge", 1.0)], ["huge", "ok"])
        np.testing.assert_array_equal(values, [0.0, 1.0])
        assert metrics["reward_errors"] == 1.0 and np.isfinite(metrics["rewards/test_huge"])

    @pytest.mark.slow
    def test_a_hung_graders_children_die_with_its_worker(self, registered, pool, tmp_path):
        pid_file = tmp_path / "child.pid"
        values, metrics = _score([("test_forking", 1.0)], [f"fork {pid_file}"], pool=pool)
        assert metrics["reward_timeouts"] == 1.0
        stat = pathlib.Path(f"/proc/{int(pid_file.read_text())}/stat")
        deadline = time.monotonic() + 10
        while stat.exists() and stat.read_text().split(") ")[1][0] != "Z":
            assert time.monotonic() < deadline, "the grader's child outlived its killed worker"
            time.sleep(0.05)

    def test_crashed_worker_is_replaced(self, registered, pool):
        replaced = pool.replaced_workers
        values, metrics = _score([("test_crashing", 1.0)], ["crash", "ok", "ok"], pool=pool)
        np.testing.assert_array_equal(values, [0.0, 1.0, 1.0])
        assert metrics["reward_errors"] == 1.0
        assert pool.replaced_workers == replaced + 1

    def test_memory_hog_gets_memory_error(self, registered, pool):
        values, metrics = _score([("test_greedy", 1.0)], ["greedy", "ok"], pool=pool)
        np.testing.assert_array_equal(values, [0.0, 1.0])
        assert metrics["reward_errors"] == 1.0 and metrics["reward_timeouts"] == 0.0

    def test_non_finite_reward_is_an_error(self, registered):
        values, metrics = _score([("test_nan", 1.0)], ["nan", "ok"])
        np.testing.assert_array_equal(values, [0.0, 1.0])
        assert metrics["reward_errors"] == 1.0

    def test_failing_batch_reward_zeroes_its_column(self, registered):
        for name in ["test_batch_raising", "test_batch_wrong_shape"]:
            values, metrics = _score([(name, 1.0), ("test_length", 1.0)], ["a", "bb"])
            np.testing.assert_array_equal(values, [1.0, 2.0])
            assert metrics[f"reward_errors/{name}"] == 2.0

    def test_unpicklable_grader_is_an_error(self, pool):
        outcomes = pool.map(lambda *args: 1.0, [("p", "c", {})])
        assert outcomes[0].status == "error" and outcomes[0].value == 0.0


class TestCombine:
    def test_weighted_sum(self, registered):
        values, metrics = _score([("test_length", 0.5), ("test_nan", 2.0)], ["a", "abcd", "nan"])
        np.testing.assert_allclose(values, [0.5 * 1 + 2.0, 0.5 * 4 + 2.0, 0.5 * 3 + 0.0])
        assert values.dtype == np.float32 and values.shape == (3,)
        assert metrics["rewards/test_length"] == pytest.approx(8 / 3)

    def test_separate_columns_are_unweighted(self, registered):
        specs = rewards.as_specs([("test_length", 0.5), ("test_nan", 2.0)])
        values, _ = rewards.score_batch(
            specs, ["p"] * 2, ["a", "nan"], [{}] * 2, combine="separate"
        )
        np.testing.assert_array_equal(values, [[1.0, 1.0], [3.0, 0.0]])
        assert values.dtype == np.float32
        np.testing.assert_array_equal(rewards.spec_weights(specs), [0.5, 2.0])

    def test_options_reach_the_reward(self, registered):
        values, _ = _score([("test_length", 1.0, {"scale": 10.0})], ["abc"])
        np.testing.assert_array_equal(values, [30.0])

    def test_completion_lengths_are_added_to_examples(self, registered):
        rewards.register("test_read_length")(lambda p, c, example: example["completion_length"])
        try:
            values, _ = _score(
                [("test_read_length", 1.0)], ["a", "b"], completion_lengths=np.array([7, 9])
            )
        finally:
            rewards.unregister("test_read_length")
        np.testing.assert_array_equal(values, [7.0, 9.0])


class TestValidation:
    def test_unknown_reward_lists_known_names(self):
        with pytest.raises(KeyError, match="registered rewards: .*countdown"):
            rewards.as_specs([("mathh", 1.0)])

    def test_duplicate_reward(self):
        with pytest.raises(ValueError, match="appears 2 times"):
            rewards.as_specs([("math", 1.0), ("math", 0.5)])

    def test_empty_specs(self):
        with pytest.raises(ValueError, match="at least one reward"):
            rewards.as_specs([])

    def test_row_count_mismatch(self):
        with pytest.raises(ValueError, match="one entry per row"):
            rewards.score_batch(rewards.as_specs([("countdown", 1.0)]), ["p"], ["c", "d"], [{}])

    def test_bad_combine(self):
        with pytest.raises(ValueError, match="combine must be"):
            rewards.score_batch(rewards.as_specs([("countdown", 1.0)]), [], [], [], combine="mean")

    def test_register_twice(self):
        with pytest.raises(ValueError, match="already registered"):
            rewards.register("math")(lambda p, c, e: 0.0)

    def test_pool_arguments(self):
        with pytest.raises(ValueError, match="timeout_s must be > 0"):
            rewards.GraderPool(1, timeout_s=0)
        with pytest.raises(ValueError, match="num_workers must be >= 1"):
            rewards.GraderPool(0)
        with pytest.raises(ValueError, match="memory_limit_gb must be > 0"):
            rewards.GraderPool(1, memory_limit_gb=0)
