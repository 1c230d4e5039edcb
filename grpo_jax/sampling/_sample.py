"""Drawing one token per row from a method's distribution, and the support it was drawn from."""

import jax
import jax.numpy as jnp
from flax import struct

from grpo_jax.sampling._methods import Greedy, tempered_log_probs

BLOCK = 256  # entries per block of the two-level inverse CDF


@struct.dataclass
class Support:
    """The tokens a cut kept, per row (keep-sampling-mask, DeepSeek-V3.2 arXiv:2512.02556
    sec. 3.1: training renormalises pi_old and pi_theta over this set).

    Attributes:
      ids: `[B, K]` int32, the kept token ids in descending probability, then -1. K is
        the method's candidate bound (`TopP.max_candidates`, `TopK.max_k`, ...; 1 for
        `Greedy`, 0 for `Temperature`).
      size: `[B]` int32, the number of kept tokens. `size <= K`: `ids` holds exactly
        the support. `size > K` (the nucleus did not fit, or `Temperature`, whose
        support is the whole vocabulary, size V): `ids` holds its K most likely tokens,
        and the support is not recorded.
    """

    ids: jax.Array
    size: jax.Array


def inverse_cdf(weights_bv, u_b):
    """Per row, the first index whose cumulative weight exceeds `u * total`, in two levels.

    The rows are cut into blocks of `BLOCK`; the block totals' cumulative sum picks the
    block, and a cumulative sum within that one block picks the index. Two passes over
    `[B, V]` (one sum) instead of a full-length cumulative sum, which XLA:CPU runs as a
    tree of windowed sums: 5-10x faster at V = 49,152. The float32 sums perturb the
    boundaries by ~1e-7 relative; an index of weight 0 is never returned.

    Args:
      weights_bv: `[B, V]` float32 non-negative weights, each row with a positive sum.
      u_b: `[B]` uniform numbers in [0, 1).

    Returns:
      `(index [B] int32, total [B] float32 weight of the row)`.
    """
    b, v = weights_bv.shape
    blocks_bnk = jnp.pad(weights_bv, ((0, 0), (0, -v % BLOCK))).reshape(b, -1, BLOCK)
    block_mass_bn = jnp.sum(blocks_bnk, axis=-1)
    cdf_bn = jnp.cumsum(block_mass_bn, axis=-1)
    total_b = cdf_bn[:, -1]
    target_b = u_b * total_b
    # The first block whose cdf exceeds the target; `last` (the first reaching the total,
    # so of positive mass) guards against u * total rounding up to the total.
    last_b = jnp.argmax(cdf_bn >= total_b[:, None], axis=-1)
    block_b = jnp.minimum(jnp.sum(cdf_bn <= target_b[:, None], axis=-1), last_b)
    before_b = jnp.where(
        block_b > 0, jnp.take_along_axis(cdf_bn, block_b[:, None] - 1, axis=-1)[:, 0], 0.0
    )
    within_bk = jnp.take_along_axis(blocks_bnk, block_b[:, None, None], axis=1)[:, 0]
    within_cdf_bk = jnp.cumsum(within_bk, axis=-1)
    last_in_b = jnp.argmax(within_cdf_bk >= within_cdf_bk[:, -1:], axis=-1)
    offset_b = jnp.minimum(
        jnp.sum(within_cdf_bk <= (target_b - before_b)[:, None], axis=-1), last_in_b
    )
    return (block_b * BLOCK + offset_b).astype(jnp.int32), total_b


def _uniforms(rng, b):
    """`[B]` uniform numbers in [0, 1): from one key, or one from each of `[B]` keys."""
    single = 0 if jax.dtypes.issubdtype(rng.dtype, jax.dtypes.prng_key) else 1
    if rng.ndim == single:
        return jax.random.uniform(rng, (b,))
    return jax.vmap(lambda key: jax.random.uniform(key, ()))(rng)


def sample(method, rng, logits_bv, *, with_support=False):
    """Draws one token per row from `method`'s distribution, by inverse CDF.

    One uniform number per row picks the first token (in id order) whose cumulative kept
    probability exceeds it (`inverse_cdf`): V times fewer random bits than Gumbel-max
    (`jax.random.categorical`), which was 4x slower at B = 256, V = 512 on CPU. The
    returned log-probs are log q_x - log(kept mass), q the tempered probabilities.

    Args:
      method: `Greedy`, `Temperature`, `TopK`, `TopP` or `MinP`.
      rng: a PRNG key, or `[B]` keys, one per row: then a row's token depends on its
        own key and logits only, not on the other rows of the batch.
      logits_bv: `[B, V]` next-token logits.
      with_support: also return the `Support` the token was drawn from (static).

    Returns:
      `(tokens [B] int32, log-probs [B] float32 of those tokens under the method)`, and
      the `Support` with `with_support`.

    Example:
      >>> tokens, logp = sample(Greedy(), jax.random.key(0), jnp.array([[0.0, 2.0, 1.0]]))
      >>> tokens, logp
      (Array([1], dtype=int32), Array([0.], dtype=float32))
    """
    b = logits_bv.shape[0]
    if isinstance(method, Greedy):
        tokens_b = jnp.argmax(logits_bv, axis=-1).astype(jnp.int32)
        logp_b = jnp.zeros((b,), jnp.float32)
        support = Support(ids=tokens_b[:, None], size=jnp.ones((b,), jnp.int32))
    else:
        logp_bv = tempered_log_probs(logits_bv, method.temperature)
        q_bv = jnp.exp(logp_bv)
        floor_b, candidates_bk = method.cut(q_bv)
        keep_bv = q_bv >= floor_b[:, None]
        tokens_b, kept_mass_b = inverse_cdf(jnp.where(keep_bv, q_bv, 0.0), _uniforms(rng, b))
        logp_b = jnp.take_along_axis(logp_bv, tokens_b[:, None], axis=-1)[:, 0] - jnp.log(
            kept_mass_b
        )
        size_b = jnp.sum(keep_bv, axis=-1, dtype=jnp.int32)
        in_support_bk = jnp.arange(candidates_bk.shape[-1]) < size_b[:, None]
        support = Support(ids=jnp.where(in_support_bk, candidates_bk, -1), size=size_b)
    return (tokens_b, logp_b, support) if with_support else (tokens_b, logp_b)
