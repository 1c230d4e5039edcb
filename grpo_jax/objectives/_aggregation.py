"""Reducing per-token losses to one number: the four modes, named as in verl."""

import jax.numpy as jnp

from grpo_jax.objectives import _checks

AGGREGATION_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum",
                     "seq-mean-token-sum-norm", "bnpo")
# Modes whose value over micro-batches does not add up to the full batch's.
SPLIT_DEPENDENT_MODES = ("bnpo",)


def aggregate(loss, mask, *, mode, num_tokens=None, num_seqs=None, norm_len=None,
              local_seqs=None):
    r"""Reduces a per-token loss `[B, T]` to a scalar.

    =========================  =====================================================
    mode                       value
    =========================  =====================================================
    ``token-mean``             sum(L m) / num_tokens  (DAPO, Dr. GRPO token form)
    ``seq-mean-token-mean``    sum_i [sum_t (L m) / n_i] / num_seqs  (GRPO, GSPO)
    ``seq-mean-token-sum``     sum(L m) / num_seqs
    ``seq-mean-token-sum-norm`` sum(L m) / (num_seqs * norm_len)  (Dr. GRPO)
    ``bnpo``                   sum(L m) / n * local_seqs / num_seqs  (TRL's "bnpo")
    =========================  =====================================================

    n_i is row i's count of valid tokens. The defaults are this batch's own counts
    (num_tokens = mask.sum(), num_seqs = B, norm_len = T). A trainer that splits a
    batch into micro-batches or shards it passes the GLOBAL num_tokens and num_seqs, so
    the pieces' losses add up to the full batch's loss and the gradient does not depend
    on the split. Fully masked rows contribute 0; a fully masked batch gives 0, not NaN,
    also with a global count of 0 (a micro-batch of padding rows only).

    ``bnpo`` is the exception, on purpose: the token mean of the batch passed in (n its
    own valid tokens, whatever num_tokens says), weighted by its share of the rows,
    local_seqs / num_seqs (1 without global counts). Summed over equal micro-batches
    that is TRL's loss_type="bnpo": each micro-batch's token mean divided by the
    gradient accumulation steps. Its value depends on the split (TRL: "results may
    slightly vary depending on the local batch size").

    Args:
      loss: `[B, T]` per-token loss.
      mask: `[B, T]` response mask.
      mode: one of the four modes above.
      num_tokens: scalar, the valid-token count of the whole batch.
      num_seqs: scalar, the row count of the whole batch.
      norm_len: Python int >= 1, the constant divisor per row (Dr. GRPO: the max
        response length).
      local_seqs: scalar, ``bnpo``'s count of this batch's rows as num_seqs counts
        them (padding rows excluded); default B.

    Returns:
      scalar float32.

    Example:
      >>> loss = jnp.array([[1., 1, 0], [2, 0, 0]]); mask = jnp.array([[1, 1, 0], [1, 0, 0]])
      >>> (aggregate(loss, mask, mode="token-mean"),
      ...  aggregate(loss, mask, mode="seq-mean-token-mean"))
      (Array(1.3333334, dtype=float32), Array(1.5, dtype=float32))

    References:
      Yu et al., DAPO (2025), sec. 3.3; Liu et al., Dr. GRPO (2025), sec. 3.1; TRL's
      GRPOTrainer (loss_type "bnpo").
    """
    _checks.check_choice("mode", mode, AGGREGATION_MODES)
    _checks.check_real("aggregate", loss=loss, mask=mask)
    _checks.check_token_arrays("aggregate", loss=loss, mask=mask)
    _checks.check_binary_mask("aggregate", "mask", mask)
    _checks.check_scalar("aggregate", num_tokens=num_tokens, num_seqs=num_seqs, norm_len=norm_len,
                         local_seqs=local_seqs)
    if norm_len is not None:
        _checks.check_greater("aggregate: norm_len", norm_len, 0)
    loss, mask = jnp.asarray(loss), jnp.asarray(mask)
    valid = mask.astype(bool)
    masked = jnp.where(valid, loss.astype(jnp.promote_types(loss.dtype, jnp.float32)), 0.0)
    if mode == "bnpo":
        local_mean = jnp.sum(masked) / jnp.maximum(jnp.sum(valid, dtype=jnp.float32), 1)
        if num_seqs is None:
            return local_mean
        rows = loss.shape[0] if local_seqs is None else local_seqs
        return local_mean * rows / jnp.maximum(num_seqs, 1)
    num_seqs = loss.shape[0] if num_seqs is None else jnp.maximum(num_seqs, 1)
    if mode == "token-mean":
        # A float sum of the mask fuses with the loss sum; a bool count costs its own pass.
        num_tokens = jnp.sum(valid, dtype=jnp.float32) if num_tokens is None else num_tokens
        return jnp.sum(masked) / jnp.maximum(num_tokens, 1)
    if mode == "seq-mean-token-mean":
        row_lengths = jnp.maximum(jnp.sum(valid, axis=-1, dtype=jnp.float32), 1)
        return jnp.sum(jnp.sum(masked, axis=-1) / row_lengths) / num_seqs
    if mode == "seq-mean-token-sum":
        return jnp.sum(masked) / num_seqs
    norm_len = loss.shape[1] if norm_len is None else norm_len
    return jnp.sum(masked) / (num_seqs * norm_len)
