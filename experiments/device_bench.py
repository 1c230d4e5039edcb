"""grpo_jax's update and sampler on one GPU, beside PyTorch on the same chip, and one RL step.

    bash experiments/device_bench.sh                      # on the GPU machine (installs wheels)
    python experiments/device_bench.py --out results.json # the same without the wheel step
    python experiments/device_bench.py --smoke --out /tmp/device_bench.json   # CPU, tiny shapes

Each part runs in its own process under a time cap (`CAPS_S`, seconds on an H100; the
run ends within `--budget_s`, 420 s, and a part that would start with less time than it
needs is skipped and says so), so a part that fails or overruns costs only itself, and
JAX's and PyTorch's allocators never share the GPU. The parts, in order:

- ``ceilings``: PyTorch's bf16 matrix product (8192^3, random data) and device-to-device
  copy (bytes read + written): the chip's measured ceilings, beside the datasheet's.
- ``jax_update``: the RL update (`training.programs.policy_programs`, as `rl.train` builds
  it: GRPO's objective, packed micro-batches) on Qwen3-0.6B and Qwen3-1.7B shapes with
  random weights, bf16 compute, float32 master weights and Adam, remat "full", 64 rows of
  a 32-token prompt and a 993-token completion (1,024 tokens per packed row); seconds per
  update (median after a compiling call) and pi_old's forward pass on the same rows.
- ``torch_update``: transformers' Qwen3 of the same shape (sdpa, float32 weights under
  bf16 autocast, gradient checkpointing, fused AdamW) on the same token batch.
- ``jax_decode``: `sampling.generate` of Qwen3-0.6B (bf16 weights; the prefill's attention
  the update's, cuDNN unless it failed there, the decode steps' XLA's) with B = 64 and 256
  rows (B / 8 prompts of 512 random tokens x G = 8), 1,024 new tokens each, no stop token;
  a call with one new token gives the prefill's share. Every row runs to the budget, so
  the engine with C = B slots would run these same decode steps (`rollout.slots`
  replaces a stopped row, and no row stops here).
- ``torch_decode``: transformers' `generate` of the same shape, batch and lengths (bf16,
  sdpa, its default dynamic cache, sampling at temperature 1 forced to 1,024 tokens).
- ``rl_step``: `python -m grpo_jax.main` (configs/grpo.py, 8 prompts x 8 answers of at
  most 1,024 tokens, one update per step) from a random Qwen3-0.6B-shaped checkpoint
  (Qwen3's 151,936-token vocabulary, a character tokenizer: the random model almost never
  samples its stop token, so nearly every answer runs to the budget), two steps; the
  second step's rollout / pi_old / update seconds (the first compiles).

The results' ``summary`` derives MFU, floor fractions, the ratios (PyTorch's seconds over
grpo_jax's), the RL step's slowest stage, its timing breakdown (pi_old's forward over an
update's seconds; a one-token call's share of a decode call, the prefill) and a ``next``
line naming where to look for the next speed-up.

Formulas (`model_flops`, `decode_floor_bytes`): MFU = model FLOPs / seconds / the chip's
dense bf16 peak (`CHIPS`, datasheet), with PaLM's model FLOPs (Chowdhery et al.,
arXiv:2204.02311, appendix B): 6 N per token for the matmul weights N a token meets
(embedding lookup excluded, output projection included) plus 12 L H_q d_head T for
attention over the T tokens of its packed row. The decode floor: every new token's step
reads every weight once, and the keys and values of its context (a prompt's once for its
G rows, as the sampler's shared prefix stores them); floor fraction = those bytes / the
chip's HBM bandwidth (datasheet) / the measured seconds (prefill included).

``--smoke`` runs the same code on CPU with tiny shapes (tests/test_device_bench.py).
"""

import argparse
import json
import os
import pathlib
import platform
import signal
import string
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]

# (device_kind substring, dense bf16 FLOP/s, HBM bytes/s): NVIDIA's datasheets; the first
# match wins, so the specific names come first.
CHIPS = (
    ("H100 PCIe", 756e12, 2.0e12),
    ("H100 NVL", 835e12, 3.9e12),
    ("H200", 989e12, 4.8e12),
    ("H100", 989e12, 3.35e12),   # SXM: "NVIDIA H100 80GB HBM3"
)
# Seconds each part may take on an H100 (compiles included); they add up to `BUDGET_S`.
CAPS_S = {"ceilings": 10, "jax_update": 100, "jax_decode": 75, "torch_update": 45,
          "torch_decode": 70, "rl_step": 120}
BUDGET_S = 420
SMOKE_CAP_S, SMOKE_BUDGET_S = 600, 1800   # on a (shared, 2-core) CPU: compiles dominate
PARTS = tuple(CAPS_S)
GROUP = 8            # answers per prompt, in the decode and the RL step
PROMPT = 32          # the update batch's prompt columns (experiments/bench_packing.py's)

SHAPES = {   # what each part runs, on the GPU and in --smoke
    "gpu": dict(update_models=("qwen3_0_6b", "qwen3_1_7b"), update_rows=64, completion=993,
                micro_batches=4, update_steps=5, decode_model="qwen3_0_6b", slots=(64, 256),
                prompt_len=512, new_tokens=1024, rl_model="qwen3_0_6b", rl_prompts=8,
                rl_steps=2, dtype="bfloat16", attention="cudnn", matmul=8192,
                copy_bytes=2 * 2**30),
    "smoke": dict(update_models=("tiny",), update_rows=8, completion=16, micro_batches=2,
                  update_steps=1, decode_model="tiny", slots=(8, 16), prompt_len=16,
                  new_tokens=8, rl_model="tiny", rl_prompts=2, rl_steps=1, dtype="float32",
                  attention="xla", matmul=256, copy_bytes=2**24),
}


# ---------------------------------------------------------------------------- formulas

def chip_spec(device_kind: str) -> tuple[str, float, float] | None:
    """`(name, dense bf16 FLOP/s, HBM bytes/s)` of the first `CHIPS` entry in
    `device_kind`, or None for a chip not listed (a CPU)."""
    for name, flops, bandwidth in CHIPS:
        if name in device_kind:
            return name, flops, bandwidth
    return None


def model_flops(cfg, rows: int, seq: int) -> float:
    """PaLM's model FLOPs of one forward + backward pass over `rows` rows of `seq`
    tokens: (6 N + 12 L H_q d_head seq) per token (experiments/bench_models.py)."""
    from bench_models import flops_per_token
    return flops_per_token(cfg, seq, backward=True) * rows * seq


def mfu(flops: float, seconds: float, peak: float) -> float:
    """Model FLOPs utilisation: `flops` / `seconds` / `peak` FLOP/s."""
    return flops / seconds / peak


def kv_bytes_per_token(cfg, itemsize: int) -> int:
    """Bytes of one token's keys and values over every layer: 2 L K d_head itemsize."""
    return 2 * cfg.n_layers * cfg.n_kv_heads * cfg.head_dim * itemsize


def decode_floor_bytes(weight_bytes: float, kv_token_bytes: float, prompts: int, rows: int,
                       prompt_len: int, new_tokens: int) -> float:
    """The fewest bytes `new_tokens` decode steps read: step j (0-based) reads every weight
    and the keys and values of the prompt (once per prompt, shared by its rows) and of
    the row's j earlier completion tokens.

    Returns: new_tokens * weight_bytes + kv_token_bytes * (new_tokens * prompts *
      prompt_len + rows * new_tokens * (new_tokens - 1) / 2).
    """
    kv_tokens = new_tokens * prompts * prompt_len + rows * new_tokens * (new_tokens - 1) / 2
    return new_tokens * weight_bytes + kv_token_bytes * kv_tokens


def floor_fraction(floor_bytes: float, seconds: float, bandwidth: float) -> float:
    """The HBM floor's time (`floor_bytes` / `bandwidth`) over the measured `seconds`."""
    return floor_bytes / bandwidth / seconds


# ---------------------------------------------------------------------------- parts

def _median_seconds(call, steps, cap_s):
    """Median seconds of up to `steps` calls of `call` (already compiled), fewer when
    they would pass `cap_s` seconds in all; `call` blocks until its result is ready."""
    times, begin = [], time.perf_counter()
    while len(times) < steps and (not times or time.perf_counter() - begin + times[-1] < cap_s):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2], len(times)


def _jax_header():
    import importlib.metadata

    import jax
    device = jax.devices()[0]
    plugins = [d.metadata["Name"] + " " + d.version for d in importlib.metadata.distributions()
               if d.metadata["Name"] and d.metadata["Name"].startswith("jax-cuda")]
    return {"device_kind": device.device_kind, "platform": device.platform,
            "jax": jax.__version__, "jax_plugins": ", ".join(sorted(plugins))}


def _update_call(config, name, shape, attention, mesh):
    """`(cfg, params count, update(), forward(), packing statistics)` of the RL update of
    the named shape: `update()` runs one optimizer step (it donates its inputs, so each
    call carries the last one's outputs), `forward()` pi_old's forward pass."""
    import jax
    import numpy as np
    from flax import nnx

    from grpo_jax import models, parallel
    from grpo_jax.training import batch as batch_lib, packing, programs, steps
    from bench_packing import rl_rows

    rows_n, n, micro = shape["update_rows"], shape["completion"], shape["micro_batches"]
    cfg = models.get_model_config(name, dtype=shape["dtype"], param_dtype="float32",
                                  remat="full", attention_impl=attention)
    graphdef, params = nnx.split(models.init_model(cfg, seed=0, mesh=mesh))
    count = int(sum(x.size for x in jax.tree.leaves(params)))
    rows = rl_rows(config, cfg, np.full(rows_n, n), np.random.default_rng(0))
    run = programs.policy_programs(config, mesh, graphdef, params, programs.rl_objective(config))
    state = {"params": params,
             "opt": steps.init_optimizer_state(run.tx, run.trained_part(params), mesh)}
    del params
    batch = parallel.global_rows(mesh, rows)
    index = np.arange(rows_n, dtype=np.int32)
    planner = packing.Planner.of(batch, mesh)
    forward_plan, stats = planner.chunks(run.pieces)
    update_plan = planner.pieces(index[batch_lib.piece_rows(rows_n, micro)])

    def update():
        state["params"], state["opt"], metrics = run.update(
            state["params"], state["opt"], batch, index, plan=update_plan)
        return jax.block_until_ready(metrics)

    def forward():
        return jax.block_until_ready(run.forward(state["params"], batch, forward_plan))

    return cfg, count, update, forward, stats


def part_jax_update(shape, cap_s, save):
    """Seconds of the RL update and of pi_old's forward pass per model shape. Where
    cuDNN's fused attention fails to compile or run, the XLA attention instead (said in
    the results)."""
    import jax

    from grpo_jax import config_lib, parallel

    out = {**_jax_header(), "models": {}}
    rows_n, n, micro = shape["update_rows"], shape["completion"], shape["micro_batches"]
    config = config_lib.apply_overrides(config_lib.load_config(str(ROOT / "configs/grpo.py")), {
        "rollout.max_new_tokens": n, "rollout.prompts_per_batch": rows_n // GROUP,
        "objective.group_size": GROUP, "train.micro_batches": micro, "train.minibatches": 1,
        "train.packing": "on"})
    mesh = parallel.make_mesh("data=1,fsdp=1,tensor=1", devices=jax.devices()[:1])
    attention = shape["attention"]
    for name in shape["update_models"]:
        begin = time.perf_counter()
        cfg, count, update, forward, stats = _update_call(config, name, shape, attention, mesh)
        try:
            loss = float(update()["loss"])
        except Exception as error:   # noqa: BLE001  (any compile or run failure of the kernel)
            if attention != "cudnn":
                raise
            out["attention_fallback"] = f"cudnn failed, xla used: {error!r}"[:600]
            attention = "xla"
            del update, forward
            jax.clear_caches()
            cfg, count, update, forward, stats = _update_call(config, name, shape, attention, mesh)
            loss = float(update()["loss"])
        first_s = time.perf_counter() - begin
        update_s, calls = _median_seconds(update, shape["update_steps"], cap_s / 4)
        forward()
        forward_s, _ = _median_seconds(forward, shape["update_steps"], cap_s / 8)
        seq = PROMPT + n - 1    # a row's tokens as packed (its last token is not read)
        out["models"][name] = {
            "params": count, "rows": rows_n, "seq": seq, "tokens": rows_n * seq,
            "micro_batches": micro, "pack_rows_fraction": float(stats["pack_rows_fraction"]),
            "model_flops": model_flops(cfg, rows_n, seq), "first_call_s": first_s,
            "update_s": update_s, "timed_calls": calls, "forward_s": forward_s,
            "loss": loss, "attention": attention}
        save(out)
        del update, forward
        jax.clear_caches()
    return out


def _torch_device(torch):
    return "cuda" if torch.cuda.is_available() else "cpu"


def _sync(torch):
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _torch_header(torch):
    import transformers
    device = _torch_device(torch)
    name = torch.cuda.get_device_name() if device == "cuda" else platform.processor()
    return {"device": name, "torch": torch.__version__, "cuda": torch.version.cuda or "",
            "transformers": transformers.__version__}


def _torch_model(torch, name, dtype, **overrides):
    """transformers' model of the named shape, random weights, sdpa, on the device."""
    import transformers

    from grpo_jax import models
    hf = models.to_hf_config(models.get_model_config(name, **overrides))
    torch.manual_seed(0)
    with torch.device(_torch_device(torch)):   # drawn on the device: seconds, not minutes
        model = transformers.AutoModelForCausalLM.from_config(
            hf, attn_implementation="sdpa", dtype=dtype)
    return model, hf


def part_ceilings(shape, cap_s, save):
    """PyTorch's bf16 matmul rate and device copy bandwidth on this chip."""
    import torch
    device, m = _torch_device(torch), shape["matmul"]
    a, b = (torch.randn(m, m, device=device, dtype=torch.bfloat16) for _ in range(2))
    src = torch.randn(shape["copy_bytes"] // 4, device=device)
    dst = torch.empty_like(src)

    def timed(fn, repeats=10):
        for _ in range(3):
            fn()
        _sync(torch)
        start = time.perf_counter()
        for _ in range(repeats):
            fn()
        _sync(torch)
        return (time.perf_counter() - start) / repeats

    matmul_s = timed(lambda: a @ b)
    copy_s = timed(lambda: dst.copy_(src))
    return {**_torch_header(torch), "matmul_flops_per_s": 2 * m**3 / matmul_s,
            "copy_bytes_per_s": 2 * src.numel() * 4 / copy_s, "matmul_n": m,
            "copy_bytes": src.numel() * 4}


def part_torch_update(shape, cap_s, save):
    """Seconds of transformers' forward + backward + AdamW step on the update's tokens."""
    import torch
    out = {**_torch_header(torch), "models": {}}
    device = _torch_device(torch)
    rows_n, micro = shape["update_rows"], shape["micro_batches"]
    seq = PROMPT + shape["completion"] - 1
    autocast = torch.bfloat16 if shape["dtype"] == "bfloat16" else torch.float32
    for name in shape["update_models"]:
        model, hf = _torch_model(torch, name, torch.float32)
        model.gradient_checkpointing_enable()   # remat "full", as the JAX update
        model.config.use_cache = False
        opt = torch.optim.AdamW(model.parameters(), lr=1e-6, fused=device == "cuda")
        tokens = torch.randint(0, hf.vocab_size, (rows_n, seq), device=device,
                               generator=torch.Generator(device).manual_seed(0))

        def step():
            for piece in tokens.chunk(micro):
                with torch.autocast(device, dtype=autocast, enabled=autocast != torch.float32):
                    loss = model(input_ids=piece, labels=piece).loss / micro
                loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            _sync(torch)
            return float(loss)

        begin = time.perf_counter()
        loss = step()
        first_s = time.perf_counter() - begin
        update_s, count = _median_seconds(step, shape["update_steps"], cap_s / 3)
        out["models"][name] = {"update_s": update_s, "timed_calls": count,
                               "first_call_s": first_s, "loss": loss * micro}
        save(out)
        model = opt = None   # frees them before the next model loads
        if device == "cuda":
            torch.cuda.empty_cache()
    return out


def part_jax_decode(shape, cap_s, save):
    """Seconds of `sampling.generate` (prefill + new_tokens decode steps) per batch."""
    import jax
    import numpy as np
    from flax import nnx

    from grpo_jax import models
    import _bench_common as common

    cfg = models.get_model_config(shape["decode_model"], dtype=shape["dtype"],
                                  param_dtype=shape["dtype"], attention_impl=shape["attention"])
    graphdef, state = nnx.split(models.init_model(cfg, seed=0))
    n, s = shape["new_tokens"], shape["prompt_len"]
    itemsize = np.dtype(cfg.dtype).itemsize
    params = int(sum(x.size for x in jax.tree.leaves(state)))
    out = {**_jax_header(), "model": shape["decode_model"], "params": params,
           "weight_bytes": params * np.dtype(cfg.param_dtype).itemsize,
           "kv_token_bytes": kv_bytes_per_token(cfg, itemsize), "batches": {}}
    for b in shape["slots"]:
        ids = common.prompts(b, cfg.vocab_size, length=s)
        begin = time.perf_counter()
        common.ours(graphdef, state, ids, 1, 0, max_len_bucket=n)   # compiles
        first_s = time.perf_counter() - begin
        prefill_s = common.seconds(
            lambda: common.ours(graphdef, state, ids, 1, 0, max_len_bucket=n))
        total_s = common.seconds(lambda: common.ours(graphdef, state, ids, n, 1, max_len_bucket=n))
        out["batches"][str(b)] = {
            "rows": b, "prompts": b // GROUP, "prompt_len": s, "new_tokens": n,
            "first_call_s": first_s, "prefill_s": prefill_s, "seconds": total_s,
            "tokens_per_s": b * n / total_s,
            "floor_bytes": decode_floor_bytes(out["weight_bytes"], out["kv_token_bytes"],
                                              b // GROUP, b, s, n)}
        save(out)
    return out


def part_torch_decode(shape, cap_s, save):
    """Seconds of transformers' `generate` at the decode part's batches and lengths."""
    import torch
    import _bench_common as common
    dtype = torch.bfloat16 if shape["dtype"] == "bfloat16" else torch.float32
    model, hf = _torch_model(torch, shape["decode_model"], dtype)
    model.eval()
    device, n = _torch_device(torch), shape["new_tokens"]
    out = {**_torch_header(torch), "batches": {}}
    for b in shape["slots"]:
        ids = common.prompts(b, hf.vocab_size, length=shape["prompt_len"])
        common.transformers_generate(torch, model, ids, 2, 0, device=device)   # warm-up
        seconds = common.seconds(lambda: (common.transformers_generate(
            torch, model, ids, n, 1, device=device), _sync(torch)))
        out["batches"][str(b)] = {"seconds": seconds, "tokens_per_s": b * n / seconds}
        save(out)
    return out


def part_rl_checkpoint(shape, directory):
    """Writes a random checkpoint of the RL step's shape with a character tokenizer."""
    from grpo_jax import models
    from grpo_jax.training.tokenizer import train_char_tokenizer
    tokenizer = train_char_tokenizer([string.printable])
    cfg = models.get_model_config(shape["rl_model"], eos_token_id=tokenizer.eos_token_id,
                                  pad_token_id=tokenizer.pad_token_id, bos_token_id=None)
    models.save_pretrained(models.init_model(cfg, seed=0), directory, tokenizer=tokenizer,
                           dtype="bfloat16")   # the run reads it into float32 master weights
    return {"vocab_size": cfg.vocab_size}


def rl_command(shape: dict, checkpoint: str, workdir: str, data_dir: str) -> list[str]:
    """`python -m grpo_jax.main` for the RL step part."""
    overrides = {
        "model.path": checkpoint, "model.sft_warm_start": False, "model.dtype": shape["dtype"],
        "model.param_dtype": "float32", "model.remat": "full",
        "model.attention": shape["attention"], "task.data_dir": data_dir,
        "task.knobs.num_train": 512, "task.knobs.num_test": 64, "eval.num_prompts": 8,
        "train.steps": shape["rl_steps"], "train.minibatches": 1,
        "train.micro_batches": shape["micro_batches"], "train.eval_every": 10**9,
        "train.checkpoint_every": 10**9, "train.export": False,
        "rollout.prompts_per_batch": shape["rl_prompts"], "objective.group_size": GROUP,
        "rollout.max_new_tokens": shape["new_tokens"]}
    return [sys.executable, "-m", "grpo_jax.main", "--config", "configs/grpo.py:runlocal=True",
            "--workdir", workdir, *(f"--config.{k}={v}" for k, v in overrides.items())]


def part_rl_step(shape, cap_s, smoke):
    """The RL step's split: a random checkpoint (made on the CPU, so that process holds no
    GPU memory), then `grpo_jax.main`; its last step's timings."""
    from grpo_jax import run_files
    keys = ("time_rollout", "time_old_logp", "time_update", "rollout_tokens_per_s",
            "update_tokens_per_s", "response_length_mean", "generated_tokens")
    with tempfile.TemporaryDirectory() as tmp:
        checkpoint, workdir = os.path.join(tmp, "checkpoint"), os.path.join(tmp, "run")
        begin = time.perf_counter()
        made = _child("rl_checkpoint", ["--smoke"] * smoke + ["--checkpoint", checkpoint],
                      cap_s / 3, env={"JAX_PLATFORMS": "cpu"}, group=False)
        checkpoint_s = time.perf_counter() - begin
        if made["status"] != "ok":
            raise RuntimeError(f"the random checkpoint failed: {made}")
        begin = time.perf_counter()
        run = subprocess.run(rl_command(shape, checkpoint, workdir, os.path.join(tmp, "data")),
                             cwd=ROOT, capture_output=True, text=True,
                             timeout=max(cap_s - checkpoint_s, 1), env=_env())
        if run.returncode:
            raise RuntimeError(f"grpo_jax.main exited {run.returncode}: {run.stderr[-3000:]}")
        rows = run_files.read_metrics(workdir)
    last = rows[-1]
    return {"vocab_size": made["result"]["vocab_size"], "steps": len(rows),
            "measured_step": last["step"], "checkpoint_s": checkpoint_s,
            "main_s": time.perf_counter() - begin, **{k: last[k] for k in keys},
            "first_step_s": sum(rows[0][k] for k in keys[:3]),
            "log_tail": run.stdout[-1500:]}   # the step lines, with the compile seconds


# ---------------------------------------------------------------------------- driver

def _env(extra=None):
    env = {**os.environ, **(extra or {})}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "experiments"),
                                         env.get("PYTHONPATH", "")])
    return env


def _child(part, args, cap_s, env=None, group=True):
    """Runs `part` in a fresh process under `cap_s` seconds, in a process group of its own
    with `group` (killed whole at the cap: the RL step's own children too); `{"status":
    "ok" | "timeout" |
    "error", "seconds", "result" (what the part saved, if anything), "error"}`."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "result.json")
        begin = time.perf_counter()
        proc = subprocess.Popen(
            [sys.executable, __file__, "--part", part, "--part_out", path, "--cap_s",
             str(cap_s), *args], cwd=ROOT, env=_env(env), stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True, start_new_session=group)
        try:
            _, stderr = proc.communicate(timeout=cap_s)
            status = "error" if proc.returncode else "ok"
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL) if group else proc.kill()
            _, stderr = proc.communicate()
            status = "timeout"
        done = {"status": status, "seconds": time.perf_counter() - begin}
        if os.path.exists(path):
            with open(path) as f:
                done["result"] = json.load(f)
        if status == "timeout":
            done["error"] = f"over its {cap_s:.0f} s cap; stderr: {stderr[-2000:]}"
        elif status == "error":
            done["error"] = stderr[-3000:]
        return done


def run_part(args):
    """The child's side: runs one part, writes its JSON to --part_out (also after each
    model or batch, so a part stopped at its cap leaves what it measured)."""
    shape = SHAPES["smoke" if args.smoke else "gpu"]
    if args.attention:
        shape = {**shape, "attention": args.attention}

    def save(result):
        with open(args.part_out + ".tmp", "w") as f:
            json.dump(result, f)
        os.replace(args.part_out + ".tmp", args.part_out)

    if args.part == "rl_checkpoint":
        save(part_rl_checkpoint(shape, args.checkpoint))
    elif args.part == "rl_step":
        save(part_rl_step(shape, args.cap_s, args.smoke))
    else:
        save(globals()[f"part_{args.part}"](shape, args.cap_s, save))


def _ok(parts, name):
    """What part `name` measured: all of it, or up to its cap or error."""
    return parts.get(name, {}).get("result")


def summarize(parts: dict, peak: float | None, bandwidth: float | None) -> dict:
    """Derived numbers: MFU, floor fractions, ratios against PyTorch, the RL step's
    split, its slowest stage and the next optimisation to look at."""
    summary = {"update": {}, "decode": {}}
    ju, tu = _ok(parts, "jax_update"), _ok(parts, "torch_update")
    for name, row in (ju or {}).get("models", {}).items():
        entry = {"update_s": row["update_s"], "tokens_per_s": row["tokens"] / row["update_s"],
                 "forward_share": row["forward_s"] / row["update_s"]}
        if peak:
            entry["mfu"] = mfu(row["model_flops"], row["update_s"], peak)
        torch_row = (tu or {}).get("models", {}).get(name)
        if torch_row:
            entry["torch_update_s"] = torch_row["update_s"]
            entry["speedup_vs_torch"] = torch_row["update_s"] / row["update_s"]
            if peak:
                entry["torch_mfu"] = mfu(row["model_flops"], torch_row["update_s"], peak)
        summary["update"][name] = entry
    jd, td = _ok(parts, "jax_decode"), _ok(parts, "torch_decode")
    for b, row in (jd or {}).get("batches", {}).items():
        entry = {"tokens_per_s": row["tokens_per_s"],
                 "prefill_share": row["prefill_s"] / row["seconds"]}
        if bandwidth:
            entry["floor_fraction"] = floor_fraction(row["floor_bytes"], row["seconds"], bandwidth)
        torch_row = (td or {}).get("batches", {}).get(b)
        if torch_row:
            entry["torch_tokens_per_s"] = torch_row["tokens_per_s"]
            entry["speedup_vs_torch"] = torch_row["seconds"] / row["seconds"]
            if bandwidth:
                entry["torch_floor_fraction"] = floor_fraction(
                    row["floor_bytes"], torch_row["seconds"], bandwidth)
        summary["decode"][b] = entry
    rl = _ok(parts, "rl_step")
    if rl:
        split = {"rollout": rl["time_rollout"], "pi_old": rl["time_old_logp"],
                 "update": rl["time_update"]}
        summary["rl_step"] = {**split, "total": sum(split.values())}
        summary["slowest"] = max(split, key=split.get)
    summary["next"] = next_optimisation(summary)
    return summary


def next_optimisation(summary: dict) -> str:
    """One line naming where the next speed-up is, from the numbers measured."""
    slowest = summary.get("slowest")
    decode = [summary["decode"][b] for b in sorted(summary["decode"], key=int)]
    update = list(summary["update"].values())
    if slowest == "rollout" and decode:
        d = decode[0]
        if d["prefill_share"] > 0.3:
            return ("the rollout is the slowest stage and the prefill takes "
                    f"{d['prefill_share']:.0%} of a decode call: profile the prefill (jax.profiler)"
                    " before the decode steps")
        frac = d.get("floor_fraction")
        at = f" at {frac:.0%} of the HBM floor" if frac is not None else ""
        return (f"the rollout is the slowest stage and decodes{at}: profile one decode step "
                "(jax.profiler) for the attention over the cache and the sampling over V")
    if slowest in ("update", "pi_old") and update:
        u = update[0]
        at = f" at {u['mfu']:.0%} MFU" if "mfu" in u else ""
        return (f"the {slowest} stage is the slowest and the update runs{at}: try remat "
                "'dots_saveable' and fewer micro-batches where memory allows, then profile it")
    if update or decode:
        return "no RL step split measured: rerun the rl_step part to name the slowest stage"
    return "nothing measured: see the parts' errors"


def _fmt(x, spec):
    return "-" if x is None else format(x, spec)


def print_table(results):
    s, meta = results["summary"], results["meta"]
    print(f"\n# device_bench  commit {meta['commit']}  {meta['date']}  {meta['device']}  "
          f"jax {meta.get('jax')} ({meta.get('jax_plugins')})  torch {meta.get('torch')}  "
          f"CUDA {meta.get('cuda')}")
    print(f"# peak {_fmt(meta['peak_flops'] and meta['peak_flops'] / 1e12, '.0f')} TFLOP/s, "
          f"HBM {_fmt(meta['bandwidth'] and meta['bandwidth'] / 1e12, '.2f')} TB/s "
          f"(datasheet: {meta['chip'] or 'unknown chip'})")
    for name, part in results["parts"].items():
        note = "" if part["status"] == "ok" else f"  {part.get('error', '')[-200:]!r}"
        print(f"# part {name:13s} {part['status']:8s} {part.get('seconds', 0):6.1f} s{note}")
    print("\nupdate      s/update  torch s  speed-up  MFU     torch MFU  fwd share")
    for name, u in s["update"].items():
        print(f"{name:11s} {u['update_s']:8.3f}  {_fmt(u.get('torch_update_s'), '7.3f'):>7s}  "
              f"{_fmt(u.get('speedup_vs_torch'), '7.2f'):>7s}x {_fmt(u.get('mfu'), '6.1%'):>6s}  "
              f"{_fmt(u.get('torch_mfu'), '8.1%'):>8s}  {u['forward_share']:8.2f}")
    print("\ndecode B    tok/s     torch tok/s  speed-up  % floor  torch % floor  prefill")
    for b, d in s["decode"].items():
        print(f"{b:11s} {d['tokens_per_s']:9,.0f} "
              f"{_fmt(d.get('torch_tokens_per_s'), '11,.0f'):>11s}  "
              f"{_fmt(d.get('speedup_vs_torch'), '7.2f'):>7s}x "
              f"{_fmt(d.get('floor_fraction'), '7.1%'):>7s}  "
              f"{_fmt(d.get('torch_floor_fraction'), '12.1%'):>12s}  {d['prefill_share']:7.2f}")
    if "rl_step" in s:
        r = s["rl_step"]
        print(f"\nRL step: {r['total']:.2f} s = rollout {r['rollout']:.2f} + "
              f"pi_old {r['pi_old']:.2f}"
              f" + update {r['update']:.2f}; slowest: {s['slowest']}")
    print(f"next: {s['next']}")


def _meta(args, parts):
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                            capture_output=True, text=True).stdout.strip()
    meta = {"commit": commit, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "command": " ".join(sys.argv), "smoke": args.smoke, "caps_s": CAPS_S,
            "budget_s": args.budget_s, "host": platform.node()}
    for name in ("jax_update", "jax_decode", "ceilings", "torch_update", "torch_decode"):
        result = _ok(parts, name) or {}
        for key in ("device_kind", "jax", "jax_plugins", "torch", "cuda", "transformers", "device"):
            if result.get(key) and not meta.get(key):
                meta[key] = result[key]
    kind = meta.get("device_kind") or meta.get("device") or ""
    meta["device"] = kind or "unknown"
    spec = chip_spec(kind)
    meta["chip"] = spec[0] if spec else None
    meta["peak_flops"] = args.peak_tflops * 1e12 if args.peak_tflops else spec and spec[1]
    meta["bandwidth"] = args.bandwidth_gbs * 1e9 if args.bandwidth_gbs else spec and spec[2]
    return meta


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="CPU, tiny shapes")
    parser.add_argument("--out", default="device_bench.json", help="the results file (JSON)")
    parser.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated of {PARTS}")
    parser.add_argument("--budget_s", type=float, default=None,
                        help=f"seconds for all parts (default {BUDGET_S}, --smoke "
                             f"{SMOKE_BUDGET_S})")
    parser.add_argument("--peak_tflops", type=float, default=None,
                        help="dense bf16 peak, for a chip CHIPS does not list")
    parser.add_argument("--bandwidth_gbs", type=float, default=None,
                        help="HBM GB/s, for a chip CHIPS does not list")
    parser.add_argument("--part", help=argparse.SUPPRESS)
    parser.add_argument("--part_out", help=argparse.SUPPRESS)
    parser.add_argument("--cap_s", type=float, default=0.0, help=argparse.SUPPRESS)
    parser.add_argument("--checkpoint", help=argparse.SUPPRESS)
    parser.add_argument("--attention", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.budget_s = args.budget_s or (SMOKE_BUDGET_S if args.smoke else BUDGET_S)
    if args.part:
        return run_part(args)
    names = args.parts.split(",")
    unknown = sorted(set(names) - set(PARTS))
    if unknown:
        parser.error(f"--parts: unknown {unknown}; choose from {PARTS}")
    begin, parts, extra = time.perf_counter(), {}, []
    for name in names:
        left = args.budget_s - (time.perf_counter() - begin)
        cap = min(SMOKE_CAP_S if args.smoke else CAPS_S[name], left)
        if cap < min(CAPS_S[name] / 2, 30) and not args.smoke:
            parts[name] = {"status": "skipped", "seconds": 0.0,
                           "error": f"{left:.0f} s of the {args.budget_s:.0f} s budget left"}
            continue
        print(f"# {name} (cap {cap:.0f} s)", flush=True)
        # PyTorch's parts never run JAX on the GPU (it would take 75% of its memory)
        torch_part = name in ("ceilings", "torch_update", "torch_decode")
        env = {"JAX_PLATFORMS": "cpu"} if torch_part else None
        parts[name] = _child(name, ["--smoke"] * args.smoke + extra, cap, env=env)
        if "attention_fallback" in parts[name].get("result", {}):   # the RL step's too
            extra = ["--attention", "xla"]
    meta = _meta(args, parts)
    results = {"meta": meta, "parts": parts,
               "summary": summarize(parts, meta["peak_flops"], meta["bandwidth"])}
    results["meta"]["seconds"] = time.perf_counter() - begin
    with open(args.out, "w") as f:
        json.dump(results, f, indent=1, default=float)
    print_table(results)
    print(f"# results: {args.out} ({results['meta']['seconds']:.0f} s)")


if __name__ == "__main__":
    main()
