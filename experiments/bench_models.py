"""Throughput of grpo_jax.models and the memory of the chunked log-prob path.

    python experiments/bench_models.py                      # CPU: tiny and 0.6B, short sequences
    python experiments/bench_models.py --gpu                # GPU: bf16 compute, seq 2048, MFU
    python experiments/bench_models.py --quick              # smoke run (tiny only)
    XLA_FLAGS=--xla_force_host_platform_device_count=8 python experiments/bench_models.py \
        --models tiny_moe --batch 32 --data_parallel 8 --quick --moe_impl ragged   # or dense

Table 1 times what a trainer runs on a batch of B x S tokens: the forward pass to
per-token log-probs (chunked over the vocabulary, `Decoder.token_logprobs`) and the
forward+backward (value_and_grad of their sum w.r.t. every weight). Weights are random
(`init_model`), float32 master weights with the compute dtype of --dtype; timings are
medians of --steps calls after one warm-up call (compilation excluded), results
block_until_ready. Tokens/s counts B*S positions.

MFU = model FLOPs/s / peak FLOPs/s (PaLM, Chowdhery et al. 2022, appendix B): per token,
6 N (fwd+bwd) or 2 N (fwd) with N the matmul parameters a token meets (embedding lookup
excluded, output projection included, only the k routed experts of an MoE layer), plus
attention 12 L H_q d_head S (fwd+bwd) or 4 L H_q d_head S (fwd). Peak: --peak_tflops, or
the bf16 dense peak of a known GPU; none on CPU.

Table 2 compares the compiled memory (XLA memory_analysis: temporaries, arguments
excluded) of value_and_grad of summed token log-probs at V=151,936 (Qwen) and B*T=8,192
with D=1,024: the naive path materialises [B*T, V] float32 logits, the chunked path one
chunk of them at a time.
"""

import argparse
import contextlib
import os
import pathlib
import platform
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from grpo_jax import models  # noqa: E402  (runs from a checkout, uninstalled)
from grpo_jax.models import logprobs  # noqa: E402
from grpo_jax.objectives import token_logprobs  # noqa: E402

PEAK_BF16_TFLOPS = {  # dense bf16 peak by device_kind substring
    "H200": 989.0, "H100": 989.0, "A100": 312.0, "L4": 121.0, "A10": 125.0,
    "TPU v4": 275.0, "TPU v5 lite": 197.0, "TPU v5p": 459.0, "TPU v6": 918.0,
}


def matmul_params(cfg):
    """Weights a token is multiplied by: no embedding lookup, k of E experts."""
    d, h = cfg.d_model, cfg.head_dim
    attn = d * h * (2 * cfg.n_heads + 2 * cfg.n_kv_heads)
    per_layer = []
    for i in range(cfg.n_layers):
        if cfg.is_moe_layer(i):
            per_layer.append(
                attn + d * cfg.n_experts + 3 * d * cfg.moe_d_ff * cfg.n_experts_per_tok
            )
        else:
            per_layer.append(attn + 3 * d * cfg.d_ff)
    return sum(per_layer) + d * cfg.vocab_size


def flops_per_token(cfg, seq, backward):
    """PaLM's model FLOPs per token: 6N + 12 L H d S with the backward pass, a third without."""
    full = 6 * matmul_params(cfg) + 12 * cfg.n_layers * cfg.n_heads * cfg.head_dim * seq
    return full if backward else full / 3


def peak_flops(tflops):
    if tflops:
        return tflops * 1e12
    kind = jax.devices()[0].device_kind
    for name, peak in PEAK_BF16_TFLOPS.items():
        if name in kind:
            return peak * 1e12
    return None


def median_seconds(fn, args, steps):
    jax.block_until_ready(fn(*args))  # compile + warm up
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def throughput(name, args):
    """One row of table 1: forward and forward+backward tokens/s (and MFU) of model `name`."""
    cfg = models.get_model_config(
        name, dtype=args.dtype, remat=args.remat, attention_impl=args.attention_impl,
        moe_impl=args.moe_impl,
    )
    mesh = None
    if args.data_parallel > 1:   # the rows split over a data axis, the weights by the fsdp rules
        mesh = jax.make_mesh((args.data_parallel, 1), ("data", "fsdp"),
                             axis_types=(jax.sharding.AxisType.Auto,) * 2)
    graphdef, state = nnx.split(models.init_model(cfg, mesh=mesh))
    tokens = jax.random.randint(jax.random.key(0), (args.batch, args.seq), 0, cfg.vocab_size)
    if mesh is not None:
        tokens = jax.device_put(tokens, jax.NamedSharding(mesh, jax.P("data")))
    targets = jnp.roll(tokens, -1, axis=1)

    def loss(state, tokens):
        logp = nnx.merge(graphdef, state).token_logprobs(
            tokens, targets, chunk_size=args.chunk_size
        )
        return jnp.sum(logp)

    n_tokens = args.batch * args.seq
    row = {"model": name, "params": sum(x.size for x in jax.tree.leaves(state))}
    peak = peak_flops(args.peak_tflops)
    for label, fn, backward in (
        ("fwd", jax.jit(loss), False), ("fwd+bwd", jax.jit(jax.value_and_grad(loss)), True),
    ):
        with jax.set_mesh(mesh) if mesh is not None else contextlib.nullcontext():
            seconds = median_seconds(fn, (state, tokens), args.steps)
        row[f"{label} tok/s"] = n_tokens / seconds
        achieved = flops_per_token(cfg, args.seq, backward) * n_tokens / seconds
        row[f"{label} MFU"] = f"{100 * achieved / peak:.1f}%" if peak else "n/a"
    return row


def logprob_memory(chunk_size, n=8192, d=1024, v=151936):
    """Table 2: compiled temporary bytes of value_and_grad, naive vs chunked, float32 hidden."""
    args = (jax.ShapeDtypeStruct((1, n, d), jnp.float32), jax.ShapeDtypeStruct((d, v), jnp.float32),
            jax.ShapeDtypeStruct((1, n), jnp.int32))
    paths = {
        "naive: token_logprobs(h @ W)": lambda h, w, t: token_logprobs(logprobs.unembed(h, w), t),
        f"chunked ({chunk_size} tokens)": lambda h, w, t: models.chunked_token_logprobs(
            h, w, t, chunk_size=chunk_size),
    }
    rows = []
    for label, fn in paths.items():
        grad = jax.jit(jax.value_and_grad(lambda h, w, t: jnp.sum(fn(h, w, t)), argnums=(0, 1)))
        temp = grad.lower(*args).compile().memory_analysis().temp_size_in_bytes
        rows.append({"path": label, "temp GiB": temp / 2**30})
    return rows


def table(rows):
    keys = list(rows[0])
    cells = [[f"{r[k]:,.0f}" if isinstance(r[k], (int, float)) and r[k] >= 100 else
              f"{r[k]:.3f}" if isinstance(r[k], float) else str(r[k]) for k in keys] for r in rows]
    widths = [max(len(k), *(len(c[i]) for c in cells)) for i, k in enumerate(keys)]
    lines = [
        "  ".join(k.ljust(w) for k, w in zip(keys, widths)), "  ".join("-" * w for w in widths),
    ]
    lines += ["  ".join(c.rjust(w) for c, w in zip(row, widths)) for row in cells]
    return "\n".join(lines)


def header(args):
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                            text=True).stdout.strip()
    device = jax.devices()[0]
    cpu = platform.processor() or platform.machine()
    try:
        cpu = next(
            line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if "model name" in line
        )
    except (OSError, StopIteration):
        pass
    return "\n".join([
        f"# bench_models  commit {commit}  {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
        f"# device {device.platform} {device.device_kind} x{jax.device_count()}; CPU {cpu}, "
        f"{os.cpu_count()} cores;"
        f" jax {jax.__version__}; load average at start {os.getloadavg()[0]:.1f}",
        f"# command: python {' '.join(sys.argv)}",
        f"# B={args.batch} S={args.seq} dtype={args.dtype} (float32 weights) remat={args.remat} "
        f"chunk={args.chunk_size} attention={args.attention_impl} moe={args.moe_impl} "
        f"data_parallel={args.data_parallel}, median of {args.steps} steps",
    ])


def main():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--models", default=None, help="comma-separated named shapes "
                        "(default tiny,qwen3_0_6b; with --quick, tiny)")
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--remat", action="store_true")
    parser.add_argument("--chunk_size", type=int, default=1024)
    parser.add_argument("--attention_impl", default="xla", choices=models.ATTENTION_IMPLS)
    parser.add_argument("--moe_impl", default="ragged", choices=models.MOE_IMPLS,
                        help="how an MoE model's routed experts are computed")
    parser.add_argument("--data_parallel", type=int, default=1,
                        help="split the rows over this many devices (on CPU, force them with "
                             "XLA_FLAGS=--xla_force_host_platform_device_count=N)")
    parser.add_argument("--peak_tflops", type=float, default=None)
    parser.add_argument("--gpu", action="store_true", help="bf16, B=8, S=2048, remat, 10 steps")
    parser.add_argument(
        "--quick", action="store_true",
        help="tiny model (unless --models), S=32, 2 steps, no table 2",
    )
    args = parser.parse_args()
    if args.gpu:
        args.dtype, args.batch, args.seq, args.remat, args.steps = "bfloat16", 8, 2048, True, 10
    if args.quick:
        args.models, args.seq, args.steps = args.models or "tiny", 32, 2
    args.models = args.models or "tiny,qwen3_0_6b"
    print(header(args), flush=True)
    rows = [throughput(name, args) for name in args.models.split(",")]
    print("\n1. tokens/s (B*S tokens per step)\n" + table(rows), flush=True)
    if not args.quick:
        print("\n2. value_and_grad of summed token log-probs, V=151,936, B*T=8,192, D=1,024: "
              "compiled temporary memory\n" + table(logprob_memory(args.chunk_size)))


if __name__ == "__main__":
    main()
