"""`generate`: checks a sampling request and runs the static sampler (`_generate`) or,
with slots, the continuous-batching engine (`_engine`)."""

import jax
import numpy as np

from grpo_jax.sampling._buckets import bucket_length
from grpo_jax.sampling._engine import generate_continuous
from grpo_jax.sampling._generate import _generate, _int32, _rule_axes, row_multiple
from grpo_jax.sampling._paged import check_pages, generate_paged


def generate(
    graphdef, state, prompt_tokens, prompt_mask, *, rng, method, group_size, max_new_tokens,
    stop_tokens, pad_id, prompt_ids=None, max_len_bucket=None, rules="sampling",
    record_support=False, record_routing=False, slots=0, kv_page_size=0, kv_pages=0,
    with_page_stats=False,
):
    """Samples `group_size` completions of every prompt.

    Under a mesh (`jax.set_mesh`), the rows are split over the mesh's row axes (every
    axis but "tensor", `parallel.row_axes`) and the weights are resharded on device to
    `rules`, once, before the loop. The same `rng` gives the same tokens on
    any mesh (threefry random bits do not depend on the sharding), and in any batch:
    completion g of the prompt with id i draws token t with
    ``fold_in(fold_in(fold_in(rng, i), g), t)`` (`row_keys`), so reordering the prompts
    (with their ids), sampling a prompt alone or with others, or asking for more
    completions per prompt leaves every completion's tokens as they were.

    Args:
      graphdef, state: `nnx.split(model)` of a `models.Decoder`; `state` may be the
        trainer's live (sharded) weights.
      prompt_tokens: `[P, S]` int32 left-padded prompts (see `pad_prompts`).
      prompt_mask: `[P, S]` 1 on prompt tokens; every row needs at least one.
      rng: a PRNG key (see above for how each token's key derives from it).
      method: `Greedy()`, `Temperature(t)`, `TopK(k, t)`, `TopP(p, t)` or `MinP(p, t)`.
      group_size: G, completions per prompt (static).
      max_new_tokens: the most tokens per completion in [1, N]: an int, a scalar array,
        or one per row (`[P*G]`, a row stopping at its own budget); a new value does not
        recompile.
      stop_tokens: ids that end a completion (e.g. `[eos]`), `[K]` ints; may be empty.
      pad_id: written after a completion's last token.
      prompt_ids: `[P]` ints naming each prompt's random streams (default 0..P-1); give
        a prompt the same id in another call to sample it the same way.
      max_len_bucket: N, the static completion buffer (`Rollout.tokens` is `[B, N]`);
        default `bucket_length(max_new_tokens)`, a power of two.
      rules: the weights' sharding rule set while sampling (`models.RULE_SETS`).
      record_support: also record, per sampled position, the tokens the method's cut
        kept (`Rollout.support_ids`, `support_size`: DeepSeek-V3.2's keep-sampling-mask,
        arXiv:2512.02556 sec. 3.1). Static; when False nothing is computed or stored
        for it and those fields are None.
      record_routing: on an MoE model, also record the experts every token went to
        (`Rollout.prompt_routing`, `routing`: DeepSeek-V3.2's keep routing), for a
        training forward to replay (`Decoder.hidden_states(routing=...)`). Static; it
        costs `B (S + N) L_moe k` int32 of memory. A dense model records nothing.
      slots: with 0 < slots < P*G, decode with continuous batching in that many slots
        (`_engine`): a row that stops hands its slot to the next pending row. The same
        tokens as the static batch (each row has its own random stream), up to float
        rounding in the logits, and the same records. 0 (or >= P*G): every row decodes
        at once.
      kv_page_size: with `slots`, tokens per page of a paged KV cache (`_paged`: a pool
        of pages shared by the slots, taken as rows grow and freed when they stop); 0:
        each slot has its own S + N columns. The same tokens either way. Not with
        `record_routing`.
      kv_pages: with `kv_page_size`, the pool's completion pages (at least one full
        row's, ceil(N / kv_page_size)); 0: enough for every slot's full budget.
      with_page_stats: return `(Rollout, _paged.PagedStats)` (with `kv_page_size` only).

    Returns:
      A `Rollout` of device arrays, rows sharded like the batch; `to_host` gathers it.
    """
    max_len_bucket, prompt_ids = check_request(
        prompt_tokens, prompt_mask, group_size, max_new_tokens, max_len_bucket, rules, prompt_ids
    )
    p = np.shape(prompt_tokens)[0]
    continuous = 0 < slots < p * group_size
    if kv_page_size:
        if not slots:
            raise ValueError(f"kv_page_size={kv_page_size} pages the slots' caches; set slots > 0")
        if record_routing:
            raise ValueError("kv_page_size does not record routing; set record_routing=False "
                             "or kv_page_size=0")
        num_slots = min(int(slots), p * group_size)
        check_slots(num_slots)
        check_pages(num_slots, int(max_len_bucket), int(kv_page_size), int(kv_pages))
        rollout, stats = generate_paged(
            graphdef, state, _int32(prompt_tokens), _int32(prompt_mask), rng, _int32(prompt_ids),
            method, _int32(stop_tokens).reshape(-1), _int32(pad_id), _int32(max_new_tokens),
            group_size=group_size, buffer_len=int(max_len_bucket), num_slots=num_slots,
            page_size=int(kv_page_size), kv_pages=int(kv_pages), rules=rules,
            record_support=bool(record_support))
        return (rollout, stats) if with_page_stats else rollout
    if with_page_stats:
        raise ValueError("with_page_stats needs kv_page_size > 0")
    if continuous:
        check_slots(slots)
        return generate_continuous(
            graphdef, state, _int32(prompt_tokens), _int32(prompt_mask), rng, _int32(prompt_ids),
            method, _int32(stop_tokens).reshape(-1), _int32(pad_id), _int32(max_new_tokens),
            group_size=group_size, buffer_len=int(max_len_bucket), num_slots=int(slots),
            rules=rules, record_support=bool(record_support), record_routing=bool(record_routing),
        )
    return _generate(
        graphdef, state, _int32(prompt_tokens), _int32(prompt_mask), rng, _int32(prompt_ids),
        method, _int32(stop_tokens).reshape(-1), _int32(pad_id), _int32(max_new_tokens),
        group_size=group_size, buffer_len=int(max_len_bucket), rules=rules,
        record_support=bool(record_support), record_routing=bool(record_routing),
    )


def check_request(prompt_tokens, prompt_mask, group_size, max_new_tokens, max_len_bucket, rules,
                  prompt_ids):
    """Checks a sampling request (`generate`'s arguments of the same names) and returns
    `(max_len_bucket, prompt_ids)` with their defaults filled in."""
    p, s = np.shape(prompt_tokens)
    if np.shape(prompt_mask) != (p, s):
        raise ValueError(
            f"prompt_mask has shape {np.shape(prompt_mask)}; it must match prompt_tokens {(p, s)}"
        )
    if group_size < 1:
        raise ValueError(f"group_size must be >= 1, got {group_size}")
    try:
        caps = np.asarray(max_new_tokens, np.int64)
    except (TypeError, jax.errors.TracerArrayConversionError):  # traced: clamped to the buffer
        caps = None
    if caps is not None and caps.ndim and caps.shape != (p * group_size,):
        raise ValueError(f"max_new_tokens is one int or one per row ([P*G] = [{p * group_size}]), "
                         f"got shape {caps.shape}")
    if max_len_bucket is None:
        if caps is None:
            raise ValueError("max_len_bucket is required when max_new_tokens is traced")
        max_len_bucket = bucket_length(int(caps.max()))
    if caps is not None and not (1 <= caps.min() and caps.max() <= max_len_bucket):
        raise ValueError(
            f"max_new_tokens must be in [1, max_len_bucket={max_len_bucket}], got {max_new_tokens}"
        )
    mesh = jax.sharding.get_abstract_mesh()
    if not mesh.empty:
        missing = sorted(_rule_axes(rules) - set(mesh.axis_names))
        if missing:
            raise ValueError(
                f"the {rules!r} sharding rules split weights over mesh axes {missing}, which the "
                f"mesh {dict(mesh.shape)} lacks; add them to the mesh (size 1 is fine)"
            )
        ways = row_multiple()
        if (p * group_size) % ways:
            raise ValueError(
                f"P*G = {p}*{group_size} rows do not split over the mesh's batch axes "
                f"({ways} ways); "
                f"use a number of prompts times group_size that is a multiple of {ways}"
            )
    if prompt_ids is None:
        prompt_ids = np.arange(p, dtype=np.int32)
    if np.shape(prompt_ids) != (p,):
        raise ValueError(
            f"prompt_ids has shape {np.shape(prompt_ids)}; it must be ({p},), one id per prompt"
        )
    return max_len_bucket, prompt_ids


def check_slots(slots):
    """Checks that `slots` split over the current mesh's row axes."""
    if slots % row_multiple():
        raise ValueError(f"slots={slots} do not split over the mesh's batch axes "
                         f"({row_multiple()} ways); use a multiple of {row_multiple()}")
