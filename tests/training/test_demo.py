"""The demo pipeline (SFT warm start -> RL -> equal-time SFT control -> table) end to end."""

import json
import os

import pytest

from grpo_jax import run_files
from grpo_jax.training import demo
from tests import readme_metrics
from tests.training.training_setups import tiny_config


@pytest.mark.slow
def test_demo_pipeline_runs_each_stage_once_and_prints_the_table(data_dir, tmp_path, capsys):
    # The pipeline, not the accuracy, is under test: a 10-step SFT stage.
    config = tiny_config("demo", data_dir, **{"train.export": True, "sft.steps": 10,
                                              "sft.eval_every": 10})
    config.mode = "demo"
    results = demo.run(config, str(tmp_path))
    assert [r["stage"] for r in results] == [
        "SFT warm start", "+ DAPO (RL)", "+ SFT for the same time (control)"]
    for row in results:
        assert 0.0 <= row["eval_accuracy"] <= 1.0 and row["seconds"] > 0
    assert results[2]["seconds"] == results[1]["seconds"]   # the control gets RL's wall time
    for stage in ("sft", "rl", "sft_control"):
        assert os.path.exists(tmp_path / stage / "export" / "config.json")
        # docs/metrics.md names each metric
        keys = set().union(*run_files.read_metrics(tmp_path / stage))
        assert readme_metrics.undocumented(keys) == [], stage
    # The timed control logs and saves its last step, whatever sft.log_every is.
    last_logged = run_files.last_logged_step(tmp_path / "sft_control")
    saved = [int(d) for d in os.listdir(tmp_path / "sft_control" / "checkpoints") if d.isdigit()]
    assert last_logged == max(saved)
    out = capsys.readouterr().out
    assert "+ DAPO (RL)" in out and "pass@1" in out
    with open(tmp_path / "results.json") as f:
        assert json.load(f) == results

    # A second run finds every stage done and only re-evaluates.
    mtimes = {
        s: os.path.getmtime(tmp_path / s / "wall_time.json") for s in ("sft", "rl", "sft_control")
    }
    again = demo.run(config, str(tmp_path))
    assert [r["eval_accuracy"] for r in again] == [r["eval_accuracy"] for r in results]
    assert mtimes == {s: os.path.getmtime(tmp_path / s / "wall_time.json") for s in mtimes}


def test_a_stage_interrupted_and_resumed_is_timed_as_the_sum_of_its_parts(tmp_path, monkeypatch):
    """The first invocation stops after 30 s (an exception, as SIGTERM's); the resumed one
    gets spent = 30 (the control's remaining time is computed from it) and takes 10 s: the
    stage took 40 s. A finished stage, and a record written before the `finished` key, is
    not run again."""
    import types
    clock = iter([100.0, 130.0, 200.0, 210.0])
    monkeypatch.setattr(demo, "time", types.SimpleNamespace(time=lambda: next(clock)))
    spent_seen = []

    def stopped(spent):
        spent_seen.append(spent)
        raise RuntimeError("stopped by SIGTERM")

    with pytest.raises(RuntimeError, match="SIGTERM"):
        demo._timed(str(tmp_path), stopped)
    assert json.loads((tmp_path / "wall_time.json").read_text()) == {"seconds": 30.0,
                                                                     "finished": False}
    assert demo._timed(str(tmp_path), spent_seen.append) == 40.0
    assert spent_seen == [0.0, 30.0]
    assert demo._timed(str(tmp_path), stopped) == 40.0       # finished: not run again
    (tmp_path / "wall_time.json").write_text(json.dumps({"seconds": 7.5}))
    assert demo._timed(str(tmp_path), stopped) == 7.5
