"""Packed forward passes: the rows' real tokens laid end to end in fewer, full rows.

A rollout batch keeps every row at the padded width S + N (prompts left-padded to S,
completions right-padded to N). On ragged answers most of that is padding, and a forward
pass over it spends its FLOPs there in the same proportion. Packing puts each row's real
tokens (its prompt, then its completion but the last token, which nothing reads) into
rows of width T = S + N - 1, first fit in decreasing length, several sequences to a row;
every token carries its sequence's segment id and its position inside the sequence,
attention stays inside a segment (`Decoder.hidden_states(segment_ids=...)`), and the
per-position results are gathered back to the `[b, N]` completion layout, so the
objectives see the arrays they see unpacked (equal up to float reordering:
tests/training/test_packing.py).

Plans are made on the host from the rows' lengths, before the programs run, in two
shapes: an update packs each micro-batch's rows into at most as many rows (`plan_pieces`;
R rounded up to one of `BUCKETS` sizes), and a forward pass over the whole batch (pi_old,
pi_ref, values) packs all of it and runs the packed rows a micro-batch's worth at a time
(`plan_chunks`; C chunks of r rows). A run compiles each program once per size it meets.
The arrays of a plan:

- ``pack_src``: `[..., R, T]` int32, where each packed token comes from: its flat index
  into the piece's `[b, S + N]` rows (prompt then completion columns); 0 on padding.
- ``pack_segments``: `[..., R, T]` int32, 1 + the sequence's row in the piece, 0 on padding.
- ``pack_positions``: `[..., R, T]` int32, the token's position in its sequence (from 0, as
  `decoder.default_positions` counts it unpacked).
- ``pack_target``: `[..., R, T]` int32, the flat index into the piece's `[b, N]`
  completion tokens of the token each position's output scores; 0 where none.
- ``pack_back``: `[..., b, N]` int32, for completion token t of row i the flat index into
  the `[R * T]` packed positions whose output scores it; 0 past the row's last token.
"""

import dataclasses
from collections.abc import Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from grpo_jax import parallel

KEYS = ("pack_src", "pack_segments", "pack_positions", "pack_target", "pack_back")
ROW_KEYS = KEYS[:4]   # `[R, T]` per packed position; pack_back is per completion token
BUCKETS = 8   # packed-row counts per piece size: R is a multiple of ceil(b / BUCKETS)


def read_mask(rows: Mapping[str, jax.Array]) -> jax.Array:
    """`[B, N]`: 1 on every completion token a forward pass reads. The loss's `mask` where
    the two agree; rows with tokens the loss skips but the model reads (a multi-turn
    episode's environment tokens) carry them in ``context_mask``."""
    return rows.get("context_mask", rows["mask"])


@jax.jit
def _lengths(prompt_mask, mask):
    """`[3, B]`: prompt and completion lengths, and 1 where the row is laid out as packing
    reads it (the prompt's tokens a suffix of its columns, the completion's a prefix)."""
    p = jnp.sum(prompt_mask, axis=1, dtype=jnp.int32)
    c = jnp.sum(mask, axis=1, dtype=jnp.int32)
    s, n = prompt_mask.shape[1], mask.shape[1]
    laid_out = (jnp.all((prompt_mask > 0) == (jnp.arange(s) >= s - p[:, None]), axis=1)
                & jnp.all((mask > 0) == (jnp.arange(n) < c[:, None]), axis=1))
    return jnp.stack([p, c, laid_out.astype(jnp.int32)])


def row_lengths(rows: Mapping[str, jax.Array]) -> tuple[np.ndarray, np.ndarray]:
    """`(prompt lengths [B], completion lengths [B])` of the rows, as numpy on every
    process (the rows may be split over processes). Raises ValueError for a row whose
    prompt is not left-padded or whose completion mask has a hole."""
    prompt, completion, laid_out = parallel.whole_on_host(
        _lengths(rows["prompt_mask"], read_mask(rows)))
    if not laid_out.all():
        raise ValueError(f"rows {np.flatnonzero(laid_out == 0)[:8].tolist()} are not the sampler's "
                         "layout (prompt left-padded, completion mask a prefix), which packed "
                         "forward passes read; set train.packing='off'")
    return prompt, completion


def bucket(needed: int, rows: int, ways: int) -> int:
    """The packed-row count for `needed` rows of a piece of `rows`: the next multiple of
    a step of about `rows / BUCKETS` (itself a multiple of the `ways` row shards), never
    more than `rows`."""
    step = ways * -(-rows // (BUCKETS * ways))
    return min(rows, max(step, -(-needed // step) * step))


def first_fit_decreasing(lengths: Sequence[int] | np.ndarray,
                         capacity: int) -> tuple[np.ndarray, np.ndarray, int]:
    """`(row [n], offset [n], rows used)`: each length placed in the first packed row with
    room, longest first (Johnson 1973: at most 11/9 OPT + 1 rows). Lengths of 0 are not
    placed (row -1)."""
    row, offset = np.full(len(lengths), -1), np.zeros(len(lengths), np.int64)
    free = np.full(len(lengths), capacity)
    used = 0
    for i in np.argsort(-np.asarray(lengths), kind="stable"):
        if lengths[i] <= 0:
            continue
        fits = np.flatnonzero(free[:used] >= lengths[i])
        r = fits[0] if len(fits) else used
        used += r == used
        row[i], offset[i] = r, capacity - free[r]
        free[r] -= lengths[i]
    return row, offset, used


def _sequence_lengths(p, c):
    """Tokens a row's sequence puts in a packed row: its prompt and completion but the
    completion's last token (nothing reads its output); 0 for a row without completion."""
    return np.where(c > 0, p + c - 1, 0)


def _layout(p, c, placement, rows, *, prompt_len, new_tokens):
    """One piece's plan arrays (`KEYS`, packed rows first) from its rows' `p`, `c` `[b]`
    prompt and completion lengths and their `first_fit_decreasing` placement, in `rows`
    packed rows (at least the placement's)."""
    width, capacity = prompt_len + new_tokens, prompt_len + new_tokens - 1
    lengths, (row, offset, _) = _sequence_lengths(p, c), placement
    src = np.zeros((rows, capacity), np.int32)
    segments, positions, target = np.zeros_like(src), np.zeros_like(src), np.zeros_like(src)
    back = np.zeros((len(p), new_tokens), np.int32)
    for i in np.flatnonzero(row >= 0):
        at = slice(offset[i], offset[i] + lengths[i])
        src[row[i], at] = i * width + prompt_len - p[i] + np.arange(lengths[i])
        segments[row[i], at] = i + 1
        positions[row[i], at] = np.arange(lengths[i])
        scoring = slice(offset[i] + p[i] - 1, offset[i] + lengths[i])   # the completion's scorers
        target[row[i], scoring] = i * new_tokens + np.arange(c[i])
        back[i, :c[i]] = row[i] * capacity + offset[i] + p[i] - 1 + np.arange(c[i])
    return dict(zip(KEYS, (src, segments, positions, target, back)))


def plan_pieces(prompt_lengths: np.ndarray, completion_lengths: np.ndarray, pieces: np.ndarray,
                *, prompt_len: int, new_tokens: int, ways: int) -> dict[str, np.ndarray]:
    """Each piece's rows packed on their own (an update's micro-batches).

    Args:
      prompt_lengths, completion_lengths: `[B]` real tokens of every row of the batch.
      pieces: `[n, b]` int, the batch rows of each piece, in the piece's row order.
      prompt_len: S; new_tokens: N, the padded widths.
      ways: the mesh's row shards (R is a multiple of it).

    Returns:
      `{key: [n, ...]}` for `KEYS`, R the same for every piece (the most any needs,
      rounded up by `bucket`).
    """
    pieces = np.asarray(pieces)
    p, c = np.asarray(prompt_lengths)[pieces], np.asarray(completion_lengths)[pieces]
    capacity = prompt_len + new_tokens - 1
    placements = [first_fit_decreasing(_sequence_lengths(p[m], c[m]), capacity)
                  for m in range(len(pieces))]
    rows = bucket(max(used for _, _, used in placements), pieces.shape[1], ways)
    layouts = [_layout(p[m], c[m], placements[m], rows, prompt_len=prompt_len,
                       new_tokens=new_tokens) for m in range(len(pieces))]
    return {k: np.stack([layout[k] for layout in layouts]) for k in KEYS}


def plan_chunks(prompt_lengths: np.ndarray, completion_lengths: np.ndarray, chunk_rows: int,
                *, prompt_len: int, new_tokens: int) -> dict[str, np.ndarray]:
    """The whole batch packed, in chunks of `chunk_rows` packed rows (a forward pass's
    pieces). Returns `{key: [C, chunk_rows, T]}` for `ROW_KEYS` and ``pack_back`` `[B, N]`
    into the `[C * chunk_rows * T]` packed positions."""
    p, c = np.asarray(prompt_lengths), np.asarray(completion_lengths)
    placement = first_fit_decreasing(_sequence_lengths(p, c), prompt_len + new_tokens - 1)
    rows = -(-max(placement[2], 1) // chunk_rows) * chunk_rows
    arrays = _layout(p, c, placement, rows, prompt_len=prompt_len, new_tokens=new_tokens)
    chunked = {k: arrays[k].reshape(-1, chunk_rows, arrays[k].shape[-1]) for k in ROW_KEYS}
    return {**chunked, "pack_back": arrays["pack_back"]}


def plan_sharding(shape: tuple[int, ...], mesh: jax.sharding.Mesh) -> jax.NamedSharding:
    """Where a plan array of `shape` lives: its rows (the second-to-last axis: packed rows,
    or the rows `pack_back` maps) split over the mesh's row axes, like the rows they
    index; replicated when they do not split."""
    axes = parallel.row_axes(mesh)
    if not parallel.rows_divide(shape[-2], parallel.row_ways(mesh)):
        return jax.NamedSharding(mesh, jax.P())
    return jax.NamedSharding(mesh, jax.P(*[None] * (len(shape) - 2), axes, None))


def place(arrays: Mapping[str, np.ndarray], mesh: jax.sharding.Mesh) -> dict[str, jax.Array]:
    """A host plan's arrays on the mesh (`plan_sharding`), every process reading its own
    slices of the same host arrays: a device holds its share, not the whole plan (a
    whole-batch plan at the papers' scale is ~1 GiB of int32)."""
    return {k: jax.make_array_from_callback(x.shape, plan_sharding(x.shape, mesh),
                                            lambda index, x=x: x[index])
            for k, x in arrays.items()}


@dataclasses.dataclass(frozen=True)
class Planner:
    """The plans of one batch (`[B, ...]` global arrays), its lengths fetched once.

    Attributes:
      lengths: `(prompt [B], completion [B])` numpy lengths (`row_lengths`).
      prompt_len, new_tokens: the batch's S and N.
      mesh: the device mesh the plans go to (`place`).
    """

    lengths: tuple[np.ndarray, np.ndarray]
    prompt_len: int
    new_tokens: int
    mesh: jax.sharding.Mesh

    @classmethod
    def of(cls, rows: Mapping[str, jax.Array], mesh: jax.sharding.Mesh) -> "Planner":
        return cls(row_lengths(rows), rows["prompt_tokens"].shape[1], rows["tokens"].shape[1], mesh)

    def pieces(self, pieces: np.ndarray) -> dict[str, jax.Array]:
        """`plan_pieces` of `[n, b]` batch rows (an update's micro-batches), on the mesh."""
        return place(plan_pieces(*self.lengths, pieces, prompt_len=self.prompt_len,
                                 new_tokens=self.new_tokens, ways=parallel.row_ways(self.mesh)),
                     self.mesh)

    def chunks(self, num_pieces: int) -> tuple[dict[str, jax.Array], dict[str, float]]:
        """`(plan_chunks on the mesh, its statistics)` in chunks of a `num_pieces`-th of
        the batch's rows."""
        rows = len(self.lengths[0])
        arrays = plan_chunks(*self.lengths, rows // num_pieces, prompt_len=self.prompt_len,
                             new_tokens=self.new_tokens)
        return place(arrays, self.mesh), statistics(arrays, rows)


def statistics(arrays: Mapping[str, np.ndarray], rows: int) -> dict[str, float]:
    """``{"pack_rows_fraction", "pack_fill"}`` of a plan of `rows` batch rows: packed rows
    per padded row, and the share of packed positions holding a token."""
    segments = arrays["pack_segments"]
    return {"pack_rows_fraction": segments.size / segments.shape[-1] / rows,
            "pack_fill": float(np.count_nonzero(segments) / segments.size)}


def packed_inputs(rows: Mapping[str, jax.Array],
                  routing: jax.Array | None = None) -> tuple[dict[str, jax.Array], jax.Array]:
    """What a forward over one piece's packed rows reads, gathered on device.

    Args:
      rows: the piece's `[b, ...]` rows (``prompt_tokens``, ``tokens``) and its plan
        (`KEYS`).
      routing: MoE keep routing: `[L_moe, b, S + N - 1, k]` experts of the unpacked
        forward's tokens, or None.

    Returns:
      `(inputs, targets [R, T])`: ``inputs`` the keyword arguments of
      `Decoder.hidden_states` (tokens, segment_ids, positions, routing), ``targets`` the
      token each position's output scores (the next token of its sequence).
    """
    flat = jnp.concatenate([rows["prompt_tokens"], rows["tokens"]], axis=1).reshape(-1)
    src = rows["pack_src"]
    inputs = {"tokens": flat[src], "segment_ids": rows["pack_segments"],
              "positions": rows["pack_positions"]}
    if routing is not None:
        width = rows["prompt_tokens"].shape[1] + rows["tokens"].shape[1]
        per_row = routing.reshape(routing.shape[0], -1, routing.shape[-1])   # [L, b (S+N-1), k]
        inputs["routing"] = per_row[:, src // width * (width - 1) + src % width]
    return inputs, flat[src + 1]


def unpack(x: jax.Array, back: jax.Array) -> jax.Array:
    """`[R, T, ...]` per packed position -> `[b, N, ...]` per completion token."""
    return x.reshape(-1, *x.shape[2:])[back]
