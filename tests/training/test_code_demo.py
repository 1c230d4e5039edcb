"""experiments/code_demo.py's summary and table, on hand-made stage results (no run)."""

import argparse
import importlib.util
import json
import pathlib

import numpy as np
import pytest
from scipy import stats as scipy_stats

from grpo_jax import run_files

REPO = pathlib.Path(__file__).resolve().parents[2]
MACHINE = {"commit": "abc1234", "machine": "2 CPU cores", "load": 1.5}


@pytest.fixture(scope="module")
def script():
    spec = importlib.util.spec_from_file_location("code_demo",
                                                  REPO / "experiments" / "code_demo.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def stage_row(pass1, mean_k, steps=10, seconds=60.0):
    return {"pass@1": pass1, "mean@k": mean_k, "steps": steps, "seconds": seconds}


def seed_row(warm, rl, sft):
    return {"warm": stage_row(*warm), "rl": stage_row(*rl), "sft": stage_row(*sft)}


def test_command_line(script):
    args = argparse.Namespace(seeds="0,1", steps=2, sft_steps=20, prompts=None)
    assert script.command_line(args) == ("python experiments/code_demo.py --seeds 0,1 "
                                         "--steps 2 --sft-steps 20")


def test_summary_reads_each_stage_and_its_last_step(script, tmp_path):
    for directory, last in (("sft", 300), ("rl", 2), ("sft_control", 7)):
        (tmp_path / directory).mkdir()
        rows = [{"step": s, "loss": 1.0} for s in (1, last)]
        (tmp_path / directory / run_files.METRICS).write_text(
            "".join(json.dumps(r) + "\n" for r in rows))
    results = [{"stage": "SFT warm start", "seconds": 50.0, "eval_accuracy": 0.25,
                "eval_mean_at_k": 0.2, "eval_pass_at_k": 0.5, "eval_k": 4.0},
               {"stage": "+ DAPO (RL)", "seconds": 30.0, "eval_accuracy": 0.5,
                "eval_mean_at_k": 0.45, "eval_pass_at_k": 0.7, "eval_k": 4.0},
               {"stage": "+ SFT for the same time (control)", "seconds": 30.0,
                "eval_accuracy": 0.3, "eval_mean_at_k": 0.3, "eval_pass_at_k": 0.6,
                "eval_k": 4.0}]
    assert script.summary(results, str(tmp_path)) == {
        "warm": stage_row(0.25, 0.2, 300, 50.0), "rl": stage_row(0.5, 0.45, 2, 30.0),
        "sft": stage_row(0.3, 0.3, 7, 30.0)}


def test_two_seeds_give_the_range_and_the_exact_sign_flip_p(script):
    per_seed = {0: seed_row((0.2, 0.1), (0.5, 0.4), (0.4, 0.3)),
                1: seed_row((0.3, 0.2), (0.6, 0.5), (0.3, 0.3))}
    table = script.format_table(per_seed, command="python experiments/code_demo.py",
                                prompts=100, k=4, machine=MACHINE)
    lines = table.splitlines()
    assert lines[0] == "python experiments/code_demo.py"
    assert "| 1 | + DAPO (RL) | 0.600 | 0.500 | 10 | 60 |" in lines
    assert "| mean of 2 | SFT warm start | 0.250 | 0.150 | 10 | 60 |" in lines
    # RL - SFT pass@1: +0.1 and +0.3; of the 4 sign flips, |+-0.1 +-0.3| >= 0.4 for 2.
    assert ("| RL - SFT | pass@1 | +0.100 +0.300 | +0.200 | range [0.100, 0.300] over 2 "
            "seeds | 0.500 | no difference detected at 2 seeds |") in lines
    assert ("| RL - warm start | mean@k | +0.300 +0.300 | +0.300 | range [0.300, 0.300] "
            "over 2 seeds | 0.500 | no difference detected at 2 seeds |") in lines
    # sqrt(0.25 / 100)
    assert lines[-1].endswith("binomial standard error of 0.050.")


def test_five_seeds_give_the_t_interval(script):
    rl = [0.5, 0.6, 0.7, 0.8, 0.9]
    per_seed = {s: seed_row((0.1, 0.1), (rl[s], rl[s]), (0.4, 0.4)) for s in range(5)}
    table = script.format_table(per_seed, command="", prompts=100, k=4, machine=MACHINE)
    d = np.array(rl) - 0.4
    lo, hi = scipy_stats.t.interval(0.95, df=4, loc=d.mean(), scale=scipy_stats.sem(d))
    # All 5 differences positive: 2 of the 32 sign flips reach |sum| = 1.5, p = 0.0625.
    line = next(x for x in table.splitlines() if x.startswith("| RL - SFT | pass@1 |"))
    assert line == (f"| RL - SFT | pass@1 | +0.100 +0.200 +0.300 +0.400 +0.500 | +0.300 | "
                    f"95% t-CI [{lo:.3f}, {hi:.3f}] | 0.062 | no difference detected at "
                    "5 seeds |")
    assert (f"{lo:.3f}", f"{hi:.3f}") == ("0.104", "0.496")
