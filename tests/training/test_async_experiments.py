"""The asynchronous measurements' scripts: experiments/async_equality.py's comparison and
experiments/vapo_vs_dapo.py's ``--run`` rows, on hand-made rows (no run is started)."""

import importlib.util
import json
import math

import pytest

from grpo_jax import run_files

from tests.training.training_setups import REPO


def _script(name):
    spec = importlib.util.spec_from_file_location(name, REPO / "experiments" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_equality_compares_every_metric_but_timings_step_by_step():
    equality = _script("async_equality")
    got = {1: {"step": 1, "loss": 1.0, "time_update": 3.0, "rollout_tokens_per_s": 9.0},
           2: {"step": 2, "loss": 2.0, "entropy": float("nan")}}
    want = {1: {"step": 1, "loss": 1.0, "time_update": 5.0, "rollout_tokens_per_s": 1.0},
            2: {"step": 2, "loss": 2.5, "entropy": float("nan"), "eval_accuracy": 0.5}}
    table = equality.compare_metrics(got, want)
    assert table == [("entropy", 1, 1, 0.0), ("eval_accuracy", 1, 0, math.inf),
                     ("loss", 2, 1, 0.5), ("step", 2, 2, 0.0)]
    report, equal = equality.format_report(table, (3, 3, []), ["# header"])
    assert not equal and report.splitlines()[0] == "# header"
    assert report.splitlines()[-1] == "DIFFERENT: 2 metrics differ (eval_accuracy, loss)"

    same = equality.compare_metrics(got, got)
    report, equal = equality.format_report(same, (3, 3, []), [])
    assert equal and report.splitlines()[-1] == (
        "EQUAL: 3 metrics over 2 steps, every value the same, and the exported parameters")
    report, equal = equality.format_report(same, (3, 2, ["head"]), [])
    assert not equal and "2 of 3 tensors equal bit for bit; only in one export: ['head']" in report
    assert equality.variants(2) == {
        "async": ["--config.async_rl.enabled=True", "--config.async_rl.max_staleness=2",
                  "--config.async_rl.fixed=True"],
        "policy_lag": ["--config.rollout.policy_lag=2"]}


def test_equal_time_runs_name_their_rows_and_overrides():
    equal_time = _script("vapo_vs_dapo")
    assert equal_time.parse_run("async_k1=dapo,async_rl.enabled=True,async_rl.max_staleness=1") \
        == ("async_k1", "dapo", ["async_rl.enabled=True", "async_rl.max_staleness=1"])
    assert equal_time.parse_run("sync=dapo") == ("sync", "dapo", [])
    for bad in ("dapo", "=dapo", "x=dapo,enabled"):
        with pytest.raises(SystemExit, match="expected NAME=RECIPE"):
            equal_time.parse_run(bad)
    rows = [{"recipe": "async_k1", "seed": s, "rl_steps": steps, "budget_seconds": 60.0,
             "value_pretrain_steps": 0, "seconds": 65.0, "eval_accuracy": acc,
             "peak_rss_bytes": 2**30} for s, steps, acc in ((0, 120, 0.9), (1, 100, 0.8))]
    line = equal_time.format_table(rows, []).splitlines()[2].split()
    # mean steps 110, s/step the mean of 60/120 and 60/100, pass@1 mean ± sample std
    assert line[:5] == ["async_k1", "2", "0.850", "±", "0.071"]
    assert line[-7:] == ["110.0", "0.55", "65", "n/a", "1.000", "±", "0.000"]


def test_the_step_table_averages_each_seeds_steps_from_the_sixth(tmp_path):
    equal_time = _script("vapo_vs_dapo")
    for seed, offset in ((0, 0.0), (1, 1.0)):   # steps 1-5 compile: left out
        run = tmp_path / f"split_seed{seed}"
        run.mkdir()
        rows = [{"step": t, "time_rollout": 100.0 if t < 6 else t + offset, "staleness": 1.0,
                 "time_weight_transfer": 0.5} for t in range(1, 9)]
        (run / run_files.METRICS).write_text("".join(json.dumps(r) + "\n" for r in rows))
    results = [{"recipe": "split", "seed": s} for s in (0, 1)]
    table = equal_time.format_step_table(results, str(tmp_path)).splitlines()
    assert table[0].startswith("# per step, mean over steps 6.. of each run, per seed 0 / 1")
    assert table[1].split() == ["run", "time_rollout", "staleness", "time_weight_transfer"]
    # steps 6, 7, 8: mean 7 (seed 0), 8 (seed 1)
    assert table[2].split() == ["split", "7.00", "/", "8.00", "1.00", "/", "1.00",
                                "0.50", "/", "0.50"]
    # From step 2 (a run of a few long steps): steps 2-5 take the 100 s of the first steps.
    table = equal_time.format_step_table(results, str(tmp_path), from_step=2).splitlines()
    assert table[0].startswith("# per step, mean over steps 2.. of each run")
    # seed 0: (4 x 100 + 6 + 7 + 8) / 7 = 60.14; seed 1: (400 + 7 + 8 + 9) / 7 = 60.57
    assert table[2].split()[1:4] == ["60.14", "/", "60.57"]


def test_a_recipe_with_its_own_argument_replaces_runlocal():
    equal_time = _script("vapo_vs_dapo")
    assert equal_time.config_spec("dapo") == str(REPO / "configs" / "dapo.py:runlocal=True")
    assert equal_time.config_spec("smollm2:path=/ckpt") == str(REPO / "configs" /
                                                                "smollm2.py:path=/ckpt")
    assert equal_time.parse_run("sync=smollm2:path=/ckpt,async_rl.enabled=True") == (
        "sync", "smollm2:path=/ckpt", ["async_rl.enabled=True"])
