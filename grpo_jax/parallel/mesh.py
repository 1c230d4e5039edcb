"""A device mesh from the config, and how rows of a batch split over it.

The config declares the mesh as ``"data=-1,fsdp=1,tensor=1"`` (or the same as a tuple
of ``(name, size)`` pairs): one size may be -1 (all remaining devices). Axes are Auto, so
jit places what the shardings of its inputs and outputs leave open (``jax.make_mesh``
defaults to Explicit). ``"auto"`` (the default) chooses between data parallelism and
fully sharded data parallelism from the run's state and the devices' memory
(`choose_mesh`).

Rows (prompts, completions, their rewards) split over every axis but ``"tensor"``: the
``data`` axis by definition, ``fsdp`` because fully sharded data parallelism is data
parallelism with sharded weights, ``expert`` likewise. This is the one definition the
trainer, the sampler and the multi-host row exchange (`parallel.hosts`) share.
"""

import math
import os

import jax
import numpy as np
from jax.sharding import AxisType, NamedSharding, PartitionSpec

NOT_ROW_AXES = ("tensor",)   # weights split over it, rows never are
AUTO = "auto"
DATA_PARALLEL = "data=-1,fsdp=1,tensor=1"     # every device holds all the weights
FULLY_SHARDED = "data=1,fsdp=-1,tensor=1"     # the weights split over every device
# "auto" shards the weights once the replicated state would take more than this share of a
# device's memory: the rest is for activations, the KV cache and the batch.
AUTO_STATE_SHARE = 0.5


def choose_mesh(spec, *, state_bytes, device_memory):
    """The mesh to build for the config's ``mesh`` field.

    Args:
      spec: the config's ``mesh``: name=size pairs (returned as they are) or "auto".
      state_bytes: a function of no arguments returning the bytes of the run's weights,
        gradients and optimizer state (and reference, lagged and critic copies) on one
        device if replicated; called only for "auto" on devices with a known memory.
      device_memory: bytes of memory of one device, or None where unknown (CPU).

    Returns:
      `(spec, reason)`: name=size pairs, and a one-line reason when "auto" chose to shard
      the weights (None otherwise). "auto" is `DATA_PARALLEL` unless the replicated state
      exceeds `AUTO_STATE_SHARE` of `device_memory`, then `FULLY_SHARDED`.
    """
    if spec != AUTO:
        return spec, None
    if device_memory is None:
        return DATA_PARALLEL, None
    needed = state_bytes()
    if needed <= AUTO_STATE_SHARE * device_memory:
        return DATA_PARALLEL, None
    return FULLY_SHARDED, (
        f"mesh 'auto': the weights, gradients and optimizer state would take {needed / 2**30:.1f} "
        f"GiB on every device replicated, over {AUTO_STATE_SHARE:.0%} of its "
        f"{device_memory / 2**30:.1f} GiB, so they are sharded over every device (mesh "
        f"{FULLY_SHARDED!r} with the model.rules sharding); set --config.mesh to choose")


def parse_mesh(spec):
    """``"data=-1,fsdp=2,tensor=1"`` (or ``[("data", -1), ...]``) -> ``(("data", -1), ...)``."""
    if spec == AUTO:
        raise ValueError("mesh 'auto' is chosen from the run's state (parallel.choose_mesh) "
                         "before a mesh is built; pass name=size pairs here")
    if not isinstance(spec, str):
        return tuple((str(name), int(size)) for name, size in spec)
    axes = []
    for item in filter(None, (part.strip() for part in spec.split(","))):
        name, sep, size = item.partition("=")
        try:
            axes.append((name.strip(), int(size)))
        except ValueError:
            sep = ""
        if not sep or not name.strip():
            raise ValueError(f"mesh {spec!r}: write it as name=size pairs separated by commas, "
                             "e.g. 'data=-1,fsdp=2,tensor=1'")
    if not axes:
        raise ValueError(f"mesh {spec!r} names no axis; e.g. 'data=-1,fsdp=1,tensor=1'")
    return tuple(axes)


def _resolve_sizes(axes, num_devices):
    names = tuple(name for name, _ in axes)
    sizes = [int(size) for _, size in axes]
    if len(set(names)) != len(names):
        raise ValueError(f"mesh axis names must be unique, got {names}")
    if sizes.count(-1) > 1:
        raise ValueError(f"at most one mesh axis may have size -1, got {tuple(axes)}")
    known = math.prod(s for s in sizes if s != -1)
    if -1 in sizes:
        if num_devices % known:
            raise ValueError(f"mesh {tuple(axes)}: {num_devices} devices do not divide by the "
                             f"fixed axis sizes (product {known})")
        sizes[sizes.index(-1)] = num_devices // known
    if math.prod(sizes) != num_devices:
        raise ValueError(f"mesh {tuple(axes)} needs {math.prod(sizes)} devices, but there are "
                         f"{num_devices}; set one axis size to -1 to take the rest")
    return names, tuple(sizes)


def make_mesh(axes, devices=None):
    """`jax.sharding.Mesh` from ``"data=-1,tensor=1"`` or ``[(name, size), ...]`` (one size -1)."""
    devices = jax.devices() if devices is None else devices
    names, sizes = _resolve_sizes(parse_mesh(axes), len(devices))
    axis_types = (AxisType.Auto,) * len(names)
    try:
        return jax.make_mesh(sizes, names, axis_types=axis_types, devices=devices)
    except AssertionError:   # TPU devices that form no box of the torus (6 chips of a 2x2x2
        # slice: a split mesh's share): jax finds no physical layout; take them in order
        return jax.sharding.Mesh(np.asarray(devices).reshape(sizes), names, axis_types=axis_types)


STANDARD_AXES = ("data", "fsdp", "tensor")   # every mesh built from a spec has these


def split_devices(spec, devices):
    """`(training devices, rollout devices)`: the last of `devices` for the rollout mesh
    ``spec`` (``rollout.mesh``: name=size pairs, no -1), the rest for training."""
    axes = parse_mesh(spec)
    if any(size < 1 for _, size in axes):
        raise ValueError(f"rollout.mesh {spec!r}: give every axis a size >= 1 (the rollout "
                         "mesh takes that many devices; the training mesh takes the rest)")
    count = math.prod(size for _, size in axes)
    if count >= len(devices):
        raise ValueError(f"rollout.mesh {spec!r} takes {count} of the {len(devices)} devices, "
                         "leaving none to train on; make it smaller, or set rollout.mesh='' to "
                         "sample on the training mesh")
    return devices[:len(devices) - count], devices[len(devices) - count:]


def check_process_split(spec, train_devices, rollout_devices):
    """Raises ValueError naming ``rollout.mesh`` unless the split (`split_devices`) falls
    on a process boundary, with as many devices on each side.

    On several processes each mesh takes whole processes, its roles: those of the rollout
    mesh only sample and the others only train, each issuing its own programs in its own
    order (a process in both would run two orders of collectives). The batch and the
    parameters cross between them shard for shard, device i to device i, hence the same
    device count on both sides (`parallel.transfer`).
    """
    def processes(devices):
        return sorted({d.process_index for d in devices})

    shared = set(processes(train_devices)) & set(processes(rollout_devices))
    if shared:
        per_process = sum(
            d.process_index == min(shared) for d in (*train_devices, *rollout_devices)
        )
        raise ValueError(
            f"rollout.mesh={spec!r} takes the last {len(rollout_devices)} devices, which splits "
            f"process {min(shared)}'s {per_process} devices between the training and the rollout "
            "mesh. On several processes each mesh takes whole processes (the rollout processes "
            "sample, the others train): give rollout.mesh a multiple of the devices per "
            f"process ({per_process}), or rollout.mesh='' to sample on the training mesh")
    if len(train_devices) != len(rollout_devices):
        total = len(train_devices) + len(rollout_devices)
        per_process = len([d for d in rollout_devices
                           if d.process_index == rollout_devices[0].process_index])
        fix = (f"make rollout.mesh's size {total // 2}" if total // 2 % per_process == 0 else
               "run an even number of processes (the rollout mesh takes half of them)")
        raise ValueError(
            f"rollout.mesh={spec!r} takes {len(rollout_devices)} devices and leaves "
            f"{len(train_devices)} to train: on several processes the two meshes need as many "
            f"devices each (the parameters and the batch cross device for device); {fix}, or "
            "rollout.mesh='' to sample on the training mesh")


def with_standard_axes(spec):
    """``spec``'s (name, size) pairs plus every `STANDARD_AXES` name it leaves out, at size 1,
    so the weights' and activations' sharding rules find their axes on the mesh."""
    axes = parse_mesh(spec)
    names = {name for name, _ in axes}
    return axes + tuple((name, 1) for name in STANDARD_AXES if name not in names)


def sharding_on(x, mesh):
    """The `NamedSharding` on `mesh` of an array `x` on another mesh: its `PartitionSpec`
    where `mesh` has those axes and its dimensions divide, else replicated."""
    spec = getattr(x.sharding, "spec", PartitionSpec())
    for dim, entry in zip(x.shape, spec):
        axes = () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)
        if any(a not in mesh.shape for a in axes) or dim % math.prod(mesh.shape[a] for a in axes):
            return NamedSharding(mesh, PartitionSpec())
    return NamedSharding(mesh, spec)


def on_mesh(tree, mesh):
    """`tree` (jax arrays, e.g. on another mesh) copied to the devices of `mesh`, each leaf
    in its `sharding_on` `mesh`. Between meshes of different devices of one process this is
    JAX's cross-mesh transfer (`jax.device_put`); between processes, `parallel.transfer`."""
    return jax.device_put(tree, jax.tree.map(lambda x: sharding_on(x, mesh), tree))


def row_axes(mesh):
    """The mesh axes a batch's rows split over (every axis but "tensor")."""
    return tuple(a for a in mesh.axis_names if a not in NOT_ROW_AXES)


def row_ways(mesh):
    """How many ways rows split: the product of the row axes' sizes."""
    return math.prod(mesh.shape[a] for a in row_axes(mesh))


def row_sharding(mesh, leading=0):
    """`NamedSharding` splitting axis `leading` of an array over the row axes."""
    return NamedSharding(mesh, PartitionSpec(*[None] * leading, row_axes(mesh)))


def rows_divide(rows: int, ways: int) -> bool:
    """Whether `rows` rows split evenly `ways` ways (a mesh's `row_ways`): the one rule for
    where a batch's rows live. Rows that divide are split over the row axes; others are
    replicated (`rows_sharding`, a plan's rows), or inside a jitted function left to XLA
    (micro-batch pieces, the sampler's carry)."""
    return rows % ways == 0


def rows_sharding(mesh, rows):
    """`[rows, ...]` arrays over the row axes when `rows` divide (`rows_divide`), else
    replicated."""
    if rows_divide(rows, row_ways(mesh)):
        return row_sharding(mesh)
    return NamedSharding(mesh, PartitionSpec())


def tree_shardings(tree):
    """The sharding of every leaf of a tree of arrays (or sharded ShapeDtypeStructs)."""
    return jax.tree.map(lambda x: x.sharding, tree)


def cpu_cores():
    """The cores this process may run on (its CPU affinity where the OS reports one)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:   # macOS, Windows
        return os.cpu_count() or 1


def use_cpu_cores(max_devices=8):
    """Makes the host CPU one XLA device per core, so a CPU mesh runs on every core.

    XLA:CPU runs one device's program mostly on one thread: a decode step is a chain of
    small kernels, and only large matmuls fan out. With N CPU devices the mesh's data
    axis runs N programs side by side (on 2 cores, 1.2-1.9x the sampler's tokens/s:
    experiments/results/bench_sampler_cpu_keys_transposed.txt). N is the largest power
    of two up to `min(cores, max_devices)`, so common batch sizes split evenly. On a GPU
    or TPU host this only adds host devices; the accelerator stays the default backend.

    Call it before JAX runs anything (the device count is fixed when the first
    computation starts). It leaves alone a count already chosen, by
    `--xla_force_host_platform_device_count` in XLA_FLAGS or `jax_num_cpu_devices`.

    Returns:
      The number of CPU devices it set, or None when it changed nothing.
    """
    if "xla_force_host_platform_device_count" in os.environ.get("XLA_FLAGS", ""):
        return None
    if jax.config.jax_num_cpu_devices != -1:
        return None
    from jax._src import xla_bridge   # no public "has JAX started?" test
    if xla_bridge.backends_are_initialized():
        return None
    count = 2 ** int(math.log2(max(1, min(cpu_cores(), max_devices))))
    jax.config.update("jax_num_cpu_devices", count)
    return count
