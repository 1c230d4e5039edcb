"""Several processes, one mesh: start-up, and rows moving between a process and the mesh.

On a TPU pod (or several GPU hosts) every host runs the same command; after
`initialize`, `jax.devices()` lists every chip of every host and one mesh spans them.
Each process reads its own shard of the data, and a batch crosses into the mesh as one
global array whose rows are the processes' local rows in process order (`global_rows`);
a process reads back only the rows it holds (`local_rows`), the rows of its own
examples, so it can score them. With one process both are a plain device transfer.

Split meshes on several processes give the processes roles (`setup_meshes`): some
train, the others sample. Within `process_group` the collectives here (`agree_max`,
`allgather_json`, `sync`) and the data split (`process_count`, `process_index`) span one
role's processes only, so each role runs its own programs in its own order.
"""

import contextlib
import functools
import json
import os
import socket
import zlib

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import NamedSharding, PartitionSpec

from grpo_jax.parallel import mesh as mesh_lib

_EXPLICIT = ("coordinator_address", "num_processes", "process_id")
_GROUP = None   # the processes `process_group` set, or None: all of them


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


def enable_transfers(address):
    """Lets `jax.device_put` copy arrays to a mesh of other processes' devices (split
    meshes on several processes: `parallel.transfer`), through JAX's socket transfer
    server: ``jax_cross_host_transfer_socket_address``, read when the backend starts.

    Args:
      address: "host:port" this process serves transfers on (``distributed.transfer_address``),
        or "": the address this host reaches the coordinator from, and a free port.

    Every process publishes its address (the key-value store) and the others connect to
    it, so it must be reachable from them; "" picks a port per process, so several
    processes on one host do not collide.

    Raises:
      RuntimeError: JAX started before (another stage of this process): it reads the
        setting once.
    """
    from jax._src import distributed, xla_bridge   # no public accessors for either
    if xla_bridge.CROSS_HOST_TRANSFER_SOCKET_ADDRESS.value:
        return
    if xla_bridge.backends_are_initialized():
        raise RuntimeError("split meshes on several processes (rollout.mesh) copy arrays between "
                           "processes, which JAX sets up when it starts, but it started before "
                           "(an earlier stage of this process): run the RL stage in a process of "
                           "its own, or set rollout.mesh=''")
    if not address:
        host = distributed.global_state.coordinator_address.rsplit(":", 1)[0].strip("[]")
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect((host, 1))   # UDP: sends nothing, picks the route's interface
            local = probe.getsockname()[0]
        with socket.socket() as free:
            free.bind((local, 0))
            address = f"{local}:{free.getsockname()[1]}"
    jax.config.update("jax_cross_host_transfer_socket_address", address)


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
    config's mesh is built over the others. On several processes each mesh takes whole
    processes (`mesh.check_process_split`): those of the rollout mesh sample, the others
    (process 0 among them) train."""
    spec = config.rollout.mesh
    if not spec:
        mesh = setup_mesh(config, state_bytes)
        return mesh, mesh
    if initialize(config.distributed):
        enable_transfers(config.distributed.transfer_address)   # before jax.devices() starts JAX
    train_devices, rollout_devices = mesh_lib.split_devices(spec, jax.devices())
    if jax.process_count() > 1:
        mesh_lib.check_process_split(spec, train_devices, rollout_devices)
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
    """True on process 0, the one that prints and writes metrics and exports (with roles,
    a training process)."""
    return jax.process_index() == 0


@contextlib.contextmanager
def process_group(processes):
    """Within it, the processes that act together are `processes` (ids, e.g. a role's:
    `mesh_processes` of its mesh): `sync`, `agree_max` and `allgather_json` gather over
    them only, and `process_count`, `process_index` count among them (each reads its
    share of the data). The other processes must not join their collectives."""
    global _GROUP
    previous, _GROUP = _GROUP, tuple(sorted(processes))
    try:
        yield
    finally:
        _GROUP = previous


def acting_processes():
    """The ids of the processes acting together, ascending: all of them, or those of
    `process_group`."""
    return _GROUP if _GROUP is not None else tuple(range(jax.process_count()))


def process_count():
    """How many processes act together (all of them, or those of `process_group`)."""
    return len(acting_processes())


def process_index():
    """This process's place among those acting together: its share of the data."""
    return acting_processes().index(jax.process_index())


def mesh_processes(mesh):
    """The ids of the processes that hold devices of `mesh`, ascending."""
    return tuple(sorted({device.process_index for device in mesh.devices.flat}))


def _gather(value):
    """`[n, ...]`: `value` (a numpy array of the same shape on every process) of each of
    the n processes acting together, in order; a program over their devices only."""
    value = np.asarray(value)
    group = acting_processes()
    if len(group) == 1:
        return value[None]
    mesh, replicate = _replicator(group)
    stacked = jax.make_array_from_process_local_data(
        NamedSharding(mesh, PartitionSpec("processes")), value[None], (len(group), *value.shape))
    return np.asarray(replicate(stacked).addressable_data(0))


@functools.lru_cache(maxsize=None)
def _replicator(group):
    """`(mesh, copy)`: a mesh over the devices of processes `group`, one row each, and a
    jitted copy of an array onto all of them (one function, so each shape compiles once)."""
    devices = [d for d in jax.devices() if d.process_index in group]
    mesh = jax.sharding.Mesh(np.array(devices).reshape(len(group), -1), ("processes", "local"))
    return mesh, jax.jit(lambda x: x, out_shardings=NamedSharding(mesh, PartitionSpec()))


def sync(name):
    """Waits until every process acting together reaches this point (a no-op for one);
    raises if another reached a point of another name."""
    if process_count() > 1 and len(set(_gather(np.uint32(zlib.crc32(name.encode()))))) > 1:
        raise RuntimeError(f"processes out of step: this one is at {name!r}, another elsewhere")


def agree_max(value):
    """The largest of every process's integer `value` (e.g. a prompt width)."""
    return int(np.max(_gather(np.asarray(value, np.int64))))


def allgather_json(obj):
    """`[obj of process 0, obj of process 1, ...]` for a JSON-serialisable `obj` (the
    processes acting together, in order)."""
    if process_count() == 1:
        return [obj]
    data = np.frombuffer(json.dumps(obj).encode(), np.uint8)
    width = agree_max(len(data))
    padded = np.zeros(width + 1, np.int32)
    padded[0], padded[1:len(data) + 1] = len(data), data
    return [json.loads(bytes(row[1:row[0] + 1].astype(np.uint8)).decode())
            for row in _gather(padded)]


def allgather_rows(value):
    """Every process's `[k_i, ...]` numpy rows (k_i may differ, the trailing shape and
    dtype may not), as a list in process order (the processes acting together). The
    rows cross padded to a power of two, so few shapes compile."""
    value = np.asarray(value)
    if process_count() == 1:
        return [value]
    counts = _gather(np.int64(value.shape[0]))
    width = 1 << max(0, int(counts.max()) - 1).bit_length()   # the next power of two
    padded = np.zeros((width, *value.shape[1:]), value.dtype)
    padded[:value.shape[0]] = value
    return [rows[:count] for rows, count in zip(_gather(padded), counts)]


def _row_sharding(mesh, rows):
    """Rows over the row axes; a single process may replicate rows that do not split."""
    if not mesh_lib.rows_divide(rows, mesh_lib.row_ways(mesh)) and process_count() > 1:
        raise ValueError(
            f"{rows} rows per process do not split over the mesh's {mesh_lib.row_ways(mesh)}-way "
            f"row axes {mesh_lib.row_axes(mesh)} across {process_count()} processes; make "
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
        sharding = _row_sharding(mesh, x.shape[0] * process_count())
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
    processes where this one holds only part of it (`process_allgather`, a collective of
    the processes of the array's mesh: each calls it at once), so small arrays read the
    same everywhere; an array replicated on every device (a decode slot's flags, as the
    engine leaves them) is read from this process's own copy, and one on this process's
    devices alone (every array with one process) is a plain `jax.device_get`: no other
    process involved in either."""
    def get(x):
        if isinstance(x, jax.Array) and not x.is_fully_addressable and x.is_fully_replicated:
            return np.asarray(x.addressable_data(0))
        if isinstance(x, jax.Array) and not x.is_fully_addressable:
            return np.asarray(multihost_utils.process_allgather(x, tiled=True))
        return np.asarray(jax.device_get(x))

    return jax.tree.map(get, tree)
