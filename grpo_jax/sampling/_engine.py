"""Continuous batching: C decode slots; when a row stops, the next pending row takes its slot.

The static sampler (`_generate`) decodes all B = P*G rows together until the last one
stops, so on ragged lengths most rows idle through the tail. Here a fixed number of slots
decode together, and whenever a slot's row stops (its stop token, or max_new_tokens) the
next pending row (in row order: prompt by prompt, completion by completion) is admitted
into it, until every row is done. Each prompt is prefilled once, as in the static
sampler; admitting a row copies its prompt's prefilled keys and values into the slot.

A slot's cache has S + N columns: the prompt in the first S, then its completion in a
ring of N columns that every slot writes at the same column each step (so the model's
single cache index serves all slots). A row admitted at step t0 writes its j-th token at
column S + (t0 + j) mod N; it has at most N tokens, so it never overwrites its own, and
admission marks every completion column invalid, so no row reads what the slot's
previous row left. Positions count valid tokens (`models.default_positions`), so a
row's rope angles are the static sampler's.

Once no row is pending, the tail narrows: when the live rows fit in half the slots,
they move into the first half (`_narrow`: their caches, logits and counters gathered)
and the loop goes on with C/2 slots, then C/4 (`tail_widths`): the last long rows no
longer carry C - 1 idle slots through every step. On the 2-core CPU a decode step's time
is nearly proportional to its slots (the logits and sampling over V dominate), so this
cuts the tail's cost; where a step costs about the same at any width (a small batch on an
accelerator, bound by reading the weights), it costs one gather per narrowing and saves
little.

Every row draws its tokens with its own key (`_generate.row_keys`: rng, prompt id,
completion index, position), so the tokens equal the static sampler's whatever the
schedule, up to float rounding in the logits (attention reads the prompt from the slot
rather than from the shared prefix: a different summation order).
"""

import functools

import jax
import jax.numpy as jnp
from flax import nnx, struct

from grpo_jax.models.decoder import kv_row_axis
from grpo_jax.objectives import token_logprobs
from grpo_jax.sampling._generate import (MAX_NEW_TOKENS, STOP_TOKEN, Rollout, _on_mesh,
                                         _shard_rows, _support_bound, row_keys)
from grpo_jax.sampling._sample import sample


@struct.dataclass
class _Slots:
    """The `lax.while_loop` carry: C slots decoding, B rows written."""

    cache: object           # KVCache of [C, S + N] columns; index: the ring column written next
    logits: jax.Array       # [C, V] float32, the next-token logits of each slot's row
    row: jax.Array          # [C] int32, the row a slot decodes; B when it has none
    t: jax.Array            # [C] int32, tokens the slot's row has so far
    live: jax.Array         # [C] bool, the slot's row still samples
    next_row: jax.Array     # [] int32, the first row not yet admitted
    tokens: jax.Array       # [B, N] int32
    logp: jax.Array         # [B, N] float32
    sample_logp: jax.Array  # [B, N] float32
    lengths: jax.Array      # [B] int32
    stopped: jax.Array      # [B] bool, the row sampled a stop token
    turns: "_Turns | None" = None   # rows that pause and take appended tokens (`Engine`)
    support_ids: jax.Array | None = None    # [B, N, K] int32 with record_support
    support_size: jax.Array | None = None   # [B, N] int32 with record_support
    routing: jax.Array | None = None        # [B, N, L_moe, k] int32 with record_routing


@struct.dataclass
class _Turns:
    """What a carry holds for rows that pause and resume (`Engine`): a row that samples a
    pause token waits in its slot until the host appends tokens to it; a slot whose row
    has queued tokens feeds them (one per step, into the row's cache) before sampling."""

    paused: jax.Array     # [C] bool, the slot's row sampled a pause token and waits
    queue: jax.Array      # [B, Q] int32, tokens to feed each row
    queued: jax.Array     # [B] int32, how many of the row's queue are real
    fed: jax.Array        # [B] int32, how many of them the row has fed
    appended: jax.Array   # [B, N] bool, the token came from the queue, not from sampling
    turn_len: jax.Array   # [B] int32, tokens the row sampled since it last fed one
    turn_budget: jax.Array   # [] int32, a row pauses each time its turn grows by this many tokens


def _set_rows(old, new, admit_c, axis):
    """`old` with the slots of `admit_c` ([C] bool, along `axis`) replaced by `new`."""
    shape = [1] * old.ndim
    shape[axis] = admit_c.shape[0]
    return jnp.where(admit_c.reshape(shape), new.astype(old.dtype), old)


TAIL_HALVINGS = 2   # the tail decodes in C, then C/2, then C/4 slots (`tail_widths`)


def tail_widths(num_slots, ways=1, halvings=TAIL_HALVINGS):
    """The slot counts the engine decodes with: `num_slots` while rows are pending, then
    each half of the last, at most `halvings` times, while it stays a multiple of `ways`
    (the mesh's row ways).

    Example:
      >>> tail_widths(64), tail_widths(8, ways=4), tail_widths(6)
      ([64, 32, 16], [8, 4], [6, 3])
    """
    widths = [num_slots]
    while (len(widths) <= halvings and widths[-1] % 2 == 0 and (widths[-1] // 2) % ways == 0):
        widths.append(widths[-1] // 2)
    return widths


def _narrow(slots, width):
    """The carry in its first `width` slots, the live ones moved there in slot order (at
    most `width` are live): their keys, values, logits and counters gathered along the
    slot axis; the ring column (`cache.index`) is shared, so it stays."""
    assert slots.turns is None, "rows that pause decode at one width (`Engine`)"
    order_c = jnp.argsort(~slots.live, stable=True)[:width]
    take = lambda x, axis: jnp.take(x, order_c, axis=axis)
    cache = slots.cache
    cache = cache.replace(k=tuple(take(k, kv_row_axis(k)) for k in cache.k),
                          v=tuple(take(v, kv_row_axis(v)) for v in cache.v),
                          valid=take(cache.valid, 0))
    return slots.replace(cache=cache, logits=take(slots.logits, 0), row=take(slots.row, 0),
                         t=take(slots.t, 0), live=take(slots.live, 0))


def _copy_prompts(cache, prompt_cache, admit_c, prompt_c):
    """The slot cache with each admitted slot's first S columns set to its prompt's keys
    and values (`prompt_cache`, P rows) and every later column marked invalid."""
    s = prompt_cache.valid.shape[1]

    def keys(slot_k, prompt_k):
        axis = kv_row_axis(slot_k)
        head = _set_rows(slot_k[..., :s], jnp.take(prompt_k, prompt_c, axis=axis), admit_c, axis)
        return slot_k.at[..., :s].set(head)

    def values(slot_v, prompt_v):
        axis = kv_row_axis(slot_v)
        head = _set_rows(slot_v[..., :s, :], jnp.take(prompt_v, prompt_c, axis=axis), admit_c, axis)
        return slot_v.at[..., :s, :].set(head)

    valid = jnp.concatenate([jnp.take(prompt_cache.valid, prompt_c, axis=0),
                             jnp.zeros_like(cache.valid[:, s:])], axis=1)
    return cache.replace(k=tuple(map(keys, cache.k, prompt_cache.k)),
                         v=tuple(map(values, cache.v, prompt_cache.v)),
                         valid=_set_rows(cache.valid, valid, admit_c, 0))


def _admit(slots, prompt_cache, prompt_logits, *, group_size, num_rows):
    """Gives every slot without a live row the next pending row (if any is left)."""
    free_c = ~slots.live if slots.turns is None else ~slots.live & ~slots.turns.paused
    new_row_c = slots.next_row + jnp.cumsum(free_c, dtype=jnp.int32) - 1
    admit_c = free_c & (new_row_c < num_rows)
    prompt_c = jnp.minimum(new_row_c, num_rows - 1) // group_size

    def admit_rows(cache_and_logits):   # skipped on the steps where no row stops
        cache, logits = cache_and_logits
        return (_copy_prompts(cache, prompt_cache, admit_c, prompt_c),
                _set_rows(logits, jnp.take(prompt_logits, prompt_c, axis=0), admit_c, 0))

    cache, logits = jax.lax.cond(jnp.any(admit_c), admit_rows, lambda x: x,
                                 (slots.cache, slots.logits))
    return slots.replace(
        cache=cache,
        logits=logits,
        row=jnp.where(admit_c, new_row_c, jnp.where(~free_c, slots.row, num_rows)),
        t=jnp.where(admit_c, 0, slots.t),
        live=slots.live | admit_c,
        next_row=slots.next_row + jnp.sum(admit_c, dtype=jnp.int32),
    )


def _sample_slots(slots, keys_b, method, stop_tokens, pad_id, cap_b, pause_tokens=None):
    """Samples one token for every live slot (row b's t-th with ``fold_in(keys_b[b], t)``),
    or feeds the next token of its row's queue (`_Turns`), writes it at (row, t) of the
    outputs and ends the rows that stop or reach `cap_b`; a sampled pause token pauses
    its row (below the budget)."""
    num_rows = keys_b.shape[0]
    row_c = jnp.minimum(slots.row, num_rows - 1)
    step_keys_c = jax.vmap(jax.random.fold_in)(keys_b[row_c], slots.t)
    record = slots.support_ids is not None
    drawn = sample(method, step_keys_c, slots.logits, with_support=record)
    token_c, sample_logp_c = drawn[:2]
    live_c = slots.live
    turns = slots.turns
    if turns is None:
        feeding_c = jnp.zeros_like(live_c)
    else:
        fed_c = turns.fed[row_c]
        feeding_c = live_c & (fed_c < turns.queued[row_c])
        queue_q = jnp.minimum(fed_c, turns.queue.shape[1] - 1)
        token_c = jnp.where(feeding_c, turns.queue[row_c, queue_q], token_c)
    token_c = jnp.where(live_c, token_c, pad_id)
    sampled_c = live_c & ~feeding_c
    temperature = getattr(method, "temperature", 1.0)
    logp_c = jnp.where(live_c, token_logprobs(slots.logits, token_c, temperature=temperature), 0.0)
    out_c = jnp.where(live_c, slots.row, num_rows)   # writes to rows past the end are dropped
    at = (out_c, slots.t)
    t_c = slots.t + live_c
    stop_c = sampled_c & jnp.isin(token_c, stop_tokens)
    under_cap_c = t_c < cap_b[row_c]
    slots = slots.replace(
        tokens=slots.tokens.at[at].set(token_c, mode="drop"),
        logp=slots.logp.at[at].set(logp_c, mode="drop"),
        sample_logp=slots.sample_logp.at[at].set(jnp.where(sampled_c, sample_logp_c, 0.0),
                                                 mode="drop"),
        lengths=slots.lengths.at[out_c].set(t_c, mode="drop"),
        stopped=slots.stopped.at[out_c].set(stop_c, mode="drop"),
        t=t_c,
        live=live_c & ~stop_c & under_cap_c,
    )
    if record:   # the cut's kept tokens where the row sampled (not where it was fed)
        support = drawn[2]
        slots = slots.replace(
            support_ids=slots.support_ids.at[at].set(
                jnp.where(sampled_c[:, None], support.ids, -1), mode="drop"),
            support_size=slots.support_size.at[at].set(
                jnp.where(sampled_c, support.size, 0), mode="drop"))
    if turns is not None:
        turn_c = jnp.where(feeding_c, 0, turns.turn_len[row_c] + sampled_c)
        pause_c = (turn_c > 0) & (turn_c % turns.turn_budget == 0)   # every budget's worth
        if pause_tokens is not None:
            pause_c |= jnp.isin(token_c, pause_tokens)
        pause_c &= sampled_c & ~stop_c & under_cap_c
        slots = slots.replace(live=slots.live & ~pause_c, turns=turns.replace(
            paused=turns.paused | pause_c,
            turn_len=turns.turn_len.at[out_c].set(turn_c, mode="drop"),
            fed=turns.fed.at[jnp.where(feeding_c, out_c, num_rows)].add(1, mode="drop"),
            appended=turns.appended.at[at].set(feeding_c, mode="drop"),
        ))
    return slots, token_c


def init_slots(model, prompt_logits, *, rows, prompt_len, buffer_len, num_slots, pad_id,
               queue=None, queued=None, turn_budget=None, support_k=0, routing_shape=None):
    """The loop's carry before the first admission: `num_slots` empty slots of
    `prompt_len + buffer_len` columns, outputs for `rows` rows. With `queue` (`[rows, Q]`
    int32) and `queued` (`[rows]`: how many of each row's queue are real), the carry holds
    `_Turns`: rows pause on pause tokens (and, given `turn_budget`, after every
    `turn_budget` tokens sampled since they last fed one) and feed their queue before
    sampling. With `support_k` > 0 it records each sampled position's kept tokens (K of
    them), with `routing_shape` (`(L_moe, k)`) the experts of every fed token."""
    zeros_bn = jnp.zeros((rows, buffer_len), jnp.float32)
    c = num_slots
    records = {}
    if support_k:
        records.update(support_ids=jnp.full((rows, buffer_len, support_k), -1, jnp.int32),
                       support_size=jnp.zeros((rows, buffer_len), jnp.int32))
    if routing_shape is not None:
        records.update(routing=jnp.zeros((rows, buffer_len, *routing_shape), jnp.int32))
    turns = None
    if queue is not None:
        turns = _Turns(paused=jnp.zeros((c,), bool), queue=queue, queued=queued,
                       fed=jnp.zeros((rows,), jnp.int32),
                       appended=jnp.zeros((rows, buffer_len), bool),
                       turn_len=jnp.zeros((rows,), jnp.int32),
                       turn_budget=jnp.asarray(buffer_len + 1 if turn_budget is None
                                               else turn_budget, jnp.int32))
    return _Slots(
        cache=model.init_cache(c, prompt_len + buffer_len).replace(index=jnp.int32(prompt_len)),
        logits=jnp.zeros((c, prompt_logits.shape[-1]), jnp.float32),
        row=jnp.full((c,), rows, jnp.int32), t=jnp.zeros((c,), jnp.int32),
        live=jnp.zeros((c,), bool), next_row=jnp.zeros((), jnp.int32),
        tokens=jnp.full((rows, buffer_len), pad_id, jnp.int32), logp=zeros_bn,
        sample_logp=zeros_bn, lengths=jnp.zeros((rows,), jnp.int32),
        stopped=jnp.zeros((rows,), bool), turns=turns, **records,
    )


def engine_step(graphdef, state, slots, prompt_cache, prompt_logits, keys_b, cap_b, *, method,
                stop_tokens, pad_id, group_size, batch_axes=(), ways=1, pause_tokens=None):
    """One iteration of the engine's loop: every live slot samples its token, the model
    decodes them (one `decode_step` over the C slots), and free slots take pending rows.

    Args:
      graphdef, state: the model, its weights in the sampling layout.
      slots: the `_Slots` carry (`init_slots`).
      prompt_cache, prompt_logits: the P prompts' prefill (`Decoder.prefill`).
      keys_b: `[B]` row keys (`row_keys`); cap_b: `[B]` int32 per-row token budgets.
      method, stop_tokens, pad_id, group_size: as `generate`.
      batch_axes, ways: the mesh's row axes and their size (`_on_mesh`).
      pause_tokens: `[K]` ids that pause a row (with `_Turns` in the carry), or None.

    Returns:
      the next `_Slots`.
    """
    s = prompt_cache.valid.shape[1]
    ring_end = slots.cache.valid.shape[1]
    slots, token_c = _sample_slots(slots, keys_b, method, stop_tokens, pad_id, cap_b,
                                   pause_tokens)
    logits, cache, experts = nnx.merge(graphdef, state).decode_step(token_c, slots.cache,
                                                                    with_routing=True)
    if slots.routing is not None:   # token t - 1's experts, where the row samples on from it
        goes_on_c = slots.live if slots.turns is None else slots.live | slots.turns.paused
        at = (jnp.where(goes_on_c, slots.row, keys_b.shape[0]), slots.t - 1)
        slots = slots.replace(routing=slots.routing.at[at].set(
            jnp.transpose(experts[:, :, 0], (1, 0, 2)), mode="drop"))
    cache = cache.replace(index=jnp.where(cache.index == ring_end, s, cache.index))   # the ring
    slots = slots.replace(logits=logits, cache=_shard_rows(cache, batch_axes, ways))
    return _admit(slots, prompt_cache, prompt_logits, group_size=group_size,
                  num_rows=keys_b.shape[0])


def prefill_prompts(model, prompt_tokens, prompt_mask, *, method, record_support, record_routing):
    """`(prompt logits, prompt cache, prompt experts [P, S, L_moe, k] or None, the
    `init_slots` keywords of the records)`: the prompts' prefill and what recording the
    support (its K) and the routing (on an MoE) needs."""
    p, s = prompt_tokens.shape
    prompt_logits, prompt_cache, experts = model.prefill(
        prompt_tokens, model.init_cache(p, s), attention_mask=prompt_mask, with_routing=True)
    records = {}
    if record_support:
        records["support_k"] = _support_bound(method, prompt_logits)
    if record_routing and experts is not None:   # a dense model has nothing to record
        experts = jnp.transpose(experts, (1, 2, 0, 3))   # [L_moe, P, S, k] -> [P, S, L_moe, k]
        records["routing_shape"] = experts.shape[2:]
    else:
        experts = None
    return prompt_logits, prompt_cache, experts, records


@functools.partial(jax.jit, static_argnames=("graphdef", "group_size", "buffer_len", "num_slots",
                                             "rules", "record_support", "record_routing"))
def generate_continuous(graphdef, state, prompt_tokens, prompt_mask, rng, prompt_ids, method,
                        stop_tokens, pad_id, max_new_tokens, *, group_size, buffer_len, num_slots,
                        rules, record_support=False, record_routing=False):
    """`_generate`'s `Rollout` decoded in `num_slots` slots."""
    state, batch_axes, ways = _on_mesh(state, rules)
    p, s = prompt_tokens.shape
    b, n = p * group_size, buffer_len
    model = nnx.merge(graphdef, state)
    prompt_logits, prompt_cache, prompt_experts, records = prefill_prompts(
        model, prompt_tokens, prompt_mask, method=method, record_support=record_support,
        record_routing=record_routing)
    slots = init_slots(model, prompt_logits, rows=b, prompt_len=s, buffer_len=n,
                       num_slots=num_slots, pad_id=pad_id, **records)
    keys_b = row_keys(rng, prompt_ids, group_size)
    cap_b = jnp.broadcast_to(max_new_tokens, (b,))
    step = functools.partial(engine_step, graphdef, state, prompt_cache=prompt_cache,
                             prompt_logits=prompt_logits, keys_b=keys_b, cap_b=cap_b,
                             method=method, stop_tokens=stop_tokens, pad_id=pad_id,
                             group_size=group_size, batch_axes=batch_axes, ways=ways)
    slots = _admit(slots, prompt_cache, prompt_logits, group_size=group_size, num_rows=b)
    widths = tail_widths(num_slots, ways)
    for width, narrower in zip(widths, widths[1:] + [0]):
        if width < num_slots:
            slots = _narrow(slots, width)

        def cond(slots, narrower=narrower):   # on while rows are pending or too many live
            live = jnp.sum(slots.live, dtype=jnp.int32)
            return (live > 0) & ((slots.next_row < b) | (live > narrower))

        slots = jax.lax.while_loop(cond, step, slots)
    # Rows split over the row axes as the static sampler's: left to XLA they come out
    # whole on every device, and each process must hold (and score) its own prompts' rows.
    return _shard_rows(rollout_of(slots, prompt_tokens, prompt_mask, group_size, prompt_experts),
                       batch_axes, ways)


def rollout_of(slots, prompt_tokens, prompt_mask, group_size, prompt_experts=None):
    """The `Rollout` a carry has written so far (rows not yet done: their tokens so far,
    `truncated`); with `_Turns`, `appended` marks the tokens that came from a queue; the
    records where the carry keeps them (`prompt_experts`: `[P, S, L_moe, k]` or None)."""
    n = slots.tokens.shape[1]
    mask_bn = (jnp.arange(n)[None, :] < slots.lengths[:, None]).astype(jnp.int32)
    repeat = lambda x: jnp.repeat(x, group_size, axis=0)
    return Rollout(
        prompt_tokens=repeat(prompt_tokens), prompt_mask=repeat(prompt_mask), tokens=slots.tokens,
        logp=slots.logp, sample_logp=slots.sample_logp, mask=mask_bn, lengths=slots.lengths,
        truncated=~slots.stopped,
        stop_reason=jnp.where(slots.stopped, STOP_TOKEN, MAX_NEW_TOKENS).astype(jnp.int32),
        appended=None if slots.turns is None else slots.turns.appended,
        support_ids=slots.support_ids, support_size=slots.support_size, routing=slots.routing,
        prompt_routing=None if prompt_experts is None else repeat(prompt_experts),
    )
