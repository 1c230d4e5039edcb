"""experiments/bench_sampler.py runs end to end on tiny shapes and prints its tables."""

import importlib.util
import pathlib
import sys

import pytest

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "experiments" / "bench_sampler.py"


@pytest.fixture(scope="module")
def bench():
    pytest.importorskip(
        "torch", reason="the benchmark compares with transformers' PyTorch generate"
    )
    spec = importlib.util.spec_from_file_location("bench_sampler", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_sampler"] = module  # as a script run registers its __main__
    spec.loader.exec_module(module)
    yield module
    for name in ("bench_sampler", "bench_sampler_vocab"):
        sys.modules.pop(name, None)


@pytest.mark.slow
def test_quick_run_prints_every_tiny_model_table(bench, capsys):
    bench.main(["--quick"])
    out = capsys.readouterr().out
    assert "1. generation tokens/s" in out and "grpo_jax 1 device" in out and "ratio 8 dev" in out
    assert "2. |sampler logp - teacher-forced logp|" in out and "bfloat16" in out
    assert "3. decode attention of one layer" in out


@pytest.mark.slow
def test_quick_run_prints_the_vocabulary_tables(bench, capsys, char_checkpoint):
    """A character-level checkpoint stands in for SmolLM2 (its chat template formats the
    questions), the random model has 4,096 tokens in --quick."""
    bench.main(["--quick", "--tables", "vocab,step", "--smollm2", char_checkpoint])
    out = capsys.readouterr().out
    assert (
        "4. generation tokens/s at real vocabulary sizes" in out and "5. one sampling step" in out
    )
    for row in (
        "SmolLM2-135M  float32  16  top-p 0.95", "random, V=4,096  float32  16  top-p 0.95",
    ):
        assert " ".join(row.split()) in " ".join(out.split())
    assert "full sort of the vocabulary" in out and "the 0.95 nucleus has a median" in out
