"""Grouped rollouts: prefill each prompt once, then decode G completions in a `lax.while_loop`.

B = P*G rows, the G completions of a prompt consecutive (docs/semantics.md, "Batch layout"). The
prompts are prefilled once per prompt (not per completion) into a P-row cache that the G
completions share (`Decoder.init_cache(prefix=...)`: stored and read once per prompt);
each completion's own cache grows in segments (`_segment_ends`), one while loop per
size. Everything that varies per call (sampling parameters, max_new_tokens, stop ids, pad
id, the weights) is an array argument of one jitted function; only shapes (P, S, the
completion buffer N, the number of stop ids), G, the method's kind and the model
structure select a compilation.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx, struct

from grpo_jax import parallel
from grpo_jax.models import KVCache, sharding
from grpo_jax.models.decoder import kv_row_axis
from grpo_jax.objectives import token_logprobs
from grpo_jax.sampling._sample import sample

SEGMENT = 64  # cache slots for the first completion tokens; segments are multiples of it

# Rollout.stop_reason codes.
STOP_TOKEN = 0  # sampled one of stop_tokens (it is the last token of the completion)
MAX_NEW_TOKENS = 1  # reached max_new_tokens without a stop token (truncated)


@struct.dataclass
class Rollout:
    """G completions per prompt, the G rows of a prompt consecutive (B = P*G).

    Attributes:
      prompt_tokens: `[B, S]` int32 left-padded prompts (each repeated G times).
      prompt_mask: `[B, S]` int32, 1 on prompt tokens.
      tokens: `[B, N]` int32 completion tokens, `pad_id` after the last one. N is the
        completion buffer (a bucket >= max_new_tokens).
      logp: `[B, N]` float32 log-prob of each token under the model's tempered
        distribution, softmax(logits / temperature) before any cut (the behaviour
        log-prob of the trainer's ratio, which is taken at the same temperature;
        temperature 1 for greedy); 0 where mask is 0.
      sample_logp: `[B, N]` float32 log-prob under the sampling distribution that drew
        it (0 for greedy); 0 where mask is 0.
      mask: `[B, N]` int32, 1 on generated tokens up to and including the stop token.
      lengths: `[B]` int32 completion lengths (mask.sum(-1)).
      truncated: `[B]` bool, hit max_new_tokens without a stop token.
      stop_reason: `[B]` int32, `STOP_TOKEN` (0) or `MAX_NEW_TOKENS` (1).
      support_ids: `[B, N, K]` int32 or None: with `generate(record_support=True)`, the
        tokens the method's cut kept at each position (keep-sampling-mask), in
        descending probability then -1; see `Support`. -1 where mask is 0.
      support_size: `[B, N]` int32 or None: how many tokens the cut kept; a position
        with size > K did not fit in the K candidates (its support is not recorded:
        train it on the full softmax). 0 where mask is 0.
      prompt_routing: `[B, S, L_moe, k]` int32 or None: with
        `generate(record_routing=True)` on an MoE model, the experts each prompt token
        went to in each MoE layer (keep routing).
      routing: `[B, N, L_moe, k]` int32 or None: the same for completion token j when
        it was fed back to sample token j + 1 (0 where it never was: the last token).
      appended: `[B, N]` bool or None: from `Engine`, True on tokens a row was given
        (`Engine.resume`, or queued before it started) rather than sampled: a tool's
        reply, or a partial rollout's earlier tokens. Their `logp` is the model's
        log-prob of them, their `sample_logp` 0. None from `generate`.
    """

    prompt_tokens: jax.Array
    prompt_mask: jax.Array
    tokens: jax.Array
    logp: jax.Array
    sample_logp: jax.Array
    mask: jax.Array
    lengths: jax.Array
    truncated: jax.Array
    stop_reason: jax.Array
    support_ids: jax.Array | None = None
    support_size: jax.Array | None = None
    prompt_routing: jax.Array | None = None
    routing: jax.Array | None = None
    appended: jax.Array | None = None


@struct.dataclass
class _Loop:
    """The `lax.while_loop` carry."""

    step: jax.Array  # [] int32, tokens sampled so far = the next column to write
    cache: KVCache  # [B, segment end] slots after the shared [P, S] prompt cache
    logits: jax.Array  # [B, V] float32, logits of the next token
    tokens: jax.Array  # [B, N] int32
    logp: jax.Array  # [B, N] float32
    sample_logp: jax.Array  # [B, N] float32
    done: jax.Array  # [B] bool, the row has sampled a stop token
    lengths: jax.Array  # [B] int32, tokens generated per row (the stop token included)
    support_ids: jax.Array | None  # [B, N, K] int32 when recording the support, else None
    support_size: jax.Array | None  # [B, N] int32 when recording the support, else None
    routing: jax.Array | None  # [B, N, L_moe, k] int32 when recording routing, else None


def _rule_axes(rules):
    """The mesh axes a sharding rule table splits weights over."""
    entries = sharding.get_rules(rules).values()
    return {a for e in entries if e is not None for a in ((e,) if isinstance(e, str) else e)}


def row_multiple():
    """What `generate`'s P*G rows must be a multiple of under the current mesh (1 without
    one): the size of the mesh axes rows split over (`parallel.row_axes`)."""
    mesh = jax.sharding.get_abstract_mesh()
    return 1 if mesh.empty else parallel.row_ways(mesh)


def _shard_rows(tree, batch_axes, ways=1):
    """Constrains every array's row axis to `batch_axes`, the rest left to XLA: the
    leading axis, or for a `KVCache`'s keys and values `kv_row_axis` (after a scanned
    model's layer axis).

    An array whose rows do not split `ways` ways (the P rows of the shared prompt cache
    when P < ways) is left to XLA."""
    if not batch_axes:
        return tree

    def constrain(x, axis=0):
        if x.ndim == 0 or not parallel.rows_divide(x.shape[axis], ways):
            return x
        spec = jax.P(*[jax.P.UNCONSTRAINED] * axis, batch_axes,
                     *[jax.P.UNCONSTRAINED] * (x.ndim - axis - 1))
        return jax.lax.with_sharding_constraint(x, spec)

    def visit(x):
        if not isinstance(x, KVCache):
            return constrain(x)
        kv = lambda arrays: tuple(constrain(a, kv_row_axis(a)) for a in arrays)
        return x.replace(k=kv(x.k), v=kv(x.v), valid=constrain(x.valid),
                         prefix=None if x.prefix is None else visit(x.prefix))

    return jax.tree.map(visit, tree, is_leaf=lambda x: isinstance(x, KVCache))


def _weights_in(state, rules):
    """The weights in the sampling layout (whole on each `tensor` group, so the loop does
    not gather them every step); a no-op when they already are."""
    def constrain(variable):
        spec = sharding.logical_to_spec(variable.get_metadata()["logical_axes"], rules)
        return variable.replace(jax.lax.with_sharding_constraint(variable.get_value(), spec))

    return jax.tree.map(constrain, state, is_leaf=lambda x: isinstance(x, nnx.Variable))


def _on_mesh(state, rules):
    """`(state, batch_axes, ways)` under the current mesh: the weights in the sampling
    layout, the axes rows split over and how many ways (unchanged, (), 1 without a mesh)."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty:
        return state, (), 1
    return _weights_in(state, rules), parallel.row_axes(mesh), parallel.row_ways(mesh)


def _segment_ends(buffer_len):
    """Completion lengths at which the KV cache grows: 64, 128, 192, 256, 320, 448, ..., buffer_len.

    A decode step attends over every cache slot, filled or not, and at long lengths that
    read is most of its time; sizing the cache for the whole buffer from the first step
    would make early steps pay for the last ones. Each segment adds a quarter of the
    slots so far, rounded up to a multiple of 64, so past the first few segments at most
    a fifth of the slots read are empty, at the price of one loop body per segment in the
    compiled program (7 for N = 512, 16 for N = 4096). Doubling (4 bodies for N = 512)
    read 15% more slots on average and was 10% slower at B = 256, N = 512 on CPU.
    """
    ends, end = [], SEGMENT
    while end < buffer_len:
        ends.append(end)
        end += -(-max(end // 4, SEGMENT) // SEGMENT) * SEGMENT
    return ends + [buffer_len]


def row_keys(rng, prompt_ids, group_size):
    """`[P*G]` keys, one per completion: ``fold_in(fold_in(rng, prompt id), completion
    index)``. Token t of a completion is drawn with ``fold_in(its key, t)``, so what it
    samples depends on (rng, prompt id, completion index, position) and the logits, not
    on which other rows share its batch or in which order they come."""
    def key(prompt_id, completion):
        return jax.random.fold_in(jax.random.fold_in(rng, prompt_id), completion)

    prompt_b = jnp.repeat(prompt_ids, group_size)
    completion_b = jnp.tile(jnp.arange(group_size, dtype=jnp.int32), prompt_ids.shape[0])
    return jax.vmap(key)(prompt_b, completion_b)


def _sample_column(loop, keys_b, method, stop_tokens, pad_id, cap_b):
    """Samples column `loop.step` from `loop.logits` (row b with ``fold_in(keys_b[b],
    step)``); rows that stopped or have `cap_b` tokens get pad_id and zeros (and an empty
    support when it is recorded)."""
    record = loop.support_ids is not None
    step_keys_b = jax.vmap(jax.random.fold_in, in_axes=(0, None))(keys_b, loop.step)
    drawn = sample(method, step_keys_b, loop.logits, with_support=record)
    token_b, sample_logp_b = drawn[:2]
    live_b = ~loop.done & (loop.lengths < cap_b)
    token_b = jnp.where(live_b, token_b, pad_id)
    temperature = getattr(method, "temperature", 1.0)
    logp_b = jnp.where(live_b, token_logprobs(loop.logits, token_b, temperature=temperature), 0.0)
    sample_logp_b = jnp.where(live_b, sample_logp_b, 0.0)

    def put(buf_bn, col_b):
        return jax.lax.dynamic_update_slice_in_dim(buf_bn, col_b[:, None], loop.step, axis=1)

    if record:
        support = drawn[2]
        loop = loop.replace(
            support_ids=put(loop.support_ids, jnp.where(live_b[:, None], support.ids, -1)),
            support_size=put(loop.support_size, jnp.where(live_b, support.size, 0)),
        )
    return loop.replace(
        step=loop.step + 1,
        tokens=put(loop.tokens, token_b),
        logp=put(loop.logp, logp_b),
        sample_logp=put(loop.sample_logp, sample_logp_b),
        done=loop.done | (live_b & jnp.isin(token_b, stop_tokens)),
        lengths=loop.lengths + live_b,
    )


def _support_bound(method, logits_bv):
    """K, the number of support ids a step of `method` records (from shapes alone)."""
    _, _, support = jax.eval_shape(
        lambda m, z: sample(m, jax.random.key(0), z, with_support=True), method, logits_bv)
    return support.ids.shape[-1]


@functools.partial(jax.jit, static_argnames=("graphdef", "group_size", "buffer_len", "rules",
                                             "record_support", "record_routing"))
def _generate(graphdef, state, prompt_tokens, prompt_mask, rng, prompt_ids, method, stop_tokens,
              pad_id, max_new_tokens, *, group_size, buffer_len, rules, record_support,
              record_routing):
    state, batch_axes, ways = _on_mesh(state, rules)
    p, s = prompt_tokens.shape
    model = nnx.merge(graphdef, state)
    ends = _segment_ends(buffer_len)
    logits_pv, prompt_cache, prompt_experts = model.prefill(
        prompt_tokens, model.init_cache(p, s), attention_mask=prompt_mask, with_routing=True)

    def repeat(x):
        return jnp.repeat(x, group_size, axis=0)

    def rows_first(experts):   # [L_moe, B, S, k] -> [B, S, L_moe, k]
        return jnp.transpose(experts, (1, 2, 0, 3))

    b = p * group_size
    cache = model.init_cache(b, ends[0], prefix=_shard_rows(prompt_cache, batch_axes, ways))
    cache, logits_bv, prompt_tokens, prompt_mask = _shard_rows(
        (cache, *map(repeat, (logits_pv, prompt_tokens, prompt_mask))), batch_axes, ways
    )
    zeros_bn = jnp.zeros((b, buffer_len), jnp.float32)
    support_ids = support_size = routing = prompt_routing = None
    if record_support:
        support_ids = jnp.full((b, buffer_len, _support_bound(method, logits_bv)), -1, jnp.int32)
        support_size = jnp.zeros((b, buffer_len), jnp.int32)
    record_routing = record_routing and prompt_experts is not None   # dense: nothing to record
    if record_routing:
        prompt_routing = _shard_rows(repeat(rows_first(prompt_experts)), batch_axes, ways)
        routing = jnp.zeros((b, buffer_len, *prompt_routing.shape[2:]), jnp.int32)
    loop = _Loop(
        step=jnp.zeros((), jnp.int32), cache=cache, logits=logits_bv,
        tokens=jnp.full((b, buffer_len), pad_id, jnp.int32), logp=zeros_bn, sample_logp=zeros_bn,
        done=jnp.zeros((b,), bool), lengths=jnp.zeros((b,), jnp.int32),
        support_ids=support_ids, support_size=support_size, routing=routing,
    )
    keys_b = row_keys(rng, prompt_ids, group_size)
    cap_b = jnp.broadcast_to(max_new_tokens, (b,))
    step = functools.partial(_sample_column, keys_b=keys_b, method=method, stop_tokens=stop_tokens,
                             pad_id=pad_id, cap_b=cap_b)
    loop = step(loop)

    def cond(loop, end):
        live = ~loop.done & (loop.lengths < cap_b)
        return (loop.step < jnp.minimum(jnp.max(cap_b), end)) & jnp.any(live)

    def body(loop):
        last_b = jax.lax.dynamic_index_in_dim(loop.tokens, loop.step - 1, axis=1, keepdims=False)
        logits_bv, cache, experts = nnx.merge(graphdef, state).decode_step(
            last_b, loop.cache, with_routing=True)
        if record_routing:   # the experts of token step - 1, fed now to sample token step
            loop = loop.replace(routing=jax.lax.dynamic_update_slice_in_dim(
                loop.routing, rows_first(experts), loop.step - 1, axis=1))
        return step(_shard_rows(loop.replace(logits=logits_bv, cache=cache), batch_axes, ways))

    for end in ends:
        cache = _shard_rows(loop.cache.grow(end), batch_axes, ways)
        loop = jax.lax.while_loop(functools.partial(cond, end=end), body, loop.replace(cache=cache))
    mask_bn = (jnp.arange(buffer_len)[None, :] < loop.lengths[:, None]).astype(jnp.int32)
    return Rollout(
        prompt_tokens=prompt_tokens, prompt_mask=prompt_mask, tokens=loop.tokens, logp=loop.logp,
        sample_logp=loop.sample_logp, mask=mask_bn, lengths=loop.lengths, truncated=~loop.done,
        stop_reason=jnp.where(loop.done, STOP_TOKEN, MAX_NEW_TOKENS).astype(jnp.int32),
        support_ids=loop.support_ids, support_size=loop.support_size,
        prompt_routing=prompt_routing, routing=loop.routing,
    )


def _int32(x):
    """Device arrays stay on device; host values stay numpy (replicated inputs, on any hosts)."""
    return x.astype(jnp.int32) if isinstance(x, jax.Array) else np.asarray(x, np.int32)


def to_host(rollout):
    """The whole `Rollout` as numpy arrays on every host, gathered once
    (`parallel.whole_on_host`; on one host simply a copy to host memory)."""
    return parallel.whole_on_host(rollout)
