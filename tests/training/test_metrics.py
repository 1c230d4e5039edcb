"""The metric writer: files, the console line, and an ETA that leaves compilation out."""

import io
import json

import jax
import jax.numpy as jnp
import numpy as np

from grpo_jax import run_files
from grpo_jax.training import metrics as metrics_lib


def test_compile_seconds_counts_real_compilation():
    before = metrics_lib.compile_seconds()
    jax.jit(lambda x: jnp.cumsum(jnp.sin(x) @ x.T, axis=1))(np.ones((37, 53), np.float32))
    assert metrics_lib.compile_seconds() > before


def test_eta_comes_from_steady_steps_and_compile_time_is_shown_apart(tmp_path, monkeypatch):
    clock = {"now": 1000.0, "compile": 7.0}
    monkeypatch.setattr(metrics_lib.time, "time", lambda: clock["now"])
    monkeypatch.setattr(metrics_lib, "compile_seconds", lambda: clock["compile"])
    stream = io.StringIO()
    writer = metrics_lib.MetricWriter(str(tmp_path), total_steps=600, stream=stream)

    # 50 steps in 60 s, 55 s of which JAX spent compiling: 0.1 s per steady step.
    clock["now"], clock["compile"] = 1060.0, 62.0
    writer.write(50, {"loss": 0.5})
    first = stream.getvalue().splitlines()[-1]
    assert "0.10s/step eta 0.9m | compile 55s" in first    # 550 steps x 0.1 s = 55 s
    # The next 50 steps take 5 s with no compilation: still 0.1 s per step.
    clock["now"] = 1065.0
    writer.write(100, {"loss": 0.25})
    second = stream.getvalue().splitlines()[-1]
    assert "0.10s/step eta 0.8m | compile 55s" in second   # 500 x 0.1 s = 50 s
    writer.close()

    rows = run_files.read_metrics(tmp_path)
    assert [r["step"] for r in rows] == [50, 100]
    assert [r["time_compile"] for r in rows] == [55.0, 0.0]   # per interval, not cumulative
    assert [r["loss"] for r in rows] == [0.5, 0.25]


def test_a_resumed_run_drops_the_rows_it_redoes(tmp_path):
    path = tmp_path / run_files.METRICS
    path.write_text("".join(json.dumps({"step": s, "loss": s / 10}) + "\n" for s in (1, 2, 3, 4)))
    writer = metrics_lib.MetricWriter(str(tmp_path), total_steps=6, start_step=2,
                                      stream=io.StringIO())
    writer.write(3, {"loss": 0.75})
    writer.close()
    rows = run_files.read_metrics(path)
    assert [(r["step"], r["loss"]) for r in rows] == [(1, 0.1), (2, 0.2), (3, 0.75)]


def test_a_fresh_start_redoes_step_0_and_a_resume_keeps_it(tmp_path):
    """``train.eval_at_start`` logs the starting policy as step 0: a run that starts over
    (no checkpoint) writes it again, a run resumed at step 2 keeps it."""
    path = tmp_path / run_files.METRICS
    old = "".join(json.dumps({"step": s, "eval_accuracy": s / 10}) + "\n" for s in (0, 1, 2, 3))
    for start, kept in ((0, []), (2, [(0, 0.0), (1, 0.1), (2, 0.2)])):
        path.write_text(old)
        metrics_lib.MetricWriter(str(tmp_path), total_steps=6, start_step=start,
                                 stream=io.StringIO()).close()
        rows = run_files.read_metrics(path)
        assert [(r["step"], r["eval_accuracy"]) for r in rows] == kept


def test_rows_reach_the_file_at_each_flush_and_a_minute_after_the_last(tmp_path, monkeypatch):
    """In a bucket (here its way on a local workdir: whole_file) metrics.jsonl is
    rewritten whole, as an object cannot be appended to: when the loop flushes at a
    checkpoint, when a row comes a minute after the last flush, and at close. A run
    killed between flushes leaves the rows of the last one."""
    clock = {"now": 1000.0}
    monkeypatch.setattr(metrics_lib.time, "time", lambda: clock["now"])
    writer = metrics_lib.MetricWriter(str(tmp_path), total_steps=9, stream=io.StringIO(),
                                      whole_file=True)

    def steps_on_disk():
        return [row["step"] for row in run_files.read_metrics(tmp_path)]

    writer.write(1, {"loss": 1.0})
    assert steps_on_disk() == []
    writer.flush()   # a checkpoint of step 1
    assert steps_on_disk() == [1]
    writer.write(2, {"loss": 2.0})
    clock["now"] += 59.0
    writer.write(3, {"loss": 3.0})
    assert steps_on_disk() == [1]
    clock["now"] += 1.0
    writer.write(4, {"loss": 4.0})   # 60 s after the flush of step 1
    assert steps_on_disk() == [1, 2, 3, 4]
    writer.write(5, {"loss": 5.0})   # a kill here loses step 5 only: it is redone on resume
    assert steps_on_disk() == [1, 2, 3, 4]
    writer.close()
    assert steps_on_disk() == [1, 2, 3, 4, 5]
    assert sorted(p.name for p in tmp_path.iterdir()) == [run_files.METRICS, run_files.TENSORBOARD]


def test_a_local_workdir_gets_each_row_as_it_comes(tmp_path):
    """On a local disk every row is in metrics.jsonl once written (a `tail -f` sees each
    step), with no flush; a bucket's workdir is written whole (the test above)."""
    path = tmp_path / run_files.METRICS
    path.write_text("".join(json.dumps({"step": s, "loss": s / 10}) + "\n" for s in (1, 2, 3)))
    writer = metrics_lib.MetricWriter(
        str(tmp_path), total_steps=9, start_step=2, stream=io.StringIO()
    )
    assert not writer.whole_file
    assert [row["step"] for row in run_files.read_metrics(path)] == [1, 2]
    writer.write(3, {"loss": 0.5})
    assert [(r["step"], r["loss"]) for r in run_files.read_metrics(path)] == [
        (1, 0.1), (2, 0.2), (3, 0.5)]
    writer.close()
