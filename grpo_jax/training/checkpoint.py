"""Orbax checkpoints of the whole run: parameters, optimizer state, step, data positions.

Saving is asynchronous (training goes on while the files are written) and keeps the
last `keep` steps. Every process takes part in saving and restoring the (global) arrays;
each process's data position is gathered into the checkpoint's JSON, so every process
resumes its own shard of the data exactly where it stopped. Restoring places every array
straight into the sharding of the abstract target, so a resumed run on a mesh never holds
a full copy per device.
"""

import jax
import orbax.checkpoint as ocp

from grpo_jax import parallel, paths


class Checkpointer:
    """Saves and restores ``(state_tree, meta_json)`` pairs under ``workdir/checkpoints``."""

    def __init__(self, directory, *, keep=3, asynchronous=True):
        options = ocp.CheckpointManagerOptions(max_to_keep=keep,
                                               enable_async_checkpointing=asynchronous)
        self._manager = ocp.CheckpointManager(paths.resolve(directory), options=options)

    def latest_step(self):
        """The step of the newest complete checkpoint, or None."""
        return self._manager.latest_step()

    def save(self, step, state, meta):
        """Starts writing `state` (a pytree of arrays) and `meta` (JSON) for `step`."""
        self._manager.save(step, args=ocp.args.Composite(
            state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)))

    def restore(self, step, abstract_state):
        """Returns ``(state, meta)`` of `step`, each array in `abstract_state`'s sharding.

        Args:
          step: a step from `latest_step()`.
          abstract_state: a pytree of `jax.ShapeDtypeStruct` with shardings (or arrays,
            whose shapes, dtypes and shardings are used).
        """
        target = jax.tree.map(ocp.utils.to_shape_dtype_struct, abstract_state)
        restored = self._manager.restore(step, args=ocp.args.Composite(
            state=ocp.args.StandardRestore(target), meta=ocp.args.JsonRestore()))
        return restored.state, restored.meta

    def save_run(self, step, state, data_iterator, **meta):
        """Saves `state` and every process's position in its data stream at `step`."""
        positions = parallel.allgather_json(data_iterator.get_state())
        self.save(step, state, {"step": step, "data": positions, **meta})

    def restore_run(self, state, data_iterator):
        """Restores the newest checkpoint into `state`'s shardings and moves `data_iterator`
        to where this process stopped; returns ``(step, state)``, or ``(0, state)`` if
        there is no checkpoint."""
        step = self.latest_step()
        if step is None:
            return 0, state
        state, meta = self.restore(step, state)
        positions = meta["data"]
        if len(positions) != jax.process_count():
            raise ValueError(f"the checkpoint of step {step} was written by {len(positions)} "
                             f"processes, this run has {jax.process_count()}; resume with the same "
                             "number of processes (each reads its own shard of the data)")
        data_iterator.set_state(positions[jax.process_index()])
        return step, state

    def wait(self):
        """Blocks until every started save is on disk."""
        self._manager.wait_until_finished()

    def close(self):
        self._manager.wait_until_finished()
        self._manager.close()
