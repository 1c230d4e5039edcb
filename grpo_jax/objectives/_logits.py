"""Quantities read off a model's logits: token log-probs (with a causal LM's shift for
completions) and entropy.

Both upcast to float32 first, whatever the model's compute dtype: a bf16 log-softmax
over a 150k vocabulary loses the small differences the ratios are made of.
"""

import jax
import jax.numpy as jnp
import numpy as np

from grpo_jax.objectives import _checks


def token_logprobs(logits, tokens, *, temperature=1.0):
    r"""Log-probability of each chosen token under the (tempered) softmax.

    .. math::
        \log \pi(y_t) = z_{t, y_t} / \tau - \operatorname{logsumexp}_v (z_{t, v} / \tau)

    Args:
      logits: `[..., T, V]` unnormalised scores, any float dtype.
      tokens: `[..., T]` integer token ids in `[0, V)`.
      temperature: `\tau`, a Python float or a scalar array (an array does not
        recompile when it changes). 1.0 gives the trainer's log-probs.

    Returns:
      `[..., T]` float32 log-probabilities.

    Example:
      >>> logits = jnp.log(jnp.array([[[0.5, 0.25, 0.25]]]))
      >>> token_logprobs(logits, jnp.array([[1]]))  # log 0.25
      Array([[-1.3862944]], dtype=float32)
    """
    _check_logits_and_tokens("token_logprobs", logits, tokens)
    logits, tokens = jnp.asarray(logits), jnp.asarray(tokens)
    scaled = logits.astype(jnp.float32) / temperature
    chosen = jnp.take_along_axis(scaled, tokens[..., None], axis=-1)[..., 0]
    return chosen - jax.nn.logsumexp(scaled, axis=-1)


def _check_logits_and_tokens(fn, logits, tokens):
    """`logits` `[..., V]` floating, `tokens` `[...]` = logits' shape without V, integer."""
    _checks.check_floating(fn, logits=logits)
    _checks.check_integer(fn, tokens=tokens)
    shape = _checks.check_last_axis(fn, "logits", logits)
    if _checks.shape_of(tokens) != shape[:-1]:
        raise _checks.shape_error(
            fn, "tokens", f"[..., T] = {_checks.shape_text(shape[:-1])}",
            _checks.shape_of(tokens),
            sizes=f"logits [..., T, V] = {_checks.shape_text(shape)}")


def completion_logprobs(logits, tokens, prompt_lengths, completion_len, *, temperature=1.0):
    r"""Log-probabilities of each row's completion tokens from a causal LM's logits.

    A causal language model's logits at position t score the *next* token, t + 1. For a
    row whose prompt takes positions `[0, p)` and whose completion follows at `[p, p + N)`,
    completion token j is scored by the logits at position p + j - 1:

    .. math::
        \log \pi(y_j \mid x, y_{<j}) = \log\operatorname{softmax}(z_{p + j - 1} / \tau)_{s_{p + j}}

    (`token_logprobs(logits, tokens)` on the same arrays would score each token with the
    logits that have already seen it.)

    Args:
      logits: `[B, L, V]` the model's logits on `tokens`, any float dtype.
      tokens: `[B, L]` each row's prompt then completion (then padding), L >= p + N.
      prompt_lengths: `[B]` integer p per row (prompts right-padded to where their
        completion starts), or a Python int for prompts that all end at the same position
        (left-padded prompts); 1 <= p and p + N <= L.
      completion_len: N, a Python int: completion positions to score per row. Positions
        past a row's completion hold what follows it; mask them in the loss.
      temperature: `\tau`, as in `token_logprobs`.

    Returns:
      `[B, N]` float32 log-probabilities, the layout every loss here takes as ``logp``.

    Raises:
      ValueError: when a prompt length is 0 (its first completion token has no logits
        that score it) or a row's p + N passes L, for a Python int or a concrete array.
        Under jit the lengths are not known: such rows' positions are NaN instead (a
        loss that reads them is NaN).

    Example:
      >>> logits = jnp.log(jnp.array([[[0.1, 0.9], [0.3, 0.7], [0.5, 0.5]]]))
      >>> completion_logprobs(logits, jnp.array([[0, 1, 0]]), 1, 2)  # log 0.9, log 0.3
      Array([[-0.10536057, -1.2039728 ]], dtype=float32)
    """
    fn = "completion_logprobs"
    _checks.check_static_int("completion_len", completion_len, fn=fn)
    if not isinstance(completion_len, int) or completion_len < 1:
        raise ValueError(f"{fn}: completion_len must be a Python int >= 1 (the static N of "
                         f"the [B, N] result), got {completion_len!r}")
    _checks.check_floating(fn, logits=logits)
    _checks.check_integer(fn, tokens=tokens)
    _checks.check_real(fn, prompt_lengths=prompt_lengths)
    if len(_checks.shape_of(tokens)) != 2:
        raise _checks.shape_error(fn, "tokens", "[B, L] (rows x prompt and completion "
                                  "positions)", _checks.shape_of(tokens))
    logits, tokens = jnp.asarray(logits), jnp.asarray(tokens)
    b, length = tokens.shape
    if _checks.shape_of(logits)[:2] != (b, length) or len(_checks.shape_of(logits)) != 3:
        raise _checks.shape_error(fn, "logits", f"[B, L, V] with [B, L] = tokens' {(b, length)}",
                                  _checks.shape_of(logits))
    _checks.check_scalar_or_rows(fn, "prompt_lengths", prompt_lengths, b)
    _check_prompt_range(fn, prompt_lengths, completion_len, length)
    starts = jnp.broadcast_to(jnp.asarray(prompt_lengths, jnp.int32), (b,))
    unclipped = starts[:, None] + jnp.arange(completion_len)                         # [B, N]
    targets = jnp.clip(unclipped, 0, length - 1)
    scoring = jnp.clip(targets - 1, 0, length - 1)
    chosen_logits = jnp.take_along_axis(logits, scoring[..., None], axis=1)          # [B, N, V]
    logp = token_logprobs(chosen_logits, jnp.take_along_axis(tokens, targets, axis=1),
                          temperature=temperature)
    # Traced lengths out of range: NaN, not a clamped neighbour's log-prob.
    in_range = (starts[:, None] >= 1) & (unclipped < length)
    return jnp.where(in_range, logp, jnp.nan)


def _check_prompt_range(fn, prompt_lengths, completion_len, length):
    """Raises ValueError unless 1 <= p and p + N <= L for every row (when p is known)."""
    if any(isinstance(x, jax.core.Tracer) or not getattr(x, "is_fully_addressable", True)
           for x in _checks.leaves(prompt_lengths)):
        return   # not known here: out-of-range positions come out NaN
    starts = np.asarray(prompt_lengths).reshape(-1)
    if starts.size == 0:
        return
    low, high = int(starts.min()), int(starts.max())
    if low < 1:
        raise ValueError(f"{fn}: prompt_lengths must be >= 1, got {low}: the first completion "
                         "token is scored by the logits of the position before it, so a "
                         "row needs at least one prompt token (e.g. BOS)")
    if high + completion_len > length:
        raise ValueError(f"{fn}: prompt_lengths + completion_len must be <= L = {length} "
                         f"(tokens' length), got {high} + {completion_len} = "
                         f"{high + completion_len}: pad tokens and logits to that length, or "
                         "score fewer completion positions")


def entropy_from_logits(logits):
    r"""Entropy of the softmax distribution at every position.

    .. math:: H = \operatorname{logsumexp}(z) - \sum_v \operatorname{softmax}(z)_v z_v

    Args:
      logits: `[..., V]` unnormalised scores, any float dtype.

    Returns:
      `[...]` float32 entropies in nats, >= 0.

    Example:
      >>> entropy_from_logits(jnp.zeros((1, 4)))  # uniform over 4: log 4
      Array([1.3862944], dtype=float32)
    """
    _checks.check_floating("entropy_from_logits", logits=logits)
    _checks.check_last_axis("entropy_from_logits", "logits", logits)
    logits = jnp.asarray(logits).astype(jnp.float32)
    probs = jax.nn.softmax(logits, axis=-1)
    return jax.nn.logsumexp(logits, axis=-1) - jnp.sum(probs * logits, axis=-1)
