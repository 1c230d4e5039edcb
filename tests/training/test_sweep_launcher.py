"""python -m grpo_jax.sweep with real trainers: a run killed mid-way fails alone, and the
same command again skips the finished run and resumes the killed one to its end."""

import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest

from grpo_jax import run_files, sweep
from grpo_jax.training import checkpoint
from tests.training.training_setups import REPO

RECIPE = '''"""Two clip ranges on the tiny dapo setting, 4 steps."""

from tests.training.training_setups import tiny_config


def get_config(arg=None):
    return tiny_config("dapo", {data_dir!r}, **{{"train.steps": 4, "train.checkpoint_every": 1,
                                               "train.eval_every": 100}})


def get_sweep():
    return [{{"objective.loss.eps_high": 0.2}}, {{"objective.loss.eps_high": 0.28}}]
'''
FIRST, SECOND = "00_eps_high-0.2/seed-0", "01_eps_high-0.28/seed-0"


def _pid_running(workdir):
    """The pid of the trainer whose command line names `workdir`."""
    for entry in pathlib.Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                argv = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if f"--workdir={workdir}".encode() in argv:
                return int(entry.name)
    return None


def _logged_steps(workdir):
    return [row["step"] for row in run_files.read_metrics(workdir)]


@pytest.mark.slow
def test_a_killed_run_fails_alone_and_the_rerun_skips_the_finished_one_and_resumes_it(
        data_dir, tmp_path):
    (tmp_path / "recipe.py").write_text(RECIPE.format(data_dir=data_dir))
    # The tests' 8 CPU devices (XLA_FLAGS), so the runs' programs are the other tiny dapo
    # runs' (the second entry's clip range is dapo's own): read from the compilation cache.
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    command = [sys.executable, "-m", "grpo_jax.sweep", "--config", "recipe.py",
               "--workdir_root", "runs"]
    runs = tmp_path / "runs"
    killed = runs / SECOND

    # 1. Run 00 finishes; run 01 is killed (SIGKILL, nothing more saved) mid-run, past
    #    step 2 and once a checkpoint is on disk (saves are asynchronous).
    with open(tmp_path / "first.log", "w") as out:
        launcher = subprocess.Popen(command, cwd=tmp_path, env=env, stdout=out,
                                    stderr=subprocess.STDOUT)
        deadline = time.time() + 900
        while len(_logged_steps(killed)) < 2 or not checkpoint.complete_steps(
            killed / "checkpoints"
        ):
            assert launcher.poll() is None, (tmp_path / "first.log").read_text()[-3000:]
            assert time.time() < deadline, "run 01 logged no second step"
            time.sleep(0.05)
        os.kill(_pid_running(killed), signal.SIGKILL)
        assert launcher.wait(timeout=300) == 1
    first = (tmp_path / "first.log").read_text()
    assert f"finished {FIRST}" in first
    assert f"FAILED {SECOND} (exit status -9)" in first and f"log {killed / 'train.log'}" in first
    assert f"[sweep] 1 of 2 runs finished; failed: {SECOND}; stopped: none." in first
    saved = checkpoint.complete_steps(killed / "checkpoints")[-1]
    assert 1 <= saved < 4

    # 2. The same command: 00 is skipped, 01 resumes from its last complete checkpoint.
    second = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True,
                            timeout=900)
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    assert f"  {FIRST}: finished\n" in second.stdout
    assert f"  {SECOND}: resumes from step {saved}\n" in second.stdout
    assert f"start {FIRST}" not in second.stdout and f"finished {SECOND}" in second.stdout
    assert "[sweep] 2 of 2 runs finished\n" in second.stdout
    log = (killed / "train.log").read_text()
    assert f"resumed from the checkpoint of step {saved} in {killed}" in log
    assert log.count("=== grpo_jax.sweep:") == 2
    assert (runs / FIRST / "train.log").read_text().count("=== grpo_jax.sweep:") == 1
    assert _logged_steps(killed) == [1, 2, 3, 4]   # the redone steps' rows replaced
    record = json.loads((killed / sweep.RUN_RECORD).read_text())
    assert len(record["starts"]) == 2 and record["overrides"] == {"objective.loss.eps_high": 0.28}
    assert record["config"]["objective"]["loss"]["eps_high"] == 0.28

    # 3. Nothing left to run.
    dry = subprocess.run(command + ["--dry_run"], cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=300)
    assert "2 runs, 2 finished, 0 to run" in dry.stdout
