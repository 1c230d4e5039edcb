"""Several processes, one mesh: start-up, and rows moving between a process and the mesh.

On a TPU pod (or several GPU hosts) every host runs the same command; after
`initialize`, `jax.devices()` lists every chip of every host and one mesh spans them.
Each process reads its own shard of the data, and a batch crosses into the mesh as one
global array whose rows are the processes' local rows in process order (`global_rows`);
a process reads back only the rows it holds (`local_rows`), the rows of its own
examples, so it can score them. With one process both are a plain device transfer.
"""

import json
import os

import jax
import numpy as np
from jax.experimental import multihost_utils

from grpo_jax.parallel import mesh as mesh_lib

_EXPLICIT = ("coordinator_address", "num_processes", "process_id")


def initialize(cfg):
    """Joins this process to the others (`jax.distributed.initialize`) when asked.

    Asked when ``cfg.enabled`` is True, when any of ``cfg.coordinator_address``,
    ``cfg.num_processes``, ``cfg.process_id`` is set (then all three must be), or when
    the environment sets GRPO_JAX_DISTRIBUTED=1. With none of the three set, JAX detects
    the cluster itself (Cloud TPU, SLURM, Open MPI). Collectives between CPU devices use
    gloo. Safe to call more than once (the demo calls it per stage).

    Args:
      cfg: the ``config.distributed`` section.

    Returns:
      True when this process runs distributed.
    """
    given = {name: cfg[name] for name in _EXPLICIT if cfg[name] not in (None, "")}
    if given and len(given) < len(_EXPLICIT):
        missing = [f"distributed.{name}" for name in _EXPLICIT if name not in given]
        raise ValueError(f"set {', '.join(missing)} too: an explicit multi-process launch "
                         f"needs all of {', '.join('distributed.' + n for n in _EXPLICIT)} "
                         "(or none, to let JAX detect the cluster)")
    enabled = bool(cfg.enabled or given or os.environ.get("GRPO_JAX_DISTRIBUTED", "0") == "1")
    if enabled and not jax.distributed.is_initialized():
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        jax.distributed.initialize(**given)
    return enabled


_ANNOUNCED_MESHES = set()   # the demo builds one mesh per stage; each is printed once


def setup_mesh(config, state_bytes=None, *, devices=None, role=""):
    """The config's mesh, after joining the other processes if the run is distributed;
    the first time a process builds it, process 0 says on which devices it runs.

    Args:
      config: the run config; its ``mesh`` is name=size pairs or "auto".
      state_bytes: for "auto", a function of no arguments giving the run's replicated
        state in bytes (`mesh.choose_mesh`); without it "auto" is data parallel.
      devices: the devices to build it over (default: all of them); role: a word for
        the printed line ("training", "rollout").
    """
    initialize(config.distributed)
    spec, reason = mesh_lib.choose_mesh(config.mesh, state_bytes=state_bytes,
                                        device_memory=device_memory(jax.local_devices()[0])
                                        if state_bytes else None)
    mesh = mesh_lib.make_mesh(spec, devices=devices)
    _announce(mesh, reason, role)
    return mesh


def _announce(mesh, reason=None, role=""):
    hosts = jax.process_count()
    line = (f"{role + ' ' if role else ''}mesh {dict(mesh.shape)} over {mesh.size} "
            f"{mesh.devices.flat[0].platform} device(s)"
            f"{f' in {hosts} processes' if hosts > 1 else ''}")
    if is_main() and line not in _ANNOUNCED_MESHES:
        _ANNOUNCED_MESHES.add(line)
        print(reason + "\n" + line if reason else line, flush=True)


def setup_meshes(config, state_bytes=None):
    """`(training mesh, rollout mesh)` of an RL run. With ``rollout.mesh`` "" they are one
    mesh (`setup_mesh`) over every device; with name=size pairs (e.g. "data=4") the last
    that many devices form the rollout mesh (axes it leaves out have size 1) and the
    config's mesh is built over the others. Split meshes run on one process."""
    spec = config.rollout.mesh
    if not spec:
        mesh = setup_mesh(config, state_bytes)
        return mesh, mesh
    initialize(config.distributed)
    if jax.process_count() > 1:
        raise ValueError(f"rollout.mesh={spec!r} splits the devices of one process; this run "
                         f"has {jax.process_count()} processes. Set rollout.mesh=''")
    train_devices, rollout_devices = mesh_lib.split_devices(spec, jax.devices())
    mesh = setup_mesh(config, state_bytes, devices=train_devices, role="training")
    rollout_mesh = mesh_lib.make_mesh(mesh_lib.with_standard_axes(spec), devices=rollout_devices)
    _announce(rollout_mesh, role="rollout")
    return mesh, rollout_mesh


def device_memory(device):
    """Bytes of memory a real accelerator gives one program, or None where the runtime does
    not say (CPU)."""
    try:
        stats = device.memory_stats()
    except Exception:   # backends without memory statistics raise rather than return None
        return None
    return (stats or {}).get("bytes_limit")


def is_main():
    """True on process 0, the one that prints and writes metrics and exports."""
    return jax.process_index() == 0


def sync(name):
    """Waits until every process reaches this point (a no-op with one process)."""
    if jax.process_count() > 1:
        multihost_utils.sync_global_devices(name)


def agree_max(value):
    """The largest of every process's integer `value` (e.g. a prompt width)."""
    if jax.process_count() == 1:
        return int(value)
    return int(np.max(multihost_utils.process_allgather(np.asarray(value, np.int64))))


def allgather_json(obj):
    """`[obj of process 0, obj of process 1, ...]` for a JSON-serialisable `obj`."""
    if jax.process_count() == 1:
        return [obj]
    data = np.frombuffer(json.dumps(obj).encode(), np.uint8)
    width = agree_max(len(data))
    padded = np.zeros(width + 1, np.int32)
    padded[0], padded[1:len(data) + 1] = len(data), data
    gathered = np.asarray(multihost_utils.process_allgather(padded))
    return [json.loads(bytes(row[1:row[0] + 1].astype(np.uint8)).decode()) for row in gathered]


def _row_sharding(mesh, rows):
    """Rows over the row axes; a single process may replicate rows that do not split."""
    if rows % mesh_lib.row_ways(mesh) and jax.process_count() > 1:
        raise ValueError(
            f"{rows} rows per process do not split over the mesh's {mesh_lib.row_ways(mesh)}-way "
            f"row axes {mesh_lib.row_axes(mesh)} across {jax.process_count()} processes; make "
            "rollout.prompts_per_batch (and sft.batch_size) a multiple of the row ways")
    return mesh_lib.rows_sharding(mesh, rows)


def global_rows(mesh, local):
    """This process's rows (a pytree of `[r, ...]` arrays) as rows of global mesh arrays.

    Process i's rows land at rows ``[i r, (i + 1) r)`` of the global `[n r, ...]` arrays,
    split over the row axes of `mesh`. Every process must pass the same pytree structure,
    the same `r`, and the same trailing shapes.
    """
    def put(x):
        x = np.asarray(x)
        sharding = _row_sharding(mesh, x.shape[0] * jax.process_count())
        return jax.make_array_from_process_local_data(sharding, x)

    return jax.tree.map(put, local)


def _row_blocks(array):
    """`{first row: this process's block of rows}` of a global array (device arrays; a
    block held by several local devices once)."""
    blocks = {}
    for shard in array.addressable_shards:
        start = (shard.index[0].start or 0) if shard.index else 0
        blocks.setdefault(start, shard.data)
    return blocks


def local_rows(array):
    """The rows of a global array that this process holds, in row order, as numpy.

    For an array from `global_rows` (or any computation that keeps its rows split over
    the row axes) these are exactly the rows this process put in; with one process, the
    whole array.
    """
    blocks = _row_blocks(array)
    return np.concatenate([np.asarray(blocks[start]) for start in sorted(blocks)])


def held_rows(sharding, rows):
    """The ids of the rows this process holds when `rows` rows are split by `sharding`
    (along the first axis), ascending: the rows `local_rows` reads and `global_rows`
    takes from this process; every row on one process.

    Example (one process):
      >>> held_rows(jax.sharding.SingleDeviceSharding(jax.devices()[0]), 3)
      array([0, 1, 2])
    """
    ids = np.arange(rows)
    indices = sharding.addressable_devices_indices_map((rows,)).values()
    return np.unique(np.concatenate([ids[index[0]] for index in indices]))


def read_rows(array, rows):
    """Rows `rows` (ids among `held_rows`, in any order) of a global array as numpy, read
    from this process's own devices: no other process takes part, so each process may
    ask for its own rows, or for none."""
    rows = np.asarray(rows, np.int64).reshape(-1)
    out = np.zeros((rows.size, *array.shape[1:]), array.dtype)
    with jax.set_mesh(None):   # each gather runs on the one device that holds the block
        for start, block in _row_blocks(array).items():
            inside = (rows >= start) & (rows < start + block.shape[0])
            if inside.any():
                out[inside] = np.asarray(block[rows[inside] - start])
    return out


def whole_on_host(tree):
    """Every array of `tree` whole, as numpy, on every process: gathered from all
    processes where this one holds only part of it (`process_allgather`, a collective:
    every process calls it at once), so small arrays (a decode slot's flags) read the
    same everywhere; with one process a plain `jax.device_get`."""
    def get(x):
        if isinstance(x, jax.Array) and not x.is_fully_addressable:
            return np.asarray(multihost_utils.process_allgather(x, tiled=True))
        return np.asarray(jax.device_get(x))

    return jax.tree.map(get, tree)
