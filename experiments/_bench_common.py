"""What experiments/bench_sampler.py and its real-vocabulary tables (bench_sampler_vocab.py)
share: the prompts, one timed `generate` call of each library, the torch thread probe and
the table printer. Import it once `sys.path` holds the checkout (bench_sampler.py puts it there)."""

import contextlib
import time

import jax
import numpy as np

from grpo_jax import sampling

GROUP_SIZE = 8
PROMPT_LEN = 32
# (B, new tokens) of the torch thread probe (`pick_torch_threads`), and of --quick's
PROBE, QUICK_PROBE = (64, 32), (16, 4)


def torch_or_none():
    """The torch module, or None when it is not installed."""
    try:
        import torch
        return torch
    except ImportError:
        return None


def table(title, columns, rows):
    print(title)
    widths = [max(len(str(x)) for x in col) for col in zip(columns, *rows)]
    for cells in [columns, ["-" * w for w in widths], *rows]:
        print(
            "  ".join(
                str(c).rjust(w) if i else str(c).ljust(w)
                for i, (c, w) in enumerate(zip(cells, widths))
            )
        )
    print()


def prompts(batch, vocab_size, length=PROMPT_LEN):
    """`[B/G, length]` random prompt ids (no padding)."""
    rng = np.random.default_rng(0)
    return rng.integers(0, vocab_size, size=(batch // GROUP_SIZE, length)).astype(np.int32)


def ours(
    graphdef, state, ids, new_tokens, seed, max_len_bucket=None, mesh=None,
    method=sampling.Temperature(1.0), mask=None, pad_id=0,
):
    """One `generate` call, under `mesh` when given (rows split over its "data" axis)."""
    mask = np.ones_like(ids) if mask is None else mask
    with jax.set_mesh(mesh) if mesh is not None else contextlib.nullcontext():
        rollout = sampling.generate(
            graphdef, state, ids, mask, rng=jax.random.key(seed), method=method,
            group_size=GROUP_SIZE, max_new_tokens=new_tokens, stop_tokens=[], pad_id=pad_id,
            max_len_bucket=max_len_bucket,
        )
        jax.block_until_ready(rollout)
    assert int(rollout.lengths.min()) == new_tokens
    return rollout


def transformers_generate(
    torch, torch_model, ids, new_tokens, seed, mask=None, top_p=1.0, top_k=0, pad_id=0, device="cpu"
):
    """transformers' sampling (temperature 1, then top-k / top-p when set), forced to
    `new_tokens`; the prompts go to `device`, the model's."""
    torch.manual_seed(seed)
    mask = np.ones_like(ids) if mask is None else mask
    with torch.no_grad():
        out = torch_model.generate(
            input_ids=torch.tensor(ids, device=device).long(),
            attention_mask=torch.tensor(mask, device=device).long(),
            do_sample=True, temperature=1.0, top_k=top_k, top_p=top_p,
            num_return_sequences=GROUP_SIZE, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
            pad_token_id=pad_id,
        )
    assert out.shape == (ids.shape[0] * GROUP_SIZE, ids.shape[1] + new_tokens)
    return out


def pick_torch_threads(torch, torch_model, ids, new_tokens):
    """Sets torch to the faster of 1 and 2 threads on a short generate (`ids` x G rows,
    `new_tokens` each), and says so."""
    rates = {}
    for threads in (1, 2):
        torch.set_num_threads(threads)
        transformers_generate(torch, torch_model, ids, 4, 0)
        rates[threads] = ids.shape[0] * GROUP_SIZE * new_tokens / seconds(
            lambda: transformers_generate(torch, torch_model, ids, new_tokens, 0))
    best = max(rates, key=rates.get)
    torch.set_num_threads(best)
    print(
        f"# torch threads: {best} (probe, B={ids.shape[0] * GROUP_SIZE}, {new_tokens} new tokens: "
        + ", ".join(f"{t} thread(s) {r:,.0f} tok/s" for t, r in rates.items())
        + ")\n"
    )


def seconds(fn):
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start
