"""A run, a sweep and a report whose workdirs are in a bucket, on a local GCS emulator
(the `gcs_emulator` fixture: no network). The run is `faults_config`'s, so it must end
equal to the uninterrupted local run (the `reference` fixture), row for row, rollout for
rollout, and in its export.
"""

import json
import os
import signal
import struct
import subprocess
import sys

import numpy as np
import pytest

from grpo_jax import paths, report, sweep
from grpo_jax.training import preemption
from tests.training.training_setups import (FAULTS, REPO, assert_rows_equal, assert_same_export,
                                            finished_checkpoints, read_metrics,
                                            step_lines, wait_for_step)

BUCKET = "gs://test-bucket"   # the emulator's


def _scalars(directory):
    """`{(tag, step): {values}}` over every TensorBoard event file in `directory` (TFRecord
    framing: length, its CRC, an Event proto, its CRC)."""
    from tensorboardX.proto import event_pb2
    seen = {}
    for file in paths.path(directory).iterdir():
        data, at = file.read_bytes(), 0
        while at < len(data):
            (length,) = struct.unpack("<Q", data[at:at + 8])
            event = event_pb2.Event.FromString(data[at + 12:at + 12 + length])
            at += 12 + length + 4
            for value in event.summary.value:
                seen.setdefault((value.tag, event.step), set()).add(value.simple_value)
    return seen


def _local_files(folder):
    return sorted(os.path.relpath(os.path.join(root, name), folder)
                  for root, _, names in os.walk(folder) for name in names)


@pytest.mark.slow
def test_a_run_in_a_bucket_survives_kills_and_its_sweep_reports_from_the_bucket(
        gcs_emulator, data_dir, reference, tmp_path):
    """The run: killed (-9) after step 5, resumed and stopped by SIGTERM two steps later,
    finished by `grpo_jax.sweep` (the sweep's one run). Every file it writes is in the
    bucket; nothing lands in its working directory, its temporary directory or its home.
    The report of the sweep, written into the bucket, has the bytes of the one made from
    a local copy of the sweep (``--collect_into``)."""
    spec = tmp_path / "bucket_sweep.py"
    spec.write_text(
        "from tests.training.training_setups import faults_config\n\n\n"
        "def get_config(arg=None):\n"
        f"    return faults_config({data_dir!r}, **{{'train.export': True, "
        "'train.log_rollouts_every': 1})\n\n\n"
        "def get_sweep():\n"
        "    return [{'train.checkpoint_every': 3}]\n")
    [run] = sweep.expand(str(spec), f"{BUCKET}/sweep")
    workdir = run.workdir
    assert workdir == f"{BUCKET}/sweep/00_checkpoint_every-3/seed-{run.seed}"
    local = {name: tmp_path / name for name in ("cwd", "tmp", "home")}
    for folder in local.values():
        folder.mkdir()
    env = {**os.environ, **gcs_emulator, "PYTHONPATH": str(REPO), "TMPDIR": str(local["tmp"]),
           "HOME": str(local["home"])}

    def start(command, log):
        return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env,
                                cwd=local["cwd"])

    # Killed with SIGKILL during step 5 or 6: it resumes from the last complete checkpoint.
    log = tmp_path / "killed.log"
    with open(log, "w") as out:
        process = start(run.command, out)
        wait_for_step(process, log, 5)
        process.kill()
        assert process.wait(timeout=60) == -signal.SIGKILL
    complete = finished_checkpoints(workdir)   # step 3's, unless its upload was cut short
    assert complete in ([], [3])
    resumed = complete[-1] if complete else 0

    # Stopped by SIGTERM two steps after it resumed: it saves the step it finishes.
    log = tmp_path / "stopped.log"
    with open(log, "w") as out:
        process = start(run.command, out)
        wait_for_step(process, log, resumed + 2)
        process.send_signal(signal.SIGTERM)
        code = process.wait(timeout=600)
    text = log.read_text()
    assert code == preemption.EXIT_STATUS, text[-3000:]
    assert (f"resumed from the checkpoint of step {resumed} in {workdir}" in text) == (resumed > 0)
    stopped = step_lines(text)[-1]
    assert f"stopped by SIGTERM after step {stopped}; its checkpoint is" in text
    assert sweep.describe_state(run) == f"resumes from step {stopped}"

    # The sweep finishes it; a second look finds it finished.
    done = subprocess.run([sys.executable, "-m", "grpo_jax.sweep", f"--config={spec}",
                           f"--workdir_root={BUCKET}/sweep"], capture_output=True, text=True,
                          env=env, cwd=local["cwd"], timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "[sweep] 1 of 1 runs finished" in done.stdout
    assert sweep.describe_state(run) == "finished"
    train_log = (paths.path(workdir) / sweep.LOG).read_text()
    assert f"resumed from the checkpoint of step {stopped} in {workdir}" in train_log

    # The run's files, all in the bucket, equal the uninterrupted local run's.
    assert_rows_equal(workdir, reference, range(1, 13))   # the rows after each resume redone once
    assert_same_export(workdir, reference)
    for step in range(1, 13):
        assert ((paths.path(workdir) / "rollouts" / f"{step}.jsonl").read_bytes()
                == (reference / "rollouts" / f"{step}.jsonl").read_bytes()), step
    scalars = _scalars(f"{workdir}/tensorboard")
    for row in read_metrics(reference):
        assert scalars[("reward_mean", row["step"])] == {np.float32(row["reward_mean"])}
    recorded = json.loads((paths.path(workdir) / "config.json").read_text())
    assert recorded["train"]["checkpoint_every"] == 3
    assert (paths.path(workdir) / "tokenizer" / "tokenizer.json").exists()
    assert (paths.path(workdir) / "export" / "tokenizer.json").exists()
    assert finished_checkpoints(workdir)[-1] == FAULTS["train.steps"]

    # The report, from the bucket into the bucket, and from a local copy of the sweep.
    assert report.main([f"{BUCKET}/sweep"]) == 0
    copy = tmp_path / "collected"
    assert report.main([f"{BUCKET}/sweep", f"--collect_into={copy}"]) == 0
    made = sorted(
        p.name for p in paths.path(f"{BUCKET}/sweep").iterdir() if p.name != run.entry_name
    )
    assert made == ["report.md", "reward_mean.png"]
    for name in made:
        assert (paths.path(f"{BUCKET}/sweep") / name).read_bytes() == (copy / name).read_bytes()

    # Nothing local but caches (the shared dataset and warm start, JAX's compilation cache).
    assert _local_files(local["cwd"]) == [] and _local_files(local["tmp"]) == []
    assert [f for f in _local_files(local["home"]) if not f.startswith(".cache/")] == []
