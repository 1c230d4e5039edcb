"""Decode KV bytes per chip, and the slots that fit, for the contiguous and the paged engine.

Arithmetic from the shapes, not compiler output (the fit report compiles the decode program
beside it). A token column of one row holds keys and values of every layer:
``b = 2 x layers x kv_heads x head_dim x dtype bytes``. On a mesh, as the fit report lays
out the contiguous cache (`cache_sharding`), rows split over the row axes and kv
heads over "tensor", each only where it divides (else that dimension is whole on each chip).

- contiguous engine (`rollout.slots` = C): the P prompts' prefilled cache (S columns each)
  and C slots of S + N columns (each slot copies in its row's prompt, then its ring of the
  N = `rollout.max_new_tokens` budget): ``(P S + C (S + N)) b``;
- paged engine (`rollout.kv_page_size` = page): one pool of ``P ceil(S / page)`` prompt
  pages, M completion pages and one trash page, ``(P ceil(S / page) + M + 1) page b``,
  kv heads split as above. The pool lives inside the engine's program and XLA lays it
  out: `pool_ways` = 1 is the pool whole on each chip (what the TPU kernel reads, one
  layer at a time: `models.paged_kernel` runs it over replicated pools), `pool_ways` = the
  row ways is its storage split over the chips. Compiled for v5p:2x2x2 (Qwen3-8B,
  fsdp over 8 chips), the paged call's temporaries grow by 1/8 + 1/12 of the whole pool:
  stored split 8 ways, plus about three of its 36 layers gathered whole at a time
  (docs/tpu.md); the fit report counts the compiled program's pool split.

M is sized from each slot's row length L: ``M = C ceil(L / page)`` (at least one full row,
``ceil(N / page)``, as `sampling._paged.check_pages` asks), with L the budget N (the
default pool) or a quantile of a lognormal length distribution (`lognormal_length`). A pool
sized at a quantile holds every slot's row at that length at once; a longer row takes the
pages shorter ones leave free, and when none are, admission waits or the youngest row is
preempted and re-queued (docs/sampling.md): the engine still runs, at a lower rate.
"""

import dataclasses
import math
import statistics

import jax
import jax.numpy as jnp

from grpo_jax import parallel
from grpo_jax.models import sharding as sharding_lib
from grpo_jax.sampling import _paged

# Phi^-1(0.99): the lognormal's 99th percentile sits z99 standard deviations above mu.
Z99 = statistics.NormalDist().inv_cdf(0.99)


@dataclasses.dataclass(frozen=True)
class KVLayout:
    """One token column's keys and values and how a mesh splits them.

    Attributes:
      column_bytes: b, bytes of one row's token column over every layer (keys and values),
        all chips together.
      head_ways: ways the kv heads split over chips (1 when they do not divide).
      row_ways: ways rows split over chips (a row count that does not divide stays whole).
    """

    column_bytes: int
    head_ways: int = 1
    row_ways: int = 1

    def rows_per_chip(self, rows: int) -> int:
        """Rows one chip holds of `rows` (all of them when they do not divide)."""
        return rows // self.row_ways if rows % self.row_ways == 0 else rows

    @property
    def chip_column_bytes(self) -> int:
        """Bytes one chip holds of one row's token column."""
        return self.column_bytes // self.head_ways


def cache_sharding(x: jax.Array | jax.ShapeDtypeStruct, mesh: jax.sharding.Mesh,
                   stacked: bool) -> jax.NamedSharding:
    """A KV cache array's sharding: rows over the row axes, kv heads over "tensor" (keys and
    values of a scanned model have a leading layer axis)."""
    axes = ("batch",) if x.ndim <= 2 else (None,) * stacked + ("batch", "kv_heads")
    return jax.NamedSharding(mesh, sharding_lib.activation_spec(x.shape, axes, mesh))


def kv_layout(cfg, mesh) -> KVLayout:
    """The `KVLayout` of model `cfg` (a `models.ModelConfig`) on `mesh`: the kv heads'
    split read off the fit report's own cache sharding (`cache_sharding`)."""
    ways = parallel.row_ways(mesh)
    keys = jax.ShapeDtypeStruct((ways, cfg.n_kv_heads, cfg.head_dim, 1), cfg.dtype)
    shard = cache_sharding(keys, mesh, False).shard_shape(keys.shape)
    column = 2 * cfg.n_layers * cfg.n_kv_heads * cfg.head_dim * jnp.dtype(cfg.dtype).itemsize
    return KVLayout(column, head_ways=cfg.n_kv_heads // shard[1], row_ways=ways)


def contiguous_kv_bytes(layout: KVLayout, *, prompts: int, prompt_len: int, slots: int,
                        new_tokens: int) -> int:
    """Per-chip KV bytes of the contiguous engine: ``(P S + C (S + N)) b`` split as
    `layout` says (module docstring).

    Args:
      layout: the `KVLayout`.
      prompts: P, prompts prefilled together.
      prompt_len: S, the prompt bucket.
      slots: C, the engine's slots.
      new_tokens: N, the completion budget (`rollout.max_new_tokens`).
    """
    columns = (layout.rows_per_chip(prompts) * prompt_len
               + layout.rows_per_chip(slots) * (prompt_len + new_tokens))
    return columns * layout.chip_column_bytes


def pool_pages(slots: int, length: int, new_tokens: int, page: int) -> int:
    """M, completion pages for `slots` rows of `length` tokens each (whole pages), at
    least one full row of `new_tokens` (what the engine asks of a pool): the engine's
    `pool_pages` for rows of `length` tokens, held to `check_pages`' minimum."""
    return max(_paged.pool_pages(slots, length, page), _paged.pool_pages(1, new_tokens, page))


def paged_kv_bytes(layout: KVLayout, *, prompts: int, prompt_len: int, pages: int, page: int,
                   pool_ways: int = 1) -> int:
    """Per-chip KV bytes of the paged engine's pool: ``(P ceil(S / page) + M + 1) page b``,
    kv heads split as `layout` says; the pages split `pool_ways` ways (1: whole on each
    chip, as the engine keeps them).

    Args:
      layout: the `KVLayout`.
      prompts: P; prompt_len: S.
      pages: M, the pool's completion pages (`pool_pages`).
      page: tokens per page (`rollout.kv_page_size`).
      pool_ways: ways the pool's pages split over chips (module docstring).
    """
    total = prompts * -(-prompt_len // page) + pages + 1
    return -(-total // pool_ways) * page * layout.chip_column_bytes


def contiguous_slots_that_fit(layout: KVLayout, budget: int, *, prompts: int, prompt_len: int,
                              new_tokens: int) -> int:
    """The most slots C, a multiple of the row ways, whose contiguous KV bytes per chip
    (`contiguous_kv_bytes`) are within `budget` bytes; 0 when none fit."""
    ways = layout.row_ways
    room = budget - contiguous_kv_bytes(layout, prompts=prompts, prompt_len=prompt_len, slots=0,
                                        new_tokens=new_tokens)
    per_group = (prompt_len + new_tokens) * layout.chip_column_bytes   # one slot per chip
    return max(0, room // per_group) * ways


def paged_slots_that_fit(layout: KVLayout, budget: int, *, prompts: int, prompt_len: int,
                         new_tokens: int, page: int, length: int, pool_ways: int = 1) -> int:
    """The most slots C, a multiple of the row ways, whose pool sized for rows of `length`
    tokens (`pool_pages`) is within `budget` bytes per chip (`paged_kv_bytes`); 0 when not
    even one full row's pool fits."""
    ways = layout.row_ways

    def fits(slots):
        pages = pool_pages(slots, length, new_tokens, page)
        return paged_kv_bytes(layout, prompts=prompts, prompt_len=prompt_len, pages=pages,
                              page=page, pool_ways=pool_ways) <= budget

    if not fits(ways):
        return 0
    low, high = 1, 2   # in groups of `ways` slots: fits(low * ways), find the first that does not
    while fits(high * ways):
        low, high = high, high * 2
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (mid, high) if fits(mid * ways) else (low, mid)
    return low * ways


def lognormal_sigma(p99_over_mean: float) -> float:
    """sigma of a lognormal whose p99 / mean is `p99_over_mean` (r): from
    ``r = exp(z99 sigma - sigma^2 / 2)``, the smaller root
    ``sigma = z99 - sqrt(z99^2 - 2 ln r)``; needs 1 < r <= exp(z99^2 / 2) (about 14.97)."""
    largest = math.exp(Z99 ** 2 / 2)
    if not 1 < p99_over_mean <= largest:
        raise ValueError(f"--length_p99_over_mean must be in (1, {largest:.2f}] (a lognormal's "
                         f"p99 / mean), got {p99_over_mean}")
    return Z99 - math.sqrt(Z99 ** 2 - 2 * math.log(p99_over_mean))


def lognormal_length(quantile: float, new_tokens: int, p99_over_mean: float) -> int:
    """The `quantile` of completion lengths L = min(N, exp(X)), X ~ Normal(mu, sigma^2),
    with sigma from the p99 / mean ratio r (`lognormal_sigma`) and mu placing the p99 at the
    budget N (mu = ln N - z99 sigma, so the mean is N / r and 1% of rows reach the budget):
    ``ceil(N exp(sigma (z_q - z99)))``, at most N, at least 1.

    Args:
      quantile: q in (0, 1).
      new_tokens: N, the budget.
      p99_over_mean: r, e.g. 4 for reasoning answers' long tail.
    """
    if not 0 < quantile < 1:
        raise ValueError(f"--length_quantile must be in (0, 1), got {quantile}")
    sigma = lognormal_sigma(p99_over_mean)
    z = statistics.NormalDist().inv_cdf(quantile)
    return max(1, min(new_tokens, math.ceil(new_tokens * math.exp(sigma * (z - Z99)))))


def report(config, cfg, mesh, *, prompt_len: int, budget: int | None, quantiles=(),
           p99_over_mean: float = 4.0) -> dict:
    """The fit report's KV section for a run with ``rollout.slots`` > 0: per-chip KV bytes
    at the run's slots and the slots that fit in `budget` bytes per chip, for the
    contiguous engine and the paged one (pages of ``rollout.kv_page_size``, or 16 tokens
    when it is 0), its pool sized at the budget and at each of `quantiles` of the lognormal
    lengths (`lognormal_length`), whole on each chip and split over the row ways (module
    docstring).

    Returns:
      `{"column_bytes", "head_ways", "row_ways", "budget_bytes", "page", "p99_over_mean",
      "rows": [{"engine", "length", "pool_ways", "pages", "bytes", "slots_that_fit"}],
      "table"}`; ``slots_that_fit`` is None without a budget.
    """
    layout = kv_layout(cfg, mesh)
    p, s = config.rollout.prompts_per_batch, prompt_len
    n, c = config.rollout.max_new_tokens, config.rollout.slots
    page = config.rollout.kv_page_size or 16
    shape = dict(prompts=p, prompt_len=s)
    rows = [{"engine": "contiguous", "length": n, "pool_ways": None, "pages": None,
             "bytes": contiguous_kv_bytes(layout, slots=c, new_tokens=n, **shape),
             "slots_that_fit": None if budget is None else contiguous_slots_that_fit(
                 layout, budget, new_tokens=n, **shape)}]
    lengths = [("budget", n)] + [(f"q{q:g}", lognormal_length(q, n, p99_over_mean))
                                 for q in quantiles]
    for ways in sorted({1, layout.row_ways}):
        for name, length in lengths:
            pages = pool_pages(c, length, n, page)
            fit = None if budget is None else paged_slots_that_fit(
                layout, budget, new_tokens=n, page=page, length=length, pool_ways=ways, **shape)
            rows.append({"engine": f"paged ({name})", "length": length, "pool_ways": ways,
                         "pages": pages, "slots_that_fit": fit,
                         "bytes": paged_kv_bytes(layout, pages=pages, page=page, pool_ways=ways,
                                                 **shape)})
    result = {"column_bytes": layout.column_bytes, "head_ways": layout.head_ways,
              "row_ways": layout.row_ways, "budget_bytes": budget, "page": page,
              "p99_over_mean": p99_over_mean, "slots": c, "rows": rows}
    result["table"] = format_report(result)
    return result


def format_report(result) -> str:
    """The KV section as a markdown table, then what its columns mean."""
    gib = lambda nbytes: f"{nbytes / 2**30:.2f}"
    budget = result["budget_bytes"]
    lines = [f"| engine | row length | pool | completion pages | KV GiB per chip at "
             f"{result['slots']} slots | slots that fit in "
             f"{'?' if budget is None else gib(budget)} GiB |", "|" + "---|" * 6]
    for row in result["rows"]:
        split = f"split {row['pool_ways']} ways"
        pool = {None: "-", 1: "whole on each chip"}.get(row["pool_ways"], split)
        fit = "?" if row["slots_that_fit"] is None else f"{row['slots_that_fit']:,}"
        pages = "-" if row["pages"] is None else f"{row['pages']:,}"
        lines.append(f"| {row['engine']} | {row['length']:,} | {pool} | {pages} | "
                     f"{gib(row['bytes'])} | {fit} |")
    lines.append(
        f"Arithmetic from the shapes, not compiler output (grpo_jax/aot/kv.py): "
        f"{result['column_bytes']:,} bytes per token column (keys and values of every layer), "
        f"kv heads split {result['head_ways']} way(s), rows {result['row_ways']} way(s); pages "
        f"of {result['page']} tokens; a pool holds every slot's row at the row length (budget, "
        f"or quantile q of lognormal lengths with p99 at the budget and p99/mean "
        f"{result['p99_over_mean']:g}), at least one full row, plus the prompts' pages and a "
        f"trash page. Slots that fit: a multiple of the row ways.")
    return "\n".join(lines)
