"""Asynchronous RL: a producer thread samples the next steps' rollouts while the learner
updates, with a bound on how stale a batch may be.

Versions: theta_v is the policy after v RL steps (theta_0 at the start). The batch trained
at step t (counted from 1) was sampled by theta_v with

    staleness = (t - 1) - v,   0 <= staleness <= k = ``async_rl.max_staleness``,

so the producer may run up to k steps ahead of the learner: it samples step s as soon as
theta_{s-1-k} exists. Free-running (``async_rl.fixed = False``) it samples with the newest
version published; with ``fixed`` with exactly v = max(0, s - 1 - k), the schedule of the
synchronous loop's ``rollout.policy_lag = k``, which the asynchronous run then equals step
for step. The learner keeps the last k versions (its lagged copies, checkpointed as in the
synchronous loop) to recompute pi_old under the parameters that sampled: the behaviour
policy of decoupled PPO (Fu et al., "AReaL", arXiv:2505.24298, sec. 4; Hilton et al.,
arXiv:2110.00641), separate from the proximal pi_old only when the objective asks for it.

`Producer` is the thread and its hand-over; `lagged_copies` what a run keeps; `DeviceTurns`
how the two threads share one mesh. The trainer's rollout source
(`rollout_source.Asynchronous`) builds the producer's sampling function. On several
processes the sampler is processes of its own instead of a thread, on the fixed schedule
(`roles`).
"""

import contextlib
import dataclasses
import threading
from collections.abc import Iterator
from typing import Any, Callable

import jax


def lagged_copies(config: Any) -> int:
    """How many past versions of the trained parameters a run keeps: ``rollout.policy_lag``
    in the synchronous loop, ``async_rl.max_staleness`` when asynchronous."""
    if config.async_rl.enabled:
        return config.async_rl.max_staleness
    return config.rollout.policy_lag


def check_config(config: Any, process_count: int) -> None:
    """Raises ValueError naming the field for asynchronous settings the trainer cannot run.
    On several processes split meshes run only as process roles (`roles`): the fixed
    asynchronous schedule, the rollout processes sampling and the others training."""
    cfg = config.async_rl   # enabled and fixed are bools: the config's types hold them
    several = process_count > 1
    if several and config.rollout.mesh and not (cfg.enabled and cfg.fixed):
        raise ValueError(f"rollout.mesh={config.rollout.mesh!r} on {process_count} processes "
                         "gives the rollout mesh's processes the sampling and the others the "
                         "training, which runs the fixed asynchronous schedule: set "
                         "async_rl.enabled=True and async_rl.fixed=True (or rollout.mesh='' to "
                         "sample on the training mesh)")
    if not cfg.enabled:
        return
    if not isinstance(cfg.max_staleness, int) or cfg.max_staleness < 1:
        raise ValueError(f"async_rl.max_staleness must be an int >= 1 (0 is the synchronous "
                         f"loop: async_rl.enabled=False), got {cfg.max_staleness!r}")
    if config.rollout.policy_lag:
        raise ValueError("async_rl.enabled with rollout.policy_lag > 0: the asynchronous run "
                         "sets its own staleness (async_rl.max_staleness; async_rl.fixed=True "
                         "for exactly that many steps); set rollout.policy_lag=0")
    if several and not config.rollout.mesh:
        raise ValueError(f"async_rl.enabled on {process_count} processes needs split meshes, "
                         "whole processes each: set rollout.mesh to the sampling processes' "
                         "devices (e.g. rollout.mesh=data=4 with 4 devices a process and 2 "
                         "processes: process 1 samples, process 0 trains), or "
                         "async_rl.enabled=False")


def version_for(step: int, max_staleness: int) -> int:
    """The version a fixed schedule samples step `step` with: max(0, step - 1 - k)."""
    return max(0, step - 1 - max_staleness)


@dataclasses.dataclass
class Produced:
    """One step's rollouts as the producer hands them over.

    Attributes:
      step: the RL step they are for; version: v of the theta_v that sampled them.
      batch, metrics, examples: `rollout.collect`'s three.
      data_position: the prompt stream's state after this step's draws (what a checkpoint
        of this step saves: the producer may have drawn further).
      seconds: the producer's wall time on them.
      carry: with partial rollouts, the groups carried over after this step (the
        producer's pool may be further on), else None.
    """

    step: int
    version: int
    batch: dict
    metrics: dict
    examples: Any
    data_position: Any
    seconds: float
    carry: Any = None


class Producer:
    """The rollout thread: samples steps ``first..last`` in order with `sample(step, version,
    trained_params) -> (batch, metrics, examples, data_position, carry)` (version: v of the
    theta_v given; carry: `Produced.carry`), each as soon as the version it needs is
    published, and holds them until the learner takes them.

    Args:
      sample: the sampling function (runs on this thread).
      first, last: the steps to produce.
      max_staleness: k; fixed: sample with exactly `version_for` (else the newest).
      versions: ``{v: trained params}`` already published (a resumed run's lagged copies).
      clock: the time function (tests inject delays through `sample`).
    """

    def __init__(self, sample: Callable, *, first, last, max_staleness, fixed, versions,
                 clock=None):
        import time
        self._sample, self._first, self._last = sample, first, last
        self._k, self._fixed, self._clock = max_staleness, fixed, clock or time.time
        self._versions = dict(versions)
        self._ready = {}
        self._error = None
        self._stopping = False
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="rollout-producer", daemon=True)
        self._thread.start()

    def publish(self, version: int, trained: Any) -> None:
        """Makes theta_version available to the steps that may sample with it."""
        with self._cond:
            self._versions[version] = trained
            self._cond.notify_all()

    def take(self, step: int) -> "Produced":
        """Waits for step `step`'s `Produced` and returns it; re-raises the producer's error."""
        with self._cond:
            while step not in self._ready and self._error is None:
                self._cond.wait()
            if step not in self._ready:
                raise RuntimeError(f"the rollout producer failed before step {step}") \
                    from self._error
            produced = self._ready.pop(step)
            self._cond.notify_all()
        staleness = step - 1 - produced.version
        if not 0 <= staleness <= self._k:   # the bound the producer's waits guarantee
            raise RuntimeError(f"step {step}'s rollouts are {staleness} steps stale, outside "
                               f"[0, async_rl.max_staleness = {self._k}]")
        return produced

    def close(self) -> None:
        """Stops after the rollout in progress (its result dropped) and joins the thread."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        self._thread.join()

    def _wait_for_version(self, step):
        """`(v, params)` to sample `step` with, once available; None when stopping."""
        need = version_for(step, self._k)
        with self._cond:
            while not self._stopping and max(self._versions, default=-1) < need:
                self._cond.wait()
            if self._stopping:
                return None
            version = need if self._fixed else max(self._versions)
            params = self._versions[version]
            # Later steps need versions >= need (fixed) or the newest: drop the rest.
            keep = need if self._fixed else version
            self._versions = {v: p for v, p in self._versions.items() if v >= keep}
            return version, params

    def _run(self):
        try:
            for step in range(self._first, self._last + 1):
                chosen = self._wait_for_version(step)
                if chosen is None:
                    return
                version, params = chosen
                begin = self._clock()
                batch, metrics, examples, position, carry = self._sample(step, version, params)
                produced = Produced(step, version, batch, metrics, examples, position,
                                    self._clock() - begin, carry)
                with self._cond:
                    if self._stopping:
                        return
                    self._ready[step] = produced
                    self._cond.notify_all()
        except BaseException as error:   # handed to the learner's next `take`
            with self._cond:
                self._error = error
                self._cond.notify_all()


class DeviceTurns:
    """The learner's and the producer's turns on the devices they share (one mesh).

    XLA's CPU runtime can deadlock when two threads run programs on the same devices at
    once and one of them has a collective: its all-reduce waits for a device that is busy
    with the other thread's program, and after 40 s the runtime aborts the process
    ("Termination timeout for `all reduce` ... Exiting to ensure a consistent program
    state"). So on one mesh one thread at a time runs programs: the learner holds the turn
    through its step and gives it up only while it waits for its batch (`given_up`); the
    producer holds it while it samples (`held`). Each waits for its programs' outputs
    before passing the turn on. What overlaps is the learner's wait with the sampling: on
    one mesh the devices (and a CPU's cores) cannot do both at once anyway. On split meshes
    (disjoint devices) both run freely: ``shared=False`` makes every method a no-op.
    """

    def __init__(self, shared):
        self._lock = threading.Lock() if shared else None
        self._learner_holds = False

    def take(self) -> None:
        """The learner takes the turn (waits while the producer samples)."""
        if self._lock is not None and not self._learner_holds:
            self._lock.acquire()
            self._learner_holds = True

    def give_back(self, outputs: Any = ()) -> None:
        """The learner gives the turn up, once `outputs` are computed (an array that a
        failed step deleted, donated, has nothing left to wait for: its error is the
        step's). The turn is given up even when waiting raises."""
        if self._lock is not None and self._learner_holds:
            live = [x for x in jax.tree.leaves(outputs)
                    if not (isinstance(x, jax.Array) and x.is_deleted())]
            try:
                jax.block_until_ready(live)
            finally:
                self._learner_holds = False
                self._lock.release()

    @contextlib.contextmanager
    def given_up(self, outputs: Any = ()) -> Iterator[None]:
        """The learner's wait for its batch: the turn given up (once `outputs`, every array
        the learner's last programs write, are computed) and taken back after."""
        held = self._learner_holds
        self.give_back(outputs)
        try:
            yield
        finally:
            if held:
                self.take()

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        """The producer's turn, for a block that waits for its own outputs before it ends."""
        if self._lock is None:
            yield
            return
        with self._lock:
            yield


@dataclasses.dataclass
class DataPosition:
    """A prompt stream's saved state, standing in for the stream when a checkpoint asks it
    (`checkpoint.Checkpointer.save_run` calls ``get_state``)."""

    state: Any

    def get_state(self) -> Any:
        return self.state
