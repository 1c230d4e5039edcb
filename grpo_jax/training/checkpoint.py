"""Orbax checkpoints of the whole run: parameters, optimizer state, step, data positions.

Saving is asynchronous (training goes on while the files are written) and keeps the
last `keep` steps. Every process takes part in saving and restoring the (global) arrays;
each process's data position is gathered into the checkpoint's JSON, so every process
resumes its own shard of the data exactly where it stopped. Restoring places every array
straight into the sharding of the abstract target, so a resumed run on a mesh never holds
a full copy per device.

What can go wrong on disk, and what happens:

- An interrupted save. orbax writes step N into ``N.orbax-checkpoint-tmp`` and renames
  it to ``N`` when every file is written (on GCS, where renames are not atomic, it writes
  ``N/`` and marks it finished with ``N/commit_success.txt`` last). Unfinished saves are
  never restored; a resumed run names them and leaves them be (orbax replaces one when
  it saves that step again).
- A damaged checkpoint. Flipped or zeroed bytes in array data usually read back without
  any error, as wrong numbers, so every save records a checksum of each array
  (`fingerprint`) and of the data positions, and every restore checks them. A checkpoint
  that fails to read or to check is named, the one before it is tried, and once one
  reads, the unreadable newer ones are renamed ``N.unreadable`` (kept, never deleted),
  out of the way of the steps the resumed run saves again. If none reads, nothing is
  moved and the error says what to do.
- A write that fails (full disk, read-only or vanished directory): the error names the
  directory, the bytes a checkpoint needs and the space there; the checkpoints saved
  before are intact, and the failed one is an unfinished save.
"""

import contextlib
import hashlib
import json
import re
import shutil
import threading
from typing import Any

import jax
import jax.numpy as jnp
import orbax.checkpoint as ocp
from etils import epath
from orbax.checkpoint._src.futures import future as future_lib

from grpo_jax import parallel, paths

UNREADABLE_SUFFIX = ".unreadable"
EXTRA_ITEM = "extra"   # the checkpoint item of `Checkpointer.save`'s host arrays


def _word_checksum(x):
    """The uint32 sum of `x`'s words (its bits, 32 at a time or fewer) times 2i + 1, i the
    word's position: exact in any order, so the same for any sharding of `x`."""
    if x.dtype == jnp.bool_:
        x = x.astype(jnp.uint8)
    width = x.dtype.itemsize
    if width < 4:
        narrow = {1: jnp.uint8, 2: jnp.uint16}[width]
        words = jax.lax.bitcast_convert_type(x, narrow).astype(jnp.uint32)
    else:   # 8-byte words become a trailing pair of 4-byte ones
        words = jax.lax.bitcast_convert_type(x, jnp.uint32)
    weights = 2 * jnp.arange(words.size, dtype=jnp.uint32).reshape(words.shape) + 1
    return jnp.sum(words * weights, dtype=jnp.uint32)


_checksums = jax.jit(lambda leaves: [_word_checksum(x) for x in leaves])


def _by_devices(arrays):
    """Indices of `arrays` grouped by the devices they live on (one jit call per group)."""
    groups = {}
    for index, x in enumerate(arrays):
        devices = x.sharding.device_set if isinstance(x, jax.Array) else None
        groups.setdefault(frozenset(devices or ()), []).append(index)
    return groups.values()


def fingerprint(state: Any) -> dict[str, int]:
    """``{path of each array in state: checksum of its bits}``, a JSON-able dict of ints.

    Each checksum is the sum, modulo 2^32, of the array's 32-bit (or narrower) words, each
    times an odd weight of its position: any single changed word changes it, and integer
    sums do not depend on the order of addition, so the numbers saved on one mesh check a
    restore into another. With several processes, every process must call it.
    """
    leaves = jax.tree_util.tree_flatten_with_path(state)[0]
    arrays = [x for _, x in leaves]
    sums = {}
    for group in _by_devices(arrays):
        sums.update(zip(group, jax.device_get(_checksums([arrays[i] for i in group]))))
    return {jax.tree_util.keystr(path): int(sums[i]) for i, (path, _) in enumerate(leaves)}


def _first_lines(error, width=1000):
    """The first line of `error` and of its cause: tensorstore's errors go on for pages."""
    text = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"[:width]
    cause = error.__cause__ or error.__context__
    return text + (f" (from {_first_lines(cause, width)})" if cause is not None else "")


def _size(nbytes):
    return f"{nbytes / 2**30:.2f} GiB" if nbytes >= 2**30 else f"{nbytes / 2**20:.1f} MiB"


def _free_space(directory):
    """' (N free there)' for a local directory (or its nearest existing parent), else ''."""
    if "://" in directory:   # gs://...: no local filesystem to ask
        return ""
    path = epath.Path(directory)
    while not path.exists() and path != path.parent:
        path = path.parent
    return f" ({_size(shutil.disk_usage(path).free)} free there now)"


def complete_steps(directory: str) -> list[int]:
    """The steps with a complete checkpoint in `directory`, ascending, read from the file
    names alone (no Checkpointer, nothing restored); [] when there is none."""
    root = epath.Path(paths.resolve(directory))
    if not root.exists():
        return []
    return sorted(int(path.name) for path in root.iterdir()
                  if path.name.isdigit() and ocp.path.step.is_path_finalized(path))


def check_config(config: Any) -> None:
    """Raises ValueError naming the field unless the checkpoint settings can keep a run:
    ``train.checkpoint_every`` and ``sft.checkpoint_every`` >= 1 (the steps between
    saves), ``train.keep_checkpoints`` >= 1 (the newest checkpoint is what a re-run
    resumes from: 0 would delete it; 1 keeps the newest only)."""
    for field in ("train.checkpoint_every", "sft.checkpoint_every"):
        section, name = field.split(".")
        every = config[section][name]
        if not isinstance(every, int) or every < 1:
            raise ValueError(f"{field} must be an int >= 1 (steps between checkpoints; the "
                             f"last step is always saved), got {every!r}")
    keep = config.train.keep_checkpoints
    if not isinstance(keep, int) or keep < 1:
        raise ValueError(f"train.keep_checkpoints must be an int >= 1 (1 keeps the newest "
                         f"checkpoint only, which a re-run resumes from), got {keep!r}")


def base_pointer(config: Any) -> str:
    """What a run's starting weights are, for a checkpoint's meta: ``model.path`` (where a
    LoRA run's frozen base lives, since its checkpoints hold the adapters only), or the
    named shape and the seed it is drawn from."""
    return config.model.path or f"model.name={config.model.name} seed={config.seed}"


def _whole_shards_on_cpu():
    """On the CPU backend, save each array's shards whole (orbax's replica-parallel saving
    off, as orbax itself does on GPU). Replica-parallel splits every replicated shard into
    one slice per replica, and each distinct slice is an eagerly compiled program: a
    first save of the tiny model compiled ~64 of them (~10 s on 2 cores), where the CPU
    devices share one host's memory and nothing is gained. Other backends keep orbax's
    default."""
    if jax.default_backend() == "cpu":
        ocp.type_handlers.register_type_handler(
            jax.Array, ocp.type_handlers.ArrayHandler(use_replica_parallel=False), override=True)


def _acting_processes():
    """orbax's options for the processes acting together (`parallel.process_group`: with
    process roles, the learner's processes save and restore alone)."""
    group = parallel.acting_processes()
    if len(group) == jax.process_count():
        return ocp.options.MultiprocessingOptions()
    return ocp.options.MultiprocessingOptions(primary_host=group[0], active_processes=set(group))


def _json_checksum(value):
    """The SHA-256 of `value`'s JSON text (keys sorted), a hex string."""
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode("utf-8")).hexdigest()


def _release_waiting_threads():
    """Ends orbax's threads still waiting for a signal of a save that failed before sending
    it (a directory that could not be created): each is cancelled, then woken by its
    signals, and returns. Left waiting, these (non-daemon) threads would keep the process
    from exiting for orbax's signal timeout, 300 s, after the error was reported."""
    waiting = [t for t in threading.enumerate()
               if isinstance(t, future_lib._SignalingThread) and t.is_alive()]
    for thread in waiting:
        thread.cancel()
        future_lib.set_signals(thread._receive_signals, operation_id=thread._operation_id)
    for thread in waiting:
        threading.Thread.join(thread, timeout=10)   # its own join raises once cancelled


def _check_expected(meta, expect, where):
    """Raises ValueError naming each key of `expect` whose value `meta` recorded otherwise."""
    differ = {k: (meta[k], v) for k, v in expect.items() if k in meta and meta[k] != v}
    if differ:
        what = "; ".join(f"{k}: the checkpoint has {saved!r}, this run {now!r}"
                         for k, (saved, now) in differ.items())
        raise ValueError(
            f"the checkpoint {where} was written by a run on another starting point ({what}). "
            "Its adapters belong to that base: re-run with the model.path / model.name / seed "
            "that wrote it, or use a new --workdir to start afresh on this base")


class Checkpointer:
    """Saves and restores ``(state_tree, meta_json)`` pairs under ``workdir/checkpoints``."""

    def __init__(self, directory, *, keep=3, asynchronous=True):
        if keep < 1:   # orbax's max_to_keep=0 deletes every checkpoint, the newest included
            raise ValueError(f"keep must be >= 1 (the newest checkpoint is the one a re-run "
                             f"resumes from), got {keep}")
        _whole_shards_on_cpu()
        self.directory = paths.resolve(directory)
        processes = _acting_processes()
        if processes.active_processes:   # orbax leaves the directory to a subset's caller
            paths.path(self.directory).mkdir(parents=True, exist_ok=True)
        options = ocp.CheckpointManagerOptions(max_to_keep=keep,
                                               enable_async_checkpointing=asynchronous,
                                               multiprocessing_options=processes,
                                               create=not processes.active_processes)
        self._manager = ocp.CheckpointManager(self.directory, options=options)
        self._handler = ocp.CompositeCheckpointHandler(   # restores without orbax's barrier
            composite_options=ocp.CompositeOptions(multiprocessing_options=processes))
        self._in_flight = None   # (step, bytes) of the save being written
        # One process of several saving alone (the learner of process roles) holds every
        # shard, which orbax refuses to write as a jax.Array on several processes (the
        # arrays of pmap, different on each): it writes a host copy, which restores into
        # the state's shardings like any checkpoint.
        self._host_copy = len(parallel.acting_processes()) == 1 < jax.process_count()

    def latest_step(self) -> int | None:
        """The step of the newest complete checkpoint, or None."""
        return self._manager.latest_step()

    def save(self, step: int, state: Any, meta: dict[str, Any],
             extra: tuple[Any, Any] | None = None) -> None:
        """Starts writing `state` (a pytree of arrays) and `meta` (JSON) for `step`; the
        `fingerprint` of `state` goes into the meta. `extra`: None, or `(arrays, info)`,
        host state whose shapes a resumed run cannot know beforehand (a partial-rollout
        pool): `arrays` (a dict of non-empty numpy arrays, or None) is saved as an item of
        its own, restored as saved (`restore_run(..., extra=True)`), and `info` (JSON)
        in the meta; both are checked on restore like the state.

        Raises:
          OSError: the previous save, or the start of this one, failed to write; the
            message names the directory and the space a checkpoint needs.
        """
        meta = {**meta, "fingerprint": fingerprint(state)}
        items = {
            "state": ocp.args.StandardSave(jax.device_get(state) if self._host_copy else state)
        }
        arrays, info = extra if extra is not None else (None, None)
        if extra is not None:
            meta["extra"] = info
        if arrays:
            meta["extra_fingerprint"] = fingerprint(arrays)
            items[EXTRA_ITEM] = ocp.args.StandardSave(arrays)
        self.wait()
        self._remove_unfinished_save(step)
        self._in_flight = (step, sum(x.nbytes for x in jax.tree.leaves((state, arrays))))
        with self._naming_write_failures():
            self._manager.save(step, args=ocp.args.Composite(meta=ocp.args.JsonSave(meta), **items))

    def _remove_unfinished_save(self, step):
        """Deletes an unfinished save of `step` in an object store before `step` is saved
        again. There orbax writes a step in place and marks it complete last, so a save
        cut short leaves a partial database that tensorstore would write into; on a local
        disk orbax writes a new temporary directory and replaces the old one itself."""
        if not paths.is_url(self.directory):
            return
        target = epath.Path(self.directory) / str(step)
        if parallel.is_main() and target.exists() and not ocp.path.step.is_path_finalized(target):
            self._say(f"deleting {target}: an unfinished save of the step about to be saved")
            target.rmtree()
        parallel.sync(f"unfinished save of step {step} removed")

    def wait(self) -> None:
        """Blocks until the save in flight is on disk (OSError as `save` if it failed)."""
        with self._naming_write_failures():
            self._manager.wait_until_finished()
            # A write error can be recorded after the finalize thread ended cleanly; orbax
            # then raises it at the start of the NEXT save, under that step's name.
            self._manager.check_for_errors()
        self._in_flight = None

    @contextlib.contextmanager
    def _naming_write_failures(self):
        try:
            yield
        except Exception as error:
            if self._in_flight is None:
                raise
            step, nbytes = self._in_flight
            self._in_flight = None
            _release_waiting_threads()
            self._manager.reload()
            before = [s for s in self._manager.all_steps() if s != step]
            raise OSError(
                f"writing the checkpoint of step {step} to {self.directory} failed: "
                f"{_first_lines(error)}\n"
                f"A checkpoint of this run needs about {_size(nbytes)} in {self.directory}"
                f"{_free_space(self.directory)}. The checkpoints saved before it are intact "
                f"(steps {before}). Free some space (or make the directory writable, or use "
                "another --workdir) and re-run the same command: it resumes from step "
                f"{before[-1] if before else 0}.") from error

    def _try_restore(self, step, abstract_state):
        """``((state, meta, (extra arrays, extra info)), None)``, or ``(None, what went
        wrong)``, agreed by every process.

        `abstract_state` is a pytree of `jax.ShapeDtypeStruct` with shardings (or of arrays,
        whose shapes, dtypes and shardings are used); every array lands in its sharding.
        The extra arrays (`save`) come back as saved, or None.
        """
        target = jax.tree.map(ocp.utils.to_shape_dtype_struct, abstract_state)
        path = epath.Path(self.directory) / str(step)
        items = {"state": ocp.args.StandardRestore(target), "meta": ocp.args.JsonRestore()}
        if (path / EXTRA_ITEM).exists():   # as saved: its shapes are the checkpoint's own
            items[EXTRA_ITEM] = ocp.args.StandardRestore()
        try:
            restored = self._handler.restore(path, args=ocp.args.Composite(**items))
            error = ""
        except Exception as failure:   # any read error: the caller tries an older step
            error = _first_lines(failure)
        errors = parallel.allgather_json(error)   # the fingerprint below is a collective
        if any(errors):
            return None, "; ".join(f"process {i}: {e}" if len(errors) > 1 else e
                                   for i, e in enumerate(errors) if e)
        state, meta = restored.state, restored.meta
        if "data_checksum" in meta and meta["data_checksum"] != _json_checksum(meta["data"]):
            return None, ("its data position differs from the checksum saved with it: damaged "
                          "or edited (a resume from it would read other examples)")
        arrays = restored[EXTRA_ITEM] if EXTRA_ITEM in items else None
        for saved, found in ((meta.get("fingerprint"), state),   # absent before it existed
                             (meta.get("extra_fingerprint"), arrays)):
            if saved is None:
                continue
            found = fingerprint(found)
            changed = [path for path, value in saved.items() if found.get(path) != value]
            if changed:
                return None, (f"{len(changed)} of {len(saved)} arrays differ from the checksums "
                              f"saved with them (first: {', '.join(changed[:3])}): damaged data")
        return (state, meta, (arrays, meta.get("extra"))), None

    def save_run(self, step: int, state: Any, data_iterator: Any,
                 extra: tuple[Any, Any] | None = None, **meta: Any) -> None:
        """Saves `state` and every process's position in its data stream at `step` (and
        `extra`, as `save`)."""
        positions = parallel.allgather_json(data_iterator.get_state())
        self.save(step, state, {"step": step, "data": positions,
                                "data_checksum": _json_checksum(positions), **meta}, extra)

    def restore_run(self, state: Any, data_iterator: Any, extra: bool = False,
                    expect: dict[str, Any] | None = None) -> tuple:
        """Restores the newest readable checkpoint into `state`'s shardings and moves
        `data_iterator` to where this process stopped; returns ``(step, state)``, or
        ``(0, state)`` if there is no checkpoint; with `extra`, ``(step, state, (arrays,
        info))``: what `save` was given as `extra` (``(None, None)`` where none).

        Unfinished saves are named and ignored; unreadable checkpoints are named, and set
        aside as ``N.unreadable`` once an older one reads. `expect`: ``{meta key: value}``
        the checkpoint must have recorded (``{"base": base_pointer(config)}`` for a LoRA
        run, whose checkpoints hold adapters of that base only); a key it lacks is not
        checked.

        Raises:
          RuntimeError: there are checkpoints and none of them reads.
          ValueError: the checkpoint recorded another value of a key of `expect`.
        """
        self._report_unfinished_saves()
        unreadable = []
        for step in reversed(self._manager.all_steps()):
            restored, problem = self._try_restore(step, state)
            if problem is None:
                break
            unreadable.append(step)
            self._say(f"the checkpoint {self.directory}/{step} cannot be read: {problem}; "
                      "trying the one before it")
        else:
            if unreadable:
                raise RuntimeError(
                    f"none of the checkpoints in {self.directory} (steps {unreadable[::-1]}) can "
                    "be read. If the config changed since they were written (model, optimizer, "
                    "rollout.policy_lag, train.ref_reset_every), re-run with the config that "
                    "wrote them, or use a new --workdir. If they are damaged, copy back a good "
                    f"checkpoint, or move them aside (mv {self.directory} "
                    f"{self.directory}.damaged) and re-run to start from step 0.")
            return (0, state, (None, None)) if extra else (0, state)
        self._set_aside(unreadable, resume_step=step)
        state, meta, saved_extra = restored
        _check_expected(meta, expect or {}, f"{self.directory}/{step}")
        positions = meta["data"]
        if len(positions) != parallel.process_count():
            raise ValueError(f"the checkpoint of step {step} was written by {len(positions)} "
                             f"processes, this run has {parallel.process_count()}; resume with the "
                             "same number of processes (each reads its own shard of the data)")
        data_iterator.set_state(positions[parallel.process_index()])
        return (step, state, saved_extra) if extra else (step, state)

    def _report_unfinished_saves(self):
        root = epath.Path(self.directory)
        if not root.exists():
            return
        for path in sorted(root.iterdir(), key=lambda p: p.name):
            if re.match(r"^\d+(\.|$)", path.name) and not ocp.path.step.is_path_finalized(path):
                self._say(f"ignoring {path}: an unfinished save (interrupted before its commit "
                          "marker was written); orbax replaces it when that step is saved again")

    def _set_aside(self, steps, *, resume_step):
        """Renames the unreadable checkpoints of `steps` to ``N.unreadable`` (``-2``, ...)."""
        if not steps:
            return
        if parallel.is_main():
            root = epath.Path(self.directory)
            for step in steps:
                target, copy = root / f"{step}{UNREADABLE_SUFFIX}", 1
                while target.exists():
                    copy += 1
                    target = root / f"{step}{UNREADABLE_SUFFIX}-{copy}"
                source = root / str(step)
                try:
                    source.rename(target)
                except Exception as error:   # e.g. a store without directory renames
                    raise RuntimeError(f"could not move the unreadable checkpoint {source} to "
                                       f"{target} ({_first_lines(error)}); move it yourself "
                                       "(gsutil -m mv on GCS) and re-run") from error
                self._say(f"moved the unreadable checkpoint of step {step} to {target} (kept, "
                          f"not deleted); resuming from step {resume_step}")
        parallel.sync("unreadable checkpoints set aside")
        self._manager.reload()

    @staticmethod
    def _say(line):
        if parallel.is_main():
            print(line, flush=True)

    def close(self) -> None:
        """Waits for the save in flight (OSError as `save` if it failed), then closes."""
        try:
            self.wait()
        finally:
            self._manager.close()
            self._handler.close()
