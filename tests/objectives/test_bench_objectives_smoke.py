"""experiments/bench_objectives.py runs end to end on tiny shapes and prints its tables."""

import importlib.util
import pathlib

import pytest

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "experiments" / "bench_objectives.py"


def _load_script():
    spec = importlib.util.spec_from_file_location("bench_objectives", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_quick_run_prints_every_table(capsys):
    bench = _load_script()
    bench.main(["--quick"])
    out = capsys.readouterr().out
    for name in ("ppo_clip_loss", "gspo_loss", "cispo_loss", "sapo_loss"):
        assert name in out
    for mode in bench.objs.AGGREGATION_MODES:
        assert mode in out
    for title in ("1. value+grad", "2. advantage estimators", "3. composed DAPO objective",
                  "4. memory-bandwidth limit", "5. where the DAPO value+grad time goes"):
        assert title in out
    assert "Mtokens/s" in out and "rows/s" in out
