"""The critic's side of PPO: the clipped value loss, and how much of the returns the
values explain.

Values are per token, `[B, T]`: V(s_t), the value of the state before completion token
t (the prompt and the tokens before t), in the layout of the log-probs.
"""

import jax
import jax.numpy as jnp

from grpo_jax.objectives import _checks


def value_loss(values, old_values, returns, mask, *, clip=None):
    r"""PPO's per-token value loss, optionally clipped around the values that sampled.

    .. math::
        L_t = \tfrac12 \max\big((V_t - R_t)^2,\;
              (V^{old}_t + \operatorname{clip}(V_t - V^{old}_t, -\epsilon, \epsilon) - R_t)^2\big)

    Without `clip` it is the plain squared error 1/2 (V_t - R_t)^2. The clip keeps one
    batch's updates from moving a value further than epsilon from the value it had
    when the targets were computed, as the policy's ratio clip does for the policy.

    Args:
      values: `[B, T]` V(s_t) of the critic being trained (differentiated).
      old_values: `[B, T]` the values the batch's targets were computed with.
      returns: `[B, T]` the regression targets (GAE returns = advantages + old values).
      mask: `[B, T]` response mask.
      clip: epsilon, or None for the unclipped loss.

    Returns:
      `(loss [B, T], {"value_clipped": [B, T]})`, both 0 at masked positions;
      ``value_clipped`` is 1.0 where the value has moved past the clip and the clipped
      term is the larger one (its gradient is then 0).

    Example:
      >>> loss, d = value_loss(jnp.array([[0.5, 0.9]]), jnp.array([[0.0, 0.8]]),
      ...                      jnp.array([[1.0, 1.0]]), jnp.ones((1, 2)), clip=0.2)
      >>> [round(float(x), 4) for x in loss[0]], d["value_clipped"]
      ([0.32, 0.005], Array([[1., 0.]], dtype=float32))

    References:
      Schulman et al., Proximal Policy Optimization Algorithms (arXiv:1707.06347),
      eq. 9 (the value term), as OpenAI baselines' ppo2 clips it; Engstrom et al.,
      Implementation Matters in Deep RL (arXiv:2005.12729), sec. 3 ("value function
      clipping").
    """
    if clip is not None:
        _checks.check_greater("clip", clip, 0.0)
    _checks.check_floating("value_loss", values=values, old_values=old_values)
    _checks.check_real("value_loss", returns=returns, mask=mask)
    _checks.check_token_arrays("value_loss", values=values, old_values=old_values,
                               returns=returns, mask=mask)
    values, old_values, returns, mask = map(jnp.asarray, (values, old_values, returns, mask))
    valid = mask.astype(bool)
    f32 = lambda x: jnp.where(valid, x.astype(jnp.float32), 0.0)
    values = f32(values)
    old_values, returns = (
        jax.lax.stop_gradient(f32(old_values)), jax.lax.stop_gradient(f32(returns)),
    )
    squared = jnp.square(values - returns)
    if clip is None:
        return jnp.where(valid, 0.5 * squared, 0.0), {"value_clipped": jnp.zeros_like(squared)}
    clipped = old_values + jnp.clip(values - old_values, -clip, clip)
    squared_clipped = jnp.square(clipped - returns)
    loss = 0.5 * jnp.maximum(squared, squared_clipped)
    # Only a value past the clip can bind: inside it `clipped` is `values` up to the rounding
    # of old + (values - old), which would make the comparison a coin flip.
    moved = jnp.abs(values - old_values) > clip
    binds = jax.lax.stop_gradient(moved & (squared_clipped > squared)) & valid
    return jnp.where(valid, loss, 0.0), {"value_clipped": binds.astype(jnp.float32)}


FLAT_RETURNS_STD = 1e-6   # returns with less spread have no variance to explain


def explained_variance(values, returns, mask):
    r"""How much of the returns' variance the values explain, over the valid tokens.

    .. math:: \mathrm{EV} = 1 - \operatorname{Var}[R - V] / \operatorname{Var}[R]

    1 for a perfect critic, 0 for one no better than a constant, negative for one worse
    than a constant. NaN when the returns do not vary (a standard deviation under
    `FLAT_RETURNS_STD`, 1e-6: float32 rounding of GAE returns that are all equal): there is
    nothing to explain, and a ratio of two rounding errors would print as -1e14.

    Args:
      values: `[B, T]` V(s_t).
      returns: `[B, T]` the critic's targets.
      mask: `[B, T]` response mask.

    Returns:
      `[]` float32.

    Example:
      >>> explained_variance(jnp.array([[0.0, 1.0, 2.0]]), jnp.array([[0.0, 1.0, 3.0]]),
      ...                    jnp.ones((1, 3)))
      Array(0.85714287, dtype=float32)

    References:
      Dhariwal et al., OpenAI Baselines (2017), `explained_variance`, logged by ppo2.
    """
    _checks.check_floating("explained_variance", values=values)
    _checks.check_real("explained_variance", returns=returns, mask=mask)
    _checks.check_token_arrays("explained_variance", values=values, returns=returns, mask=mask)
    values, returns, mask = map(jnp.asarray, (values, returns, mask))
    valid = mask.astype(bool)
    count = jnp.maximum(jnp.sum(valid, dtype=jnp.float32), 1.0)

    def variance(x):
        x = jnp.where(valid, x.astype(jnp.float32), 0.0)
        mean = jnp.sum(x) / count
        return jnp.sum(jnp.where(valid, jnp.square(x - mean), 0.0)) / count

    spread = variance(returns)
    residual = variance(returns.astype(jnp.float32) - values.astype(jnp.float32))
    varies = spread > FLAT_RETURNS_STD ** 2
    return jnp.where(varies, 1.0 - residual / jnp.where(varies, spread, 1.0), jnp.nan)
