"""Continuous batching against the static batch on a long-tailed length distribution.

    python experiments/bench_engine.py                  # V = 151,936 (Qwen3's), 512-token budget
    python experiments/bench_engine.py --quick          # V = 4,096, 128-token budget, 1 repeat
    python experiments/bench_engine.py --smollm2 DIR    # SmolLM2-135M-Instruct, its own answers

The model is the named "tiny" config (qwen3, D = 128, 3 layers, float32) with Qwen3's
vocabulary, randomly initialised. P prompts of 32 random tokens x G completions, ancestral
sampling at temperature 1, no stop token: every row is cut at its own budget
(`generate(max_new_tokens=[P*G])`), drawn from a lognormal (sigma 0.8: p99 / mean ~ 4.7,
the long tail of reasoning answers) with its p99 at the budget and capped there. Useful
tokens/s = the rows' tokens (sum of lengths) / wall time of the whole request, prefill
included; the best of --repeats rounds (the machine is shared).

Ways of serving the same P*G rows with at most C rows decoding at once (2C for the last):
static in batches of C rows (each batch runs until its longest row: the memory of C rows,
today's sampler called B/C times), static with every row at once (B rows of memory), and
continuous batching in C slots (`generate(slots=C)`: a stopped row's slot takes the next
pending row; once none is pending, the tail narrows to C/2 and C/4 slots); then the same
over a paged KV cache (`generate(slots=C, kv_page_size=--page)`, docs/sampling.md), at C
slots with a pool for every slot's budget and at 2C slots with a pool of the contiguous C
slots' KV bytes (rows wait for pages instead of slots). The KV MiB column is computed from
the shapes: allocated, and in use at the peak (the paged pool's prompt pages plus the
most completion pages held, `PagedStats.peak_pages`). Each prints its
decode steps (loop iterations; for the engine, replayed from the rows' lengths, with the
steps' total slots in units of C, its work) and tokens/s, and the share
of rows whose tokens equal the static batches' token for token: each row has its own
random stream, so the rows differ only where a batch shape's float rounding of the
logits moves a draw across a token boundary (then the row continues differently).

With --smollm2 DIR (SmolLM2-135M-Instruct converted to a Hugging Face directory:
docs/models.md), the rows are the model's own answers to P arithmetic word problems in
its chat template, sampled at temperature 1 (or --temperature) until its end-of-turn token
or the 512-token budget: the length distribution is the model's, not drawn.
"""

import argparse
import platform
import time

import jax
import numpy as np
from flax import nnx

from grpo_jax import models, parallel, sampling
from grpo_jax.sampling import _paged

parallel.use_cpu_cores()   # before JAX runs anything; a no-op when XLA_FLAGS sets the count


def lognormal_lengths(rows, budget, rng, sigma=0.8):
    """`[rows]` ints in [1, budget] whose p99 is the budget: exp(N(mu, sigma)), capped."""
    mu = np.log(budget) - 2.326 * sigma
    return np.clip(np.round(np.exp(rng.normal(mu, sigma, rows))), 1, budget).astype(np.int32)


def serve(model, prompts, mask, lengths, *, group_size, budget, slots, chunk, stop_tokens=(),
          temperature=1.0, kv_page_size=0, kv_pages=0):
    """One request of every row, each cut at its `lengths` (an int: the budget for every
    row) or at a stop token; returns (tokens, lengths on host, wall seconds, the most
    completion pages in use or None)."""
    lengths = np.broadcast_to(lengths, (prompts.shape[0] * group_size,))
    kwargs = dict(rng=jax.random.key(0), method=sampling.Temperature(temperature),
                  stop_tokens=list(stop_tokens), pad_id=0, max_len_bucket=budget,
                  group_size=group_size)
    start = time.perf_counter()
    if chunk:   # static, C rows (C / G prompts) per call
        per_call = chunk // group_size
        parts = []
        for first in range(0, prompts.shape[0], per_call):
            rows = slice(first * group_size, (first + per_call) * group_size)
            parts.append(
                sampling.generate(
                    *model, prompts[first : first + per_call], mask[first : first + per_call],
                    max_new_tokens=lengths[rows], prompt_ids=np.arange(first, first + per_call),
                    **kwargs,
                )
            )
        rollouts = jax.block_until_ready(parts)
    else:
        paging = dict(kv_page_size=kv_page_size, kv_pages=kv_pages,
                      with_page_stats=True) if kv_page_size else {}
        out = jax.block_until_ready(sampling.generate(
            *model, prompts, mask, max_new_tokens=lengths, slots=slots, **paging, **kwargs))
        rollouts, stats = ([out[0]], out[1]) if kv_page_size else ([out], None)
    seconds = time.perf_counter() - start
    peak = None if chunk or not kv_page_size else int(stats.peak_pages)
    tokens = np.concatenate([np.asarray(r.tokens) for r in rollouts])
    return tokens, np.concatenate([np.asarray(r.lengths) for r in rollouts]), seconds, peak


def kv_bytes(cfg, columns):
    """KV cache bytes of `columns` token columns over every layer (keys and values)."""
    return 2 * cfg.n_layers * cfg.n_kv_heads * cfg.head_dim * columns * np.dtype(cfg.dtype).itemsize


def engine_schedule(lengths, slots, ways=1):
    """`(decode steps, slot-steps)` of `generate(slots=C)` on rows of these `lengths`,
    replayed on the host: admission in row order, a stopped row's slot refilled at the end
    of the step, and once nothing is pending the tail narrowing to each of
    `sampling.tail_widths` when the live rows fit (slot-steps: the slots every step
    decoded, the work done)."""
    pending, widths = list(lengths), sampling.tail_widths(slots, ways)
    left = [pending.pop(0) if pending else 0 for _ in range(slots)]
    steps = slot_steps = 0
    width = widths.pop(0)
    while any(left):
        while not pending and widths and sum(x > 0 for x in left) <= widths[0]:
            width = widths.pop(0)
        steps, slot_steps = steps + 1, slot_steps + width
        left = [x - 1 if x else 0 for x in left]
        left = [x if x or not pending else pending.pop(0) for x in left]
    return steps, slot_steps


def word_problems(count, rng):
    """`count` two-step arithmetic word problems (the answers run from a line to a page)."""
    names, things = ("Ana", "Ben", "Chen", "Dara"), ("apples", "books", "coins", "stamps")
    return [f"{names[i % 4]} has {rng.integers(12, 99)} {things[i % 4]}, buys "
            f"{rng.integers(3, 40)} more and gives away {rng.integers(2, 11)}. How many "
            f"{things[i % 4]} are left? Explain your reasoning." for i in range(count)]


def smollm2_requests(path, count, rng):
    """`(model (graphdef, state), prompts [P, S], mask, stop ids, description)` for
    SmolLM2's own answers to `count` word problems in its chat template."""
    model, tokenizer = models.from_pretrained(path)
    ids = [tokenizer.apply_chat_template([{"role": "user", "content": text}],
                                         add_generation_prompt=True, tokenize=True)
           for text in word_problems(count, rng)]
    ids = [x["input_ids"] if hasattr(x, "keys") else x for x in ids]
    prompts, mask = sampling.pad_prompts(ids, pad_id=tokenizer.pad_token_id or 0)
    stops = sorted({tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("<|im_end|>")})
    return nnx.split(model), prompts, mask, stops, f"SmolLM2-135M-Instruct ({path}), float32"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="V = 4,096, 128 tokens, 1 repeat")
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--group_size", type=int, default=8)
    parser.add_argument("--slots", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--page", type=int, default=16, help="kv_page_size of the paged rows")
    parser.add_argument("--smollm2", help="SmolLM2-135M-Instruct as a Hugging Face directory: "
                                          "its own answers instead of drawn lengths")
    args = parser.parse_args(argv)
    vocab, budget = (4096, 128) if args.quick else (151_936, 512)
    repeats = 1 if args.quick else args.repeats
    p, g, c = args.prompts, args.group_size, args.slots
    rng = np.random.default_rng(0)
    if args.smollm2:   # the model's own answers: every row may run to the budget
        model, prompts, mask, stops, name = smollm2_requests(args.smollm2, p, rng)
        lengths, warm_lengths = budget, 2
    else:
        lengths = lognormal_lengths(p * g, budget, rng)
        prompts = rng.integers(1, vocab, (p, 32)).astype(np.int32)
        mask, stops, warm_lengths = np.ones_like(prompts), (), np.minimum(lengths, 2)
        cfg = models.get_model_config("tiny", vocab_size=vocab)
        model = nnx.split(models.init_model(cfg, seed=0))
        name = f"tiny model with V = {vocab:,}, float32"
    print(f"{platform.processor() or platform.machine()}, {len(jax.devices())} CPU device(s), "
          f"jax {jax.__version__}; {name}; temperature {args.temperature}; {p} prompts of "
          f"{prompts.shape[1]} columns x G = {g}",
          flush=True)
    cfg, page, s = nnx.merge(*model).cfg, args.page, prompts.shape[1]
    # The engine: the P prompts' prefill, and its slots' S + N columns each.
    contiguous_columns = p * s + c * (s + budget)
    prompt_columns = p * -(-s // page) * page
    # The pool with the contiguous engine's KV bytes (less the prompts' pages and the trash
    # page), for 2C slots: rows wait for pages (or are preempted) instead of for slots.
    same_bytes = (contiguous_columns - prompt_columns) // page - 1
    ways = [("static, batches of C rows", dict(slots=0, chunk=c)),
            ("static, every row at once", dict(slots=0, chunk=0)),
            ("continuous, C slots", dict(slots=c, chunk=0)),
            (f"paged ({page}-token pages), C slots",
             dict(slots=c, chunk=0, kv_page_size=page, kv_pages=0)),
            (f"paged ({page}-token pages), 2C slots in the C slots' KV bytes",
             dict(slots=2 * c, chunk=0, kv_page_size=page, kv_pages=same_bytes))]
    results, reference = [], None
    for how_name, how in ways:
        serve(model, prompts, mask, warm_lengths, group_size=g, budget=budget, stop_tokens=stops,
              temperature=args.temperature, **how)   # compile
        best = np.inf
        for _ in range(repeats):
            tokens, got_lengths, seconds, peak = serve(
                model, prompts, mask, lengths, group_size=g, budget=budget, stop_tokens=stops,
                temperature=args.temperature, **how)
            best = min(best, seconds)
        if how.get("kv_page_size"):   # the pool allocated, and the pages in use at the peak
            pool = prompt_columns + (_pool(how, budget) + 1) * page
            memory = (kv_bytes(cfg, pool), kv_bytes(cfg, prompt_columns + peak * page))
        elif how["slots"]:
            memory = (kv_bytes(cfg, contiguous_columns),) * 2
        else:   # the static sampler: each prompt once, every row of a call N columns
            rows = how["chunk"] or p * g
            memory = (kv_bytes(cfg, rows // g * s + rows * budget),) * 2
        if reference is None:
            reference = tokens
            print(f"{p * g} rows: lengths mean {got_lengths.mean():.1f}, p99 "
                  f"{np.percentile(got_lengths, 99):.0f}, max {got_lengths.max()}, p99/mean "
                  f"{np.percentile(got_lengths, 99) / got_lengths.mean():.1f}; "
                  f"{got_lengths.sum():,} useful tokens (of the static batches)", flush=True)
        same = float(np.mean(np.all(tokens == reference, axis=1)))
        steps = {"static, batches of C rows": sum(int(got_lengths[i:i + c].max())
                                                  for i in range(0, p * g, c)),
                 "static, every row at once": int(got_lengths.max())}.get(how_name)
        if how.get("kv_page_size"):   # waits for pages: no host replay of its schedule
            steps = "-"
        elif steps is None:   # the engine: its schedule replayed from the rows' lengths
            steps, slot_steps = engine_schedule(got_lengths.tolist(), c)
            steps = f"{steps} ({slot_steps / c:.0f} at C slots' cost)"
        print(f"{how_name}: {best:.2f} s, {got_lengths.sum():,} tokens, {same:.1%} of rows token "
              "for token the static batches'", flush=True)
        rows = how["chunk"] or how["slots"] or p * g
        results.append((how_name, rows, steps, best, same, int(got_lengths.sum()), memory))
    static = results[0][3]
    print(f"\nuseful generated tokens/s, C = {c}, best of {repeats}; KV MiB: allocated / in use "
          "at the peak (paged: the pool, and the prompts' plus the most completion pages held)\n")
    print("| serving | concurrent rows | decode steps | seconds | tokens/s | vs static batches "
          "| rows equal to static batches' | KV MiB |")
    print("|---|---|---|---|---|---|---|---|")
    for name, rows, steps, seconds, same, useful, (held, used) in results:
        print(f"| {name} | {rows} | {steps} | {seconds:.2f} | {useful / seconds:,.0f} | "
              f"{(useful / seconds) / (results[0][5] / static):.2f}x | {same:.1%} | "
              f"{held / 2**20:.1f} / {used / 2**20:.1f} |")


def _pool(how, budget):
    """The completion pages of a paged way's pool."""
    return _paged.pool_pages(how["slots"], budget, how["kv_page_size"], how["kv_pages"])


if __name__ == "__main__":
    main()
