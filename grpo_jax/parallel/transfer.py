"""Messages between the meshes of two groups of processes: arrays through JAX's cross-host
transfers, their description and small host values through jax.distributed's key-value store.

``jax.device_put(x, NamedSharding(other_mesh, spec))``, with `x` on a mesh of this
process's devices and `other_mesh` of another process's, copies each shard of `x` to the
device at the same place in `other_mesh` (JAX's socket transfer server, which
`hosts.enable_transfers` turns on). Both sides make the call: the sender with `x`, the
receiver with a stand-in of the same global shape and sharding that holds no data. What
the runtime does (jax 0.10, XLA's ``PjRtTransferServer``; each point checked with two CPU
processes):

- Copies are paired by a counter that every process advances at each cross-process copy,
  not by what they hold: the processes must issue the same copies in the same order. Two
  copies issued in opposite orders on the two sides swap their data, silently; two
  threads of a process issuing copies would pair them by chance. So each process issues
  its copies from one thread, in an order both sides derive from one schedule
  (`training.roles.transfer_order`).
- Neither side blocks: the call returns at once, the sender's shards are kept until the
  receiver has pulled them (the sender may drop its arrays), and the receiver's array is
  ready once its data has arrived. (Only a process's very first copy waits, up to a
  minute, for the other side to publish its address.)
- The two shardings must tile alike (the same HLO sharding: the same mesh shape and
  spec) over as many devices, so the sender first lays each array out on its own devices
  the way the destination mesh will hold it (`mesh.sharding_on`), a copy among its own.

A message's description (its tree structure, every array's shape, dtype and spec) and
the sender's host values go ahead of the copy through the key-value store, one key per
message and receiving process; each sending process posts to its `peer`, the receiving
process at the same place in its side. The receiver waits for that key, so it issues its side of the
copy once the sender has issued its own, and a receiver waiting on the wrong message
waits rather than pairing the wrong copies.

Host values cross the key-value store pickled (a tree structure is no JSON), so the
store is trusted: whoever reaches the coordinator port can run code in every process.
The port must be reachable from the run's processes only (docs/tpu.md).
"""

import pickle
import time

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding

from grpo_jax.parallel import hosts, mesh as mesh_lib

POLL_MS = 200   # how often a wait looks at the keys it watches besides its own


class Ended(Exception):
    """A watched message (`Channel.wait`) came instead of the one awaited."""

    def __init__(self, name, value):
        self.name, self.value = name, value
        super().__init__(f"{name}: {value}")


def peer(own_mesh, other_mesh):
    """The process of `other_mesh` paired with this one (of `own_mesh`): the one at the
    same place in its side's process order. Each side has as many processes."""
    own, other = hosts.mesh_processes(own_mesh), hosts.mesh_processes(other_mesh)
    if len(own) != len(other):
        raise ValueError(f"the two meshes span {len(own)} and {len(other)} processes; a "
                         "transfer pairs them one to one: give every process as many devices")
    return other[own.index(jax.process_index())]


def _laid_out_like(source_mesh, destination_mesh):
    """`source_mesh`'s devices arranged as `destination_mesh` (its shape and axes): a
    sharding there tiles like the same spec on `destination_mesh`."""
    if source_mesh.size != destination_mesh.size:
        raise ValueError(f"a transfer needs as many devices on both sides, got "
                         f"{source_mesh.size} and {destination_mesh.size}")
    devices = np.array(list(source_mesh.devices.flat)).reshape(destination_mesh.devices.shape)
    return Mesh(devices, destination_mesh.axis_names, axis_types=destination_mesh.axis_types)


class Channel:
    """Messages between the processes of two meshes, named and in the order both sides
    call them. Every process of either side calls `send` and `receive` for every message
    (a side of several processes sends and receives as one); `post` and `wait` carry
    host values alone.

    Args:
      name: the channel's name in the key-value store. Channels of one name are told
        apart by how many this process made before, the same count on every process.
    """

    _made = {}

    def __init__(self, name):
        from jax._src import distributed   # no public access to the key-value store
        self._client = distributed.global_state.client
        count = Channel._made[name] = Channel._made.get(name, -1) + 1
        self._prefix = f"grpo_jax/{name}/{count}"

    def _key(self, name, process):
        return f"{self._prefix}/{name}/{process}"

    def post(self, name, value, processes):
        """Posts `value` (picklable) as message `name` to each of `processes` (replacing
        one posted before: several processes may post the same news)."""
        data = pickle.dumps(value)
        for process in processes:
            self._client.key_value_set_bytes(self._key(name, process), data, allow_overwrite=True)

    def posted(self, name):
        """Whether message `name` was posted to this process, without waiting."""
        try:
            self._client.key_value_try_get_bytes(self._key(name, jax.process_index()))
        except jax.errors.JaxRuntimeError:   # NOT_FOUND: not posted
            return False
        return True

    def wait(self, name, watch=()):
        """The value of message `name` for this process, once posted (then deleted).

        Raises:
          Ended: one of the messages `watch` was posted to this process meanwhile.
        """
        key = self._key(name, jax.process_index())
        while True:
            try:
                data = self._client.blocking_key_value_get_bytes(key, POLL_MS)
                break
            except jax.errors.JaxRuntimeError as error:
                if "DEADLINE_EXCEEDED" not in str(error):
                    raise
            for other in watch:
                try:
                    value = self._client.key_value_try_get_bytes(
                        self._key(other, jax.process_index())
                    )
                except jax.errors.JaxRuntimeError:  # NOT_FOUND: not posted
                    continue
                raise Ended(other, pickle.loads(value))
        self._client.key_value_delete(key)
        return pickle.loads(data)

    def send(self, name, tree, source_mesh, destination_mesh, host=None):
        """Sends `tree` (jax arrays on `source_mesh`) to `destination_mesh`, where each
        array lands in its `mesh.sharding_on` sharding, with this process's picklable
        `host` values (they go to its `peer`: each process of a side of several passes
        its own, e.g. its data position). Returns at once."""
        leaves, treedef = jax.tree.flatten(tree)
        laid = _laid_out_like(source_mesh, destination_mesh)
        specs = [mesh_lib.sharding_on(x, destination_mesh).spec for x in leaves]
        leaves = jax.device_put(leaves, [NamedSharding(laid, spec) for spec in specs])
        described = [(x.shape, x.dtype, spec) for x, spec in zip(leaves, specs)]
        self.post(name, (treedef, described, host), [peer(source_mesh, destination_mesh)])
        jax.device_put(leaves, [NamedSharding(destination_mesh, spec) for spec in specs])

    def receive(self, name, source_mesh, destination_mesh, watch=()):
        """`(tree, host, seconds)`: message `name` as `send` sent it from `source_mesh`,
        its arrays ready on `destination_mesh`, and the seconds from its description's
        arrival to its arrays' (the copy itself). Raises `Ended` as `wait`."""
        treedef, described, host = self.wait(name, watch)
        begin = time.time()
        laid = _laid_out_like(source_mesh, destination_mesh)
        standins = [jax.make_array_from_single_device_arrays(
            shape, NamedSharding(laid, spec), [], dtype=dtype) for shape, dtype, spec in described]
        leaves = jax.block_until_ready(jax.device_put(
            standins, [NamedSharding(destination_mesh, spec) for _, _, spec in described]))
        return jax.tree.unflatten(treedef, leaves), host, time.time() - begin
