"""RL runs with an environment (``environment.name``): what the multi-turn path changes."""

import filecmp
import json

import pytest

from grpo_jax import environments
from grpo_jax.training import rl
from tests.environments.envs import CalculatorPausingOnEquals
from tests.training.training_setups import (DAPO_RUN, assert_metric_close, comparable,
                                            read_metrics, tiny_config)

EPISODE_KEYS = {"turns_per_episode": 1.0, "tool_calls_per_episode": 0.0, "tool_use_rate": 0.0,
                "tool_errors_per_episode": 0.0, "environment_tokens_per_episode": 0.0,
                "environment_failures": 0.0, "turns_over_budget_rate": 0.0}


@pytest.mark.slow
def test_an_environment_the_model_never_calls_gives_the_single_turn_run(data_dir, dapo_run,
                                                                        tmp_path, monkeypatch):
    """Two steps of DAPO with the calculator environment whose rows pause at every "="
    of their scratchpads (several times per row, resumed with nothing: the model never
    calls the tool) equal the single-turn run: the same rollouts (every row's text and
    reward), the same metrics step for step (the sampler-vs-trainer ones up to rounding:
    the engine's decode programs differ from the static sampler's), the same evaluation,
    and episode metrics of one turn and no call."""
    monkeypatch.setitem(environments.ENVIRONMENTS, "calculator_at_equals",
                        lambda max_calls: CalculatorPausingOnEquals(
                            tools={"calculator": environments.calculator}, max_calls=max_calls))
    single, episodic = dapo_run, tmp_path / "episodic"   # single: the session's run
    rl.train(tiny_config("dapo", data_dir, **DAPO_RUN,
                         **{"environment.name": "calculator_at_equals"}), str(episodic))
    want, got = read_metrics(single), read_metrics(episodic)
    assert [r["step"] for r in got] == [r["step"] for r in want] == [1, 2]
    for want_row, got_row in zip(want, got):
        want_row, got_row = comparable(want_row), comparable(got_row)
        evaluated = "eval_accuracy" in want_row
        extra = {**EPISODE_KEYS, **({f"eval_{k}": v for k, v in EPISODE_KEYS.items()}
                                    if evaluated else {})}
        assert got_row.keys() == want_row.keys() | extra.keys()
        for key, value in {**want_row, **extra}.items():
            assert_metric_close(key, got_row[key], value, rtol=0, atol=0,
                                err_msg=f"step {want_row['step']} {key}")
    assert "eval_accuracy" in want[-1]
    for step in (1, 2):
        assert filecmp.cmp(single / "rollouts" / f"{step}.jsonl",
                           episodic / "rollouts" / f"{step}.jsonl", shallow=False)
        with open(episodic / "rollouts" / f"{step}.jsonl") as f:
            completions = [json.loads(line)["completion"] for line in f]
        assert sum(c.count("=") >= 2 for c in completions) >= len(completions) // 2   # paused
