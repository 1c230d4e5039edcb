"""Quantities read off a model's logits: token log-probs and entropy.

Both upcast to float32 first, whatever the model's compute dtype: a bf16 log-softmax
over a 150k vocabulary loses the small differences the ratios are made of.
"""

import jax
import jax.numpy as jnp


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
    scaled = logits.astype(jnp.float32) / temperature
    chosen = jnp.take_along_axis(scaled, tokens[..., None], axis=-1)[..., 0]
    return chosen - jax.nn.logsumexp(scaled, axis=-1)


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
    logits = logits.astype(jnp.float32)
    probs = jax.nn.softmax(logits, axis=-1)
    return jax.nn.logsumexp(logits, axis=-1) - jnp.sum(probs * logits, axis=-1)
