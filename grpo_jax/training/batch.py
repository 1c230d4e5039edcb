"""A batch of rows on the mesh: its layout, the log-probs of its completions, and its pieces.

Row layout (the sampler's): prompts left-padded to S columns, completions right-padded
to N columns, so column S is every row's first completion token. The model reads the
concatenation `[B, S + N]`; the logits at column c score the token at column c + 1.

Every function here takes and returns global arrays whose rows are split over the mesh's
row axes (`parallel.row_axes`); nothing here moves data to the host.
"""

import functools
from collections.abc import Mapping, Sequence
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from grpo_jax import objectives, parallel
from grpo_jax.models import Decoder, chunked_token_logprobs, support_token_logprobs
from grpo_jax.training import packing

# What a forward pass over rows reads: the tokens (and `context_mask`, `packing.read_mask`),
# and the sampler's records when the
# run keeps them (DeepSeek-V3.2's keep routing and keep sampling mask).
TOKEN_KEYS = ("prompt_tokens", "prompt_mask", "tokens", "mask", "context_mask")
RECORD_KEYS = ("prompt_routing", "routing", "support_ids", "support_size")
# The sampler's experts kept without keep routing: measured against, never replayed.
SAMPLED_ROUTING_KEYS = ("sampled_prompt_routing", "sampled_routing")


def _replayed_routing(rows, keys=("prompt_routing", "routing")):
    """`[L_moe, B, S+N-1, k]` experts for the forward over tokens[:, :-1] (keep routing)."""
    experts = jnp.concatenate([rows[keys[0]], rows[keys[1]]], axis=1)[:, :-1]
    return jnp.transpose(experts, (2, 0, 1, 3))


def sampled_routing(rows: Mapping[str, jax.Array]) -> jax.Array | None:
    """The sampler's experts of the forward's tokens, `[L_moe, B, S+N-1, k]` (replayed
    with keep routing, or only kept), or None when the rows carry none."""
    for keys in (("prompt_routing", "routing"), SAMPLED_ROUTING_KEYS):
        if keys[1] in rows:
            return _replayed_routing(rows, keys)
    return None


def changed_layers(experts: jax.Array, recorded: jax.Array) -> jax.Array:
    """`[b, T]` float32: the share of MoE layers whose top-k expert SET differs between
    two routings of the same tokens (the order within the k is ignored).

    Args:
      experts, recorded: `[L_moe, b, T, k]` int expert ids.
    """
    differ = jnp.any(jnp.sort(experts, axis=-1) != jnp.sort(recorded, axis=-1), axis=-1)
    return jnp.mean(differ.astype(jnp.float32), axis=0)


def model_inputs(rows: Mapping[str, jax.Array]) -> tuple[jax.Array, jax.Array, int]:
    """`(tokens, attention)`, both `[B, S+N-1]`, and `start`: what a forward pass over the
    rows reads (every token but the last). Its output at column ``start + t`` belongs to
    completion token t: it reads the prompt and the completion's tokens before t."""
    tokens = jnp.concatenate([rows["prompt_tokens"], rows["tokens"]], axis=1)
    attention = jnp.concatenate([rows["prompt_mask"], packing.read_mask(rows)], axis=1)
    return tokens[:, :-1], attention[:, :-1], rows["prompt_tokens"].shape[1] - 1


class Forward(NamedTuple):
    """How a forward pass over the rows is laid out (`forward_layout`).

    Attributes:
      inputs: keyword arguments of `Decoder.hidden_states` (and of a value model).
      scored: per-position outputs `[b', T', ...]` -> the positions to score.
      targets: the token each scored position's output scores.
      to_scored: per-completion-token arrays `[B, N, ...]` -> the scored layout.
      to_completion: scored outputs -> the `[B, N, ...]` completion layout.
    """

    inputs: dict
    scored: Callable
    targets: jax.Array
    to_scored: Callable
    to_completion: Callable


def forward_layout(rows: Mapping[str, jax.Array]) -> Forward:
    """The `Forward` of the rows: unpacked, `model_inputs` with the completion's columns
    (from ``start`` on) scored; with a packing plan (`packing.KEYS`), the packed rows,
    every position scored (`packing.packed_inputs`). A micro-batch of an update that
    carries ``dropout_key`` (`steps.make_update_step`) passes it to the forward."""
    routing = _replayed_routing(rows) if "routing" in rows else None
    dropout = {"dropout_key": rows["dropout_key"]} if "dropout_key" in rows else {}
    if packing.KEYS[0] in rows:
        inputs, targets = packing.packed_inputs(rows, routing)
        return Forward({**inputs, **dropout}, lambda x: x, targets,
                       lambda x: packing.unpack(x, rows["pack_target"]),
                       lambda x: packing.unpack(x, rows["pack_back"]))
    tokens, attention, start = model_inputs(rows)
    inputs = {"tokens": tokens, "attention_mask": attention, **dropout}
    if routing is not None:
        inputs["routing"] = routing
    same = lambda x: x
    return Forward(inputs, lambda x: x[:, start:], rows["tokens"], same, same)


def _routing_churn(layout, rows, experts):
    """`changed_layers` between the forward's own `experts` and the sampler's, in the
    forward's scored layout."""
    recorded = sampled_routing(rows)
    if packing.KEYS[0] in rows:   # the recorded experts gathered to the packed positions
        recorded = packing.packed_inputs(rows, recorded)[0]["routing"]
    return layout.scored(changed_layers(experts, recorded))


def scored_logprobs(model: Decoder, rows: Mapping[str, jax.Array], *, temperature: float = 1.0,
                    with_stats: bool = False,
                    with_churn: bool = False) -> jax.Array | tuple[jax.Array, ...]:
    """`completion_logprobs` in the forward's scored layout (`forward_layout`): `[B, N]`
    unpacked, `[R, T]` per packed position."""
    layout = forward_layout(rows)
    routed = {"with_routing": True} if with_churn else {}
    hidden, aux_loss, *experts = model.hidden_states(**layout.inputs, **routed)
    hidden = layout.scored(hidden)
    out = chunked_token_logprobs(hidden, model.unembedding(), layout.targets,
                                 temperature=temperature, with_entropy=with_stats)
    if "support_ids" in rows:
        logp = out[0] if with_stats else out
        support = layout.to_scored(rows["support_ids"])
        kept = support_token_logprobs(hidden, model.unembedding(), layout.targets, support,
                                      temperature=temperature)
        recorded = layout.to_scored(rows["support_size"] <= rows["support_ids"].shape[-1])
        logp = jnp.where(recorded, kept, logp)
        out = (logp, out[1]) if with_stats else logp
    churn = (_routing_churn(layout, rows, experts[0]),) if with_churn else ()
    return (*out, aux_loss, *churn) if with_stats else out


def completion_logprobs(model: Decoder, rows: Mapping[str, jax.Array], *, temperature: float = 1.0,
                        with_stats: bool = False,
                        with_churn: bool = False) -> jax.Array | tuple[jax.Array, ...]:
    """`[B, N]` float32 log-probs of the completion tokens, from logits / temperature.

    The temperature is the rollout's, so the log-probs that enter a ratio or a KL belong
    to the distribution the sampler drew from. Goes through the model's chunked log-prob
    path: the `[B, S+N, V]` logits are never materialised whole. Values past a row's last
    token are meaningless; the losses mask them. Rows carrying a packing plan are
    computed on their packed rows (`forward_layout`).

    DeepSeek-V3.2's corrections (arXiv:2512.02556, sec. 3.1), when the rows carry the
    sampler's records: with ``routing`` (keep routing) an MoE forward sends every token to
    the experts the sampler chose; with ``support_ids`` (keep sampling mask) the log-prob
    is renormalised over the tokens the sampler's top-p / top-k cut kept at that position
    (where the cut kept more than the K recorded, ``support_size > K``, over the whole
    vocabulary), so pi_old and pi_theta share the sampler's action subspace.

    With `with_stats`, returns `(logp, entropy [B, N], aux_loss [])`: the entropy of the
    tempered (uncut) distribution and the MoE load-balancing loss (0 for dense models);
    and with `with_churn` (an MoE whose rows carry the sampler's experts,
    `sampled_routing`) a fourth, `[B, N]` float32: at the forward position that scores
    each completion token, the share of MoE layers whose top-k expert set the router
    chooses now differs from the one the sampler's router chose (`changed_layers`; with
    keep routing, the set the replay overrode).
    """
    out = scored_logprobs(model, rows, temperature=temperature, with_stats=with_stats,
                          with_churn=with_churn)
    to_completion = forward_layout(rows).to_completion
    if not with_stats:
        return to_completion(out)
    return (to_completion(out[0]), to_completion(out[1]), out[2],
            *(to_completion(x) for x in out[3:]))


def nll_loss(model: Decoder,
             micro: Mapping[str, jax.Array]) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Token-mean negative log-likelihood of the targets, over the GLOBAL token count."""
    logp = completion_logprobs(model, micro)
    loss = objectives.aggregate(-logp, micro["mask"], mode="token-mean",
                                num_tokens=micro["num_tokens"])
    return loss, {"loss": loss}


def token_counts(minibatch: Mapping[str, jax.Array]) -> dict[str, jax.Array]:
    """Global counts of supervised rows: target tokens and real rows."""
    return {"num_tokens": jnp.sum(minibatch["mask"], dtype=jnp.float32),
            "num_seqs": jnp.sum(minibatch["row_valid"], dtype=jnp.float32)}


def pieces(tree: Mapping[str, jax.Array], count: int,
           mesh: jax.sharding.Mesh) -> dict[str, jax.Array]:
    """`[B, ...]` leaves -> `[count, B / count, ...]`, piece m holding rows m, m + count, ...

    Interleaving keeps each piece spread over every device (a device's block of rows
    holds rows of every piece), so no rows move between devices.
    """
    rows = jax.tree.leaves(tree)[0].shape[0]
    if rows % count:
        raise ValueError(f"{rows} rows do not split into {count} pieces; choose a divisor "
                         "(train.micro_batches, train.minibatches)")
    sharding = NamedSharding(mesh, PartitionSpec(None, parallel.row_axes(mesh)))
    spread = parallel.rows_divide(rows // count, parallel.row_ways(mesh))   # else left to XLA

    def split(x):
        x = x.reshape(rows // count, count, *x.shape[1:]).swapaxes(0, 1)
        return jax.lax.with_sharding_constraint(x, sharding) if spread else x

    return jax.tree.map(split, tree)


def piece_rows(rows: int, count: int) -> np.ndarray:
    """`[count, rows / count]`: the row numbers `pieces` puts in each piece, in order."""
    return np.arange(rows).reshape(rows // count, count).T


def unpieces(x: jax.Array) -> jax.Array:
    """The inverse of `pieces` for one `[count, b, ...]` array -> `[count * b, ...]`."""
    return x.swapaxes(0, 1).reshape(-1, *x.shape[2:])


def make_rows_fn(graphdef: nnx.GraphDef, mesh: jax.sharding.Mesh,
                 per_piece: Callable[[nnx.Module, dict[str, jax.Array]], jax.Array], *,
                 num_pieces: int,
                 keys: Sequence[str] = TOKEN_KEYS + RECORD_KEYS) -> Callable[..., jax.Array]:
    """Jitted ``(params, rows, plan=None) -> [B, N, ...]``.

    Unpacked, ``per_piece(model, piece)`` runs on `B / num_pieces` rows at a time (the
    rows of an update's micro-batch: the same activation memory) and returns `[b, N,
    ...]`. With `plan` (`packing.plan_chunks` of the same `num_pieces`), it runs on one
    chunk of packed rows at a time (as many rows as a piece), reading every row's
    tokens, and returns per packed position (`[r, T, ...]`, its scored layout);
    the results are gathered back to the rows.
    """

    def fn(params, rows, plan=None):
        model = nnx.merge(graphdef, params)
        rows = {k: rows[k] for k in keys if k in rows}
        if plan is None:
            split = pieces(rows, num_pieces, mesh)
            return unpieces(jax.lax.map(lambda piece: per_piece(model, piece), split))
        chunks = {k: plan[k] for k in packing.ROW_KEYS}
        out = jax.lax.map(lambda chunk: per_piece(model, {**rows, **chunk}), chunks)
        return packing.unpack(out.reshape(-1, *out.shape[2:]), plan["pack_back"])

    return jax.jit(fn, out_shardings=parallel.row_sharding(mesh))


def make_logprob_fn(graphdef: nnx.GraphDef, mesh: jax.sharding.Mesh, *, temperature: float,
                    num_pieces: int) -> Callable[..., jax.Array]:
    """Jitted ``(params, rows, plan=None) -> [B, N]`` completion log-probs, `B / num_pieces`
    rows (or packed rows) at a time."""
    per_piece = functools.partial(scored_logprobs, temperature=temperature)
    return make_rows_fn(graphdef, mesh, per_piece, num_pieces=num_pieces)
