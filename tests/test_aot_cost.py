"""`python -m grpo_jax.aot --plan_cost` (`grpo_jax.aot.cost`): its arithmetic by hand, the
search for the smallest topology that fits, and one cost end to end on CPU devices."""

import pathlib
import subprocess
import sys
import types

import pytest

from grpo_jax import aot, config_lib
from grpo_jax.aot import cost, plan
from grpo_jax.training import footprint

REPO = pathlib.Path(__file__).resolve().parents[1]
PAPER = REPO / "configs" / "paper"
V5P = plan.CHIPS["TPU v5"]


def test_arithmetic_by_hand():
    assert cost.chip_hours(5000, 120.0, 64) == pytest.approx(5000 * 120 * 64 / 3600)
    dapo = config_lib.load_config(PAPER / "dapo_qwen25_32b.py")
    assert cost.generated_tokens(dapo) == 512 * 16 * 20480
    assert cost._chips("v5p:2x4x4") == (32, "v5p:2x4x4") and cost._chips("v5e:2x2")[0] == 4


def test_a_named_shape_is_costed_without_reading_the_checkpoint():
    dapo = config_lib.load_config(PAPER / "dapo_qwen25_32b.py")
    assert dapo.model.path and cost.costed_config(dapo).model.path == ""
    unnamed = config_lib.replaced(dapo, {"model.name": ""})
    assert cost.costed_config(unnamed).model.path == dapo.model.path


def test_the_smallest_fit_is_the_first_that_fits_and_a_state_too_large_is_not_compiled(
        monkeypatch):
    """4 chips cannot hold 400 GiB of state (100 GiB each > 95.73); 8 compile and do not
    fit; 32 fit, and the search stops there: 64 is never compiled."""
    chips = {"v5p:2x2x1": 4, "v5p:2x2x2": 8, "v5p:2x4x4": 32, "v5p:4x4x4": 64}
    device = types.SimpleNamespace(device_kind="TPU v5")
    monkeypatch.setattr(aot, "topology_devices", lambda name: [device] * chips[name])
    monkeypatch.setattr(footprint, "replicated_state_bytes", lambda config: 400 * 2**30)
    compiled = []

    def compile_run(config, name, **kwargs):
        compiled.append(name)
        return {"fits": name == "v5p:2x4x4"}

    monkeypatch.setattr(aot, "compile_run", compile_run)
    found, tried = cost.smallest_fit(None, list(chips), prompt_len=16, log=lambda line: None)
    assert found == "v5p:2x4x4" and compiled == ["v5p:2x2x2", "v5p:2x4x4"]
    assert tried == [("v5p:2x2x1", "no: the state alone is over the HBM fully sharded"),
                     ("v5p:2x2x2", "no"), ("v5p:2x4x4", "yes")]
    found, tried = cost.smallest_fit(None, list(chips), prompt_len=16,
                                     known={"v5p:2x2x2": True}, log=lambda line: None)
    assert found == "v5p:2x2x2" and compiled == ["v5p:2x2x2", "v5p:2x4x4"]   # not again


@pytest.mark.slow
def test_cost_on_cpu_devices(monkeypatch):
    """Dr. GRPO's runlocal run for 1,000 steps on 8 CPU devices, with each time variant's
    estimate taken as its FLOPs at a v5p's peak (CPU's cost model gives no time): the step
    is the rollout plus the update, tokens/s the step's 16 x 4 x 48 tokens over it, and
    chip-hours steps x step x 8 / 3600, in the result and in the printed row."""
    monkeypatch.setitem(plan.CHIPS, "cpu", V5P)

    def at_peak(program, options, chip):
        flops = program.lowered.compile().cost_analysis()
        flops = flops[0] if isinstance(flops, (list, tuple)) else flops
        return flops["flops"] / chip.peak_flops, flops["bytes accessed"]

    monkeypatch.setattr(plan, "_estimate", at_peak)
    config = config_lib.load_config(f"{PAPER / 'dr_grpo_qwen25_math_7b.py'}:runlocal=True")
    config = config_lib.apply_overrides(config, {"train.steps": 1000,
                                                 "mesh": "data=1,fsdp=-1,tensor=1"})
    result = cost.cost(config, "cpu", prompt_len=16, log=lambda line: None)
    step = result["step_s"]
    assert step > 0 and step == pytest.approx(result["rollout_s"] + result["update_s"])
    assert result["generated_tokens"] == 16 * 4 * 48
    assert result["tokens_per_s"] == pytest.approx(16 * 4 * 48 / step)
    assert result["chip_hours"] == pytest.approx(1000 * step * 8 / 3600)
    assert result["fits"] is None and result["smallest_fit"] is None   # no HBM, no list
    row = result["table"].splitlines()[2].split("|")
    assert [c.strip() for c in row[1:4]] == ["cpu", "8", "?"]
    assert float(row[6]) == pytest.approx(step, rel=1e-3)
    assert float(row[10].replace(",", "")) == pytest.approx(1000 * float(row[6]) * 8 / 3600,
                                                            rel=2e-3, abs=0.06)


def test_command_line_cost_names_a_topology_it_cannot_build():
    """``--plan_cost`` parses, loads the paper config and stops with one line on a topology
    that cannot be built (without libtpu, or a name libtpu does not know)."""
    done = subprocess.run(
        [sys.executable, "-m", "grpo_jax.aot", f"--config={PAPER / 'dapo_qwen25_32b.py'}",
         "--topology=v9z:1x1", "--plan_cost"], capture_output=True, text=True, timeout=300,
        cwd=REPO)
    assert done.returncode == 1
    assert "--topology 'v9z:1x1': could not build the TPU topology" in done.stderr
    assert "Traceback" not in done.stderr
