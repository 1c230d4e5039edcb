"""Token log-probs from final hidden states without materialising `[B, T, V]` float32 logits.

With real vocabularies (128k-152k) the float32 logits of a batch dwarf everything else:
B*T = 8,192 tokens x V = 151,936 x 4 bytes = 5 GB, and the backward pass of a naive
log-softmax keeps a second copy. Here the tokens are cut into chunks; each chunk's logits
are computed, reduced to one log-prob per token, and dropped, and `jax.checkpoint`
recomputes them in the backward pass. A chunk is a slice of every row's positions, so the
rows stay split over the devices as they are (chunks of the flattened `[B*T]` tokens made
each chunk live on one device and XLA gathered every row's hidden states on every chip).
Peak memory is O(chunk_size * V) instead of O(B * T * V); values and gradients equal the
naive path (tests/models/test_chunked_logprobs.py).
"""

import jax
import jax.numpy as jnp

from grpo_jax.models import sharding
from grpo_jax.objectives import entropy_from_logits, token_logprobs


def unembed(hidden, unembedding):
    """`[..., D]` x `[D, V]` -> `[..., V]` float32 logits (float32 accumulation)."""
    w = unembedding.astype(hidden.dtype)
    return jnp.einsum("...d,dv->...v", hidden, w, preferred_element_type=jnp.float32)


def chunked_token_logprobs(hidden, unembedding, tokens, *, temperature=1.0, chunk_size=1024,
                           with_entropy=False):
    r"""`token_logprobs(hidden @ unembedding, tokens)`, computed `chunk_size` tokens at a time.

    .. math:: \log \pi(y_t) = z_{t, y_t} / \tau - \operatorname{logsumexp}_v(z_{t, v} / \tau),
       \quad z_t = h_t W

    Args:
      hidden: `[B, T, D]` final (normed) hidden states, e.g. from
        `Decoder.hidden_states`, in any float dtype.
      unembedding: `[D, V]` output projection (`Decoder.unembedding()`).
      tokens: `[B, T]` int token ids whose log-probs to take.
      temperature: `\tau`, a float or scalar array.
      chunk_size: tokens per chunk, `chunk_size // B` positions of every row (at least
        one); peak logits memory is `chunk_size * V * 4` bytes over all devices. T need
        not be a multiple (the last chunk is padded).
      with_entropy: also return the entropy of each position's (tempered) distribution,
        from the same chunk of logits (`objectives.entropy_from_logits`).

    Returns:
      `[B, T]` float32 log-probabilities, or `(logp, entropy)` both `[B, T]`.

    Example:
      >>> h, w = jnp.ones((1, 3, 2)), jnp.eye(2)
      >>> chunked_token_logprobs(h, w, jnp.zeros((1, 3), jnp.int32), chunk_size=2)
      Array([[-0.6931472, -0.6931472, -0.6931472]], dtype=float32)
    """
    b, t, d = hidden.shape
    per_row = max(1, min(t, chunk_size // b))   # every chunk spans all rows
    n_chunks = -(-t // per_row)
    pad = n_chunks * per_row - t

    def to_chunks(x):   # [B, T, ...] -> [chunks, B, per_row, ...]
        x = jnp.pad(x, ((0, 0), (0, pad)) + ((0, 0),) * (x.ndim - 2))
        return x.reshape(b, n_chunks, per_row, *x.shape[2:]).swapaxes(0, 1)

    h, y = to_chunks(hidden), to_chunks(tokens)

    @jax.checkpoint
    def chunk(args):
        h_cd, y_c = args
        logits = unembed(sharding.constrain(h_cd, ("batch",)), unembedding)
        logp = token_logprobs(logits, y_c, temperature=temperature)
        if not with_entropy:
            return logp
        return logp, entropy_from_logits(logits / temperature)

    unchunk = lambda x: x.swapaxes(0, 1).reshape(b, -1)[:, :t]
    return jax.tree.map(unchunk, jax.lax.map(chunk, (h, y)))
