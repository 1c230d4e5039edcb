"""Asynchronous RL: the producer thread's schedule and bound, and the trainer with it.

The deterministic mode (``async_rl.fixed``) is the correctness test of the pipeline: with
every batch exactly k steps stale it must equal the synchronous loop with
``rollout.policy_lag = k`` bit for bit (tokens, every metric but timings, the exported
parameters).
"""

import threading
import time

import jax.numpy as jnp
import numpy as np
import pytest

from grpo_jax.training import async_rl, rl, roles
from tests.doctest_numbers import run_examples
from tests.training.training_setups import (LAG_RUN, LAG_STEPS, assert_rows_equal,
                                            assert_same_export, read_metrics, tiny_config)


def _producer(k, fixed, last=8, versions=None, delay=0.0):
    """A producer over fake rollouts: step s's "batch" records the version that sampled."""
    calls = []

    def sample(step, version, params):
        calls.append((step, params))
        assert params == f"theta{version}"
        time.sleep(delay)
        return {"params": params}, {"m": float(step)}, [step], {"position": step}, None

    producer = async_rl.Producer(sample, first=1, last=last, max_staleness=k, fixed=fixed,
                                 versions=versions or {0: "theta0"})
    return producer, calls


def _learn(producer, last, delay=0.0):
    """The learner's side: publish theta_{t-1}, take step t, 'update' for `delay` s."""
    taken = []
    for step in range(1, last + 1):
        producer.publish(step - 1, f"theta{step - 1}")
        taken.append(producer.take(step))
        time.sleep(delay)
    producer.close()
    return taken


@pytest.mark.parametrize("k", [1, 2, 3])
def test_fixed_schedule_samples_step_s_with_version_s_minus_1_minus_k(k):
    """With fixed, step s gets exactly theta_{max(0, s-1-k)}: staleness min(k, s-1), the
    synchronous loop's policy_lag = k; the data position travels with its step."""
    producer, calls = _producer(k, fixed=True)
    taken = _learn(producer, 8)
    for produced in taken:
        s = produced.step
        assert produced.version == max(0, s - 1 - k)
        assert produced.batch["params"] == f"theta{max(0, s - 1 - k)}"
        assert produced.data_position == {"position": s} and produced.examples == [s]
    assert [c[0] for c in calls] == list(range(1, 9))


@pytest.mark.parametrize("slow", ["learner", "sampler"])
def test_free_running_staleness_stays_within_the_bound(slow):
    """Free-running, a slow learner lets the producer run ahead (up to k) and a slow
    sampler keeps it behind (staleness 0 or close): never outside [0, k], and the producer
    uses the newest version it has."""
    k = 2
    producer, _ = _producer(k, fixed=False, last=10, delay=0.05 if slow == "sampler" else 0.0)
    taken = _learn(producer, 10, delay=0.05 if slow == "learner" else 0.0)
    staleness = [p.step - 1 - p.version for p in taken]
    assert all(0 <= s <= k for s in staleness), staleness
    if slow == "learner":   # the producer waits at the bound: steps >= k+1 are k stale
        assert staleness[k:] == [k] * (10 - k), staleness
    else:   # the learner waits for every batch, sampled with the newest version
        assert max(staleness[1:]) <= 1, staleness


def test_the_producer_waits_for_the_version_it_needs():
    """Step k + 2 needs theta_1: it is not sampled before the learner publishes it."""
    k = 1
    producer, calls = _producer(k, fixed=True, last=3)
    producer.publish(0, "theta0")
    first = producer.take(1)
    time.sleep(0.2)
    assert [c[0] for c in calls] == [1, 2] and first.version == 0   # step 3 needs theta_1
    producer.publish(1, "theta1")
    assert producer.take(2).version == 0 and producer.take(3).version == 1
    producer.close()


def test_a_failed_rollout_reaches_the_learner_and_close_stops_a_waiting_producer():
    def sample(step, version, params):
        raise ValueError("grader exploded")

    producer = async_rl.Producer(sample, first=1, last=3, max_staleness=1, fixed=True,
                                 versions={0: "theta0"})
    with pytest.raises(RuntimeError, match="failed before step 1") as info:
        producer.take(1)
    assert isinstance(info.value.__cause__, ValueError)
    producer.close()

    waiting, _ = _producer(1, fixed=True, last=5)   # stops at step 3: theta_1 never comes
    time.sleep(0.1)
    closer = threading.Thread(target=waiting.close)
    closer.start()
    closer.join(timeout=5)
    assert not closer.is_alive()


@pytest.mark.parametrize("overrides, match", [
    ({"async_rl.max_staleness": 0}, r"async_rl.max_staleness must be an int >= 1"),
    ({"rollout.policy_lag": 1}, r"set rollout.policy_lag=0"),
])
def test_config_errors_name_the_field(overrides, match):
    config = tiny_config("dapo", "/nonexistent", **{"async_rl.enabled": True, **overrides})
    with pytest.raises(ValueError, match=match):
        async_rl.check_config(config, 1)
    for several, match in [
        ({"async_rl.enabled": True}, r"async_rl.enabled on 2 processes needs split meshes.*set "
                                     r"rollout.mesh to the sampling processes' devices"),
        ({"rollout.mesh": "data=4"}, r"rollout.mesh='data=4' on 2 processes .* set "
                                     r"async_rl.enabled=True and async_rl.fixed=True"),
        ({"rollout.mesh": "data=4", "async_rl.enabled": True}, r"async_rl.fixed=True")]:
        with pytest.raises(ValueError, match=match):
            async_rl.check_config(tiny_config("dapo", "/x", **several), 2)
    async_rl.check_config(tiny_config("dapo", "/x", **{   # process roles
        "rollout.mesh": "data=4", "async_rl.enabled": True, "async_rl.fixed": True}), 2)
    assert async_rl.lagged_copies(tiny_config("dapo", "/x", **{"async_rl.enabled": True,
                                                               "async_rl.max_staleness": 3})) == 3


@pytest.mark.slow
@pytest.mark.parametrize("k, rollout_mesh", [(1, ""), (1, "data=4"), (2, "data=4")])
def test_fixed_async_equals_the_synchronous_loop_with_policy_lag_k(data_dir, lag_run,
                                                                    tmp_path, k, rollout_mesh):
    """Every batch exactly k steps stale: the same rollouts (their text row for row), every
    metric but timings, and the same exported parameters, bit for bit, as the synchronous
    loop with rollout.policy_lag = k; staleness min(k, t - 1) in both. On one mesh, and on
    split meshes (the 8 devices 4/4: the sampler on the last 4, the learner on the first
    4; both loops copy the parameters over and the batch back every step)."""
    sync = lag_run(k, rollout_mesh)
    asynchronous = tmp_path / "async"
    rl.train(tiny_config("dapo", data_dir, **LAG_RUN, **{
        "rollout.mesh": rollout_mesh, "async_rl.enabled": True, "async_rl.max_staleness": k,
        "async_rl.fixed": True}), str(asynchronous))
    assert_rows_equal(asynchronous, sync, LAG_STEPS)
    assert_same_export(asynchronous, sync)
    for step in LAG_STEPS:
        assert (asynchronous / "rollouts" / f"{step}.jsonl").read_text() == \
            (sync / "rollouts" / f"{step}.jsonl").read_text()
    assert [r["staleness"] for r in read_metrics(asynchronous)] == \
        [float(min(k, t - 1)) for t in LAG_STEPS]
    assert all(r["time_rollout_wait"] >= 0 for r in read_metrics(asynchronous))
    for run in (sync, asynchronous):   # the cross-mesh copies are timed where they happen
        rows = read_metrics(run)
        transfers = [r.get("time_weight_transfer", 0) * r.get("time_batch_transfer", 0)
                     for r in rows]
        assert all(t > 0 for t in transfers) == bool(rollout_mesh), transfers
        assert all(("time_weight_transfer" in r) == bool(rollout_mesh) for r in rows)


@pytest.mark.slow
def test_split_meshes_sample_what_one_mesh_samples(lag_run):
    """The synchronous loop sampling on 4 devices and training on the other 4 draws the
    same rollouts, row for row, as on one 8-device mesh, and logs the same metrics up to
    the rounding of a 4-way against an 8-way gradient sum (the runs with policy_lag = 1
    that the asynchronous loop is compared with)."""
    one, split = (lag_run(1, mesh) for mesh in ("", "data=4"))
    for step in LAG_STEPS:
        assert (split / "rollouts" / f"{step}.jsonl").read_text() == \
            (one / "rollouts" / f"{step}.jsonl").read_text()
    assert_rows_equal(split, one, LAG_STEPS, rtol=1e-4, atol=1e-6)


@pytest.mark.slow
def test_free_running_trains_within_its_bound(data_dir, tmp_path):
    """Free-running (each batch sampled by the newest version published), a run trains
    with every batch at most k = 2 steps stale. (Fixed mode killed with SIGKILL and
    resumed equals the uninterrupted run: test_rl.py's kill -9 test.)"""
    rl.train(tiny_config("dapo", data_dir, **{
        "train.steps": 4, "train.checkpoint_every": 100, "train.eval_every": 100,
        "async_rl.enabled": True, "async_rl.max_staleness": 2, "async_rl.fixed": False}),
        str(tmp_path))
    rows = read_metrics(tmp_path)
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert all(0 <= r["staleness"] <= 2 and r["grad_norm"] > 0 for r in rows), rows
    assert all(np.isfinite(r["loss"]) for r in rows)


@pytest.mark.parametrize("start, k, last, lagged, order", [
    (0, 2, 5, [0, 0], [("batch", 1), ("batch", 2), ("batch", 3), ("params", 1), ("batch", 4),
               ("params", 2), ("batch", 5)]),
    # resumed after step 3: the lagged copies hold theta_1 and theta_2 (steps 4 and 5)
    (3, 2, 6, [1, 2], [("batch", 4), ("batch", 5), ("params", 3), ("batch", 6)]),
])
def test_the_roles_send_each_version_just_before_the_first_batch_it_samples(start, k, last,
                                                                          lagged, order):
    """Process roles (rollout.mesh on several processes) issue their copies in one order,
    the fixed schedule's: step s sampled by theta_{max(0, s-1-k)}."""
    assert roles.starting_versions(start, k) == lagged
    assert roles.transfer_order(start, last, k) == order
    assert run_examples(roles, optionflags=0) == (0, 1)   # (failed, attempted): its k = 1 example


def _producer_gets_the_turn(turns, seconds=5.0):
    """Whether a producer thread enters `turns.held()` within `seconds` (a test that
    would otherwise hang on a turn never given fails instead)."""
    entered = threading.Event()

    def producer():
        with turns.held():
            entered.set()

    thread = threading.Thread(target=producer, daemon=True)
    thread.start()
    return entered.wait(seconds)


def test_on_one_mesh_the_learner_and_the_producer_take_turns_on_the_devices():
    """`DeviceTurns(shared=True)`: the producer's sampling (`held`) waits while the learner
    holds the turn, runs while the learner waits for its batch (`given_up`), and the
    learner takes the turn back only once the producer's block has ended; `give_back`
    lets a last sampling finish. (Two threads running programs on the same CPU devices
    at once can deadlock XLA's all-reduce, which aborts the process after 40 s.)"""
    turns, order = async_rl.DeviceTurns(shared=True), []
    producer_may_end = threading.Event()

    def producer():
        with turns.held():
            order.append("producer samples")
            producer_may_end.wait(5)
            order.append("producer ends")

    turns.take()
    thread = threading.Thread(target=producer)
    thread.start()
    time.sleep(0.2)
    order.append("learner steps")   # the producer is still waiting for the turn
    with turns.given_up():
        time.sleep(0.2)
        producer_may_end.set()
        thread.join(5)
    order.append("learner steps again")
    assert order == ["learner steps", "producer samples", "producer ends", "learner steps again"]
    assert not _producer_gets_the_turn(turns, seconds=0.2)   # the learner holds it again
    turns.give_back()
    assert _producer_gets_the_turn(turns)   # a producer's last sampling after the learner stops
    turns.take()   # a failed step's deleted (donated) array: given back all the same
    deleted = jnp.ones(3)
    deleted.delete()
    turns.give_back(deleted)
    assert _producer_gets_the_turn(turns)


def test_on_split_meshes_the_turns_wait_for_nothing():
    turns = async_rl.DeviceTurns(shared=False)
    turns.take()
    assert _producer_gets_the_turn(turns)   # the learner "holds" it, yet the producer runs
    turns.give_back()
    assert _producer_gets_the_turn(turns)
