"""The ahead-of-time fit report: its code path on this host's CPU devices (always), and on a
small TPU topology when libtpu is installed (the `tpu` extra; CI skips those)."""

import dataclasses
import json
import os
import pathlib
import re
import subprocess
import sys
import textwrap

import jax
import numpy as np
import pytest

from grpo_jax import aot, config_lib, models, parallel
from grpo_jax.aot import plan, programs as programs_lib
from grpo_jax.training import footprint, optimizer as optimizer_lib

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


def lowered_programs(config, prompt_len=16):
    """`{name: programs.Program}` of `config`'s run on its mesh of this host's devices,
    lowered, not compiled: what the report would compile."""
    mesh = parallel.make_mesh(parallel.parse_mesh(config.mesh))
    return {p.name: p for p in programs_lib.build(config, mesh, prompt_len=prompt_len)}


def _kept_arguments(lowered):
    """The arguments jit keeps of a lowered program (it drops those the program never
    reads), as sharded `ShapeDtypeStruct`s, and their indices among all its arguments.
    jax.stages.Lowered keeps them private; `TestCpuReport` checks what they give against
    the compiler."""
    args = lowered._lowering.compile_args
    kept = [jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s)
            for a, s in zip(args["global_in_avals"], args["in_shardings"], strict=True)]
    return kept, sorted(args["kept_var_idx"])


def argument_bytes(lowered):
    """Per-device bytes of a lowered program's arguments, from their shardings: the
    compiled program's argument bytes, without compiling it."""
    return programs_lib.device_bytes(_kept_arguments(lowered)[0])


def donated_bytes(lowered):
    """Per-device bytes of the donated arguments among those kept: the compiled
    program's alias bytes (every donated buffer is reused for an output)."""
    kept, indices = _kept_arguments(lowered)
    donated = [arg.donated for arg in jax.tree.leaves(lowered.args_info)]
    return programs_lib.device_bytes([x for x, i in zip(kept, indices) if donated[i]])


class TestCpuReport:
    @pytest.fixture(scope="module")
    @staticmethod
    def result():
        return aot.compile_run(tiny_config(), "cpu", prompt_len=16, log=lambda line: None)

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
        index (jit drops the columns it does not read: lengths, behaviour_logp...; the
        rewards are read, for the objective's count of non-finite rewards)."""
        cfg = models.get_model_config("tiny")
        params = expected_param_bytes(cfg, fsdp=4)
        steps = 2 * 4   # AdamW's count and the schedule's, int32, replicated
        b, s, n = 16 * 4, 16, NEW_TOKENS   # 16 prompts x G = 4, prompt 16
        # prompt tokens and mask [b, s], tokens, mask, old_logp [b, n], advantages, rewards,
        # row_valid
        per_row = 4 * (2 * s + 3 * n + 2) + 1
        rows = b // 8 * per_row
        index = b // 4 * 4   # one minibatch of 4
        train = result["programs"]["train"]
        assert train["argument_bytes"] == 3 * params + steps + rows + index
        assert train["alias_bytes"] == 3 * params + steps   # params and moments donated
        assert train["held_bytes"] == 0   # GSPO: no reference model, no lagged policy

    def test_packing_builds_the_packed_update_and_logprob_at_their_largest_plan(self, result):
        """With train.packing on, the update and pi_old's pass are the packed programs: their
        arguments gain the plan's arrays, split over the 8 row ways like the rows, at the size
        of a batch whose rows are all full: src, segment and position ids per packed
        position, `[rows, S + N - 1]`, and the gather back `[rows, N]` (the targets' map is
        read only with support ids, so jit drops it). They no longer read the padding masks
        the segments replace: the prompt's, and in pi_old's pass the completion's (the
        update's objective still reads it)."""
        packed = lowered_programs(tiny_config(**{"train.packing": "on"}))
        b, s, n = 16 * 4, 16, NEW_TOKENS
        t, minibatch = s + n - 1, b // 4
        masks = {"train": b // 8 * s * 4, "logprob": b // 8 * (s + n) * 4}
        for name, rows in (("train", minibatch), ("logprob", b)):
            padded = result["programs"][name]
            grown = argument_bytes(packed[name].lowered) - padded["argument_bytes"]
            assert grown == 4 * (3 * rows * t + rows * n) // 8 - masks[name], name
            assert "packed" in packed[name].shape and "packed" not in padded["shape"]

    def test_sampler_holds_the_run_state(self, result):
        """While sampling, the training weights, the moments and the last batch stay in memory."""
        cfg = models.get_model_config("tiny")
        params = expected_param_bytes(cfg, fsdp=4)
        rows = 64 // 8 * (4 * (2 * 16 + 4 * NEW_TOKENS + 3) + 3)
        assert result["programs"]["decode"]["held_bytes"] == 3 * params + 8 + rows

    # Every program's bytes for this configuration (8 CPU devices, jax 0.10.2), pinned so
    # that a change growing a program's memory is seen here. A jax upgrade may move them:
    # re-pin then, and say in the commit what moved and why.
    PINNED_JAX = "0.10.2"
    PINNED = {"train": (1984912, 1980156, 1979144, 9884320), "logprob": (663808, 1536, 0, 3407456),
              "prefill": (2626048, 53356, 0, 295040), "decode": (3265224, 655920, 639400, 213124)}

    def test_bytes_are_pinned(self, result):
        assert jax.__version__ == self.PINNED_JAX, "re-pin PINNED for this jax (see the comment)"
        for name, pinned in self.PINNED.items():
            program = result["programs"][name]
            assert (
                tuple(program[f"{kind}_bytes"] for kind in ("argument", "output", "alias", "temp"))
                == pinned
            ), name

    def test_bytes_from_the_lowered_programs_are_the_compilers(self, result):
        """`argument_bytes` and `donated_bytes`, which other tests read from the lowered
        programs instead of compiling them, are the compiled programs' argument and alias
        bytes."""
        for name, program in lowered_programs(tiny_config()).items():
            compiled = result["programs"][name]
            assert argument_bytes(program.lowered) == compiled["argument_bytes"], name
            assert donated_bytes(program.lowered) == compiled["alias_bytes"], name

    def test_table_has_a_row_per_program(self, result):
        rows = result["table"].splitlines()[2:]
        assert [row.split("|")[1].strip() for row in rows] == [
            "train", "logprob", "prefill", "decode",
        ]


@pytest.mark.slow
def test_train_reads_the_kept_records_and_the_supervised_rows():
    """Keep sampling mask and a supervised term add exactly their rows' per-device bytes to
    the update's arguments: support ids `[B, N, 64]` (TopP's candidate bound) and sizes
    `[B, N]`, the P prompts with their solutions `[P, 2 S + 2 N]`, and their index. The
    experts of every token `[B, S + N, L_moe, k]` ride an MoE's batch with keep routing
    (replayed) or without (for the routing churn); partial rollouts keep none."""
    def train_arguments(**overrides):
        config = tiny_config(**{"model.name": "tiny_moe", **overrides})
        return argument_bytes(lowered_programs(config)["train"].lowered)

    kept = train_arguments(**{"rollout.top_p": 0.95, "rollout.keep_sampling_mask": True,
                              "rollout.keep_routing": True, "train.sft_weight": 0.1})
    b, p, s, n, ways = 64, 16, 16, NEW_TOKENS, 8
    moe_layers, k = 3, 2   # tiny_moe: every layer routes each token to 2 experts
    records = b // ways * 4 * (n * 64 + n)
    # their row_valid is not read (the NLL is a token mean); the index of 1 of 4 minibatches
    supervised = p // ways * 4 * (2 * s + 2 * n) + p // 4 * 4
    assert kept - train_arguments() == records + supervised
    experts = b // ways * 4 * (s + n) * moe_layers * k
    partial = {"rollout.partial.enabled": True, "filtering.max_gen_batches": 2}
    assert train_arguments() - train_arguments(**partial) == experts


def test_the_update_of_a_run_with_adapter_dropout_takes_its_key():
    """``model.lora.dropout`` > 0: the train program the report compiles takes the step's
    dropout key (one replicated key, as rl.train passes it); without dropout it takes none,
    so the deterministic program is unchanged."""
    def train_program(**overrides):
        return lowered_programs(tiny_config(**{"model.lora.rank": 4, **overrides}))["train"]

    _, kwargs = train_program(**{"model.lora.dropout": 0.1}).lowered.args_info
    assert jax.dtypes.issubdtype(kwargs["rng"].dtype, jax.dtypes.prng_key)
    assert kwargs["rng"].shape == ()
    assert "rng" not in train_program().lowered.args_info[1]


def test_a_quantised_base_is_counted_at_its_integer_width():
    """QLoRA: the update's weights are each device's share of the integer projections
    (int8: 1 byte, int4: half a byte per weight; every matrix split 4 ways along "embed"
    under the fsdp rules), their float32 scales (per output channel, split where the
    output axis is "embed": o and down), the float32 embedding and norms, and the adapters."""
    def weights(quantize):
        config = tiny_config(**{"model.lora.rank": 4, "model.lora.quantize": quantize})
        return lowered_programs(config)["train"].parts["weights"]

    cfg = models.get_model_config("tiny")
    d, f, v, r, fsdp, layers = cfg.d_model, cfg.d_ff, cfg.vocab_size, 4, 4, cfg.n_layers
    q, kv = cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim
    projections = layers * (d * (2 * q + 2 * kv) + 3 * d * f) // fsdp
    scales = layers * 4 * (q + 2 * kv + d // fsdp + 2 * f + d // fsdp)
    floats = 4 * (v * d // fsdp + d + layers * (2 * d + 2 * cfg.head_dim))   # embedding, norms
    adapters = layers * 4 * r * ((d // fsdp + q) + 2 * (d // fsdp + kv) + (q + d // fsdp)
                                 + 2 * (d // fsdp + f) + (f + d // fsdp))
    # int4 also scales every 64 inputs: 2 blocks along embed (q, k, v, gate, up; the
    # 2 do not split 4 ways, so replicated), 6 along down's 384 inputs; o's head_dim whole
    blocks = layers * 4 * (2 * (q + 2 * kv) + d // fsdp + 2 * 2 * f + 6 * d // fsdp)
    assert weights("int8") == projections + scales + floats + adapters
    assert weights("int4") == projections // 2 + blocks + floats + adapters
    assert weights("") == 4 * projections + floats + adapters


@pytest.mark.slow
def test_continuous_batching_reports_one_engine_step_over_its_slots():
    """With rollout.slots = C the decode program is one step of the engine: its cache is C
    slots of S + N columns (keys and values of every layer, split over the 8 row ways)
    and the P prompts' prefilled cache it admits rows from, counted by hand."""
    config = tiny_config(**{"rollout.slots": 8})
    decode = aot.compile_run(config, "cpu", prompt_len=16, programs=("decode",),
                        log=lambda line: None)["programs"]["decode"]
    cfg = models.get_model_config("tiny")
    p, s, n, c, ways = 16, 16, NEW_TOKENS, 8, 8

    def cache_bytes(rows, columns):   # k and v of each layer (float32), valid (bool), index
        kv = 2 * cfg.n_layers * rows * cfg.n_kv_heads * cfg.head_dim * columns * 4
        return (kv + rows * columns) // ways + 4

    assert decode["state_bytes"]["cache"] == cache_bytes(c, s + n) + cache_bytes(p, s)
    assert "8 slots" in decode["shape"] and decode["flops"] > 0


def test_a_critic_adds_its_update_and_value_pass():
    """VAPO: the critic (the tiny trunk and a `[D]` head, sharded like the policy) and its
    AdamW moments are the update's arguments with the columns its value loss reads; while
    the policy trains, the critic's state is held, and the policy's while the critic runs."""
    vapo = GSPO.parent / "vapo.py"
    config = config_lib.apply_overrides(config_lib.load_config(f"{vapo}:runlocal=True"),
                                        {"mesh": "data=2,fsdp=4,tensor=1"})
    programs = lowered_programs(config)
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
    critic_train, values = programs["critic_train"], programs["values"]
    assert argument_bytes(critic_train.lowered) == (3 * critic + counters + tokens + values_returns
                                                    + index)
    assert donated_bytes(critic_train.lowered) == 3 * critic + counters
    assert critic_train.held == 3 * policy + counters
    assert argument_bytes(values.lowered) == critic + tokens
    assert values.held == 3 * policy + counters + 2 * critic + counters
    assert programs["train"].held == 3 * critic + counters


def test_device_bytes_counts_each_device_share():
    mesh = parallel.make_mesh("data=2,fsdp=4", devices=jax.devices()[:8])
    split = jax.ShapeDtypeStruct(
        (8, 6), np.float32, sharding=jax.NamedSharding(mesh, jax.P("fsdp"))
    )
    whole = jax.ShapeDtypeStruct((5,), np.int32, sharding=jax.NamedSharding(mesh, jax.P()))
    assert programs_lib.device_bytes({"a": split, "b": whole}) == 2 * 6 * 4 + 5 * 4


def test_errors_name_the_fix():
    with pytest.raises(ValueError, match="unknown programs"):
        aot.compile_run(tiny_config(), "cpu", prompt_len=16, programs=("critic",))
    with pytest.raises(ValueError, match="rollout.keep_routing=False for a dense model"):
        aot.compile_run(tiny_config(**{"rollout.keep_routing": True}), "cpu", prompt_len=16)
    config = tiny_config()
    del config.model["attention"]
    with pytest.raises(ValueError, match="model.attention"):
        footprint.model_config(config)


def test_oom_messages_are_parsed():
    """XLA:TPU's out-of-memory messages, as libtpu 0.0.52 and 0.0.42.1 word them."""
    temps = ("RESOURCE_EXHAUSTED: E1000: CompileTimeHbmOom: Ran out of memory on HBM, the total "
             "memory required for HLO temporaries (47.68G) exceeds available HBM (15.75G).")
    assert aot.compiler_lib.needed_bytes(temps) == (int(47.68 * 2**30), "temp")
    untagged = ("RESOURCE_EXHAUSTED: Ran out of memory on HBM, the total memory required for HLO "
                "temporaries (1.02T) exceeds available HBM (95.74G).")   # libtpu 0.0.42.1
    assert aot.compiler_lib.needed_bytes(untagged) == (int(1.02 * 2**40), "temp")
    total = (
        "RESOURCE_EXHAUSTED: E1000: CompileTimeHbmOom: XLA:TPU compile permanent error. Ran out "
        "of memory in memory space hbm. Used 15.75G of 15.75G hbm. Exceeded hbm capacity by 6.90M."
    )
    assert aot.compiler_lib.needed_bytes(total) == (int(15.75 * 2**30 + 6.90 * 2**20), "total")
    assert aot.compiler_lib.needed_bytes("RESOURCE_EXHAUSTED: something else") is None
    assert aot.compiler_lib.needed_bytes("INVALID_ARGUMENT: HLO temporaries (1.0G)") is None


@pytest.mark.slow
def test_command_line_writes_the_json(tmp_path):
    """`TestCpuReport`'s run (this process's 8 devices, its mesh by the flag, which replaces
    the config file's): its compiled programs are read back from the persistent cache."""
    config_file = tmp_path / "tiny_gspo.py"
    config_file.write_text(textwrap.dedent(f"""
        from grpo_jax import config_lib
        def get_config():
            config = config_lib.load_config("{GSPO}:runlocal=True")
            config.mesh = "data=8,fsdp=1,tensor=1"
            return config
    """))
    out = tmp_path / "report.json"
    done = subprocess.run(
        [sys.executable, "-m", "grpo_jax.aot", f"--config={config_file}", "--topology=cpu",
         "--prompt_len=16", "--programs=train,decode", "--config.mesh=data=2,fsdp=4,tensor=1",
         f"--json={out}"], capture_output=True, text=True, timeout=600, cwd=GSPO.parent.parent)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "| train |" in done.stdout and "fits: unknown" in done.stdout
    report = json.loads(out.read_text())
    assert report["devices"] == len(jax.devices())
    assert report["mesh"] == {"data": 2, "fsdp": 4, "tensor": 1}
    assert set(report["programs"]) == {"train", "decode"}


def test_command_line_names_a_topology_it_cannot_build():
    """Without libtpu, or with a name libtpu does not know: one line naming the fix."""
    done = subprocess.run(
        [
            sys.executable, "-m", "grpo_jax.aot", f"--config={GSPO}:runlocal=True",
            "--topology=v9z:1x1",
        ],
        capture_output=True, text=True, timeout=300, cwd=GSPO.parent.parent,
    )
    assert done.returncode == 1
    assert "--topology 'v9z:1x1': could not build the TPU topology" in done.stderr
    assert "Traceback" not in done.stderr


# ----- on TPU topologies: needs libtpu (pip install -e ".[train,tpu]"); CI does not install it ----

def tpu_topology():
    pytest.importorskip(
        "libtpu", reason="compiling for a TPU topology needs libtpu: pip install -e '.[train,tpu]'"
    )


@pytest.mark.slow
def test_tiny_model_fits_a_v5e_2x2():
    tpu_topology()
    config = tiny_config(mesh="data=1,fsdp=2,tensor=2", **{"model.rules": "fsdp_tp",
                                                             "model.attention": "splash"})
    result = aot.compile_run(config, "v5e:2x2", prompt_len=128, log=lambda line: None)
    assert result["devices"] == 4 and result["device_kind"] == "TPU v5 lite"
    assert result["hbm_bytes_per_device"] == int(15.75 * 2**30) and result["fits"] is True
    for name, program in result["programs"].items():
        assert 0 < program["bytes_per_device"] < 2**30, name
        assert program["flops"] > 0, name


@pytest.mark.slow
def test_a_run_that_cannot_fit_is_reported_with_advice():
    """qwen3_0_6b's decode cache for 4,096 rows x 1k tokens far exceeds a v5e's 15.75 GiB; the
    advice is the largest number of prompts that fits, from the bytes."""
    tpu_topology()
    config = tiny_config(
        mesh="data=1,fsdp=4,tensor=1",
        **{
            "model.name": "qwen3_0_6b", "model.dtype": "bfloat16", "model.param_dtype": "bfloat16",
            "rollout.prompts_per_batch": 256, "rollout.max_new_tokens": 1024,
            "objective.group_size": 16,
        },
    )
    result = aot.compile_run(config, "v5e:2x2", prompt_len=128, programs=("decode",),
                             log=lambda line: None)
    assert result["fits"] is False
    decode = result["programs"]["decode"]
    cache = (
        28 * 2 * 4096 * 8 * 128 * 1024 * 2 / 4
    )  # layers x (k, v) x rows x K x H x slots x bf16 / chips
    assert decode["bytes_per_device"] > cache and decode["compiler_oom"]
    advice = result["advice"][0]
    assert advice.startswith(
        f"decode does not fit: needs >= {decode['bytes_per_device'] / 2**30:.2f} GiB"
    )
    # the KV cache and temporaries scale with the prompts; the rest (weights, held state) not
    scaling = decode["state_bytes"]["cache"] + decode["temp_bytes"]
    share = (result["hbm_bytes_per_device"] - (decode["bytes_per_device"] - scaling)) / scaling
    fewer = int(256 * share)   # any P splits: P x 16 answers / 4 minibatches = 4P rows, 4 ways
    assert 0 < fewer < 256 and f"`--config.rollout.prompts_per_batch={fewer}` (now 256" in advice


# ----- the mesh "auto", the run's replicated state, and the advice by cause ---------------

GIB = 2**30


class TestChooseMesh:
    def test_an_explicit_mesh_is_kept_and_its_state_never_counted(self):
        def never():
            raise AssertionError("state_bytes called for an explicit mesh")
        assert parallel.choose_mesh("data=2,fsdp=4,tensor=1", state_bytes=never,
                                    device_memory=GIB) == ("data=2,fsdp=4,tensor=1", None)

    def test_devices_without_a_known_memory_stay_data_parallel(self):
        assert parallel.choose_mesh("auto", state_bytes=None, device_memory=None) == (
            parallel.DATA_PARALLEL, None)

    def test_state_up_to_half_the_memory_stays_data_parallel(self):
        assert parallel.choose_mesh(
            "auto", state_bytes=lambda: 8 * GIB, device_memory=16 * GIB
        ) == (parallel.DATA_PARALLEL, None)

    def test_state_over_half_the_memory_is_sharded_and_says_so(self):
        spec, reason = parallel.choose_mesh("auto", state_bytes=lambda: 8 * GIB + 1,
                                            device_memory=16 * GIB)
        assert spec == parallel.FULLY_SHARDED == "data=1,fsdp=-1,tensor=1"
        assert "8.0 GiB" in reason and "16.0 GiB" in reason and "--config.mesh" in reason

    def test_auto_is_not_a_mesh_to_build(self):
        with pytest.raises(ValueError, match="parallel.choose_mesh"):
            parallel.make_mesh("auto")


class TestReplicatedStateBytes:
    """Weights, gradient and AdamW's two moments (plus its two int32 step counters), by
    hand from the tiny model's shapes, and the copies a recipe adds."""

    def test_rl_sft_and_eval(self):
        weights = expected_param_bytes(models.get_model_config("tiny"), fsdp=1)
        config = tiny_config()
        assert footprint.replicated_state_bytes(config, "eval") == weights
        assert footprint.replicated_state_bytes(config, "sft") == 4 * weights + 8
        assert footprint.replicated_state_bytes(config, "rl") == 4 * weights + 8

    def test_reference_and_lagged_copies(self):
        weights = expected_param_bytes(models.get_model_config("tiny"), fsdp=1)
        config = tiny_config(**{"objective.kl.beta": 0.01, "rollout.policy_lag": 2})
        assert footprint.replicated_state_bytes(config, "rl") == (4 + 1 + 2) * weights + 8

    def test_a_critic_adds_its_own_trained_state(self):
        cfg = models.get_model_config("tiny")
        weights = expected_param_bytes(cfg, fsdp=1)
        critic = weights + (cfg.d_model + 1) * 4   # the trunk and a [D] head with a bias
        vapo = config_lib.load_config(f"{GSPO.parent / 'vapo.py'}:runlocal=True")
        assert footprint.replicated_state_bytes(vapo, "rl") == 4 * weights + 8 + 4 * critic + 8

    def test_lora_trains_and_copies_the_adapters_only_on_a_base_held_once(self):
        """Rank-4 adapters on every projection: A [in, 4] and B [4, out] per projection
        (float32) carry the gradient, the moments and the 2 lagged copies; the base is
        held once (no pi_ref copy with a KL term), in int8 with QLoRA: 1 byte per
        projection weight and a float32 scale per output channel."""
        cfg = models.get_model_config("tiny")
        d, f, r, layers = cfg.d_model, cfg.d_ff, 4, cfg.n_layers
        q, kv = cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim
        adapters = 4 * r * layers * ((d + q) + 2 * (d + kv) + (q + d) + 3 * (d + f))
        weights = expected_param_bytes(cfg, fsdp=1)
        projections = layers * (d * (2 * q + 2 * kv) + 3 * d * f)
        overrides = {"model.lora.rank": r, "objective.kl.beta": 0.01, "rollout.policy_lag": 2}
        lora = tiny_config(**overrides)
        assert footprint.replicated_state_bytes(lora, "rl") == weights + (4 + 2) * adapters + 8
        assert footprint.replicated_state_bytes(lora, "eval") == weights + adapters
        int8 = tiny_config(**overrides, **{"model.lora.quantize": "int8"})
        scales = 4 * layers * (q + 2 * kv + d + 2 * f + d)
        base = weights - 4 * projections + projections + scales
        assert footprint.replicated_state_bytes(int8, "rl") == base + (4 + 2) * adapters + 8

    def test_a_distillation_teacher_adds_its_own_weights_once(self, tmp_path):
        """A frozen teacher of another depth (3 layers, the policy 2; its config.json
        only) adds its weights alone: no gradient, optimizer state or copies."""
        student = models.get_model_config("tiny")
        teacher = dataclasses.replace(student, n_layers=student.n_layers + 1)
        models.to_hf_config(teacher).save_pretrained(tmp_path)
        weights = expected_param_bytes(student, fsdp=1)
        config = tiny_config(**{"distill.teacher_path": str(tmp_path)})
        teacher_bytes = expected_param_bytes(teacher, fsdp=1)
        assert teacher_bytes > weights
        assert footprint.replicated_state_bytes(config, "rl") == 4 * weights + 8 + teacher_bytes
        assert footprint.replicated_state_bytes(config, "eval") == weights
        bf16 = {"model.param_dtype": "bfloat16"}   # the teacher in the policy's dtype
        assert (footprint.replicated_state_bytes(
                    tiny_config(**bf16, **{"distill.teacher_path": str(tmp_path)}), "rl")
                - footprint.replicated_state_bytes(tiny_config(**bf16), "rl")
                == teacher_bytes // 2)
        with pytest.raises(FileNotFoundError, match="distill.teacher_path '/nowhere' is not a"):
            footprint.replicated_state_bytes(tiny_config(**{"distill.teacher_path": "/nowhere"}))

    def test_unknown_phase(self):
        with pytest.raises(ValueError, match="phase must be one of"):
            footprint.replicated_state_bytes(tiny_config(), "train")


def result(name, *, temp, parts, held=0, held_state=0, oom=False, failed=False, other=0):
    """A made-up compiled program: total = the state among its arguments + temp + other."""
    total = None if failed else sum(parts.values()) + (temp or 0) + other + held
    return aot.compiler_lib.Result(name, "", None, None, None, temp, held, total, None, None, 1.0,
                                 oom=oom, failed=failed, message="boom" if failed else "",
                                 parts=parts, held_state=held_state)


class TestAdvice:
    """Each cause gets its own fix with the exact flags, computed from the bytes."""

    HBM = 16 * GIB

    def test_replicated_weights_and_activations_of_the_update(self):
        # 64 rows per minibatch on an 8-way data mesh, weights replicated
        config = tiny_config(mesh="data=8,fsdp=1,tensor=1", **{"model.remat": "full"})
        mesh = parallel.make_mesh(config.mesh)
        rows = (
            config.rollout.prompts_per_batch
            * config.objective.group_size
            // config.train.minibatches
        )
        assert (rows, config.train.micro_batches) == (16, 1)
        train = result("train", temp=30 * GIB, parts={"weights": 2 * GIB, "optimizer": 4 * GIB})
        text = aot.compiler_lib.advice(train, self.HBM, config, mesh)
        assert text.startswith(
            "train does not fit: needs 36.00 GiB per device, 20.00 GiB over the 16.00 GiB HBM"
        )
        # room for temporaries: 16 - 6 = 10 GiB -> 3x fewer rows per piece -> the first
        # m >= 3 dividing 16 rows with whole 8-way rows: 16 / 2 = 8 -> m = 2 fails (3 needed);
        # m = 4 leaves 4 rows, not 8-way -> none fits; so the advice says so
        assert "even one row per chip" in text
        assert "training weights and optimizer state (6.00 GiB per device) are replicated" in text
        assert "--config.mesh=data=1,fsdp=-1,tensor=1" in text and "saves about 5.25 GiB" in text
        assert text.index("activations") < text.index("replicated")   # the larger cause first

    def test_micro_batches_are_chosen_to_fit_and_split(self):
        config = tiny_config(mesh="data=1,fsdp=2,tensor=1", **{"rollout.prompts_per_batch": 64})
        mesh = parallel.make_mesh(config.mesh, devices=jax.devices()[:2])
        rows = 64 * config.objective.group_size // config.train.minibatches   # 64
        train = result("train", temp=25 * GIB, parts={"weights": GIB, "optimizer": 2 * GIB},
                       other=GIB)
        text = aot.compiler_lib.advice(train, self.HBM, config, mesh)
        # room 16 - 4 = 12 GiB: 25 / 12 -> 3x; 64 rows: m = 4 (16 rows, splits 2 ways)
        assert rows == 64 and "`--config.train.micro_batches=4` (now 1" in text
        assert "about 6.25 GiB" in text and "--config.mesh" not in text   # already sharded
        assert "--config.model.attention=splash" in text    # tiny_config uses XLA attention
        assert config.model.remat == "off" and "`--config.model.remat=full`" in text

    def test_decode_gets_fewer_prompts_or_a_shorter_budget(self):
        config = tiny_config(mesh="data=1,fsdp=2,tensor=1", **{
            "rollout.prompts_per_batch": 64, "rollout.max_new_tokens": 1000})
        mesh = parallel.make_mesh(config.mesh, devices=jax.devices()[:2])
        decode = result("decode", temp=2 * GIB, parts={"weights": 2 * GIB, "cache": 28 * GIB},
                        held=4 * GIB)
        text = aot.compiler_lib.advice(decode, self.HBM, config, mesh)
        # fixed 6 GiB, cache + temporaries 30 GiB scale with rows: 10 / 30 of 64 prompts = 21,
        # and 20 x 4 rows split into 4 minibatches of 20 rows over 2 ways, 21 x 4 do not
        assert "`--config.rollout.prompts_per_batch=20` (now 64" in text
        assert "`--config.rollout.max_new_tokens=332` (now 1000)" in text

    def test_the_sampler_is_told_about_the_held_training_state_and_a_tensor_axis(self):
        """While sampling, the replicated training state is held (FSDP shrinks it); the
        sampler's own weights are whole on each chip in the sampling layout (a tensor axis
        splits them). The cache fix comes first: it is the largest."""
        config = tiny_config(mesh="data=8,fsdp=1,tensor=1", **{"rollout.prompts_per_batch": 64})
        mesh = parallel.make_mesh(config.mesh)
        decode = result("decode", temp=GIB, parts={"weights": 4 * GIB, "cache": 20 * GIB},
                        held=8 * GIB, held_state=6 * GIB)
        text = aot.compiler_lib.advice(decode, self.HBM, config, mesh)
        assert (
            "training weights and optimizer state (held while it runs) (6.00 GiB per device)"
            in text
        )
        assert "saves about 5.25 GiB" in text
        assert (
            "the sampler's weights (4.00 GiB" in text
            and "tensor=4 --config.model.rules=fsdp_tp" in text
        )
        # 12 GiB fixed, 21 GiB scale with the prompts: 64 x 4 / 21 -> 12, and 12 x 4 answers
        # / 4 minibatches = 12 rows do not split 8 ways; 8 prompts do
        assert "`--config.rollout.prompts_per_batch=8` (now 64" in text
        assert (
            text.index("KV cache")
            < text.index("training weights")
            < text.index("sampler's weights")
        )

    def test_a_compile_error_that_is_not_memory(self):
        config = tiny_config()
        failed = result("logprob", temp=None, parts={}, failed=True)
        text = aot.compiler_lib.advice(failed, self.HBM, config, parallel.make_mesh(config.mesh))
        assert text.startswith("logprob does not compile, for a reason other than memory: boom")

    def test_a_v5e_refusing_part_of_its_slice_is_told_to_sample_on_the_training_mesh(self):
        """libtpu's words (a 16 + 16 split of v5e:4x8) when a program takes part of a v5e
        slice: the advice says the slice cannot be split, and how to run unsplit."""
        config = tiny_config()
        failed = dataclasses.replace(
            result("train", temp=None, parts={}, failed=True),
            message="INTERNAL: RET_CHECK failure (...) On platforms with limited ICI routing "
                    "device assignment should include all slice devices.")
        text = aot.compiler_lib.advice(failed, self.HBM, config, parallel.make_mesh(config.mesh))
        assert text.startswith("train does not compile on part of the slice")
        assert text.endswith("set rollout.mesh=''")


class _Refusing:
    """A lowered program whose compile raises `error`."""

    def __init__(self, error):
        self.error = error

    def compile(self):
        raise self.error


class TestRefusedPrograms:
    def program(self, error):
        return programs_lib.Program("train", _Refusing(error), GIB, "rows",
                                    {"weights": 2 * GIB, "optimizer": 4 * GIB})

    def test_out_of_memory_is_a_row_with_a_lower_bound(self):
        error = RuntimeError(
            "RESOURCE_EXHAUSTED: Ran out of memory on HBM, the total memory "
            "required for HLO temporaries (10.00G) exceeds available HBM (15.75G)."
        )
        refused = aot.compiler_lib.compile_program(self.program(error))
        assert refused.oom and not refused.failed
        assert refused.temp == 10 * GIB and refused.total == (10 + 6 + 1) * GIB
        table = aot.compiler_lib.format_table([refused], 16 * GIB)
        assert "NO: needs >= 17.00 GiB" in table

    def test_any_other_error_is_a_row_too(self):
        refused = aot.compiler_lib.compile_program(
            self.program(ValueError("Mosaic failed\nat line 3")))
        assert refused.failed and refused.total is None and refused.message == "Mosaic failed"
        assert aot.compiler_lib.does_not_fit(refused, None)
        assert "NO: does not compile" in aot.compiler_lib.format_table([refused], None)


def test_host_memory_estimate_names_scan_layers():
    """Linear in the layer bodies the compiler sees; a line only when it matters."""
    host = aot.host_lib
    qwen3_8b = models.get_model_config("qwen3_8b")
    unrolled = host.compile_memory(qwen3_8b, available=8 * GIB)
    assert unrolled.bodies == 36
    assert unrolled.bytes == host.BASE_BYTES + 36 * host.PER_BODY_BYTES
    assert unrolled.warning.startswith("WARNING: host memory: compiling 36 unrolled layers")
    assert "--config.model.scan_layers=True" in unrolled.warning
    scanned = host.compile_memory(models.get_model_config("qwen3_8b", scan_layers=True),
                                  available=64 * GIB)
    assert scanned.bodies == 1 and scanned.warning is None


# ----- docs/tpu.md's fit command(s): each is a fit-table cell's, and each ends in a report ----

REPO = GSPO.parent.parent
TPU_PAGE = (REPO / "docs" / "tpu.md").read_text()   # "Will it fit?"
FIT_TABLE = (REPO / "experiments" / "results" / "aot_fit_table.md").read_text()


def tpu_page_fit_commands():
    """The commands of the ```bash blocks after each <!-- fit-command --> marker, with the
    line continuations joined."""
    blocks = re.findall(r"<!-- fit-command -->\n```bash\n(.*?)```", TPU_PAGE, re.S)
    return [" ".join(block.replace("\\\n", " ").split()) for block in blocks]


def test_every_tpu_page_fit_command_is_a_fit_table_cell():
    commands = tpu_page_fit_commands()
    assert commands, "docs/tpu.md has no <!-- fit-command --> block"
    cells = re.findall(r"^- `[^`]+`: `([^`]+)`$", FIT_TABLE, re.M)
    for command in commands:
        assert command in cells, f"not a cell of experiments/results/aot_fit_table.md: {command}"


def test_tpu_page_fit_table_is_the_generated_one():
    """docs/tpu.md's table is experiments/aot_fit_table.py's, row for row."""
    header = (
        "| model | recipe | rules | topology | train | logprob | prefill | decode | HBM | fits |"
    )

    def table(text):
        lines = text[text.index(header):].splitlines()
        return lines[:next(i for i, line in enumerate(lines) if not line.startswith("|"))]
    generated = table(FIT_TABLE)
    assert len(generated) > 2 and table(TPU_PAGE) == generated


def small(command, topology):
    """docs/tpu.md's command with a small model and budget on `topology` (same flags else)."""
    command = re.sub(r"--topology \S+", f"--topology {topology}", command)
    command = re.sub(r"--prompt_len \d+", "--prompt_len 128", command)
    command = re.sub(r"--config.model.name=\S+", "--config.model.name=tiny", command)
    command = re.sub(r"--config.rollout.max_new_tokens=\d+", "--config.rollout.max_new_tokens=128",
                     command)
    if topology == "cpu":   # no Mosaic on CPU: the splash kernel is for TPUs
        command = command.replace("--config.model.attention=splash", "--config.model.attention=xla")
    return command.replace("python -m grpo_jax.aot", f"{sys.executable} -m grpo_jax.aot")


def run_small(command, topology, devices):
    env = {**os.environ, "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}"}
    return subprocess.run(small(command, topology).split(), capture_output=True, text=True,
                          timeout=900, cwd=REPO, env=env)


@pytest.mark.slow
@pytest.mark.parametrize("command", tpu_page_fit_commands())
def test_tpu_page_fit_command_runs_on_cpu_devices(command):
    """Every flag docs/tpu.md passes is one the tool takes; it ends in a report."""
    done = run_small(command, "cpu", devices=8)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "| train |" in done.stdout and "| decode |" in done.stdout
    assert "fits: unknown" in done.stdout and "Traceback" not in done.stderr


@pytest.mark.slow
@pytest.mark.parametrize("command", tpu_page_fit_commands())
def test_tpu_page_fit_command_runs_on_its_tpu_topology(command):
    tpu_topology()
    topology = re.search(r"--topology (\S+)", command).group(1)
    done = run_small(command, topology, devices=1)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "fits: yes" in done.stdout and "Traceback" not in done.stderr


def test_lora_trains_on_adapter_sized_optimizer_state_and_holds_no_reference_copy():
    """With rank-4 adapters on every projection the update's optimizer state is Adam's two
    moments of the adapters alone, each device's slice counted by hand (A `[in, 4]`, B
    `[4, out]`; only the `embed` axis splits 4 ways under the fsdp rules), and with a KL
    term no pi_ref copy is held (the reference is the base with adapters off)."""
    def train(**overrides):
        return lowered_programs(tiny_config(**{"objective.kl.beta": 0.04, **overrides}))["train"]

    full, lora = train(), train(**{"model.lora.rank": 4})
    cfg = models.get_model_config("tiny")
    d, f, r, fsdp = cfg.d_model, cfg.d_ff, 4, 4
    q, kv = cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim
    per_layer = ((d // fsdp + q) * r                   # q: A split along embed, B whole
                 + 2 * (d // fsdp + kv) * r            # k, v
                 + (q + d // fsdp) * r                 # o: A over heads (whole), B along embed
                 + 2 * (d // fsdp + f) * r             # gate, up
                 + (f + d // fsdp) * r)                # down
    adapters = cfg.n_layers * per_layer * 4
    params = expected_param_bytes(cfg, fsdp=4)
    counts = full.parts["optimizer"] - 2 * params   # the optimizer's step counts
    assert lora.parts["optimizer"] == 2 * adapters + counts
    assert lora.parts["weights"] == params + adapters
    assert full.held_state == params and lora.held_state == 0


def test_the_fit_report_holds_the_distillation_teacher(tmp_path):
    """With distill.teacher_path the programs hold the frozen teacher's weights, each
    device its fsdp slice (by hand, a 3-layer teacher of the 2-layer policy)."""
    student = models.get_model_config("tiny")
    teacher = dataclasses.replace(student, n_layers=student.n_layers + 1)
    models.to_hf_config(teacher).save_pretrained(tmp_path)
    plain = lowered_programs(tiny_config())["train"]
    taught = lowered_programs(tiny_config(**{"distill.teacher_path": str(tmp_path)}))["train"]
    assert plain.held_state == 0
    assert taught.held_state == expected_param_bytes(teacher, fsdp=4)
    assert plan.logprob_passes(tiny_config(**{"distill.teacher_path": str(tmp_path)})) == 2


def test_split_meshes_compile_the_sampler_on_the_rollout_devices_alone():
    """With rollout.mesh the update is compiled on the training devices (4 here: its rows
    split 4 ways, not 8) and prefill and decode on the other 4, holding none of the
    training state."""
    config = tiny_config(**{"mesh": "data=1,fsdp=4,tensor=1", "rollout.mesh": "data=4"})
    result = aot.compile_run(config, "cpu", prompt_len=16, log=lambda line: None)
    assert result["mesh"] == {"data": 1, "fsdp": 4, "tensor": 1}
    assert result["rollout_mesh"] == {"data": 4, "fsdp": 1, "tensor": 1}
    cfg = models.get_model_config("tiny")
    params, steps = expected_param_bytes(cfg, fsdp=4), 2 * 4
    b, s, n = 16 * 4, 16, NEW_TOKENS
    per_row = 4 * (2 * s + 3 * n + 2) + 1   # as in TestCpuReport: GSPO's columns, rewards
    train = result["programs"]["train"]
    assert train["argument_bytes"] == 3 * params + steps + b // 4 * per_row + b // 4 * 4
    for name in ("prefill", "decode"):
        assert result["programs"][name]["held_bytes"] == 0
    devices = jax.devices()
    train_mesh = parallel.make_mesh(config.mesh, devices=devices[:4])
    rollout_mesh = parallel.make_mesh("data=4,fsdp=1,tensor=1", devices=devices[4:])
    built = {p.name: p for p in programs_lib.build(config, train_mesh, prompt_len=16,
                                                    rollout_mesh=rollout_mesh)}
    placed = lambda name: {d for s in jax.tree.leaves(built[name].lowered.compile().input_shardings)
                           for d in s.device_set}
    assert placed("prefill") == set(devices[4:]) and placed("logprob") == set(devices[:4])
