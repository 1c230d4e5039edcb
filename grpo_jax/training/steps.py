"""The jitted update: one minibatch's rows gathered on the mesh, gradients accumulated
over micro-batches, then one optax step.

The batch stays on the mesh: the update receives the whole rollout batch and the indices
of the minibatch's rows, gathers them on device and splits them into micro-batches
(`batch.pieces`). Every micro-batch's loss is normalised by the GLOBAL counts of the
minibatch (``num_tokens``, ``num_seqs``, computed before the split by `count_fn`), so the
summed gradient is the full minibatch's gradient whatever the number of micro-batches,
and so are the summed metrics. `update_on_batch` makes a step's ``epochs x minibatches``
updates on one rollout batch.
"""

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec as P

from grpo_jax.training import batch as batch_lib


RNG_STREAMS = ("rollout", "eval", "dropout", "eval_suite")


def step_rng(seed: int, stream: str, step: int) -> jax.Array:
    """The key of `stream` (one of `RNG_STREAMS`) at `step`: fold_in(seed, ...)."""
    key = jax.random.fold_in(jax.random.key(seed), RNG_STREAMS.index(stream))
    return jax.random.fold_in(key, step)


def drops_adapter_inputs(config: Any) -> bool:
    """Whether the run's updates take a dropout key: LoRA with ``model.lora.dropout`` > 0."""
    return config.model.lora.rank > 0 and config.model.lora.dropout > 0


def dropout_rng(config: Any, step: int) -> jax.Array | None:
    """The adapters' dropout key of training step `step` (`drops_adapter_inputs`), or
    None, so that a run without dropout compiles and runs the deterministic update."""
    return step_rng(config.seed, "dropout", step) if drops_adapter_inputs(config) else None


def update_key(rng: jax.Array | None, number: int) -> jax.Array | None:
    """The key of the step's `number`-th optimizer update (from 0), or None."""
    return None if rng is None else jax.random.fold_in(rng, number)


def piece_keys(rng: jax.Array | None, count: int, offset: int = 0) -> jax.Array | None:
    """`[count]` keys, fold_in(rng, offset + m) for piece m (a micro-batch), or None."""
    if rng is None:
        return None
    return jax.vmap(lambda m: jax.random.fold_in(rng, m))(offset + jnp.arange(count))


def make_update_step(
    graphdef: nnx.GraphDef, optimizer: optax.GradientTransformation,
    loss_fn: Callable[[nnx.Module, dict[str, jax.Array]], tuple[jax.Array, dict[str, jax.Array]]],
    count_fn: Callable[[Mapping[str, jax.Array]], dict[str, jax.Array]], *, mesh: jax.sharding.Mesh,
    param_shardings: nnx.State, opt_shardings: Any, micro_batches: int, sft_weight: float = 0.0,
    trained: nnx.filterlib.Filter = nnx.Param, donate_params: bool = True,
    finish_metrics: Callable[[dict[str, jax.Array]], dict[str, jax.Array]] | None = None,
) -> Callable[..., tuple[nnx.State, optax.OptState, dict[str, jax.Array]]]:
    """Returns the jitted ``update(params, opt_state, rows, index[, sft_rows, sft_index],
    plan=None, rng=None) -> (params, opt_state, metrics)``.

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
      sft_weight: with ``sft_rows`` (prompt + reference solution rows, `task.target_rows`)
        and ``sft_index``, the loss adds ``sft_weight`` x their token-mean NLL: a hybrid
        of the RL objective and supervised next-token prediction (RPT's hybrid loss).
      trained: the `nnx` filter of the parameters that are differentiated and updated
        (`nnx.LoRAParam`: a LoRA run's adapters); the others pass through unchanged and
        the optimizer state covers the trained ones only.
      finish_metrics: None, or ``metrics -> metrics`` applied to the metrics once the
        micro-batches' are summed (a statistic that is not a sum, from summed moments).

    The update reads ``rows`` (a dict of `[B, ...]` global arrays) at ``index`` (`[b]`
    int32 row numbers); params (unless not `donate_params`) and optimizer state are
    donated: their buffers are reused.
    With ``plan`` (`packing.plan` of the micro-batches, ``index[m::micro_batches]``), each
    micro-batch's forward runs on its packed rows. With ``rng`` (a key: the adapters'
    dropout, `dropout_rng`), micro-batch m carries ``dropout_key`` = fold_in(rng, m) (its
    supervised rows fold_in(rng, micro_batches + m)), which its forward drops with.
    """

    def micro_loss(trained_params, frozen, micro, sft_micro):
        model = nnx.merge(graphdef, trained_params, frozen)
        loss, metrics = loss_fn(model, micro)
        if sft_micro is not None:
            sft_loss, _ = batch_lib.nll_loss(model, sft_micro)
            loss = loss + sft_weight * sft_loss
            metrics = {**metrics, "sft_loss": sft_loss, "loss": loss}
        return loss, metrics

    grad_fn = jax.value_and_grad(micro_loss, has_aux=True)

    def split(rows, index, counts_of, plan=None, keys=None):
        minibatch = jax.tree.map(lambda x: jnp.take(x, index, axis=0), rows)
        counts = counts_of(minibatch)
        micro = batch_lib.pieces(minibatch, micro_batches, mesh)
        micro.update({k: jnp.broadcast_to(v, (micro_batches,)) for k, v in counts.items()})
        if plan is not None:
            micro.update(plan)
        if keys is not None:
            micro["dropout_key"] = keys
        return micro

    def update(params, opt_state, rows, index, sft_rows=None, sft_index=None, plan=None,
               rng=None):
        micro = split(rows, index, count_fn, plan, piece_keys(rng, micro_batches))
        sft_micro = None if sft_rows is None else split(
            sft_rows, sft_index, batch_lib.token_counts,
            keys=piece_keys(rng, micro_batches, offset=micro_batches))
        trained_params, frozen = nnx.split_state(params, trained, ...)

        def accumulate(carry, pieces):
            (loss, metrics), grads = grad_fn(trained_params, frozen, *pieces)
            return jax.tree.map(jnp.add, carry, (grads, metrics)), None

        micro = (micro, sft_micro)
        first = jax.tree.map(lambda x: x[0], micro)
        shapes = jax.eval_shape(grad_fn, trained_params, frozen, *first)
        zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), (shapes[1], shapes[0][1]))
        (grads, metrics), _ = jax.lax.scan(accumulate, zeros, micro)
        if finish_metrics is not None:
            metrics = finish_metrics(metrics)
        updates, opt_state = optimizer.update(grads, opt_state, trained_params)
        params = nnx.merge_state(optax.apply_updates(trained_params, updates), frozen)
        metrics = {**metrics, "grad_norm": optax.tree.norm(grads),
                   "update_norm": optax.tree.norm(updates)}
        return params, opt_state, metrics

    replicated = NamedSharding(mesh, P())
    return jax.jit(update, out_shardings=(param_shardings, opt_shardings, replicated),
                   donate_argnums=(0, 1) if donate_params else (1,))


def optimizer_state_shardings(optimizer: optax.GradientTransformation, params: nnx.State,
                              mesh: jax.sharding.Mesh) -> Any:
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


def init_optimizer_state(optimizer: optax.GradientTransformation, params: nnx.State,
                         mesh: jax.sharding.Mesh) -> optax.OptState:
    """``optimizer.init(params)`` created on device in `optimizer_state_shardings`.

    Without out_shardings, jit places the moments whole on every device, since they
    do not depend on the parameters' values.
    """
    shardings = optimizer_state_shardings(optimizer, params, mesh)
    return jax.jit(optimizer.init, out_shardings=shardings)(params)


def loss_seeds(mask: jax.Array, step: int | jax.Array) -> jax.Array:
    """`[B]` int32 seeds of a random loss's draw (Clip-Cov), one per row and step: a
    micro-batch draws with its first row's, so every update of every step draws anew."""
    rows = mask.shape[0]
    return step * rows + jnp.arange(rows, dtype=jnp.int32)


def update_on_batch(
    update: Callable[..., tuple[nnx.State, optax.OptState, dict[str, jax.Array]]],
    params: nnx.State, opt_state: optax.OptState, batch: Mapping[str, jax.Array],
    seed: Sequence[int], *, epochs: int, minibatches: int, micro_batches: int = 1,
    sft_rows: Mapping[str, jax.Array] | None = None,
    plan_for: Callable[[np.ndarray], dict[str, jax.Array]] | None = None,
    dropout_key: jax.Array | None = None,
) -> tuple[nnx.State, optax.OptState, dict[str, float]]:
    """``epochs x minibatches`` optimizer updates on one rollout batch, each epoch in a
    fresh random order of its rows (drawn from `seed`, the same on every process);
    returns (params, opt_state, metrics): the mean over the updates of each metric, and
    ``grad_norm_std``, the standard deviation (ddof=0) of the updates' gradient norms.
    With `sft_rows`, each update also takes its share of them for the supervised term;
    with `plan_for` (`packing.Planner.pieces`), each update's micro-batches run packed;
    with `dropout_key` (`steps.dropout_rng`), update u drops its adapters' inputs with
    `update_key(dropout_key, u)`."""
    rows = batch["mask"].shape[0]
    per_update = []
    for epoch in range(epochs):
        rng = np.random.default_rng([*seed, epoch])
        order = rng.permutation(rows).astype(np.int32)
        sft_order = None if sft_rows is None else rng.permutation(
            sft_rows["mask"].shape[0]).astype(np.int32)
        for i, index in enumerate(np.split(order, minibatches)):
            extra = () if sft_rows is None else (sft_rows, np.split(sft_order, minibatches)[i])
            plan = None if plan_for is None else plan_for(
                index[batch_lib.piece_rows(len(index), micro_batches)])
            dropout = {} if dropout_key is None else {
                "rng": update_key(dropout_key, len(per_update))}
            params, opt_state, metrics = update(params, opt_state, batch, index, *extra, plan=plan,
                                                **dropout)
            per_update.append(metrics)
    per_update = jax.device_get(per_update)
    metrics = {k: float(np.mean([m[k] for m in per_update])) for k in per_update[0]}
    metrics["grad_norm_std"] = float(np.std([m["grad_norm"] for m in per_update]))
    return params, opt_state, metrics
