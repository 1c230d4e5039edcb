"""The split plan (`grpo_jax.aot.plan`): its arithmetic by hand, the splits it tries, rows
that cannot run or do not fit, and one plan end to end on CPU devices (and on a small TPU
topology when libtpu is installed)."""

import pathlib

import numpy as np
import pytest

from grpo_jax import config_lib, models
from grpo_jax.aot import plan

GSPO = pathlib.Path(__file__).resolve().parent.parent / "configs" / "gspo.py"
V5P = plan.CHIPS["TPU v5"]


def tiny_config(**overrides):
    """GSPO's runlocal regime (16 prompts x 4 answers, 4 minibatches) on the tiny model."""
    config = config_lib.load_config(f"{GSPO}:runlocal=True")
    return config_lib.apply_overrides(config, {"mesh": "data=1,fsdp=-1,tensor=1", **overrides})


class TestStepArithmetic:
    def test_rollout_is_prefill_then_one_decode_step_per_new_token(self):
        assert plan.rollout_seconds(0.2, 0.004, 7168) == pytest.approx(0.2 + 28.672)

    def test_update_is_the_log_prob_passes_and_every_optimizer_update(self):
        # GSPO: pi_old recomputed (1 pass), 4 minibatches x 1 epoch
        assert plan.update_seconds(5.0, 3.0, updates=4, logprob_passes=1) == 23.0
        assert plan.logprob_passes(config_lib.load_config(f"{GSPO}:runlocal=True")) == 1
        grpo = config_lib.load_config(f"{GSPO.parent / 'grpo.py'}:runlocal=True")   # + pi_ref
        assert plan.logprob_passes(grpo) == 2

    def test_synchronous_adds_asynchronous_takes_the_slower_side(self):
        assert plan.step_seconds(30.0, 20.0, split=False) == 50.0
        # the sampler waits for its weights (0.5 s), the learner for the batch (0.1 s)
        assert plan.step_seconds(30.0, 20.0, weights_s=0.5, batch_s=0.1, split=True) == 30.5
        assert plan.step_seconds(30.0, 40.0, weights_s=0.5, batch_s=0.1, split=True) == 40.1

    def test_layers_extrapolate_linearly(self):
        assert plan.extrapolate(1.0, 1.5, 36) == 18.5
        assert plan.extrapolate(2.0, 3.0, 1) == 2.0

    def test_the_cost_models_minus_one_terms_are_removed(self):
        """A v5p update variant (0.6B, one layer) came back as -2.9799 s with 2.96 TFLOP and
        39.6 GB: its floor is 39.6e9 / 2765e9 = 14.3 ms, so three -1 s terms, 20.1 ms left."""
        assert plan.modelled(-2.9799, 2.96e12, 39.6e9, V5P) == pytest.approx(0.0201)
        assert plan.modelled(0.0068, 5.6e11, 1.55e10, V5P) == 0.0068   # above its floor already
        assert plan.modelled(-0.5, 1.0, 1.0, None) == -0.5              # no chip: as it is

    def test_kernel_flops_by_hand(self):
        cfg = models.get_model_config("qwen3_8b")   # 32 heads x 128, D 4096, V 151936
        assert plan.attention_flops(8, cfg) == 2 * 32 * 128 * 64
        assert plan.head_flops(8, cfg) == 2 * 8 * 4096 * 151936

    def test_program_seconds_from_variants(self):
        """Per call: the layers' difference x L x the loop they run in, plus the kernels'
        FLOPs at the peak over the mesh's chips; prefill and decode extrapolated whole."""
        cfg = models.get_model_config("tiny", attention_impl="splash")   # 3 layers, 4 x 32 heads
        config = tiny_config(**{"train.packing": "off", "train.micro_batches": 2})
        mesh = type("Mesh", (), {"size": 4})()
        estimates = {"train": [(0.5, 0), (0.7, 0)], "logprob": [(0.1, 0), (0.15, 0)],
                     "prefill": [(0.01, 0), (0.02, 0)], "decode": [(0.001, 0), (0.003, 1e9)]}
        seconds = plan.program_seconds(config, cfg, estimates, dict.fromkeys(estimates, mesh),
                                       prompt_len=16, chip=V5P)
        s, n, rows = 16, 48, 16 * 4
        attention = lambda t: 2 * 4 * 32 * t * t
        head = lambda t: 2 * t * 128 * 512
        peak = 4 * V5P.peak_flops
        # a minibatch of 16 rows; remat off: forward + 2.5x for the backward, the head's
        # chunks always rematerialised (forward twice + backward)
        train = rows / 4 * (3 * 3.5 * attention(s + n) + 4 * head(n))
        assert seconds["train"] == pytest.approx(3 * 0.2 * 2 + train / peak)
        logprob = rows * (3 * attention(s + n) + head(n))
        assert seconds["logprob"] == pytest.approx(3 * 0.05 * 4 * 2 + logprob / peak)
        assert seconds["prefill"] == pytest.approx(0.03 + 16 * 3 * attention(s) / peak)
        assert seconds["decode"] == pytest.approx(0.005)
        estimates["decode"][1] = None   # a variant that did not compile: no time
        assert plan.program_seconds(config, cfg, estimates, dict.fromkeys(estimates, mesh),
                                    prompt_len=16, chip=V5P)["decode"] is None


class TestSplits:
    def test_default_splits(self):
        assert plan.default_splits(8) == [2, 4, 6]
        assert plan.default_splits(32) == [8, 16, 24]
        assert plan.default_splits(4) == [1, 2, 3]
        assert plan.default_splits(2) == [1]

    def test_rollout_mesh_of_a_split(self):
        assert plan.rollout_spec("", 4) == "data=4"
        assert plan.rollout_spec("data=-1,tensor=4", 16) == "data=4,tensor=4"
        with pytest.raises(ValueError, match="does not make a mesh of 6 chips"):
            plan.rollout_spec("data=-1,tensor=4", 6)

    def test_the_best_row_fits(self):
        rows = [{"fits": True, "step_s": 50.0}, {"fits": False, "step_s": 10.0},
                {"fits": True, "step_s": 30.0}, {"fits": True, "step_s": None}, {"invalid": "x"}]
        assert plan.best_row(rows) == 2
        assert plan.best_row(rows[1:2]) is None

    def test_a_side_that_does_not_fit_says_so(self):
        gib = 2**30
        program = lambda total, oom=False: {"bytes_per_device": total * gib, "compiler_oom": oom,
                                            "compile_failed": False}
        programs = {"prefill": program(10), "decode": program(20), "train": program(30, oom=True),
                    "logprob": program(5)}
        assert plan._side(programs, plan.SAMPLER, 16 * gib) == ("20.0", False)
        assert plan._side(programs, plan.SAMPLER, 32 * gib) == ("20.0", True)
        assert plan._side(programs, plan.LEARNER, 95 * gib) == ("> 30.0", False)
        assert plan._side(programs, plan.SAMPLER, None) == ("20.0", None)


def tiny_weights_bytes():
    """The tiny model's float32 weights, whole (the sampling rules keep them whole on a
    chip without a tensor axis), from its shapes: tied embedding, 3 layers."""
    cfg = models.get_model_config("tiny")
    d, f, h = cfg.d_model, cfg.d_ff, cfg.head_dim
    layer = d * h * (2 * cfg.n_heads + 2 * cfg.n_kv_heads) + 3 * d * f + 2 * d + 2 * h
    return 4 * (cfg.vocab_size * d + d + cfg.n_layers * layer)


@pytest.mark.slow
def test_plan_on_cpu_devices():
    """8 CPU devices (no HBM, no time model): one mesh and the 4 + 4 split compile; 6 + 2
    cannot run (the 16 prompts do not split 6 ways), said in its row; the split copies the
    whole weights into each rollout chip every step."""
    result = plan.plan(tiny_config(), "cpu", prompt_len=16, splits=[4, 6], bandwidth=1e9,
                       log=lambda line: None)
    one, four, six = result["rows"]
    assert not one["split"] and one["rollout_chips"] == one["train_chips"] == 8
    assert four["rollout_mesh"] == {"data": 4, "fsdp": 1, "tensor": 1}
    assert four["train_mesh"] == {"data": 1, "fsdp": 4, "tensor": 1}
    assert "the 16 prompts do not split over the 6 row ways" in six["invalid"]
    assert four["copy_bytes"]["weights"] == tiny_weights_bytes()
    assert four["weights_s"] == pytest.approx(tiny_weights_bytes() / 1e9)
    assert one["fits"] is None and result["best"] is None   # no HBM, no time on CPU
    assert "| 4 + 4 | data=4 | fsdp=4 |" in result["table"]
    assert "| 6 + 2 | cannot run:" in result["table"]


@pytest.mark.slow
def test_plan_on_a_v5e_2x2():
    """On 4 v5e chips the tiny run's step times follow from its programs' times: one mesh
    rollout + update, the 2 + 2 split the slower side plus its copy."""
    pytest.importorskip("libtpu", reason="compiling for a TPU topology needs libtpu")
    result = plan.plan(tiny_config(), "v5e:2x2", prompt_len=16, splits=[2],
                       log=lambda line: None)
    one, two = result["rows"]
    assert result["bandwidth"] == 50e9 and one["fits"] is True and two["fits"] is True
    for row in (one, two):
        s = row["seconds"]
        assert all(v > 0 for v in s.values())
        assert row["rollout_s"] == pytest.approx(s["prefill"] + 48 * s["decode"])
        assert row["update_s"] == pytest.approx(4 * s["train"] + s["logprob"])
    assert one["step_s"] == pytest.approx(one["rollout_s"] + one["update_s"])
    assert two["step_s"] == pytest.approx(max(two["rollout_s"] + tiny_weights_bytes() / 50e9,
                                              two["update_s"] + two["batch_s"]))
    assert result["best"] == int(np.argmin([one["step_s"], two["step_s"]]))
