"""Length buckets: prompts and completion buffers padded to a few sizes, so that a new
length reuses a compiled sampler instead of compiling a new one."""

import numpy as np


def bucket_length(n, *, buckets=None, minimum=16):
    """The smallest bucket >= n.

    Args:
      n: a length (tokens).
      buckets: increasing sizes to choose from; None means powers of two >= `minimum`.
      minimum: the smallest power-of-two bucket when `buckets` is None.

    Example:
      >>> bucket_length(5), bucket_length(17), bucket_length(40, buckets=(32, 64))
      (16, 32, 64)
    """
    if buckets is None:
        return max(minimum, 1 << max(int(n) - 1, 0).bit_length())
    fits = [b for b in buckets if b >= n]
    if not fits:
        raise ValueError(
            f"length {n} exceeds the largest bucket {max(buckets)}; add a larger bucket"
        )
    return min(fits)


def pad_prompts(prompts, *, pad_id, buckets=None):
    """Left-pads token-id lists into one bucketed `[P, S]` array.

    Left padding puts every prompt's last token in the last column, where the sampler's
    prefill reads the next-token logits (see `models.Decoder.prefill`).

    Args:
      prompts: P non-empty sequences of token ids.
      pad_id: the id written in padding (masked out; any valid id).
      buckets: passed to `bucket_length` for S.

    Returns:
      `(tokens [P, S] int32, mask [P, S] int32)`, mask 1 on prompt tokens.

    Example:
      >>> tokens, mask = pad_prompts([[5, 6, 7], [8]], pad_id=0, buckets=(4, 8))
      >>> tokens.tolist(), mask.tolist()
      ([[0, 5, 6, 7], [0, 0, 0, 8]], [[0, 1, 1, 1], [0, 0, 0, 1]])
    """
    if not prompts:
        raise ValueError("prompts is empty; pass at least one prompt")
    empty = [i for i, p in enumerate(prompts) if len(p) == 0]
    if empty:
        raise ValueError(f"prompts {empty} have no tokens; every prompt needs at least one")
    length = bucket_length(max(len(p) for p in prompts), buckets=buckets)
    tokens = np.full((len(prompts), length), pad_id, np.int32)
    mask = np.zeros((len(prompts), length), np.int32)
    for row, prompt in enumerate(prompts):
        tokens[row, length - len(prompt):] = prompt
        mask[row, length - len(prompt):] = 1
    return tokens, mask
