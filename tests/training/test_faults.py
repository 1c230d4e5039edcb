"""Faults a run survives: SIGTERM (a preempted VM), SIGKILL, damaged and unfinished
checkpoints, a failed write; a soak of alternating SIGTERM and SIGKILL. (Two processes
killed, and stopped by SIGTERM to one of them: tests/training/test_multihost.py.)

Every run that is interrupted must end equal to one uninterrupted run of the same config
(the `reference` fixture): the same metrics row for each step, written once, and the same
exported parameters. On one machine with one device count XLA on CPU is deterministic and
a resumed run continues from exactly the saved state, so those comparisons are exact.
"""

import contextlib
import glob
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import multihost_utils
from jax.sharding import NamedSharding, PartitionSpec

from grpo_jax import run_files
from grpo_jax.training import checkpoint, preemption, rl
from tests.training.training_setups import (FAULTS, REPO, assert_rows_equal, assert_same_export,
                                            cli, cli_config_file, faults_config,
                                            finished_checkpoints, read_metrics, step_lines,
                                            wait_for_step)

# A failed orbax read or write leaves coroutines and callbacks of a closed event loop behind;
# collected later, they warn from whichever test runs then. Noise, not a fault.
pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")

class _Position:
    """A data iterator's position, as `Checkpointer.save_run` and `restore_run` see it."""

    def __init__(self, index=0):
        self.index = index

    def get_state(self):
        return {"index": self.index}

    def set_state(self, state):
        self.index = state["index"]


def _small_state(seed, mesh):
    """A float32 [256, 256] matrix sharded over 8 devices, a bfloat16 vector, an int32 scalar
    and a bool mask: 256 KiB and change."""
    rng = np.random.default_rng(seed)
    return {"w": jax.device_put(rng.normal(size=(256, 256)).astype(np.float32),
                                NamedSharding(mesh, PartitionSpec("data"))),
            "b": jnp.asarray(rng.normal(size=(10,)), jnp.bfloat16),
            "n": jnp.int32(seed), "mask": jnp.asarray([True, False, True])}


@pytest.fixture
def mesh():
    return jax.make_mesh((8,), ("data",))


def _numpy_checksum(x):
    """The fingerprint of one array computed in numpy: sum of words x (2i + 1), mod 2^32."""
    x = np.asarray(x)
    if x.dtype == bool:
        x = x.astype(np.uint8)
    words = x.reshape(-1).view({1: np.uint8, 2: np.uint16, 4: np.uint32}[x.dtype.itemsize])
    weights = (2 * np.arange(words.size, dtype=np.uint64) + 1) % 2**32
    return int(np.sum(words.astype(np.uint64) * weights % 2**32) % 2**32)


def test_fingerprint_is_the_numpy_checksum_on_any_sharding_and_sees_one_changed_word(mesh):
    state = _small_state(0, mesh)
    on_one_device = jax.tree.map(lambda x: jax.device_put(np.asarray(x), jax.devices()[0]), state)
    want = {f"['{name}']": _numpy_checksum(x) for name, x in state.items()}
    assert checkpoint.fingerprint(state) == checkpoint.fingerprint(on_one_device) == want

    nudged = np.asarray(state["w"]).copy()
    nudged[3, 5] = np.nextafter(nudged[3, 5], np.float32(np.inf))   # one bit of one word
    swapped = np.asarray(state["b"])[[1, 0, *range(2, 10)]]           # two words trade places
    changed = checkpoint.fingerprint({**state, "w": jnp.asarray(nudged), "b": jnp.asarray(swapped)})
    assert changed["['w']"] != want["['w']"] and changed["['b']"] != want["['b']"]
    assert changed["['n']"] == want["['n']"] and changed["['mask']"] == want["['mask']"]


def _largest_data_file(step_dir):
    return max(glob.glob(str(step_dir / "state" / "ocdbt.process_*" / "d" / "*")),
               key=os.path.getsize)


def _truncate(path):
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) // 2)


def test_when_no_checkpoint_reads_the_error_says_what_to_do_and_nothing_moves(mesh, tmp_path):
    directory = tmp_path / "checkpoints"
    checkpointer = checkpoint.Checkpointer(str(directory))
    for step in (1, 2):
        checkpointer.save_run(step, _small_state(step, mesh), _Position(step))
    checkpointer.close()
    for step in (1, 2):
        _truncate(_largest_data_file(directory / str(step)))

    checkpointer = checkpoint.Checkpointer(str(directory))
    with pytest.raises(RuntimeError, match=re.escape(
            f"none of the checkpoints in {directory} (steps [1, 2]) can be read")) as error:
        checkpointer.restore_run(_small_state(0, mesh), _Position())
    checkpointer.close()
    assert f"mv {directory} {directory}.damaged" in str(error.value)
    assert "re-run with the config that wrote them" in str(error.value)
    assert sorted(os.listdir(directory)) == ["1", "2"]   # named, not moved, not deleted


def test_a_checkpoint_another_process_cannot_read_is_skipped_by_every_process(mesh, tmp_path,
                                                                            monkeypatch, capsys):
    """The read errors are gathered from every process: one failing is enough for all to
    take the step before (else they would restore different steps and deadlock)."""
    directory = tmp_path / "checkpoints"
    checkpointer = checkpoint.Checkpointer(str(directory))
    for step in (1, 2):
        checkpointer.save_run(step, _small_state(step, mesh), _Position(step))
    checkpointer.close()
    other = iter(["OSError: [Errno 5] Input/output error", ""])   # process 1 on step 2, then 1
    monkeypatch.setattr(checkpoint.parallel, "allgather_json", lambda error: [error, next(other)])

    checkpointer = checkpoint.Checkpointer(str(directory))
    position = _Position()
    step, restored = checkpointer.restore_run(_small_state(0, mesh), position)
    checkpointer.close()
    assert (step, position.index) == (1, 1)
    np.testing.assert_array_equal(np.asarray(restored["w"]), np.asarray(_small_state(1, mesh)["w"]))
    out = capsys.readouterr().out
    assert (f"the checkpoint {directory}/2 cannot be read: process 1: OSError: [Errno 5] "
            "Input/output error; trying the one before it") in out
    assert sorted(os.listdir(directory)) == ["1", "2.unreadable"]


@contextlib.contextmanager
def _file_size_limit(nbytes):
    """Writes past `nbytes` of a file fail (EFBIG), as they would on a full disk: a real
    write failure inside tensorstore, without root or a small filesystem."""
    handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)   # else the write kills the process
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (nbytes, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, handler)


def test_a_failed_write_names_the_path_and_the_space_and_keeps_what_was_saved(mesh, tmp_path,
                                                                               capsys):
    directory = tmp_path / "checkpoints"
    first, second = _small_state(1, mesh), _small_state(2, mesh)
    second_values = jax.tree.map(np.asarray, second)
    nbytes = sum(np.asarray(x).nbytes for x in second_values.values())
    checkpointer = checkpoint.Checkpointer(str(directory))
    checkpointer.save_run(1, first, _Position(1))
    checkpointer.wait()

    with _file_size_limit(64 * 1024), pytest.raises(OSError) as failure:
        checkpointer.save_run(2, second, _Position(2))
        checkpointer.wait()
    message = str(failure.value)
    assert f"writing the checkpoint of step 2 to {directory} failed: " in message
    assert "File too large" in message   # the OS's words, as "No space left on device" would be
    assert f"needs about {nbytes / 2**20:.1f} MiB in {directory} (" in message
    assert re.search(r"\([0-9.]+ (GiB|MiB) free there now\)", message)
    assert "intact (steps [1])" in message and "it resumes from step 1" in message
    checkpointer.close()
    # The arrays being trained are untouched, the failed save is an unfinished one.
    for name, values in second_values.items():
        np.testing.assert_array_equal(np.asarray(second[name]), values)
    assert sorted(os.listdir(directory)) == ["1", "2.orbax-checkpoint-tmp"]

    # The next run names the unfinished save, resumes from step 1 exactly, and (with space
    # again) saves step 2 over it.
    checkpointer = checkpoint.Checkpointer(str(directory))
    position = _Position()
    step, restored = checkpointer.restore_run(_small_state(0, mesh), position)
    assert (step, position.index) == (1, 1)
    for name, values in jax.tree.map(np.asarray, first).items():
        np.testing.assert_array_equal(np.asarray(restored[name]), values)
    assert restored["w"].sharding == first["w"].sharding
    assert (f"ignoring {directory}/2.orbax-checkpoint-tmp: an unfinished save"
            in capsys.readouterr().out)
    checkpointer.save_run(2, second, _Position(2))
    checkpointer.close()
    assert sorted(os.listdir(directory)) == ["1", "2"]


@pytest.mark.slow
def test_a_failed_write_mid_run_stops_it_and_the_rerun_equals_an_uninterrupted_run(
        data_dir, reference, tmp_path, monkeypatch, capsys):
    """The disk fills while step 4 is saved: the error comes at the next save (step 6),
    step 2 is intact, and the re-run (space freed; metrics.jsonl ending in a torn row)
    resumes there and ends as the reference."""
    config = faults_config(data_dir, **{"train.checkpoint_every": 2, "train.export": True})
    directory = tmp_path / "checkpoints"
    real_save = checkpoint.Checkpointer.save
    limit = contextlib.ExitStack()

    def save_onto_a_full_disk(self, step, state, meta, extra=None):
        if step == 4:
            self.wait()   # step 2 is on disk before the disk fills
            # Below any one large array (the embedding 256 KiB, an MLP matrix 192 KiB): the
            # write fails however the store batches the ~6 MiB of arrays into data files
            # (under load it may flush them in pieces, each smaller than one MiB).
            limit.enter_context(_file_size_limit(128 * 1024))
        real_save(self, step, state, meta, extra)

    monkeypatch.setattr(checkpoint.Checkpointer, "save", save_onto_a_full_disk)
    with limit, pytest.raises(OSError, match=re.escape(
            f"writing the checkpoint of step 4 to {directory} failed: ")) as failure:
        rl.train(config, str(tmp_path))
    monkeypatch.undo()
    assert "File too large" in str(failure.value) and "intact (steps [2])" in str(failure.value)
    assert finished_checkpoints(tmp_path) == [2]
    assert [r["step"] for r in read_metrics(tmp_path)] == [1, 2, 3, 4, 5, 6]
    with open(tmp_path / run_files.METRICS, "a") as metrics:   # and a torn row, as a lost
        metrics.write('{"step": 7, "time": 17')               # machine leaves one

    capsys.readouterr()
    assert rl.train(config, str(tmp_path)) == 12
    out = capsys.readouterr().out
    assert f"{tmp_path / run_files.METRICS}:7: dropping a torn last row" in out
    assert f"ignoring {directory}/4.orbax-checkpoint-tmp: an unfinished save" in out
    assert f"resumed from the checkpoint of step 2 in {tmp_path}" in out
    assert_rows_equal(tmp_path, reference, range(1, 13))   # rows 3-6 dropped and redone, once
    assert_same_export(tmp_path, reference)


@pytest.mark.slow
def test_jax_preemption_notice_stops_the_run_and_damaged_checkpoints_are_skipped_and_kept(
        data_dir, reference, tmp_path, monkeypatch, capsys):
    """JAX's preemption service names step 5: the run saves it and stops. Then step 5 looks
    interrupted mid-save, step 4 holds another step's arrays (reads fine, wrong numbers) and
    step 3 a truncated file: the re-run names all three, sets 4 and 3 aside, resumes from
    step 2, and ends as the uninterrupted run."""
    config = faults_config(data_dir, **{"train.checkpoint_every": 1, "train.keep_checkpoints": 4,
                                  "train.export": True})
    directory = tmp_path / "checkpoints"
    handler = signal.getsignal(signal.SIGTERM)
    monkeypatch.setattr(multihost_utils, "reached_preemption_sync_point", lambda count: count == 5)
    with pytest.raises(preemption.Stopped) as stopped:
        rl.train(config, str(tmp_path))
    monkeypatch.undo()
    assert stopped.value.step == 5 and str(directory / "5") in str(stopped.value)
    assert signal.getsignal(signal.SIGTERM) is handler   # the loop put the handler back
    assert finished_checkpoints(tmp_path) == [2, 3, 4, 5]
    assert_rows_equal(tmp_path, reference, range(1, 6))

    os.rename(directory / "5", directory / "5.orbax-checkpoint-tmp")   # a save cut short
    shutil.rmtree(directory / "4" / "state")
    shutil.copytree(directory / "3" / "state", directory / "4" / "state")
    truncated = _largest_data_file(directory / "3")
    _truncate(truncated)
    truncated_size = os.path.getsize(truncated)

    capsys.readouterr()
    assert rl.train(config, str(tmp_path)) == 12
    out = capsys.readouterr().out
    assert f"ignoring {directory}/5.orbax-checkpoint-tmp: an unfinished save" in out
    assert re.search(rf"the checkpoint {directory}/4 cannot be read: \d+ of \d+ arrays differ "
                     r"from the checksums saved with them", out)
    assert f"the checkpoint {directory}/3 cannot be read: " in out
    for step in (4, 3):
        assert (f"moved the unreadable checkpoint of step {step} to {directory}/{step}.unreadable"
                in out)
    assert f"resumed from the checkpoint of step 2 in {tmp_path}" in out
    kept = directory / "3.unreadable" / os.path.relpath(truncated, directory / "3")
    assert os.path.getsize(kept) == truncated_size   # set aside as it was
    assert (directory / "4.unreadable" / "state").is_dir()
    assert finished_checkpoints(tmp_path) == [9, 10, 11, 12]
    assert_rows_equal(tmp_path, reference, range(1, 13))
    assert_same_export(tmp_path, reference)


_SIGTERM_TWICE = """
import os, signal
from grpo_jax.training import preemption
stop = preemption.Preemption()
print(stop.requested(), flush=True)
os.kill(os.getpid(), signal.SIGTERM)
print(stop.requested(), flush=True)
os.kill(os.getpid(), signal.SIGTERM)
print("still running", flush=True)
"""


def test_the_first_sigterm_is_read_at_the_step_boundary_and_the_second_ends_the_process():
    done = subprocess.run([sys.executable, "-c", _SIGTERM_TWICE], cwd=REPO, capture_output=True,
                          text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.stdout.split() == ["False", "True"]
    assert done.returncode == -signal.SIGTERM
    assert "stopping once the step in progress is done and saved" in done.stderr


@pytest.mark.slow
def test_soak_of_alternating_sigterm_and_sigkill_ends_as_the_uninterrupted_run(data_dir, reference,
                                                                           tmp_path):
    """Three interruptions at seeded random points (SIGTERM, SIGKILL, SIGTERM), each a
    random fraction of a step after the first step the process runs; every run resumes
    where the last one saved (the SIGKILL'd one from the checkpoint before its last
    step, the next SIGTERM'd one after), and the whole equals the uninterrupted run exactly."""
    overrides = {**FAULTS, "train.checkpoint_every": 3, "train.export": True}
    command, where = cli([f"--config={cli_config_file(tmp_path, data_dir, overrides)}",
                          "--workdir=soak"], cwd=tmp_path)
    workdir = tmp_path / "soak"
    times = [r["time"] for r in read_metrics(reference)]
    step_seconds = float(np.median(np.diff(times)))
    rng = np.random.default_rng(17)
    resumed, lost = 0, []
    for interruption in range(3):
        kind = signal.SIGTERM if interruption % 2 == 0 else signal.SIGKILL
        unfinished = glob.glob(str(workdir / "checkpoints" / "*.orbax-checkpoint-tmp*"))
        log = tmp_path / f"soak_{interruption}.log"
        with open(log, "w") as out:
            process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, **where)
            wait_for_step(process, log, resumed + 1)
            time.sleep(rng.uniform(0.0, 1.0) * step_seconds)
            process.send_signal(kind)
            code = process.wait(timeout=600)
        text = log.read_text()
        assert (f"resumed from the checkpoint of step {resumed} in" in text) == (resumed > 0)
        for path in unfinished:   # left by a SIGKILL during a save: named, not restored
            assert f"ignoring {path}: an unfinished save" in text
        last = step_lines(text)[-1]   # the last step this run finished and logged
        if kind == signal.SIGTERM:
            assert code == preemption.EXIT_STATUS, text[-3000:]
            assert f"stopped by SIGTERM after step {last}; its checkpoint is" in text
            saved = last
        else:
            assert code == -signal.SIGKILL, text[-3000:]
            saved = (finished_checkpoints(workdir) or [0])[-1]
        lost.append((kind.name, last, saved))
        resumed = saved

    final = subprocess.run(command, capture_output=True, text=True, timeout=600, **where)
    assert final.returncode == 0, final.stdout[-3000:] + final.stderr[-3000:]
    assert (f"resumed from the checkpoint of step {resumed} in" in final.stdout) == (resumed > 0)
    assert_rows_equal(workdir, reference, range(1, 13))
    assert_same_export(workdir, reference)
    print("interruptions (signal, last step logged, step resumed from, steps recomputed): "
          + ", ".join(f"({k}, {last}, {saved}, {last - saved})" for k, last, saved in lost))
    assert all(last == saved for kind, last, saved in lost if kind == "SIGTERM")
