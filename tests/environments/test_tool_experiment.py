"""experiments/tool_vs_no_tool.py's table, on hand-made evaluations and metrics (no run)."""

import importlib.util
import json
import pathlib

from grpo_jax import run_files

REPO = pathlib.Path(__file__).resolve().parents[2]


def _script():
    spec = importlib.util.spec_from_file_location("tool_vs_no_tool",
                                                  REPO / "experiments" / "tool_vs_no_tool.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _eval(accuracy, calls=None):
    e = {"eval_accuracy": accuracy, "eval_mean_at_k": accuracy / 2, "eval_pass_at_k": 2 * accuracy}
    if calls is not None:
        e.update(eval_tool_use_rate=calls, eval_tool_calls_per_episode=2 * calls)
    return e


def test_rollout_ends_and_the_table(tmp_path):
    script = _script()
    rows = [{"step": 1, "accuracy": 0.25, "tool_use_rate": 0.5, "tool_calls_per_episode": 1.0,
             "tool_errors_per_episode": 0.1, "environment_failures": 1.0},
            {"step": 2, "eval_accuracy": 0.3},   # an evaluation-only row is skipped
            {"step": 3, "accuracy": 0.75, "tool_use_rate": 1.0, "tool_calls_per_episode": 1.5,
             "tool_errors_per_episode": 0.0, "environment_failures": 2.0}]
    (tmp_path / run_files.METRICS).write_text("".join(json.dumps(r) + "\n" for r in rows))
    ends = script.rollout_ends(str(tmp_path))
    assert ends["steps"] == (1, 3) and ends["environment_failures"] == 3.0
    assert ends["first"]["accuracy"] == 0.25 and ends["last"]["tool_use_rate"] == 1.0

    results = [
        {
            "seed": seed, "rollouts": ends, "train_seconds": 600.0 * (seed + 1),
            "rl_seconds": 120.0,
            "evals": {
                ("before", "with"): _eval(0.2 + d, 0.5), ("before", "without"): _eval(0.1),
                ("after", "with"): _eval(0.6 + d, 1.0), ("after", "without"): _eval(0.0),
            },
        }
        for seed, d in ((0, 0.0), (1, 0.2))
    ]
    lines = script.format_table(results, ["# header"]).splitlines()
    assert lines[0] == "# header"
    table = {tuple(line.split()[:2]): line.split()[2:] for line in lines[2:6]}
    # seeds 0.2 and 0.4: mean 0.3, sample std 0.141; mean@k half, pass@k twice
    assert table["before", "with"] == ["0.300", "±", "0.141", "0.150", "±", "0.071", "0.600",
                                       "±", "0.283", "0.500", "±", "0.000"]
    assert table["after", "without"] == ["0.000", "±", "0.000"] * 3 + ["-"]
    assert ("seed 1: accuracy 0.250 -> 0.750, tool_use_rate 0.500 -> 1.000, tool_calls_per_episode "
            "1.000 -> 1.500, tool_errors_per_episode 0.100 -> 0.000, environment_failures 3 over "
            "all steps") in lines
    assert lines[-1] == ("times: seed 0 10.0 min whole training command, RL steps 2.0 min; "
                         "seed 1 20.0 min whole training command, RL steps 2.0 min")
    assert "seed 1 per run: before with: pass@1 0.400, calls in 0.500, 1.00 calls per episode" in (
        lines[-2])
