"""Two JAX processes on localhost, one 8-device mesh: the same run as one process with 8.

Each process has 4 CPU devices (gloo collectives between them); together they form the
global mesh the config declares. The two-process run must sample the same tokens, score
the same rewards, log the same metrics (from process 0 only) and end with the same
parameters as the one-process run (the `reference` fixture: the fault tests' 12-step run),
through kill -9 of both processes and SIGTERM to one of them; with a tool environment,
each process answering the calls of its own rows, the same episodes. With split meshes
(process roles), process 1 samples and process 0 trains: the same run as one process
whose 8 devices split 4/4; so does a run with a critic and the supervised term on 4
processes, two a role. With partial rollouts, each process carrying its own groups:
the same run as one process.
"""

import re
import signal
import time

import numpy as np
import orbax.checkpoint as ocp
import pytest
import safetensors.numpy

from grpo_jax import run_files
from grpo_jax.training import checkpoint, partial, preemption, rl
from tests.training.training_setups import (FAULTS, LAG_RUN, assert_rows_equal,
                                             assert_same_export, cli_config_file,
                                             finished_checkpoints, main_commands, read_metrics,
                                             start_processes, step_lines, tiny_config,
                                             wait_for_step)


def _start(commands, tmp_path, name):
    """Both processes, each writing `<name>_<i>.log`; returns (processes, logs, files)."""
    logs = [tmp_path / f"{name}_{i}.log" for i in range(len(commands))]
    files = [open(log, "w") for log in logs]
    return start_processes(commands, files), logs, files


def _wait(processes, logs, files, timeout=900):
    codes = [p.wait(timeout=timeout) for p in processes]
    for f in files:
        f.close()
    return codes, [log.read_text() for log in logs]


def _kill_after_checkpoint(commands, tmp_path, workdir, step=2):
    """Starts both processes and kills them (-9) once `step`'s checkpoint is on disk;
    asserts both died by the kill, before the run could export."""
    processes, logs, files = _start(commands, tmp_path, "killed")
    deadline = time.time() + 900
    while time.time() < deadline and step not in finished_checkpoints(workdir):
        assert all(p.poll() is None for p in processes), "a process ended before the kill"
        time.sleep(0.05)
    for p in processes:
        p.kill()
    codes, _ = _wait(processes, logs, files)
    assert codes == [-9, -9] and not (workdir / "export").exists()


@pytest.mark.slow
def test_two_processes_equal_one_process_through_kill_and_sigterm(data_dir, reference, tmp_path):
    """The two-process run is killed (-9, both processes) once step 2's checkpoint is on
    disk; run again, it resumes there, and process 1 alone gets SIGTERM a random number of
    steps later: process 0 learns it at the next step boundary (the flags are agreed every
    step), both save that step and exit 75. The third run resumes there and ends as the
    one-process run (within the tolerance of two processes against one), its step-1
    rollout row for row the same. The two processes pack their forward passes (each
    gathers every row's length for the plan) where the reference ran padded."""
    overrides = {**FAULTS, "train.checkpoint_every": 2, "train.export": True,
                 "train.log_rollouts_every": 1, "train.packing": "on"}
    workdir = tmp_path / "two"
    commands = main_commands(cli_config_file(tmp_path, data_dir, overrides), workdir, 2)

    _kill_after_checkpoint(commands, tmp_path, workdir)
    # Step 1's rollout: the same prompts, completions and rewards, row for row.
    assert (workdir / "rollouts" / "1.jsonl").read_text() == \
        (reference / "rollouts" / "1.jsonl").read_text()

    processes, logs, files = _start(commands, tmp_path, "sigterm")
    resumed = finished_checkpoints(workdir)[-1]
    wait_for_step(processes[0], logs[0], resumed + int(np.random.default_rng(3).integers(1, 4)))
    processes[1].send_signal(signal.SIGTERM)
    codes, texts = _wait(processes, logs, files, timeout=600)
    assert codes == [preemption.EXIT_STATUS] * 2, [t[-3000:] for t in texts]
    assert f"resumed from the checkpoint of step {resumed} in" in texts[0]
    stopped = step_lines(texts[0])[-1]
    assert f"stopped by SIGTERM after step {stopped}; its checkpoint is" in texts[0]
    assert "SIGTERM: stopping once" in texts[1] and "SIGTERM: stopping once" not in texts[0]
    assert finished_checkpoints(workdir)[-1] == stopped

    processes, logs, files = _start(commands, tmp_path, "finished")
    codes, (log0, log1) = _wait(processes, logs, files)
    assert codes == [0, 0], log0[-3000:]
    assert f"resumed from the checkpoint of step {stopped} in" in log0
    assert_rows_equal(workdir, reference, range(1, 13), rtol=2e-4, atol=1e-6,
                      extra=("pack_rows_fraction", "pack_fill"))
    assert_same_export(workdir, reference, rtol=1e-4, atol=1e-6)
    # Process 0 alone wrote metrics and printed the mesh of both processes' devices.
    assert len(list(workdir.glob(run_files.METRICS + "*"))) == 1
    assert "over 8 cpu device(s) in 2 processes" in log0 and "step    12/12" in log0
    assert "step " not in log1 and "mesh" not in log1


# One step of the tool recipe with 8 prompts (their rows split over both processes' mesh),
# one draw, the greedy held-out evaluation after it, and the updated parameters exported.
TOOL_RUN = {"rollout.prompts_per_batch": 8, "train.steps": 1, "train.eval_every": 1,
            "train.log_rollouts_every": 1, "filtering.max_gen_batches": 1, "eval.samples": 0,
            "train.export": True}


@pytest.mark.slow
def test_two_processes_answer_the_tool_calls_of_their_own_rows_as_one_process(data_dir, tmp_path):
    """The calculator answers the model's calls on two processes, each stepping the
    environment for its own rows and the engine taking both processes' replies: the same
    rollouts row for row (every row's text, replies included, and reward) and the same
    metrics, the episode counts (`tool_calls_per_episode`, ...) and the held-out
    evaluation's (`eval_tool_use_rate`, ...) among them, and the same parameters after the
    update, as one process with 8 devices."""
    one = tmp_path / "one"
    rl.train(tiny_config("tool_calculator", data_dir, **TOOL_RUN), str(one))
    rows = read_metrics(one)
    assert min(r["tool_calls_per_episode"] for r in rows) > 0 and "eval_tool_use_rate" in rows[-1]
    workdir = tmp_path / "two"
    config_file = cli_config_file(tmp_path, data_dir, TOOL_RUN, "tool_calculator")
    processes, logs, files = _start(main_commands(config_file, workdir, 2), tmp_path, "tools")
    codes, (log0, log1) = _wait(processes, logs, files)
    assert codes == [0, 0], log0[-3000:] + log1[-3000:]
    assert "over 8 cpu device(s) in 2 processes" in log0
    rollouts = (workdir / "rollouts" / "1.jsonl").read_text()
    assert rollouts == (one / "rollouts" / "1.jsonl").read_text()
    assert "</calculator><result>" in rollouts   # answered calls, in the rows' text
    assert_rows_equal(workdir, one, [1], rtol=2e-4, atol=1e-6)
    assert_same_export(workdir, one, rtol=1e-4, atol=1e-6)


# Process roles: 5 steps of the tiny recipe, asynchronous with every batch exactly 1 step
# stale, sampled on the last 4 devices (process 1's) and trained on the first 4 (process 0's).
# The process-roles runs: the synchronous loop's lag-1 comparison run (`LAG_RUN`: 5 steps,
# its rollouts logged, evaluated at step 5, exported) as fixed asynchronous runs on split meshes.
ROLES_RUN = {**LAG_RUN, "rollout.mesh": "data=4", "async_rl.enabled": True,
             "async_rl.max_staleness": 1, "async_rl.fixed": True}


@pytest.fixture
def one_process_split(lag_run):
    """What `ROLES_RUN` gives on one process with 8 devices split 4/4: the synchronous
    loop with rollout.policy_lag = 1 on the same split, which the fixed asynchronous loop
    equals bit for bit (test_async_rl.py), run once per session."""
    return lag_run(1, "data=4")


def _assert_equal_to_one_process(workdir, reference, log0, log1):
    """The two-process run's rollouts equal the one-process run's row for row (text and
    rewards), every step 1 stale after the first; its metrics and exported parameters
    equal them up to the rounding of the gloo all-reduce of two processes against the
    in-process one of one (metrics by up to rtol 7.4e-6, the export by up to 1.2e-7);
    every step timed both copies; process 0 alone printed and wrote."""
    for step in range(1, 6):
        assert (workdir / "rollouts" / f"{step}.jsonl").read_text() == \
            (reference / "rollouts" / f"{step}.jsonl").read_text()
    assert_rows_equal(workdir, reference, range(1, 6), rtol=5e-5, atol=1e-6)
    assert_same_export(workdir, reference, rtol=1e-5, atol=5e-7)
    rows = read_metrics(workdir)
    assert [r["staleness"] for r in rows] == [0.0, 1.0, 1.0, 1.0, 1.0]
    assert all(r["time_weight_transfer"] > 0 and r["time_batch_transfer"] > 0 for r in rows)
    assert "training mesh {'data': 4, 'fsdp': 1, 'tensor': 1} over 4 cpu device(s) in 2 " \
           "processes" in log0 and "step     5/5" in log0
    assert "step " not in log1 and len(list(workdir.glob(run_files.METRICS + "*"))) == 1


@pytest.mark.slow
def test_process_roles_killed_stopped_and_resumed_end_as_the_uninterrupted_run(
        one_process_split, data_dir, tmp_path):
    """rollout.mesh=data=4 on 2 processes of 4 devices: process 1 samples, process 0
    trains, parameters and batches crossing between them, as one process does between
    the two halves of its 8 devices; interrupted twice on the way, it ends as the
    uninterrupted one-process run (an uninterrupted two-process run checks nothing
    more: the same comparison, without the resumes). Both processes are killed (-9) once
    step 2's checkpoint is on disk, the sampler a step ahead of the learner; run again, the
    learner resumes from its checkpoint and sends the sampler the step, the prompt stream's
    position and the lagged parameters. The sampling process alone then gets SIGTERM: it
    passes it on, the learner saves its step and both exit 75. The third run ends as the
    uninterrupted one."""
    workdir = tmp_path / "roles"
    commands = main_commands(cli_config_file(tmp_path, data_dir, ROLES_RUN), workdir, 2)
    _kill_after_checkpoint(commands, tmp_path, workdir)
    resumed = finished_checkpoints(workdir)[-1]
    assert resumed == 2, "step 3 was done and saved within 50 ms of the kill"

    processes, logs, files = _start(commands, tmp_path, "sigterm")
    wait_for_step(processes[0], logs[0], 3)   # the sampler is sampling; the learner learns
    processes[1].send_signal(signal.SIGTERM)  # of it at a step boundary, 3's or 4's
    codes, (log0, log1) = _wait(processes, logs, files, timeout=600)
    assert codes == [preemption.EXIT_STATUS] * 2, log0[-3000:] + log1[-3000:]
    assert f"resumed from the checkpoint of step {resumed} in" in log0
    assert "SIGTERM: passed on to the learner" in log1
    stopped = step_lines(log0)[-1]
    assert f"stopped by SIGTERM after step {stopped}; its checkpoint is" in log0
    assert stopped in (3, 4) and finished_checkpoints(workdir)[-1] == stopped

    processes, logs, files = _start(commands, tmp_path, "finished")
    codes, (log0, log1) = _wait(processes, logs, files, timeout=600)
    assert codes == [0, 0], log0[-3000:] + log1[-3000:]
    assert step_lines(log0) == list(range(stopped + 1, 6))
    _assert_equal_to_one_process(workdir, one_process_split, log0, log1)


@pytest.mark.slow
def test_a_sampling_process_that_fails_stops_the_learner_with_its_error(data_dir, tmp_path):
    """Dynamic sampling out of draws at step 1 (one draw of 4 prompts finds fewer than 4
    groups with signal) raises on the sampling process; the learner, waiting for step 1's
    batch, raises the sampler's error in turn, and both processes end at once."""
    overrides = {**ROLES_RUN, "filtering.max_gen_batches": 1, "filtering.short_batch": "error"}
    commands = main_commands(cli_config_file(tmp_path, data_dir, overrides), tmp_path / "w", 2)
    processes, logs, files = _start(commands, tmp_path, "failed")
    deadline, failed = time.time() + 600, None
    while time.time() < deadline and any(p.poll() is None for p in processes):
        if failed is None and "dynamic sampling found" in logs[1].read_text():
            failed = time.time()
        time.sleep(0.05)
    codes, (log0, log1) = _wait(processes, logs, files, timeout=1)
    assert codes == [1, 1], (codes, log0[-3000:])
    assert failed is not None and time.time() - failed < 60   # not JAX's 5-minute timeouts
    assert "RuntimeError: the sampling processes (1,) failed before step 1:" in log0
    found = re.search(r"dynamic sampling found (\d+) groups with signal in 1 draws", log0)
    assert found and int(found.group(1)) < 4, log0[-3000:]   # fewer than the batch's 4


# Partial rollouts on two processes: 8 prompts (the rows split over both processes' mesh),
# 10 tokens a step, dynamic sampling judging each group's signal; 2 steps (the second
# resumes the rows the first carried), every step's rollouts logged, a checkpoint (with
# the pool) after each; a top-p 0.9 cut whose supports the rows keep (keep sampling mask).
PARTIAL_RUN = {"rollout.prompts_per_batch": 8, "train.steps": 2, "train.eval_every": 100,
               "train.log_rollouts_every": 1, "train.checkpoint_every": 1,
               "rollout.partial.enabled": True, "rollout.partial.tokens_per_step": 10,
               "filtering.max_gen_batches": 4, "filtering.short_batch": "pad",
               "rollout.top_p": 0.9, "rollout.keep_sampling_mask": True}
PARTIAL_COUNTS = ("carried_groups", "forced_groups", "gen_batches", "generated_tokens",
                  "token_staleness_max", "token_staleness_mean", "carried_token_share")


def _saved_pool(workdir, step):
    """The pool a run's checkpoint of `step` saved (`partial.to_checkpoint`)."""
    reader = ocp.Checkpointer(ocp.CompositeCheckpointHandler())
    items = ocp.args.Composite(meta=ocp.args.JsonRestore(),
                               **{checkpoint.EXTRA_ITEM: ocp.args.StandardRestore()})
    saved = reader.restore((workdir / "checkpoints" / str(step)).absolute(), args=items)
    reader.close()
    return partial.Pool.from_checkpoint(saved[checkpoint.EXTRA_ITEM], saved.meta["extra"])


@pytest.mark.slow
def test_partial_rollouts_on_two_processes_equal_one_process(data_dir, tmp_path):
    """Each process carries the groups of its own prompts; which groups a step draws,
    forces, trains on and carries over is decided on both processes' groups in draw
    order. The two-process run samples the one-process run's rollouts row for row (text
    and rewards) at every step, logs the same counts of carried, forced and sampled
    tokens and groups, exactly, and the same metrics to the rounding of two processes
    against one (losses, rewards); its checkpoint's pool is the one-process run's, with
    the carried rows' support records."""
    one = tmp_path / "one"
    rl.train(tiny_config("dapo", data_dir, **PARTIAL_RUN), str(one))
    rows = read_metrics(one)
    assert [r["carried_groups"] > 0 for r in rows] == [True] * 2   # rows do carry over
    assert sum(r["forced_groups"] for r in rows) > 0 and max(r["gen_batches"] for r in rows) > 1
    workdir = tmp_path / "two"
    config_file = cli_config_file(tmp_path, data_dir, PARTIAL_RUN)
    processes, logs, files = _start(main_commands(config_file, workdir, 2), tmp_path, "partial")
    codes, (log0, log1) = _wait(processes, logs, files)
    assert codes == [0, 0], log0[-3000:] + log1[-3000:]
    assert "over 8 cpu device(s) in 2 processes" in log0
    for step in range(1, 3):
        assert (workdir / "rollouts" / f"{step}.jsonl").read_text() == \
            (one / "rollouts" / f"{step}.jsonl").read_text()
    assert_rows_equal(workdir, one, range(1, 3), rtol=2e-4, atol=1e-6)
    for got, want in zip(read_metrics(workdir), rows):
        assert {k: got[k] for k in PARTIAL_COUNTS} == {k: want[k] for k in PARTIAL_COUNTS}
    mine, theirs = _saved_pool(workdir, 2), _saved_pool(one, 2)
    assert mine.size == theirs.size > 0 and mine.examples == theirs.examples
    assert mine.fields == theirs.fields == partial.Pool.ARRAYS + partial.Pool.RECORDS[:2]
    for field in mine.fields:
        np.testing.assert_allclose(getattr(mine, field), getattr(theirs, field), rtol=1e-5,
                                   atol=1e-6, err_msg=field)


# Process roles with a critic, the supervised term and two processes a role: VAPO's tiny
# run (GAE over its critic's values) with one step of value pre-training and 2 RL steps,
# sft_weight 0.5, asynchronous with every batch 1 step stale, on 4 processes of 2 devices:
# processes 2 and 3 sample (rollout.mesh=data=4: their 4 devices), 0 and 1 train.
CRITIC_ROLES_RUN = {"critic.pretrain_steps": 1, "train.steps": 2, "train.eval_every": 2,
                    "train.sft_weight": 0.5, "train.export": True,
                    "train.log_rollouts_every": 1, "rollout.mesh": "data=4",
                    "async_rl.enabled": True, "async_rl.max_staleness": 1,
                    "async_rl.fixed": True}


@pytest.mark.slow
def test_process_roles_with_a_critic_and_sft_on_two_processes_a_role_equal_one_process(
        data_dir, tmp_path):
    """`CRITIC_ROLES_RUN` on 4 processes (2 sampling, 2 training, each role's rows split
    between its two processes) is the same run as on one process whose 8 devices split 4/4: the same
    rollouts row for row (each sampling process drawing its half of the prompts, each
    training process taking its peer's half and those prompts' reference solutions), the
    same metrics at every step to the rounding of the gloo all-reduce (the value
    pre-training step's, the critic's and the supervised term's among them) and the same
    exported policy and critic."""
    one = tmp_path / "one"
    rl.train(tiny_config("vapo", data_dir, **CRITIC_ROLES_RUN), str(one))
    rows = read_metrics(one)
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert "value_loss" in rows[0] and "sft_loss" not in rows[0]   # pre-training: critic only
    assert all(k in r for r in rows[1:] for k in ("value_loss", "explained_variance",
                                                   "critic_grad_norm", "sft_loss"))
    workdir = tmp_path / "four"
    config_file = cli_config_file(tmp_path, data_dir, CRITIC_ROLES_RUN, "vapo")
    processes, logs, files = _start(main_commands(config_file, workdir, 4), tmp_path, "critic")
    codes, texts = _wait(processes, logs, files)
    assert codes == [0] * 4, [t[-3000:] for t in texts]
    for step in range(1, 4):
        assert (workdir / "rollouts" / f"{step}.jsonl").read_text() == \
            (one / "rollouts" / f"{step}.jsonl").read_text()
    assert_rows_equal(workdir, one, range(1, 4), rtol=5e-5, atol=1e-6)
    assert [r["staleness"] for r in read_metrics(workdir)] == [0.0, 1.0, 1.0]
    assert_same_export(workdir, one, rtol=1e-5, atol=5e-7)
    critic = [safetensors.numpy.load((w / "export_critic" / "model.safetensors").read_bytes())
              for w in (workdir, one)]
    assert critic[0].keys() == critic[1].keys()
    for name in critic[1]:
        np.testing.assert_allclose(critic[0][name], critic[1][name], rtol=1e-5, atol=5e-7,
                                   err_msg=name)
    assert "training mesh {'data': 4, 'fsdp': 1, 'tensor': 1} over 4 cpu device(s) in 4 " \
           "processes" in texts[0] and "step     3/3" in texts[0]
    assert all("step " not in text for text in texts[1:])
    assert len(list(workdir.glob(run_files.METRICS + "*"))) == 1
