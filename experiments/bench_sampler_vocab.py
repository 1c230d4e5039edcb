"""Tables 4 and 5 of experiments/bench_sampler.py (see its docstring): sampling at real
vocabulary sizes, beside transformers' generate, and the cost of each way of finding a cut."""

import dataclasses
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx, struct

from _bench_common import (GROUP_SIZE, PROBE, ours, pick_torch_threads, prompts, seconds, table,
                           torch_or_none, transformers_generate)
from grpo_jax import models, parallel, sampling

QWEN3_VOCAB = 151_936
METHODS = [
    ("top-p 1.0", dict(top_p=1.0)), ("top-p 0.95", dict(top_p=0.95)), ("top-k 50", dict(top_k=50)),
]
QUESTIONS = [
    "What is 17 times 23? Think step by step.", "Write a short poem about the sea.",
    "Explain photosynthesis to a child.", "Give me three tips for learning to cook.",
    "Why is the sky blue?", "Summarise the plot of Hamlet in two sentences.",
    "Janet has 3 apples and buys 5 more. How many does she have?",
    "Write a Python function that reverses a string.",
]


def save_random_model(path, *, vocab_size):
    """The named "tiny" model (qwen3, D = 128, 3 layers) with `vocab_size` tokens, random, saved."""
    cfg = dataclasses.replace(models.get_model_config("tiny"), vocab_size=vocab_size)
    models.save_pretrained(models.init_model(cfg, seed=0), path)


def batch_prompts(tokenizer, batch, vocab_size):
    """`(ids [B/G, S], mask, pad id)`: chat-formatted questions left-padded to a bucket when
    there is a tokenizer, else random ids."""
    if tokenizer is None:
        ids = prompts(batch, vocab_size)
        return ids, np.ones_like(ids), 0
    texts = [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]}],
            add_generation_prompt=True, tokenize=False,
        )
        for i in range(batch // GROUP_SIZE)
    ]
    pad_id = (
        tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    )
    ids, mask = sampling.pad_prompts(
        tokenizer(texts, add_special_tokens=False)["input_ids"], pad_id=pad_id
    )
    return ids, mask, pad_id


def load(path, dtype, mesh):
    """Both libraries' copies of the model in `dtype` (weights and compute), and the tokenizer."""
    model, tokenizer = models.from_pretrained(
        path, mesh=mesh, rules="sampling", dtype=dtype, param_dtype=dtype
    )
    torch = torch_or_none()
    torch_model = None
    if torch is not None:
        import transformers

        torch_model = transformers.AutoModelForCausalLM.from_pretrained(
            path, dtype=getattr(torch, dtype)
        ).eval()
    return nnx.split(model), tokenizer, torch, torch_model


def wall_and_cpu_seconds(fn):
    """`(wall, CPU)` seconds of `fn()`; CPU time is this process's, all threads."""
    wall, cpu = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - wall, time.process_time() - cpu


def bench_real_vocab(
    named_paths, batches, dtypes, new_tokens, repeats, methods=METHODS, probe=PROBE
):
    """Table 4: tokens/s of grpo_jax (one device per core) and transformers per model,
    dtype, B and method (of `methods`); within a round the two run back to back. The CPU-time ratio
    (transformers' CPU seconds over ours, of the fastest rounds) is the work each does,
    which other processes on the machine disturb less than wall time."""
    mesh = parallel.make_mesh([("data", -1), ("tensor", 1)])
    rows = []
    for name, path in named_paths:
        for dtype in dtypes:
            (graphdef, state), tokenizer, torch, torch_model = load(path, dtype, mesh)
            vocab_size = models.load_config(path).vocab_size
            if torch_model is not None and dtype == "float32":
                pick_torch_threads(
                    torch, torch_model, batch_prompts(tokenizer, probe[0], vocab_size)[0], probe[1]
                )
            for batch in batches:
                ids, mask, pad_id = batch_prompts(tokenizer, batch, vocab_size)
                for label, knobs in methods:
                    method = sampling.make_method(temperature=1.0, **knobs)

                    def run_ours(new, seed):
                        return ours(
                            graphdef, state, ids, new, seed, max_len_bucket=new_tokens, mesh=mesh,
                            method=method, mask=mask, pad_id=pad_id,
                        )

                    def run_hf(new, seed):
                        return transformers_generate(
                            torch, torch_model, ids, new, seed, mask=mask, pad_id=pad_id,
                            **{"top_p": 1.0, "top_k": 0, **knobs},
                        )

                    compile_s = seconds(lambda: run_ours(1, 0))
                    if torch_model is not None:
                        run_hf(4, 0)
                    t_ours, t_hf = [], []   # (wall, CPU) seconds of each round
                    for r in range(repeats):
                        t_ours.append(wall_and_cpu_seconds(lambda: run_ours(new_tokens, r + 1)))
                        if torch_model is not None:
                            t_hf.append(wall_and_cpu_seconds(lambda: run_hf(new_tokens, r + 1)))
                    (ours_s, ours_cpu), (hf_s, hf_cpu) = (
                        min(t_ours), min(t_hf, default=(np.nan, np.nan)),
                    )
                    ours_tps, hf_tps = batch * new_tokens / ours_s, batch * new_tokens / hf_s
                    rows.append(
                        [
                            name, dtype, batch, label, f"{ours_tps:,.0f}", f"{hf_tps:,.0f}",
                            f"{ours_tps / hf_tps:.2f}x", f"{hf_cpu / ours_cpu:.2f}x",
                            f"{compile_s:.1f}",
                        ]
                    )
                    print(f"  {name} {dtype} B={batch} {label}: ours {ours_tps:,.0f} tok/s "
                          f"({ours_cpu:.1f} CPU s), transformers {hf_tps:,.0f} tok/s "
                          f"({hf_cpu:.1f} CPU s)", file=sys.stderr, flush=True)
    table(
        f"4. generation tokens/s at real vocabulary sizes, G={GROUP_SIZE}, {new_tokens} new "
        f"tokens, temperature 1, grpo_jax on {mesh.size} devices, best of {repeats}",
        ["model", "dtype", "B", "method", f"grpo_jax {mesh.size} dev", "transformers", "ratio",
         "CPU-time ratio", "compile s"],
        rows,
    )


@struct.dataclass
class FullSortTopP:
    """Top-p by a full sort of the vocabulary and a cumulative sum (the baseline)."""

    p: float
    temperature: float = 1.0

    def cut(self, q_bv):
        sorted_bv = -jnp.sort(-q_bv, axis=-1)
        mass_before_bv = jnp.cumsum(sorted_bv, axis=-1) - sorted_bv
        floor_b = jnp.min(jnp.where(mass_before_bv < self.p, sorted_bv, jnp.inf), axis=-1)
        return floor_b, jnp.zeros((q_bv.shape[0], 0), jnp.int32)


def next_token_logits(path, batch, sampled=32):
    """`[B, V]` float32 logits in mid-completion: after each chat prompt (or random prompt)
    and `sampled` tokens drawn at temperature 1, one forward pass."""
    model, tokenizer = models.from_pretrained(path)
    ids, mask, pad_id = batch_prompts(tokenizer, batch, model.cfg.vocab_size)
    graphdef, state = nnx.split(model)
    r = ours(graphdef, state, ids, sampled, 0, mask=mask, pad_id=pad_id)
    tokens = jnp.concatenate([r.prompt_tokens, r.tokens[:, :sampled]], axis=1)
    full_mask = jnp.concatenate([r.prompt_mask, r.mask[:, :sampled]], axis=1)
    last_hidden = jax.jit(lambda t, m: model.hidden_states(t, attention_mask=m)[0][:, -1])(
        tokens, full_mask
    )
    return model.logits(last_hidden)


def bench_sampling_step(named_paths, batch, repeats):
    """Table 5: ms per `sampling.sample` call on one device, per way of finding the cut."""
    ways = [
        ("no cut: Temperature (make_method(top_p=1.0))", sampling.Temperature(1.0)),
        ("top-p 0.95, full sort of the vocabulary", FullSortTopP(0.95)),
        (
            "top-p 0.95, exact bisection only (TopP max_candidates=1)",
            sampling.TopP(0.95, max_candidates=1),
        ),
        ("top-p 0.95, TopP as built (64 candidates, bisection if larger)", sampling.TopP(0.95)),
        ("top-p 0.95, TopP with 256 candidates", sampling.TopP(0.95, max_candidates=256)),
        ("top-k 50, TopK (lax.top_k of 64)", sampling.TopK(50)),
    ]
    draw = jax.jit(lambda method, logits: sampling.sample(method, jax.random.key(0), logits))
    primitives = [
        ("lax.top_k(logits, 64) alone", jax.jit(lambda z: jax.lax.top_k(z, min(64, z.shape[-1])))),
        (
            "lax.approx_max_k(logits, 64) alone",
            jax.jit(lambda z: jax.lax.approx_max_k(z, min(64, z.shape[-1]))),
        ),
    ]
    rows, notes = [], []
    for name, path in named_paths:
        logits = next_token_logits(path, batch)
        q = jnp.exp(sampling.Temperature(1.0).log_probs(logits))
        floor, _ = jax.jit(FullSortTopP(0.95).cut)(q)
        nucleus = np.asarray(jnp.sum(q >= floor[:, None], axis=-1))
        notes.append(f"# {name}: the 0.95 nucleus has a median of {np.median(nucleus):.0f} "
                     f"tokens (max {nucleus.max()}); {np.mean(nucleus < 64):.0%} of the rows "
                     "resolve within 64 candidates")
        timings = [(label, lambda m=method: draw(m, logits)) for label, method in ways]
        timings += [(label, lambda f=fn: f(logits)) for label, fn in primitives]
        for label, fn in timings:
            jax.block_until_ready(fn())
            ms = min(seconds(lambda: jax.block_until_ready(fn())) for _ in range(3 * repeats)) * 1e3
            rows.append([name, f"{logits.shape[-1]:,}", label, f"{ms:.1f}"])
    table(f"5. one sampling step, B={batch}, one device, logits after 32 sampled tokens "
          f"(ms per call, best of {3 * repeats})", ["logits of", "V", "cut", "ms"], rows)
    print("\n".join(notes) + "\n")
