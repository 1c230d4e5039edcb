"""The top-p floor without sorting the vocabulary: a bounded candidate set, then an exact
bisection for the rows whose nucleus does not fit in it.

Nucleus sampling (Holtzman et al. 2020, arXiv:1904.09751) keeps token v when the
probability of the tokens strictly more likely than v is below p. The kept set is
therefore "every token with probability >= floor", floor the smallest kept probability,
and finding the floor is all top-p needs. A full sort of a 49k-152k vocabulary costs
~30x a decode step's sampling on CPU; this finds the same floor from

1. the `max_candidates` most likely tokens (`lax.top_k`): their cumulative sum is the
   full sort's cumulative sum over its first K entries, so when the K-th candidate is
   already cut (its preceding mass reaches p) the floor is the last kept candidate;
2. for the other rows, a bisection over the float32 bit patterns of the probabilities
   (~28 passes over the row, each a masked sum), which ends on the smallest present
   probability whose strictly-larger mass is below p: the floor itself, not an
   approximation of it. It runs only while some row needs it (`lax.while_loop`).
"""

import jax
import jax.numpy as jnp
import numpy as np


def _order_key(x):
    """float32 -> int32 with the same order (x < y iff key(x) < key(y)), for non-NaN x."""
    bits = jax.lax.bitcast_convert_type(x, jnp.int32)
    return bits ^ ((bits >> 31) & 0x7FFFFFFF)


def _from_order_key(key):
    """The inverse of `_order_key` (the map is its own inverse on the bits)."""
    return jax.lax.bitcast_convert_type(key ^ ((key >> 31) & 0x7FFFFFFF), jnp.float32)


def _bisect_floor(q_bv, p, lo_b, hi_b):
    """Narrows `(lo, hi]` (order keys) to one probability per row: the smallest t with
    mass(q > t) < p, given mass(q > value(lo)) >= p and mass(q > value(hi)) < p.

    The mass above t only changes at probabilities present in the row, so when lo and hi
    are adjacent keys, value(hi) is present: the floor. Rows already adjacent are left as
    they are; the loop stops when every row is.
    """
    def unresolved(bounds):
        lo_b, hi_b = bounds
        return jnp.any(hi_b - lo_b > 1)

    def halve(bounds):
        lo_b, hi_b = bounds
        mid_b = lo_b + (hi_b - lo_b) // 2
        above_b = jnp.sum(jnp.where(q_bv > _from_order_key(mid_b)[:, None], q_bv, 0.0), axis=-1)
        cut_b = above_b < p  # mid is at or above the floor
        return jnp.where(cut_b, lo_b, mid_b), jnp.where(cut_b, mid_b, hi_b)

    _, hi_b = jax.lax.while_loop(unresolved, halve, (lo_b, hi_b))
    return _from_order_key(hi_b)


def nucleus_floor(q_bv, p, max_candidates):
    """The smallest probability top-p keeps in each row, and the row's top candidates.

    Token v is kept iff the probability of the tokens strictly more likely than v is
    below p (so the most likely token is always kept, and tokens tied at the floor are
    all kept); equivalently, iff `q_v >= floor`. This is transformers'
    `TopPLogitsWarper` on distinct probabilities (which, on ties at the floor, keeps
    whichever tied tokens its sort order puts first).

    Equality with the full sort. The floor is one of the row's probabilities, found by
    comparisons, so it equals the floor of a full descending sort followed by a float32
    cumulative sum (how `TopP` and transformers computed it) except when the mass
    preceding some token lies within float32 rounding of p (|mass - p| below ~1e-6; in
    the tests, about 1 row in 100 of a 2,000-token nucleus): the candidates' cumulative
    sum and the bisection's masked sums add the same numbers in another order, and there
    either result is as close to the exact nucleus. Ties at the floor, `-inf` logits
    (probability 0: never kept) and nuclei larger than the candidates are exact.

    Args:
      q_bv: `[B, V]` float32 probabilities of the tempered distribution.
      p: the nucleus mass in (0, 1], a float or scalar array.
      max_candidates: K, static: the candidates taken by `lax.top_k`. Rows whose
        nucleus has fewer than K tokens resolve from them; the others bisect.

    Returns:
      `(floor [B] float32, candidate ids [B, K] int32 in descending probability)`.
    """
    b, v = q_bv.shape
    k = min(max_candidates, v)
    top_bk, ids_bk = jax.lax.top_k(q_bv, k)
    mass_before_bk = jnp.cumsum(top_bk, axis=-1) - top_bk
    kept_bk = mass_before_bk < p  # a prefix, never empty: mass_before is 0 at the top
    fits_b = ~kept_bk[:, -1]  # the K-th candidate is cut, so the floor is a candidate
    floor_b = jnp.min(jnp.where(kept_bk, top_bk, jnp.inf), axis=-1)
    # Below (1 - p) / V, the tokens at or under t hold less than 1 - p: the mass above t
    # is more than p (the factor e covers float32 rounding of the total).
    bound = (1.0 - p) / (np.e * v)
    lo_b = jnp.where(
        fits_b, _order_key(floor_b) - 1, _order_key(jnp.full((b,), bound, jnp.float32))
    )
    # The largest probability from the row, not `top_bk[:, 0]`: XLA:CPU rewrites top-k as
    # a full sort when its values are sliced (reductions over all K are safe).
    hi_b = jnp.where(fits_b, _order_key(floor_b), _order_key(jnp.max(q_bv, axis=-1)))
    return _bisect_floor(q_bv, p, lo_b, hi_b), ids_bk
