"""The jitted update: gradient accumulation over micro-batches, then one optax step.

A minibatch arrives as arrays with a leading micro-batch axis `[M, b, ...]`. Every
micro-batch's loss is normalised by the GLOBAL counts of the minibatch (the loss
functions read ``num_tokens``/``num_seqs`` from the batch), so the summed gradient is
the full minibatch's gradient whatever M is, and so are the summed metrics.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec as P

from grpo_jax.parallel import mesh as mesh_lib


def split_micro_batches(batch, num_micro):
    """`[B, ...]` leaves -> `[num_micro, B / num_micro, ...]`."""
    rows = jax.tree.leaves(batch)[0].shape[0]
    if rows % num_micro:
        raise ValueError(f"train.micro_batches={num_micro} does not divide the minibatch of "
                         f"{rows} rows; choose a divisor")
    return jax.tree.map(lambda x: x.reshape(num_micro, rows // num_micro, *x.shape[1:]), batch)


def micro_batch_shardings(tree, mesh):
    """Shardings for `[M, b, ...]` leaves: rows over the batch axes; `[M]` leaves whole."""
    axes = tuple(a for a in mesh_lib.BATCH_AXES if a in mesh.shape)
    return jax.tree.map(
        lambda x: NamedSharding(mesh, P(None, axes) if np.ndim(x) >= 2 else P()), tree)


def make_update_step(graphdef, optimizer, loss_fn, *, param_shardings, opt_shardings, mesh):
    """Returns the jitted ``update(params, opt_state, batch) -> (params, opt_state, metrics)``.

    Args:
      graphdef: the model's `nnx.GraphDef`; `params` is its `nnx.State`.
      optimizer: an optax GradientTransformation.
      loss_fn: ``(model, micro_batch) -> (loss, metrics)``; the loss of one micro-batch
        normalised by the global counts in the micro-batch.
      param_shardings, opt_shardings: trees of `NamedSharding` for params and opt state.
      mesh: the device mesh (batch leaves are `[M, b, ...]`, rows over its batch axes).

    The params and optimizer state are donated: their buffers are reused in place.
    """

    def micro_loss(params, micro):
        return loss_fn(nnx.merge(graphdef, params), micro)

    grad_fn = jax.value_and_grad(micro_loss, has_aux=True)

    def update(params, opt_state, batch):
        def accumulate(carry, micro):
            (loss, metrics), grads = grad_fn(params, micro)
            return jax.tree.map(jnp.add, carry, (grads, metrics)), None

        first = jax.tree.map(lambda x: x[0], batch)
        shapes = jax.eval_shape(grad_fn, params, first)
        zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), (shapes[1], shapes[0][1]))
        (grads, metrics), _ = jax.lax.scan(accumulate, zeros, batch)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        metrics = {**metrics, "grad_norm": optax.tree.norm(grads),
                   "update_norm": optax.tree.norm(updates)}
        return params, opt_state, metrics

    replicated = NamedSharding(mesh, P())
    compiled = {}   # one jit per batch structure (the keys a recipe uses are fixed per run)

    def step(params, opt_state, batch):
        key = tuple(sorted(batch))
        if key not in compiled:
            compiled[key] = jax.jit(
                update,
                in_shardings=(param_shardings, opt_shardings, micro_batch_shardings(batch, mesh)),
                out_shardings=(param_shardings, opt_shardings, replicated),
                donate_argnums=(0, 1))
        return compiled[key](params, opt_state, batch)

    return step


def optimizer_state_shardings(optimizer, params, mesh):
    """The `NamedSharding` of every leaf of ``optimizer.init(params)``, computed without memory.

    A state leaf that mirrors a parameter (its tree path ends with the parameter's path
    and it has the parameter's shape: Adam's `mu` and `nu`, accumulated gradients) takes
    that parameter's sharding, so each device keeps only its slice of every moment, as
    with the weights (ZeRO, Rajbhandari et al. 2020, arXiv:1910.02054). Everything else
    (step counts, Adafactor's factored rows) is replicated over `mesh`. This holds for
    any optax transformation whose `init` can be traced.

    Args:
      optimizer: an optax GradientTransformation.
      params: a tree of `jax.Array`s or `jax.ShapeDtypeStruct`s carrying their shardings.
      mesh: the device mesh the parameters live on.
    """
    flat_params = jax.tree_util.tree_flatten_with_path(params)[0]
    param_by_path = {tuple(path): leaf for path, leaf in flat_params}
    replicated = NamedSharding(mesh, P())

    def sharding_of(path, leaf):
        for start in range(len(path)):   # longest suffix first
            param = param_by_path.get(tuple(path[start:]))
            if param is not None and param.shape == leaf.shape:
                return param.sharding
        return replicated

    return jax.tree.map_with_path(sharding_of, jax.eval_shape(optimizer.init, params))


def init_optimizer_state(optimizer, params, mesh):
    """``optimizer.init(params)`` created on device in `optimizer_state_shardings`.

    Without out_shardings, jit places the moments whole on every device, since they
    do not depend on the parameters' values.
    """
    shardings = optimizer_state_shardings(optimizer, params, mesh)
    return jax.jit(optimizer.init, out_shardings=shardings)(params)
