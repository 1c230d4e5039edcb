"""experiments/bench_sampler.py runs end to end on tiny shapes and prints its three tables."""

import importlib.util
import pathlib

import pytest

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "experiments" / "bench_sampler.py"


@pytest.mark.slow
def test_quick_run_prints_every_table(capsys):
    pytest.importorskip("torch", reason="the benchmark compares with transformers' PyTorch generate")
    spec = importlib.util.spec_from_file_location("bench_sampler", SCRIPT)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    bench.main(["--quick"])
    out = capsys.readouterr().out
    assert "1. generation tokens/s" in out and "grpo_jax 1 device" in out and "ratio 8 dev" in out
    assert "2. |sampler logp - teacher-forced logp|" in out and "bfloat16" in out
    assert "3. decode attention of one layer" in out
