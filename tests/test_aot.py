"""The ahead-of-time fit report: its code path on this host's CPU devices (always), and on a
small TPU topology when libtpu is installed (the `tpu` extra; CI skips those)."""

import json
import os
import pathlib
import subprocess
import sys
import textwrap

import jax
import numpy as np
import pytest

from grpo_jax import aot, config_lib, models, parallel
from grpo_jax.aot import programs as programs_lib
from grpo_jax.training import optimizer as optimizer_lib

KEYS = ("bytes_per_device", "flops", "estimated_s", "compile_s")
GSPO = pathlib.Path(__file__).resolve().parent.parent / "configs" / "gspo.py"
NEW_TOKENS = config_lib.load_config(f"{GSPO}:runlocal=True").rollout.max_new_tokens   # runlocal's


def tiny_config(**overrides):
    """GSPO's runlocal regime on the tiny model (XLA attention, unscanned layers)."""
    config = config_lib.load_config(f"{GSPO}:runlocal=True")
    return config_lib.apply_overrides(config, {"mesh": "data=2,fsdp=4,tensor=1", **overrides})


def expected_param_bytes(cfg, fsdp):
    """Per-device bytes of the weights under the "fsdp" rules, from the shapes by hand: every
    matrix split `fsdp` ways along D, the norm scales whole."""
    d, v, f, layers = cfg.d_model, cfg.vocab_size, cfg.d_ff, cfg.n_layers
    qkvo = d * cfg.head_dim * (2 * cfg.n_heads + 2 * cfg.n_kv_heads)
    matrices = v * d + layers * (qkvo + 3 * d * f)      # tied embeddings: no lm_head
    norms = d + layers * (2 * d + 2 * cfg.head_dim)     # final, attn/mlp, q/k norms
    return (matrices // fsdp + norms) * 4


class TestCpuReport:
    @pytest.fixture(scope="module")
    @staticmethod
    def result():
        return aot.report(tiny_config(), "cpu", prompt_len=16, log=lambda line: None)

    def test_json_keys(self, result):
        assert result["topology"] == "cpu" and result["devices"] == len(jax.devices())
        assert result["hbm_bytes_per_device"] is None and result["fits"] is None
        assert set(result["programs"]) == {"train", "logprob", "prefill", "decode"}
        for program in result["programs"].values():
            assert all(key in program for key in KEYS)
            assert program["bytes_per_device"] > 0 and program["compile_s"] > 0

    def test_train_arguments_are_the_sharded_state_and_batch(self, result):
        """The compiler's argument bytes equal the weights, the AdamW moments (sharded like
        the weights), the batch columns GSPO reads split over the 8 row ways, and the row
        index (jit drops the columns it does not read: lengths, rewards, behaviour_logp...)."""
        cfg = models.get_model_config("tiny")
        params = expected_param_bytes(cfg, fsdp=4)
        steps = 2 * 4   # AdamW's count and the schedule's, int32, replicated
        b, s, n = 16 * 4, 16, NEW_TOKENS   # 16 prompts x G = 4, prompt 16
        # prompt tokens and mask [b, s], tokens, mask, old_logp [b, n], advantages, row_valid
        per_row = 4 * (2 * s + 3 * n + 1) + 1
        rows = b // 8 * per_row
        index = b // 4 * 4   # one minibatch of 4
        train = result["programs"]["train"]
        assert train["argument_bytes"] == 3 * params + steps + rows + index
        assert train["alias_bytes"] == 3 * params + steps   # params and moments donated
        assert train["held_bytes"] == 0   # GSPO: no reference model, no lagged policy

    def test_sampler_holds_the_run_state(self, result):
        """While sampling, the training weights, the moments and the last batch stay in memory."""
        cfg = models.get_model_config("tiny")
        params = expected_param_bytes(cfg, fsdp=4)
        rows = 64 // 8 * (4 * (2 * 16 + 4 * NEW_TOKENS + 3) + 3)
        assert result["programs"]["decode"]["held_bytes"] == 3 * params + 8 + rows

    def test_table_has_a_row_per_program(self, result):
        rows = result["table"].splitlines()[2:]
        assert [row.split("|")[1].strip() for row in rows] == ["train", "logprob", "prefill", "decode"]


@pytest.mark.slow
def test_train_reads_the_kept_records_and_the_supervised_rows():
    """Keep sampling mask and keep routing (DeepSeek-V3.2) and a supervised term add exactly
    their rows' per-device bytes to the update's arguments: support ids `[B, N, 64]` (TopP's
    candidate bound) and sizes `[B, N]`, the experts of every token `[B, S + N, L_moe, k]`,
    the P prompts with their solutions `[P, 2 S + 2 N]`, and their index."""
    def train_arguments(**overrides):
        config = tiny_config(**{"model.name": "tiny_moe", **overrides})
        result = aot.report(config, "cpu", prompt_len=16, programs=("train",), log=lambda line: None)
        return result["programs"]["train"]["argument_bytes"]

    kept = train_arguments(**{"rollout.top_p": 0.95, "rollout.keep_sampling_mask": True,
                              "rollout.keep_routing": True, "train.sft_weight": 0.1})
    b, p, s, n, ways = 64, 16, 16, NEW_TOKENS, 8
    moe_layers, k = 3, 2   # tiny_moe: every layer routes each token to 2 experts
    records = b // ways * 4 * (n * 64 + n + (s + n) * moe_layers * k)
    # their row_valid is not read (the NLL is a token mean); the index of 1 of 4 minibatches
    supervised = p // ways * 4 * (2 * s + 2 * n) + p // 4 * 4
    assert kept - train_arguments() == records + supervised


@pytest.mark.slow
def test_a_critic_adds_its_update_and_value_pass():
    """VAPO: the critic (the tiny trunk and a `[D]` head, sharded like the policy) and its
    AdamW moments are the update's arguments with the columns its value loss reads; while
    the policy trains, the critic's state is held, and the policy's while the critic runs."""
    vapo = GSPO.parent / "vapo.py"
    config = config_lib.apply_overrides(config_lib.load_config(f"{vapo}:runlocal=True"),
                                        {"mesh": "data=2,fsdp=4,tensor=1"})
    result = aot.report(config, "cpu", prompt_len=16, programs=("train", "critic_train", "values"),
                        log=lambda line: None)
    cfg = models.get_model_config("tiny")
    policy = expected_param_bytes(cfg, fsdp=4)
    critic = policy + (cfg.d_model // 4 + 1) * 4   # the head split like "embed", the bias whole
    counters = 4 * sum(x.ndim == 0 for x in jax.tree.leaves(jax.eval_shape(
        optimizer_lib.make_optimizer(config.critic.optimizer, 1).init,
        {"w": jax.ShapeDtypeStruct((2,), np.float32)})))
    b, s, n, ways = 16 * 4, 16, config.rollout.max_new_tokens, 8
    index = b // 4 * 4   # one minibatch of 4
    tokens = b // ways * 4 * (2 * s + 2 * n)   # prompt tokens and mask, tokens, mask
    values_returns = b // ways * 4 * 2 * n
    programs = result["programs"]
    assert programs["critic_train"]["argument_bytes"] == 3 * critic + counters + tokens + values_returns + index
    assert programs["critic_train"]["alias_bytes"] == 3 * critic + counters
    assert programs["critic_train"]["held_bytes"] == 3 * policy + counters
    assert programs["values"]["argument_bytes"] == critic + tokens
    assert programs["values"]["held_bytes"] == 3 * policy + counters + 2 * critic + counters
    assert programs["train"]["held_bytes"] == 3 * critic + counters


def test_device_bytes_counts_each_device_share():
    mesh = parallel.make_mesh("data=2,fsdp=4", devices=jax.devices()[:8])
    split = jax.ShapeDtypeStruct((8, 6), np.float32, sharding=jax.NamedSharding(mesh, jax.P("fsdp")))
    whole = jax.ShapeDtypeStruct((5,), np.int32, sharding=jax.NamedSharding(mesh, jax.P()))
    assert programs_lib.device_bytes({"a": split, "b": whole}) == 2 * 6 * 4 + 5 * 4


def test_errors_name_the_fix():
    with pytest.raises(ValueError, match="unknown programs"):
        aot.report(tiny_config(), "cpu", prompt_len=16, programs=("critic",))
    with pytest.raises(ValueError, match="rollout.keep_routing=False for a dense model"):
        aot.report(tiny_config(**{"rollout.keep_routing": True}), "cpu", prompt_len=16)
    config = tiny_config()
    del config.model["attention"]
    with pytest.raises(ValueError, match="model.attention"):
        programs_lib.model_config(config)


def test_oom_messages_are_parsed():
    """XLA:TPU's two out-of-memory messages (as libtpu 0.0.52 words them)."""
    temps = ("RESOURCE_EXHAUSTED: E1000: CompileTimeHbmOom: Ran out of memory on HBM, the total "
             "memory required for HLO temporaries (47.68G) exceeds available HBM (15.75G).")
    assert aot.report_lib.needed_bytes(temps) == int(47.68 * 2**30)
    total = ("RESOURCE_EXHAUSTED: E1000: CompileTimeHbmOom: XLA:TPU compile permanent error. Ran out "
             "of memory in memory space hbm. Used 15.75G of 15.75G hbm. Exceeded hbm capacity by 6.90M.")
    assert aot.report_lib.needed_bytes(total) == int(15.75 * 2**30 + 6.90 * 2**20)
    assert aot.report_lib.needed_bytes("RESOURCE_EXHAUSTED: something else") is None


@pytest.mark.slow
def test_command_line_writes_the_json(tmp_path):
    config_file = tmp_path / "tiny_gspo.py"
    config_file.write_text(textwrap.dedent(f"""
        from grpo_jax import config_lib
        def get_config():
            config = config_lib.load_config("{GSPO}:runlocal=True")
            config.model.scan_layers = True
            return config
    """))
    out = tmp_path / "report.json"
    done = subprocess.run(
        [sys.executable, "-m", "grpo_jax.aot", f"--config={config_file}", "--topology=cpu",
         "--prompt_len=16", "--programs=train,decode", "--config.mesh=data=1,fsdp=2,tensor=1",
         f"--json={out}"], capture_output=True, text=True, timeout=600,
        cwd=GSPO.parent.parent, env={**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=2"})
    assert done.returncode == 0, done.stderr[-3000:]
    assert "| train |" in done.stdout and "fits: unknown" in done.stdout
    report = json.loads(out.read_text())
    assert report["devices"] == 2 and report["mesh"] == {"data": 1, "fsdp": 2, "tensor": 1}
    assert set(report["programs"]) == {"train", "decode"}


def test_command_line_names_a_topology_it_cannot_build():
    """Without libtpu, or with a name libtpu does not know: one line naming the fix."""
    done = subprocess.run(
        [sys.executable, "-m", "grpo_jax.aot", f"--config={GSPO}:runlocal=True", "--topology=v9z:1x1"],
        capture_output=True, text=True, timeout=300, cwd=GSPO.parent.parent)
    assert done.returncode == 1
    assert "--topology 'v9z:1x1': could not build the TPU topology" in done.stderr
    assert "Traceback" not in done.stderr


# ----- on TPU topologies: needs libtpu (pip install -e ".[tpu]"); CI does not install it ----

def tpu_topology():
    pytest.importorskip("libtpu", reason="compiling for a TPU topology needs libtpu: pip install -e '.[tpu]'")


@pytest.mark.slow
def test_tiny_model_fits_a_v5e_2x2():
    tpu_topology()
    config = tiny_config(mesh="data=1,fsdp=2,tensor=2", **{"model.rules": "fsdp_tp",
                                                             "model.attention": "splash"})
    result = aot.report(config, "v5e:2x2", prompt_len=128, log=lambda line: None)
    assert result["devices"] == 4 and result["device_kind"] == "TPU v5 lite"
    assert result["hbm_bytes_per_device"] == int(15.75 * 2**30) and result["fits"] is True
    for name, program in result["programs"].items():
        assert 0 < program["bytes_per_device"] < 2**30, name
        assert program["flops"] > 0, name


@pytest.mark.slow
def test_a_run_that_cannot_fit_is_reported_with_advice():
    """qwen3_0_6b's decode cache for 4,096 rows x 8k tokens far exceeds a v5e's 15.75 GiB."""
    tpu_topology()
    config = tiny_config(mesh="data=1,fsdp=4,tensor=1", **{
        "model.name": "qwen3_0_6b", "model.dtype": "bfloat16", "model.param_dtype": "bfloat16",
        "rollout.prompts_per_batch": 256, "rollout.max_new_tokens": 8192, "objective.group_size": 16})
    result = aot.report(config, "v5e:2x2", prompt_len=128, programs=("decode",), log=lambda line: None)
    assert result["fits"] is False
    decode = result["programs"]["decode"]
    cache = 28 * 2 * 4096 * 8 * 128 * 8192 * 2 / 4   # layers x (k, v) x rows x K x H x slots x bf16 / chips
    assert decode["bytes_per_device"] > cache
    assert "decode needs" in result["advice"][0] and "rollout.prompts_per_batch" in result["advice"][0]
