"""Continuous batching over a paged KV cache: memory follows the tokens in flight.

The contiguous engine (`_engine`) gives each of its C slots S + N cache columns whatever
its row's length, so its KV memory is C (S + N) columns. Here every layer has one pool
of fixed-size pages (`page` tokens each) shared by all slots, as vLLM's PagedAttention
(Kwon et al. 2023, arXiv:2309.06180, sec. 4):

- the P prompts are prefilled once and their keys and values cut into pages (S rounded
  up to whole pages, `Sp` columns); the G completions of a prompt read its pages through
  their page tables and never write them (a completion's first column is `Sp`, on a page
  of its own), so no copy on write is needed. Prompt pages stay for the whole call.
- a slot's completion pages are taken from the pool as its row grows (one when its token
  count reaches a multiple of `page`) and all go back to the pool when the row stops;
- admission waits for free pages: a free slot takes the next pending row only while the
  pool has a page for it beyond those the running rows need at the next step;
- when running rows need more pages than are free, the most recently admitted rows (the
  highest row numbers) are preempted: their pages go back, their outputs are cleared and
  they are re-queued, to start over when admitted again. The oldest row is never
  preempted (the pool holds at least one full row's pages), so every call ends.

A re-run row draws the same tokens: token t of a row is drawn with its own key
(`_generate.row_keys`: rng, prompt id, completion index, position), whatever slot or
schedule decodes it, so paged, contiguous and static samplers give the same rows up to
float rounding in the logits (attention sums over a different column layout).

Attention reads a slot's pages through an XLA gather (`layers.paged_write_and_gather`)
on CPU and GPU, materialising one layer's gathered keys and values at a time. For a TPU
(the traced-for mesh's platform), or anywhere with `model.attention="splash"`
(`models.paged_kernel.selected`), the
pools take the Pallas paged-attention kernel's layout and a slot's own pages are read in
place by the kernel, its prompt's pages through XLA (`models.paged_kernel`). The tail does
not narrow (`_engine`'s `tail_widths`): the pages already free what a stopped row held.
Rows that pause (`Engine`) decode contiguously.
"""

import functools

import jax
import jax.numpy as jnp
from flax import nnx, struct

from grpo_jax.models import KVCache, paged_kernel
from grpo_jax.models.layers import PageIndex
from grpo_jax.sampling._engine import _Slots, _sample_slots, prefill_prompts, rollout_of
from grpo_jax.sampling._generate import _on_mesh, _shard_rows, row_keys

PENDING, RUNNING, DONE = 0, 1, 2   # a row's status


@struct.dataclass
class PagedStats:
    """Counters of a paged call (`generate_paged`), each `[]` int32.

    Attributes:
      pages_taken: completion pages handed out; above the pool's size, pages were freed
        and reused within the call.
      peak_pages: the most completion pages in use at once.
      preemptions: rows preempted (re-queued) for lack of pages.
      admission_waits: steps on which a free slot and a pending row waited for pages.
    """

    pages_taken: jax.Array
    peak_pages: jax.Array
    preemptions: jax.Array
    admission_waits: jax.Array


@struct.dataclass
class _Pages:
    """The page bookkeeping of the loop's carry (M completion pages, C slots)."""

    owner: jax.Array    # [M] int32, the slot holding the page; C when it is free
    table: jax.Array    # [C, Tc] int32, each slot's completion pages (the trash page if none)
    status: jax.Array   # [B] int32, PENDING / RUNNING / DONE
    stats: PagedStats


def pool_pages(num_slots, buffer_len, page_size, kv_pages=0):
    """The completion pages of the pool: `kv_pages`, or 0 for enough for every slot's
    full budget (`num_slots * ceil(buffer_len / page_size)`)."""
    return kv_pages or num_slots * -(-buffer_len // page_size)


def check_pages(num_slots, buffer_len, page_size, kv_pages):
    """Raises ValueError naming the argument unless the paged engine can run."""
    if page_size < 1:
        raise ValueError(f"kv_page_size must be >= 1 (tokens per page), got {page_size}")
    per_row = -(-buffer_len // page_size)
    if kv_pages and kv_pages < per_row:
        raise ValueError(f"kv_pages={kv_pages} cannot hold one full row ({buffer_len} tokens in "
                         f"pages of {page_size}: {per_row} pages); raise kv_pages to >= "
                         f"{per_row}, or 0 for {num_slots * per_row}")


def _prompt_pools(prompt_cache, page, num_free, kernel=False):
    """Page pools holding the P prompts (pages `[0, P * Tp)`, prompt p's at
    `[p Tp, (p + 1) Tp)`), then `num_free` completion pages and one trash page (written
    by slots with no row, never read as valid), all zeros; with `kernel`, in
    `paged_kernel`'s layout."""
    def pool(x, keys):
        lead = x.shape[:-4]
        p = x.shape[-4]
        s = x.shape[-1] if keys else x.shape[-2]
        sp = -(-s // page) * page
        widths = [(0, 0)] * x.ndim
        widths[-1 if keys else -2] = (0, sp - s)
        x = jnp.pad(x, widths)
        tp = sp // page
        if keys:   # [.., P, K, H, Tp*page] -> [.., P*Tp, K, H, page]
            k, h = x.shape[-3:-1]
            x = x.reshape(*lead, p, k, h, tp, page)
            x = jnp.moveaxis(x, -2, -4).reshape(*lead, p * tp, k, h, page)
        else:      # [.., P, K, Tp*page, H] -> [.., P*Tp, K, page, H]
            k, h = x.shape[-3], x.shape[-1]
            x = x.reshape(*lead, p, k, tp, page, h)
            x = jnp.moveaxis(x, -3, -4).reshape(*lead, p * tp, k, page, h)
        empty = jnp.zeros((*lead, num_free + 1, *x.shape[len(lead) + 1:]), x.dtype)
        return jnp.concatenate([x, empty], axis=len(lead))

    pools = [(pool(k, True), pool(v, False)) for k, v in zip(prompt_cache.k, prompt_cache.v)]
    if kernel:
        pools = [paged_kernel.to_kernel_layout(*kv) for kv in pools]
    return tuple(k for k, _ in pools), tuple(v for _, v in pools)


def _release(pages, slots, release_c, pad_id, reset_c=None):
    """Frees the pages of the slots in `release_c` (`[C]` bool); with `reset_c`, their
    rows also go back to pending with their outputs cleared (preemption)."""
    c = release_c.shape[0]
    gone = jnp.append(release_c, False)[pages.owner]
    pages = pages.replace(owner=jnp.where(gone, c, pages.owner),
                          table=jnp.where(release_c[:, None], pages.owner.shape[0], pages.table))
    if reset_c is None:
        return pages, slots
    rows = slots.tokens.shape[0]
    row_c = jnp.where(reset_c, slots.row, rows)
    clear = lambda x, value: x.at[row_c].set(value, mode="drop")
    slots = slots.replace(
        tokens=clear(slots.tokens, pad_id), logp=clear(slots.logp, 0.0),
        sample_logp=clear(slots.sample_logp, 0.0), lengths=clear(slots.lengths, 0),
        stopped=clear(slots.stopped, False), live=slots.live & ~reset_c,
        row=jnp.where(reset_c, rows, slots.row))
    if slots.support_ids is not None:
        slots = slots.replace(support_ids=clear(slots.support_ids, -1),
                              support_size=clear(slots.support_size, 0))
    preempted = pages.stats.preemptions + jnp.sum(reset_c, dtype=jnp.int32)
    return pages.replace(status=pages.status.at[row_c].set(PENDING, mode="drop"),
                         stats=pages.stats.replace(preemptions=preempted)), slots


def _preempt(pages, slots, need_c, pad_id):
    """Preempts the fewest most-recently admitted rows so that the pages the others need
    now (`need_c`, `[C]` bool: one each) are free; returns `(pages, slots, need_c)`."""
    c = need_c.shape[0]
    free = jnp.sum(pages.owner == c, dtype=jnp.int32)
    held_c = jnp.zeros((c + 1,), jnp.int32).at[pages.owner].add(1)[:c]
    order = jnp.argsort(jnp.where(slots.live, -slots.row, 1))   # youngest live first
    live_o = slots.live[order]
    freed = jnp.concatenate([jnp.zeros(1, jnp.int32), jnp.cumsum(held_c[order] * live_o)])
    spared = jnp.concatenate([jnp.zeros(1, jnp.int32), jnp.cumsum(need_c[order] & live_o)])
    enough_k = jnp.sum(need_c, dtype=jnp.int32) - spared <= free + freed   # [C + 1]
    k = jnp.argmax(enough_k)   # the fewest preempted rows that leave enough
    preempt_c = jnp.zeros((c,), bool).at[order].set(jnp.arange(c) < k) & slots.live
    pages, slots = jax.lax.cond(
        jnp.any(preempt_c),
        lambda ps: _release(*ps, preempt_c, pad_id, reset_c=preempt_c),
        lambda ps: ps, (pages, slots))
    return pages, slots, need_c & ~preempt_c


def _allocate(pages, need_c, column_c, page):
    """Gives each slot of `need_c` the next free page for its completion column
    `column_c` (`[C]` int32); there are enough (`_preempt`)."""
    c, m = need_c.shape[0], pages.owner.shape[0]
    free_pages = jnp.nonzero(pages.owner == c, size=c, fill_value=m)[0]
    rank_c = jnp.cumsum(need_c, dtype=jnp.int32) - 1
    page_c = jnp.where(need_c, free_pages[jnp.clip(rank_c, 0, c - 1)], m)
    owner = pages.owner.at[page_c].set(jnp.arange(c, dtype=jnp.int32), mode="drop")
    slot_index = jnp.where(need_c, jnp.arange(c), c)
    table = pages.table.at[slot_index, column_c // page].set(page_c, mode="drop")
    taken = jnp.sum(need_c, dtype=jnp.int32)
    in_use = jnp.sum(owner < c, dtype=jnp.int32)
    stats = pages.stats.replace(pages_taken=pages.stats.pages_taken + taken,
                                peak_pages=jnp.maximum(pages.stats.peak_pages, in_use))
    return pages.replace(owner=owner, table=table, stats=stats)


def _admit(slots, pages, prompt_logits, *, group_size, page):
    """Gives free slots the lowest pending rows while the pool has a page for each beyond
    those the running rows take at the next step."""
    c, rows = slots.live.shape[0], pages.status.shape[0]
    free_pages = jnp.sum(pages.owner == c, dtype=jnp.int32)
    needed = jnp.sum(slots.live & (slots.t % page == 0), dtype=jnp.int32)
    pending = jnp.nonzero(pages.status == PENDING, size=c, fill_value=rows)[0]
    free_c = ~slots.live
    rank_c = jnp.cumsum(free_c, dtype=jnp.int32) - 1
    new_row_c = pending[jnp.clip(rank_c, 0, c - 1)]
    wanted_c = free_c & (new_row_c < rows)
    admit_c = wanted_c & (rank_c < free_pages - needed)
    prompt_c = jnp.minimum(new_row_c, rows - 1) // group_size
    waits = jnp.any(wanted_c & ~admit_c).astype(jnp.int32)
    slots = slots.replace(
        logits=jnp.where(admit_c[:, None], jnp.take(prompt_logits, prompt_c, axis=0), slots.logits),
        row=jnp.where(admit_c, new_row_c, slots.row), t=jnp.where(admit_c, 0, slots.t),
        live=slots.live | admit_c)
    status = pages.status.at[jnp.where(admit_c, new_row_c, rows)].set(RUNNING, mode="drop")
    stats = pages.stats.replace(admission_waits=pages.stats.admission_waits + waits)
    return slots, pages.replace(status=status, stats=stats)


def paged_step(graphdef, state, carry, prompt_pages, prompt_valid, prompt_len, prompt_logits,
               keys_b, cap_b, *, method, stop_tokens, pad_id, group_size, page, kernel=False):
    """One iteration of the paged loop: live slots sample; stopped rows free their pages;
    rows that reach a new page take one (preempting the youngest if too few are free);
    the model decodes the fed tokens; free slots take pending rows.

    Args:
      graphdef, state: the model, its weights in the sampling layout.
      carry: `(_Slots, _Pages)`; `_Slots.cache` is the paged `KVCache`.
      prompt_pages: `[P, Tp]` int32, each prompt's pool pages.
      prompt_valid: `[P, Tp * page]` bool, the prompt columns that hold a real token.
      prompt_len: `[P]` int32, real prompt tokens (the first completion token's position).
      prompt_logits, keys_b, cap_b, method, stop_tokens, pad_id, group_size: as `_engine`.
      page: tokens per page.
      kernel: the pools are in `paged_kernel`'s layout and attention runs through it.

    Returns:
      the next carry.
    """
    slots, pages = carry
    rows = keys_b.shape[0]
    was_live = slots.live
    slots, token_c = _sample_slots(slots, keys_b, method, stop_tokens, pad_id, cap_b)
    stopped_c = was_live & ~slots.live
    pages = pages.replace(status=pages.status.at[jnp.where(stopped_c, slots.row, rows)].set(
        DONE, mode="drop"))
    pages, slots = _release(pages, slots, stopped_c, pad_id)
    column_c = slots.t - 1   # the fed token's completion column
    need_c = slots.live & (column_c % page == 0)
    pages, slots, need_c = _preempt(pages, slots, need_c, pad_id)
    pages = _allocate(pages, need_c, column_c, page)
    m = pages.owner.shape[0]
    prompt_c = jnp.minimum(slots.row, rows - 1) // group_size
    n_cols = pages.table.shape[1] * page
    comp_valid = jnp.arange(n_cols)[None, :] <= column_c[:, None]
    base = prompt_pages.size   # completion page i is pool page base + i; the trash is base + m
    write_c = jnp.where(slots.live, jnp.take_along_axis(
        pages.table, jnp.clip(column_c // page, 0, pages.table.shape[1] - 1)[:, None], 1)[:, 0], m)
    index = PageIndex(table=jnp.concatenate([prompt_pages[prompt_c], base + pages.table], axis=1),
                      write_page=base + write_c, write_offset=column_c % page,
                      kernel=kernel, shared_pages=prompt_pages.shape[1])
    cache = slots.cache.replace(
        valid=jnp.concatenate([prompt_valid[prompt_c], comp_valid & slots.live[:, None]], axis=1),
        pages=index)
    positions = prompt_len[prompt_c] + jnp.maximum(column_c, 0)
    logits, cache, _ = nnx.merge(graphdef, state).paged_decode_step(token_c, positions, cache)
    slots = slots.replace(logits=logits, cache=cache.replace(pages=None))
    slots, pages = _admit(slots, pages, prompt_logits, group_size=group_size, page=page)
    return slots, pages


@functools.partial(jax.jit, static_argnames=("graphdef", "group_size", "buffer_len", "num_slots",
                                             "page_size", "kv_pages", "rules", "record_support"))
def generate_paged(graphdef, state, prompt_tokens, prompt_mask, rng, prompt_ids, method,
                   stop_tokens, pad_id, max_new_tokens, *, group_size, buffer_len, num_slots,
                   page_size, kv_pages, rules, record_support=False):
    """`_generate`'s `Rollout` decoded in `num_slots` slots over a paged KV cache.

    Args:
      graphdef ... max_new_tokens, group_size, buffer_len, num_slots, rules,
        record_support: as `_engine.generate_continuous`.
      page_size: tokens per page.
      kv_pages: completion pages in the pool (`pool_pages`; 0: every slot's budget).

    Returns:
      `(Rollout, PagedStats)`.
    """
    state, batch_axes, ways = _on_mesh(state, rules)
    p, s = prompt_tokens.shape
    b, n, c, page = p * group_size, buffer_len, num_slots, page_size
    model = nnx.merge(graphdef, state)
    prompt_logits, prompt_cache, _, records = prefill_prompts(
        model, prompt_tokens, prompt_mask, method=method, record_support=record_support,
        record_routing=False)
    m = pool_pages(c, n, page, kv_pages)
    kernel = paged_kernel.selected(model.cfg)
    pool_k, pool_v = _prompt_pools(prompt_cache, page, m, kernel)
    tp, tc = -(-s // page), -(-n // page)
    prompt_pages = jnp.arange(p * tp, dtype=jnp.int32).reshape(p, tp)
    prompt_valid = jnp.pad(prompt_mask.astype(bool), ((0, 0), (0, tp * page - s)))
    prompt_len = jnp.sum(prompt_mask, axis=1, dtype=jnp.int32)
    cache = KVCache(k=pool_k, v=pool_v, valid=jnp.zeros((c, (tp + tc) * page), bool),
                    index=jnp.zeros((), jnp.int32))
    zeros_bn = jnp.zeros((b, n), jnp.float32)
    extra = {}
    if record_support:
        k = records["support_k"]
        extra = dict(support_ids=jnp.full((b, n, k), -1, jnp.int32),
                     support_size=jnp.zeros((b, n), jnp.int32))
    slots = _Slots(cache=cache, logits=jnp.zeros((c, prompt_logits.shape[-1]), jnp.float32),
                   row=jnp.full((c,), b, jnp.int32), t=jnp.zeros((c,), jnp.int32),
                   live=jnp.zeros((c,), bool), next_row=jnp.zeros((), jnp.int32),
                   tokens=jnp.full((b, n), pad_id, jnp.int32), logp=zeros_bn,
                   sample_logp=zeros_bn, lengths=jnp.zeros((b,), jnp.int32),
                   stopped=jnp.zeros((b,), bool), **extra)
    zero = jnp.zeros((), jnp.int32)
    pages = _Pages(owner=jnp.full((m,), c, jnp.int32), table=jnp.full((c, tc), m, jnp.int32),
                   status=jnp.zeros((b,), jnp.int32),
                   stats=PagedStats(pages_taken=zero, peak_pages=zero, preemptions=zero,
                                    admission_waits=zero))
    keys_b = row_keys(rng, prompt_ids, group_size)
    cap_b = jnp.broadcast_to(max_new_tokens, (b,))
    step = functools.partial(
        paged_step, graphdef, state, prompt_pages=prompt_pages, prompt_valid=prompt_valid,
        prompt_len=prompt_len, prompt_logits=prompt_logits, keys_b=keys_b, cap_b=cap_b,
        method=method, stop_tokens=stop_tokens, pad_id=pad_id, group_size=group_size, page=page,
        kernel=kernel)
    carry = _admit(slots, pages, prompt_logits, group_size=group_size, page=page)

    def cond(carry):
        slots, pages = carry
        return jnp.any(slots.live) | jnp.any(pages.status == PENDING)

    slots, pages = jax.lax.while_loop(cond, lambda carry: step(carry=carry), carry)
    rollout = rollout_of(slots, prompt_tokens, prompt_mask, group_size)
    return _shard_rows(rollout, batch_axes, ways), pages.stats
