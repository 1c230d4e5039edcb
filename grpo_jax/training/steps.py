"""The jitted update: one minibatch's rows gathered on the mesh, gradients accumulated
over micro-batches, then one optax step.

The batch stays on the mesh: the update receives the whole rollout batch and the indices
of the minibatch's rows, gathers them on device and splits them into micro-batches
(`batch.pieces`). Every micro-batch's loss is normalised by the GLOBAL counts of the
minibatch (``num_tokens``, ``num_seqs``, computed before the split by `count_fn`), so the
summed gradient is the full minibatch's gradient whatever the number of micro-batches,
and so are the summed metrics.
"""

import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec as P

from grpo_jax import parallel
from grpo_jax.training import batch as batch_lib


def make_update_step(graphdef, optimizer, loss_fn, count_fn, *, mesh, param_shardings,
                     opt_shardings, micro_batches):
    """Returns the jitted ``update(params, opt_state, rows, index) -> (params, opt_state, metrics)``.

    Args:
      graphdef: the model's `nnx.GraphDef`; `params` is its `nnx.State`.
      optimizer: an optax GradientTransformation.
      loss_fn: ``(model, micro_batch) -> (loss, metrics)``, the loss of one micro-batch
        normalised by the global counts it finds in the micro-batch.
      count_fn: ``minibatch -> {"num_tokens": [], "num_seqs": []}``, the minibatch's
        global counts (over the mask the loss is normalised by).
      mesh: the device mesh; rows are split over its row axes.
      param_shardings, opt_shardings: trees of `NamedSharding` for params and opt state.
      micro_batches: gradient accumulation steps per update.

    The update reads ``rows`` (a dict of `[B, ...]` global arrays) at ``index`` (`[b]`
    int32 row numbers); params and optimizer state are donated: their buffers are reused.
    """

    def micro_loss(params, micro):
        return loss_fn(nnx.merge(graphdef, params), micro)

    grad_fn = jax.value_and_grad(micro_loss, has_aux=True)

    def update(params, opt_state, rows, index):
        minibatch = jax.tree.map(lambda x: jnp.take(x, index, axis=0), rows)
        counts = count_fn(minibatch)
        micro = batch_lib.pieces(minibatch, micro_batches, mesh)
        micro.update({k: jnp.broadcast_to(v, (micro_batches,)) for k, v in counts.items()})

        def accumulate(carry, piece):
            (loss, metrics), grads = grad_fn(params, piece)
            return jax.tree.map(jnp.add, carry, (grads, metrics)), None

        first = jax.tree.map(lambda x: x[0], micro)
        shapes = jax.eval_shape(grad_fn, params, first)
        zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), (shapes[1], shapes[0][1]))
        (grads, metrics), _ = jax.lax.scan(accumulate, zeros, micro)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        metrics = {**metrics, "grad_norm": optax.tree.norm(grads),
                   "update_norm": optax.tree.norm(updates)}
        return params, opt_state, metrics

    replicated = NamedSharding(mesh, P())
    return jax.jit(update, out_shardings=(param_shardings, opt_shardings, replicated),
                   donate_argnums=(0, 1))


def init_optimizer_state(optimizer, params, mesh):
    """The optimizer state, created on device in the parameters' shardings.

    Moments take their parameter's sharding through jit; scalars such as Adam's step
    count come out on one device and are replicated over the mesh.
    """
    state = jax.jit(optimizer.init)(params)
    replicated = NamedSharding(mesh, P())
    return jax.tree.map(
        lambda x: x if isinstance(x.sharding, NamedSharding) else jax.device_put(x, replicated), state)
