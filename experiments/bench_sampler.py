"""Generation throughput of grpo_jax.sampling on CPU, beside transformers' PyTorch generate.

    python experiments/bench_sampler.py            # tables 1-3: the tiny model
    python experiments/bench_sampler.py --tables vocab,step --smollm2 /work/cache/smollm2_hf
                                                   # tables 4-5: real vocabularies
    python experiments/bench_sampler.py --quick    # tables 1-3, tiny shapes, 1 repeat: a smoke run
    python experiments/bench_sampler.py --quick --tables vocab,step --smollm2 DIR   # 4-5 likewise
                                                   # (table 4: top-p 0.95 only)

The model is the named "tiny" config (qwen3: V=512, D=128, 3 layers, float32), randomly
initialised, saved with save_pretrained and loaded by both libraries from that directory.
Each batch is B/8 prompts of 32 (or 256) random tokens x G=8 completions (transformers:
num_return_sequences=8), ancestral sampling at temperature 1 (no top-k / top-p), no stop
token, so every row generates exactly the requested number of tokens. tokens/s = B *
new tokens / wall time of one generate call (prefill included), the best of --repeats
rounds (the machine is shared: the fastest round is the one least disturbed by other
processes); within a round the libraries run back to back. Warm-up runs exclude
compilation: ours with max_new_tokens=1 (the same compiled program, since
max_new_tokens is traced), transformers' with 4 new tokens. torch runs with the thread
count (1 or 2) that a probe finds faster: on a loaded machine two OpenMP threads can be
20x slower than one.

grpo_jax runs twice: on one XLA CPU device (no mesh, how `generate` runs by default),
and on one CPU device per core (`parallel.use_cpu_cores`, as `python -m grpo_jax.main`
does) with the rows split over a ("data", "tensor") mesh. XLA:CPU runs one device's
program mostly on one thread, so the second uses the cores torch's threads use.
XLA_FLAGS=--xla_force_host_platform_device_count=N picks another device count.

A second table measures how far the sampler's behaviour log-probs (`Rollout.logp`) are
from a teacher-forced forward pass over the same tokens, in float32 and in bfloat16. A
third times one layer's decode attention inside a while loop that writes the cache each
step, as the sampler does, on the previous cache layout (keys and values `[B, K, L, H]`,
two einsums; commit dcccef3) and on the model's (keys `[B, K, H, L]`, values
`[B, K, L, H]`, `layers.grouped_attention`).

Table 4 ("vocab") is the real-vocabulary comparison: SmolLM2-135M-Instruct (V = 49,152;
--smollm2, a Hugging Face directory converted to safetensors) and a random model with
Qwen3's vocabulary (V = 151,936) and the tiny model's other dims, in float32 and bfloat16
(weights and compute, both libraries), B in {16, 64, 256}, each of top-p 1.0 (no cut:
`make_method` gives plain `Temperature`), top-p 0.95 and top-k 50 at temperature 1,
forced to 64 new tokens; grpo_jax on one CPU device per core, transformers with the
same prompts (SmolLM2: chat-formatted questions; the random model: random ids) and
settings in the same round. Table 5 ("step") times one `sampling.sample` call at B = 64
on one device for each way of finding the cut: a full sort, `lax.top_k` and
`lax.approx_max_k` candidates alone, the exact bisection alone (`TopP(max_candidates=1)`)
and `TopP` as built (64 candidates, bisection when the nucleus is larger), on SmolLM2's
next-token logits after the chat prompts (V = 49,152) and the random model's (V = 151,936).
"""

import argparse
import os
import pathlib
import platform
import re
import subprocess
import sys
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "experiments"))
from grpo_jax import models, parallel  # noqa: E402  (runs from a checkout, uninstalled)
from grpo_jax.models import layers  # noqa: E402
from grpo_jax.objectives import token_logprobs  # noqa: E402
from _bench_common import (GROUP_SIZE, PROBE, PROMPT_LEN, QUICK_PROBE, ours, pick_torch_threads,  # noqa: E402
                           prompts, seconds, table, torch_or_none, transformers_generate)

parallel.use_cpu_cores()   # before JAX runs anything; a no-op when XLA_FLAGS sets the count

# (B, new tokens, prompt tokens): the speed target's grid, then long prompts, where the G
# completions sharing one cached prompt (cascade attention) matters most.
CASES = [(b, n, PROMPT_LEN) for b in (16, 64, 256) for n in (128, 512)] + [
    (64, 128, 256), (256, 128, 256),
]
QUICK_CASES = [(16, 16, PROMPT_LEN)]


def header(argv):
    cpu = re.search(r"model name\s*:\s*(.*)", pathlib.Path("/proc/cpuinfo").read_text())
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(
        ["git", "-C", str(ROOT), "status", "--porcelain", "--", "grpo_jax/sampling"],
        capture_output=True, text=True,
    ).stdout.strip()
    torch = torch_or_none()
    print(f"# bench_sampler  commit {commit or '?'}{' (sampling/ modified)' if dirty else ''}  "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    print(f"# CPU {cpu.group(1) if cpu else platform.processor()}, {os.cpu_count()} cores, "
          f"no GPU; python {platform.python_version()}, jax {jax.__version__} "
          f"({jax.default_backend()}, {jax.device_count()} device(s)), "
          f"torch {torch.__version__ if torch else 'not installed'}")
    print(f"# command: python experiments/bench_sampler.py {' '.join(argv)}".rstrip())
    print(f"# load average at start {os.getloadavg()[0]:.1f} (other processes share the cores)\n")


def bench_throughput(path, cases, repeats, probe=PROBE):
    model, _ = models.from_pretrained(path)
    single = nnx.split(model)   # the default device, no mesh
    mesh = parallel.make_mesh([("data", -1), ("tensor", 1)])
    spread = nnx.split(models.from_pretrained(path, mesh=mesh, rules="sampling")[0])
    torch = torch_or_none()
    torch_model = None
    if torch is not None:
        import transformers
        torch_model = transformers.AutoModelForCausalLM.from_pretrained(path).eval()
        pick_torch_threads(torch, torch_model, prompts(probe[0], model.cfg.vocab_size), probe[1])
    rows = []
    for batch, new, prompt_len in cases:
        ids = prompts(batch, model.cfg.vocab_size, prompt_len)
        compile_s = seconds(lambda: ours(*single, ids, 1, 0, max_len_bucket=new))
        ours(*spread, ids, 1, 0, max_len_bucket=new, mesh=mesh)
        if torch_model is not None:
            transformers_generate(torch, torch_model, ids, 4, 0)
        t_one, t_all, t_hf = [], [], []
        for r in range(repeats):
            t_one.append(seconds(lambda: ours(*single, ids, new, r + 1)))
            t_all.append(seconds(lambda: ours(*spread, ids, new, r + 1, mesh=mesh)))
            if torch_model is not None:
                t_hf.append(
                    seconds(lambda: transformers_generate(torch, torch_model, ids, new, r + 1))
                )
        one, spread_tps = batch * new / min(t_one), batch * new / min(t_all)
        hf_tps = batch * new / min(t_hf) if t_hf else float("nan")
        rows.append([batch, new, prompt_len, f"{one:,.0f}", f"{spread_tps:,.0f}", f"{hf_tps:,.0f}",
                     f"{one / hf_tps:.2f}x", f"{spread_tps / hf_tps:.2f}x", f"{compile_s:.1f}"])
        print(f"  B={batch} new={new} prompt={prompt_len}: ours {one:,.0f} / "
              f"{spread_tps:,.0f} tok/s (1 / {mesh.size} devices), "
              f"transformers {hf_tps:,.0f} tok/s", file=sys.stderr, flush=True)
    table(
        f"1. generation tokens/s, tiny model (float32), G={GROUP_SIZE}, best of {repeats}",
        [
            "B", "new tokens", "prompt", "grpo_jax 1 device", f"grpo_jax {mesh.size} devices",
            "transformers", "ratio 1 dev", f"ratio {mesh.size} dev", "compile s (first call)",
        ],
        rows,
    )


def logp_errors(teacher_graphdef, teacher_state, rollout):
    """max and mean |Rollout.logp - the teacher's forward log-prob| over the generated tokens."""
    @jax.jit
    def forced(state, rollout):
        s = rollout.prompt_tokens.shape[1]
        tokens = jnp.concatenate([rollout.prompt_tokens, rollout.tokens], axis=1)
        mask = jnp.concatenate([rollout.prompt_mask, rollout.mask], axis=1)
        logits = nnx.merge(teacher_graphdef, state)(tokens, attention_mask=mask)[:, s - 1 : -1]
        return token_logprobs(logits, rollout.tokens)

    diff = np.abs(np.asarray(forced(teacher_state, rollout)) - np.asarray(rollout.logp))
    m = np.asarray(rollout.mask, bool)
    return diff[m].max(), diff[m].mean()


def bench_logp(path, batch, new):
    loaded = {
        dtype: nnx.split(models.from_pretrained(path, dtype=dtype)[0])
        for dtype in ("float32", "bfloat16")
    }
    rows = []
    for dtype, teacher in (
        ("float32", "float32"), ("bfloat16", "bfloat16"), ("bfloat16", "float32"),
    ):
        rollout = ours(*loaded[dtype], prompts(batch, 512), new, 0)
        max_err, mean_err = logp_errors(*loaded[teacher], rollout)
        rows.append([dtype, f"{teacher} forward", f"{max_err:.2e}", f"{mean_err:.2e}"])
    table(
        f"2. |sampler logp - teacher-forced logp| over {batch * new:,} generated tokens "
        f"(B={batch}, {new} new tokens, float32 weights)",
        ["sampler compute dtype", "teacher", "max abs", "mean abs"],
        rows,
    )


def layouts_attention_ms(batch, slots, cfg, steps=8):
    """ms per decode step of one layer's attention, old cache layout vs the model's.

    Each version runs `steps` steps of a `fori_loop` that writes one new key and value
    into the cache and attends one query over all `slots` (the sampler's pattern: a
    standalone call, its cache hot in memory, times differently).
    """
    k, g, h = cfg.n_kv_heads, cfg.n_heads // cfg.n_kv_heads, cfg.head_dim
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((batch, k * g * h)), jnp.float32)
    mask = jnp.ones((batch, 1, slots), bool)

    def old_attention(q, k_cache, v_cache):   # keys and values [B, K, L, H]
        groups = q.reshape(batch, 1, k, g, h)
        scores = jnp.einsum("bskgh,bklh->bkgsl", groups, k_cache) * h**-0.5
        scores = jnp.where(mask[:, None, None], scores, jnp.finfo(jnp.float32).min)
        return jnp.einsum("bkgsl,bklh->bskgh", jax.nn.softmax(scores, axis=-1), v_cache)

    def run(attend, k_shape, k_start):
        @jax.jit
        def loop(k_cache, v_cache, x):
            def step(i, carry):
                k_cache, v_cache, x = carry
                at = slots - steps + i
                k_new = x[:, : k * h].reshape(batch, k, 1, h).reshape(k_shape(1))
                v_new = x[:, k * h : 2 * k * h].reshape(batch, k, 1, h)
                k_cache = jax.lax.dynamic_update_slice(k_cache, k_new, k_start(at))
                v_cache = jax.lax.dynamic_update_slice(v_cache, v_new, (0, 0, at, 0))
                out = attend(x.reshape(batch, 1, k * g, h), k_cache, v_cache)
                return k_cache, v_cache, jnp.tanh(out.reshape(batch, -1))
            return jax.lax.fori_loop(0, steps, step, (k_cache, v_cache, x))

        args = (jnp.zeros(k_shape(slots)), jnp.zeros((batch, k, slots, h)), x)
        jax.block_until_ready(loop(*args))
        return (
            min(seconds(lambda: jax.block_until_ready(loop(*args))) for _ in range(3)) / steps * 1e3
        )

    old_ms = run(old_attention, lambda n: (batch, k, n, h), lambda at: (0, 0, at, 0))
    new_ms = run(lambda q, k_t, v: layers.grouped_attention(q, k_t, v, mask, scale=h**-0.5),
                 lambda n: (batch, k, h, n), lambda at: (0, 0, 0, at))
    return old_ms, new_ms


def bench_attention(path, batch, slots_list):
    cfg = models.load_config(path)
    rows = []
    for slots in slots_list:
        old_ms, new_ms = layouts_attention_ms(batch, slots, cfg)
        rows.append([batch, slots, f"{old_ms:.2f}", f"{new_ms:.2f}", f"{old_ms / new_ms:.1f}x"])
    table(
        f"3. decode attention of one layer, one device (ms per step, 1 query token, "
        f"K={cfg.n_kv_heads} kv heads x G={cfg.n_heads // cfg.n_kv_heads}, H={cfg.head_dim}); "
        f"the model runs {cfg.n_layers} per step",
        [
            "B", "cache slots", "k, v [B,K,L,H] einsums (before)",
            "k [B,K,H,L], v [B,K,L,H] (model)", "ratio",
        ],
        rows,
    )


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="tiny shapes, 1 repeat (a smoke test)")
    parser.add_argument(
        "--tables", default="tiny", help="comma-separated: tiny (tables 1-3), vocab (4), step (5)"
    )
    parser.add_argument(
        "--smollm2",
        help="SmolLM2-135M-Instruct as a Hugging Face safetensors directory (tables 4, 5)",
    )
    parser.add_argument("--batches", default="16,64,256", help="batch sizes of table 4")
    parser.add_argument("--dtypes", default="float32,bfloat16", help="dtypes of table 4")
    parser.add_argument("--models", default="smollm2,random", help="models of tables 4 and 5")
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parser.parse_args(argv)
    tables = set(args.tables.split(","))
    if tables - {"tiny", "vocab", "step"}:
        parser.error(f"--tables takes tiny, vocab, step; got {args.tables}")
    repeats = 1 if args.quick else args.repeats
    probe = QUICK_PROBE if args.quick else PROBE
    header(argv)
    if "tiny" in tables:
        with tempfile.TemporaryDirectory() as path:
            models.save_pretrained(models.init_model(models.get_model_config("tiny"), seed=0), path)
            bench_throughput(path, QUICK_CASES if args.quick else CASES, repeats, probe)
            bench_logp(path, 16, 16 if args.quick else 128)
            bench_attention(path, 16 if args.quick else 256, (64,) if args.quick else (96, 544))
    if tables & {"vocab", "step"}:
        import bench_sampler_vocab as vocab   # the real-vocabulary tables, beside this file

        with tempfile.TemporaryDirectory() as path:
            vocab_size = 4096 if args.quick else vocab.QWEN3_VOCAB   # --quick: a small stand-in
            vocab.save_random_model(path, vocab_size=vocab_size)
            named = {
                "smollm2": ("SmolLM2-135M", args.smollm2),
                "random": (f"random, V={vocab_size:,}", path),
            }
            if not args.smollm2:
                print("# no --smollm2 directory: SmolLM2 rows skipped\n")
                del named["smollm2"]
            chosen = [named[m] for m in args.models.split(",") if m in named]
            if "vocab" in tables:
                batches = [16] if args.quick else [int(b) for b in args.batches.split(",")]
                dtypes = ["float32"] if args.quick else args.dtypes.split(",")
                # --quick: the nucleus alone (the table's subject; no cut and top-k are other
                # values of the same knobs), each model still a row
                methods = [m for m in vocab.METHODS if m[0] == "top-p 0.95"] if args.quick else None
                vocab.bench_real_vocab(chosen, batches, dtypes, 4 if args.quick else 64, repeats,
                                       methods or vocab.METHODS, probe)
            if "step" in tables:
                vocab.bench_sampling_step(chosen, 8 if args.quick else 64, repeats)


if __name__ == "__main__":
    main()
