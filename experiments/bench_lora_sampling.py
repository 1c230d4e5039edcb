"""Sampling with LoRA adapters: applied on the fly vs merged into a sampler copy, on CPU.

    python experiments/bench_lora_sampling.py            # tiny and SmolLM2-135M shapes
    python experiments/bench_lora_sampling.py --quick    # the tiny model, 1 repeat: a smoke run

A LoRA policy can sample in two ways: with the adapters applied on the fly (the sampler
reads the trained state itself: every projection also computes alpha/r (x A) B, no
copy), or from a merged copy (W + alpha/r A B folded once per step by `lora.merged_state`
into a second set of weights the size of the base, then the plain network). This times
both for each model shape, rank 16 on every attention and MLP projection (B random, so
the adapters act; float32), G = 8 completions of B/8 random 32-token prompts, ancestral
sampling at temperature 1, no stop token (every row generates exactly the requested
tokens): tokens/s of one `sampling.generate` call (prefill included), the best of
--repeats rounds, both ways back to back in each round; "merge s" is one merge (what a
step adds to the merged way); "merged incl. merge" charges it to that call. Shapes:
the named "tiny" config (V = 512, D = 128, 3 layers) and SmolLM2-135M's (Llama: V =
49,152, D = 576, 30 layers, 9 heads / 3 kv heads, d_ff 1,536), randomly initialised.
"""

import argparse
import dataclasses
import os
import pathlib
import platform
import re
import subprocess
import sys
import time

import jax
import numpy as np
from flax import nnx

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "experiments"))
from grpo_jax import models, parallel  # noqa: E402  (runs from a checkout, uninstalled)
from grpo_jax.models import lora  # noqa: E402
from _bench_common import ours, prompts, seconds, table  # noqa: E402

parallel.use_cpu_cores()   # before JAX runs anything; a no-op when XLA_FLAGS sets the count

RANK = 16
SPEC = lora.LoraSpec(rank=RANK, alpha=32.0, targets=lora.PROJECTIONS)
# (name, model config, [(B, new tokens)])
SMOLLM2 = dict(vocab_size=49152, d_model=576, n_layers=30, n_heads=9, n_kv_heads=3,
               head_dim=64, d_ff=1536, tie_embeddings=True, qk_norm=False, rope_theta=100000.0,
               model_type="llama")


def shapes(quick):
    tiny = models.get_model_config("tiny")
    if quick:
        return [("tiny", tiny, [(16, 16)])]
    smollm2 = dataclasses.replace(tiny, **SMOLLM2)
    return [("tiny", tiny, [(16, 128), (64, 128), (256, 128)]),
            ("SmolLM2-135M shape", smollm2, [(16, 64), (64, 64)])]


def with_random_adapters(state, seed=0):
    """`state` with every adapter factor drawn N(0, 0.02^2), so B != 0 and the adapters act."""
    rng = np.random.default_rng(seed)
    return jax.tree.map(
        lambda v: v.replace(rng.normal(0, 0.02, v.get_value().shape).astype(np.float32))
        if isinstance(v, nnx.LoRAParam) else v,
        state, is_leaf=lambda x: isinstance(x, nnx.Variable))


def bench(name, cfg, cases, repeats, mesh):
    adapted = models.init_model(dataclasses.replace(cfg, lora=SPEC), seed=0, mesh=mesh,
                                rules="sampling")
    graphdef, state = nnx.split(adapted)
    state = with_random_adapters(state)
    plain_graphdef = nnx.graphdef(models.init_model(cfg, seed=0))
    merge = jax.jit(lambda s: lora.merged_state(s, SPEC))
    merged = merge(state)
    jax.block_until_ready(merged)
    rows = []
    for batch, new in cases:
        ids = prompts(batch, cfg.vocab_size)
        for g, s in ((graphdef, state), (plain_graphdef, merged)):   # compile both
            ours(g, s, ids, 1, 0, max_len_bucket=new, mesh=mesh)
        fly, folded, merging = [], [], []
        for r in range(repeats):
            fly.append(seconds(lambda: ours(graphdef, state, ids, new, r + 1, mesh=mesh)))
            merging.append(seconds(lambda: jax.block_until_ready(merge(state))))
            folded.append(seconds(lambda: ours(plain_graphdef, merged, ids, new, r + 1, mesh=mesh)))
        tokens = batch * new
        fly_tps, merged_tps = tokens / min(fly), tokens / min(folded)
        with_merge = tokens / (min(folded) + min(merging))
        rows.append([name, batch, new, f"{fly_tps:,.0f}", f"{merged_tps:,.0f}",
                     f"{min(merging):.3f}", f"{with_merge:,.0f}", f"{with_merge / fly_tps:.2f}x"])
        print(
            f"  {name} B={batch} new={new}: on the fly {fly_tps:,.0f} tok/s, merged "
            f"{merged_tps:,.0f} tok/s (+ {min(merging):.3f} s merge)", file=sys.stderr, flush=True,
        )
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="the tiny model, 1 repeat")
    args = parser.parse_args()
    repeats = 1 if args.quick else args.repeats
    cpu = re.search(r"model name\s*:\s*(.*)", pathlib.Path("/proc/cpuinfo").read_text())
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip()
    print(f"# bench_lora_sampling  commit {commit or '?'}  "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    print(f"# CPU {cpu.group(1) if cpu else platform.processor()}, {os.cpu_count()} cores; jax "
          f"{jax.__version__} ({jax.device_count()} device(s)); load average at start "
          f"{os.getloadavg()[0]:.1f}")
    print(f"# command: python experiments/bench_lora_sampling.py {' '.join(sys.argv[1:])}".rstrip())
    print()
    mesh = parallel.make_mesh([("data", -1), ("tensor", 1)])
    rows = [row for name, cfg, cases in shapes(args.quick)
            for row in bench(name, cfg, cases, repeats, mesh)]
    table(f"generation tokens/s with rank-{RANK} adapters on every projection (float32, G=8, "
          f"prompt 32 tokens, {mesh.size} devices), best of {repeats}",
          ["model", "B", "new tokens", "on the fly", "merged", "merge s", "merged incl. merge",
           "merged / on the fly"], rows)


if __name__ == "__main__":
    main()
