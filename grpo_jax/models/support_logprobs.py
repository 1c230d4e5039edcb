"""Token log-probs renormalised over a recorded sampling support, without `[B, T, V]` logits.

Keep-sampling-mask (DeepSeek-V3.2, arXiv:2512.02556 sec. 3.1): when rollouts are drawn
with top-p / top-k, the tokens the cut kept at each position (`sampling.Rollout.support_ids`)
are recorded, and in training both pi_old and pi_theta are renormalised over that set, so
the ratio compares the distributions the sampler actually drew from. Only the support's
logits are needed: K unembedding columns per position instead of V.
"""

import jax
import jax.numpy as jnp


def _renormalised(h_cd, w_vd, y_c, ids_ck, temperature):
    """`[C]` z_y / tau - logsumexp over the valid ids of z / tau, for one chunk; `w_vd` is
    the unembedding transposed, so a gathered column is a contiguous row."""
    valid_ck = ids_ck >= 0
    support_ck = jnp.einsum("cd,ckd->ck", h_cd, jnp.take(w_vd, jnp.maximum(ids_ck, 0), axis=0),
                            preferred_element_type=jnp.float32) / temperature
    chosen_c = jnp.einsum("cd,cd->c", h_cd, jnp.take(w_vd, y_c, axis=0),
                          preferred_element_type=jnp.float32) / temperature
    masked_ck = jnp.where(valid_ck, support_ck, -jnp.inf)
    any_valid_c = jnp.any(valid_ck, axis=-1)
    lse_c = jax.nn.logsumexp(jnp.where(any_valid_c[:, None], masked_ck, 0.0), axis=-1)
    return jnp.where(any_valid_c, chosen_c - lse_c, 0.0)


def support_token_logprobs(
    hidden, unembedding, tokens, support_ids, *, temperature=1.0, chunk_size=256
):
    r"""Log-prob of each token under the tempered softmax restricted to its support.

    .. math:: \log \pi_S(y_t) = z_{t, y_t} / \tau - \operatorname{logsumexp}_{v \in S_t}
       (z_{t, v} / \tau), \quad z_t = h_t W, \quad S_t = \{\text{support\_ids}[t, k] \ge 0\}

    The logits of the K support ids are computed from the gathered unembedding columns,
    `chunk_size` positions at a time under `jax.checkpoint` (peak memory
    `chunk_size * K * D` for the gathered columns; the backward pass recomputes them).

    What a trainer does with `sampling.Rollout` fields, K = `support_ids.shape[-1]`:
    where `support_size <= K` the support is recorded and this is the log-prob of the
    distribution that drew the token (equal to `Rollout.sample_logp` at the sampler's
    parameters); where `support_size > K` the cut kept more tokens than were recorded
    (a nucleus larger than the candidate bound, which removed at most 1 - p of the mass)
    and the trainer uses the full-softmax log-prob instead, e.g.
    `jnp.where(support_size <= K, support_logp, chunked_token_logprobs(...))`.

    Args:
      hidden: `[B, T, D]` final (normed) hidden states (`Decoder.hidden_states`).
      unembedding: `[D, V]` output projection (`Decoder.unembedding()`).
      tokens: `[B, T]` token ids whose log-probs to take; each should be in its support.
      support_ids: `[B, T, K]` int32 token ids of each position's support, -1 for none.
        A position with no valid id gets 0 (as if its support were the token alone).
      temperature: `\tau`, the sampling temperature (a float or scalar array).
      chunk_size: positions per chunk; B*T need not be a multiple.

    Returns:
      `[B, T]` float32 log-probabilities.

    Example:
      >>> h, w = jnp.ones((1, 1, 2)), jnp.array([[0.0, 1.0, 2.0], [0.0, 0.0, 0.0]])
      >>> support_token_logprobs(h, w, jnp.array([[1]]), jnp.array([[[2, 1, -1]]]))  # -log(1 + e)
      Array([[-1.3132615]], dtype=float32)
    """
    b, t, d = hidden.shape
    k = support_ids.shape[-1]
    n = b * t
    n_chunks = -(-n // chunk_size)
    pad = n_chunks * chunk_size - n
    h = jnp.pad(hidden.reshape(n, d), ((0, pad), (0, 0))).reshape(n_chunks, chunk_size, d)
    y = jnp.pad(tokens.reshape(n), (0, pad)).reshape(n_chunks, chunk_size)
    ids = jnp.pad(support_ids.reshape(n, k), ((0, pad), (0, 0)), constant_values=-1)
    ids = ids.reshape(n_chunks, chunk_size, k)
    w_vd = unembedding.T.astype(hidden.dtype)

    @jax.checkpoint
    def chunk(args):
        h_cd, y_c, ids_ck = args
        return _renormalised(h_cd, w_vd, y_c, ids_ck, temperature)

    return jax.lax.map(chunk, (h, y, ids)).reshape(-1)[:n].reshape(b, t)
