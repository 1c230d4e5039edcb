"""Two JAX processes on localhost, one 8-device mesh: the same run as one process with 8.

Each process has 4 CPU devices (gloo collectives between them); together they form the
global mesh the config declares. The two-process run must sample the same tokens, score
the same rewards, log the same metrics (from process 0 only) and end with the same
parameters as the one-process run, and survive kill -9 of both processes.
"""

import time

import numpy as np
import pytest
from safetensors.numpy import load_file

from tests.training.training_setups import (assert_metric_close, comparable, main_commands,
                                             read_metrics, start_processes)


def _config_file(tmp_path, data_dir):
    path = tmp_path / "multihost_config.py"
    path.write_text(
        "from tests.training.training_setups import runlocal_config\n\n\n"
        "def get_config(arg=None):\n"
        f"    return runlocal_config('dapo', {data_dir!r}, **{{'train.steps': 3, "
        "'train.checkpoint_every': 1, 'train.eval_every': 3, 'train.export': True, "
        "'train.log_rollouts_every': 1})\n")
    return path


def _run(commands, tmp_path, name):
    logs = [open(tmp_path / f"{name}_{i}.log", "w") for i in range(len(commands))]
    processes = start_processes(commands, logs)
    codes = [p.wait(timeout=900) for p in processes]
    for log in logs:
        log.close()
    assert codes == [0] * len(codes), [(tmp_path / f"{name}_{i}.log").read_text()[-3000:]
                                       for i in range(len(codes))]


def _metrics(workdir):
    return [comparable(row) for row in read_metrics(workdir)]


def _assert_same_run(got_dir, want_dir):
    got, want = _metrics(got_dir), _metrics(want_dir)
    assert [r["step"] for r in got] == [r["step"] for r in want] == [1, 2, 3]
    for g, w in zip(got, want):
        assert g.keys() == w.keys()
        for key in w:
            assert_metric_close(key, g[key], w[key], rtol=2e-4, atol=1e-6, err_msg=key)
    got_params = load_file(str(got_dir / "export" / "model.safetensors"))
    want_params = load_file(str(want_dir / "export" / "model.safetensors"))
    assert got_params.keys() == want_params.keys()
    for name in want_params:
        np.testing.assert_allclose(got_params[name], want_params[name], rtol=1e-4, atol=1e-6,
                                   err_msg=name)


@pytest.mark.slow
def test_two_processes_equal_one_process_and_resume_after_kill(data_dir, tmp_path):
    """The one-process run, then the two-process run killed (-9, both processes) once step
    1's checkpoint is on disk and run again: it resumes there and ends as the one-process
    run, its step-1 rollout row for row the same."""
    config_file = _config_file(tmp_path, data_dir)
    one, two = tmp_path / "one", tmp_path / "two"
    _run(main_commands(config_file, one, 1), tmp_path, "one")   # the warm start, if unbuilt

    commands = main_commands(config_file, two, 2)
    logs = [open(tmp_path / f"killed_{i}.log", "w") for i in range(2)]
    processes = start_processes(commands, logs)
    deadline = time.time() + 900
    while time.time() < deadline and not (two / "checkpoints" / "1").is_dir():
        assert all(p.poll() is None for p in processes), "a process ended before the kill"
        time.sleep(0.05)
    for p in processes:
        p.kill()
    assert [p.wait() for p in processes] == [-9, -9]
    for log in logs:
        log.close()
    assert not (two / "export").exists()
    # Step 1's rollout: the same prompts, completions and rewards, row for row.
    assert (two / "rollouts" / "1.jsonl").read_text() == (one / "rollouts" / "1.jsonl").read_text()

    _run(commands, tmp_path, "resumed")
    log0, log1 = ((tmp_path / f"resumed_{i}.log").read_text() for i in range(2))
    assert "resumed from the checkpoint of step" in log0
    _assert_same_run(two, one)
    # Process 0 alone wrote metrics and printed the mesh of both processes' devices.
    assert len(list(two.glob("metrics.jsonl*"))) == 1
    assert "over 8 cpu device(s) in 2 processes" in log0 and "step     3/3" in log0
    assert "step " not in log1 and "mesh" not in log1
