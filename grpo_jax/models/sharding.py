"""Logical axis names -> mesh axes: one rule table per parallelism layout (MaxText's scheme).

Every weight names its dimensions with logical axes (see `layers.py`):

| logical axis | dimension |
|---|---|
| vocab | V, the embedding rows / output columns |
| embed | D, the residual width |
| heads, kv_heads, head_dim | N query heads, K key/value heads, H per head |
| mlp | F, the SwiGLU hidden width (dense and expert) |
| expert | E, the routed experts |
| router | E in the router's `[D, E]` weight (kept whole: top-k needs every logit) |
| norm | D of RMSNorm scales and the output bias (tiny, replicated) |
| layers | the stacked layers of a scanned decoder (never split: the scan walks them) |
| lora | the rank r of a LoRA adapter's factors (tiny, never split) |

A rule table maps each logical axis to a mesh axis name, a tuple of them, or None
(replicated). Rule sets shipped, by name:

- "fsdp" (default): ZeRO-3 style, every matrix split along `embed` over mesh axis "fsdp".
- "fsdp_tp": as fsdp, plus Megatron tensor parallelism (heads, kv_heads, mlp, vocab over
  "tensor"; Shoeybi et al. 2019).
- "fsdp_expert": as fsdp, plus experts split over "expert" (expert parallelism, GShard).
- "sampling": no FSDP (weights stay whole on each "tensor" group, so decoding does not
  gather them every step); heads, mlp and vocab over "tensor".

The mesh must have every axis the rules name (size 1 is fine).

Activations follow the mesh the model runs under (`jax.set_mesh`), whatever the rule
set: their batch rows over the row axes (every axis but "tensor", `parallel.row_axes`:
data, fsdp, expert), attention heads and the MLP width over "tensor" (`constrain`).
Without them XLA may keep a whole batch's activations on every chip of an fsdp axis.
"""

import math

import jax

from grpo_jax.parallel import mesh as mesh_lib

_REPLICATED = {
    "layers": None, "vocab": None, "embed": None, "heads": None, "kv_heads": None, "head_dim": None,
    "mlp": None, "expert": None, "router": None, "norm": None, "lora": None,
}
_TENSOR = {"vocab": "tensor", "heads": "tensor", "kv_heads": "tensor", "mlp": "tensor"}

RULE_SETS = {
    "fsdp": {**_REPLICATED, "embed": "fsdp"},
    "fsdp_tp": {**_REPLICATED, "embed": "fsdp", **_TENSOR},
    "fsdp_expert": {**_REPLICATED, "embed": "fsdp", "expert": "expert"},
    "sampling": {**_REPLICATED, **_TENSOR},
}


def get_rules(rules):
    """A rule table from a rule-set name (see `RULE_SETS`) or a table passed as a dict."""
    if isinstance(rules, str):
        if rules not in RULE_SETS:
            raise ValueError(
                f"unknown sharding rule set {rules!r}; choose one of {sorted(RULE_SETS)}"
            )
        return RULE_SETS[rules]
    return dict(rules)


def logical_to_spec(logical_axes, rules):
    """`("embed", "mlp")` -> `jax.P("fsdp", None)` under `rules` (a name or a table)."""
    table = get_rules(rules)
    unknown = [a for a in logical_axes if a not in table]
    if unknown:
        raise ValueError(
            f"logical axes {unknown} have no sharding rule; add them to the rule table"
        )
    return jax.P(*(table[a] for a in logical_axes))


def _mesh_axes(entry):
    if entry is None:
        return ()
    return (entry,) if isinstance(entry, str) else tuple(entry)


def check_spec(name, shape, spec, mesh):
    """Raises a ValueError naming the tensor if `spec` does not fit `shape` on `mesh`."""
    for dim, entry in zip(shape, spec):
        axes = _mesh_axes(entry)
        missing = [a for a in axes if a not in mesh.shape]
        if missing:
            raise ValueError(
                f"{name}: the sharding rules use mesh axes {missing}, but the mesh has "
                f"{tuple(mesh.shape)}; add them to the mesh (size 1 is fine) or pick other rules"
            )
        ways = math.prod(mesh.shape[a] for a in axes)
        if dim % ways:
            raise ValueError(
                f"{name}: dimension {dim} does not divide over mesh axes {axes} ({ways} ways); "
                f"use a mesh or rule set that splits it evenly"
            )


def variable_sharding(path, variable, mesh, rules):
    """The `NamedSharding` of one `nnx.Param` (its `logical_axes` through `rules`)."""
    name = ".".join(map(str, path))
    axes = variable.get_metadata().get("logical_axes")
    if axes is None:
        raise ValueError(f"{name} has no logical_axes metadata; create it with layers.param")
    spec = logical_to_spec(axes, rules)
    check_spec(name, variable.get_value().shape, spec, mesh)
    return jax.NamedSharding(mesh, spec)


def state_shardings(state, mesh, rules="fsdp"):
    """A tree like `state` (from `nnx.split`) holding each parameter's `NamedSharding`."""
    return jax.tree.map_with_path(
        lambda path, v: v.replace(variable_sharding(tuple(p.key for p in path), v, mesh, rules)),
        state,
        is_leaf=lambda x: hasattr(x, "get_metadata"),
    )


# Activation dimensions -> mesh axes; "batch" is resolved from the mesh (its row axes).
_ACTIVATION_AXES = {"batch": None, "heads": "tensor", "kv_heads": "tensor", "mlp": "tensor"}


def activation_spec(shape, logical_axes, mesh):
    """`jax.P` splitting an activation of `shape` along `logical_axes` on `mesh`.

    "batch" goes over the mesh's row axes, "heads", "kv_heads" and "mlp" over "tensor",
    anything else (None, "seq", "embed", ...) is replicated. A dimension that does not
    divide over its axes is left replicated, so any shape is accepted.
    """
    spec = []
    for dim, name in zip(shape, logical_axes):
        axes = (
            mesh_lib.row_axes(mesh) if name == "batch" else _mesh_axes(_ACTIVATION_AXES.get(name))
        )
        axes = tuple(a for a in axes if a in mesh.shape)
        ways = math.prod(mesh.shape[a] for a in axes)
        spec.append(axes if axes and ways > 1 and dim % ways == 0 else None)
    return jax.P(*spec)


def constrain(x, logical_axes):
    """`x` constrained to `activation_spec` under the mesh set by `jax.set_mesh`; as it is
    without one (single device, or a caller that shards by its inputs alone)."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty:
        return x
    return jax.lax.with_sharding_constraint(x, activation_spec(x.shape, logical_axes, mesh))
