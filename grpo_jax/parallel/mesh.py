"""A device mesh from the config's axis list, and the batch sharding over it.

The config declares the mesh as ``(("data", -1), ("fsdp", 1), ("tensor", 1))``: one
size may be -1 (all remaining devices). Axes are Auto, so jit places what the
shardings of its inputs and outputs leave open (``jax.make_mesh`` defaults to Explicit).
"""

import math
import os

import jax
from jax.sharding import AxisType

BATCH_AXES = ("data", "fsdp")   # the batch is split over both: FSDP shards data too


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
    """`jax.sharding.Mesh` from ``[(name, size), ...]`` (one size may be -1)."""
    devices = jax.devices() if devices is None else devices
    names, sizes = _resolve_sizes(axes, len(devices))
    return jax.make_mesh(sizes, names, axis_types=(AxisType.Auto,) * len(names), devices=devices)


def batch_ways(mesh):
    """How many ways the batch dimension is split."""
    return math.prod(mesh.shape[a] for a in BATCH_AXES if a in mesh.shape)


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


def maybe_initialize_distributed(enabled=None):
    """Calls `jax.distributed.initialize()` on multi-host launches.

    On when `enabled` is True or, when it is None, when the environment variable
    GRPO_JAX_DISTRIBUTED=1 is set (TPU pods and SLURM/multi-GPU launches set the rest
    of what jax.distributed needs).
    """
    if enabled is None:
        enabled = os.environ.get("GRPO_JAX_DISTRIBUTED", "0") == "1"
    if enabled and not jax.distributed.is_initialized():   # the demo asks once per stage
        jax.distributed.initialize()
    return enabled
