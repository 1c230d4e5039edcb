"""Asynchronous RL on several processes: the processes of the rollout mesh sample, the
others train (process roles).

With ``rollout.mesh`` on several processes each mesh takes whole processes
(`parallel.check_process_split`). The learner's processes (process 0 among them) run the
RL loop (`rl.train`) with a `Learner` in place of the producer thread; the sampler's run
`sample`. Each role's collectives span its own processes (`parallel.process_group`), and
only the learner writes (checkpoints, metrics, rollouts, exports).

Parameters go learner -> sampler and batches sampler -> learner as JAX cross-host copies
(`parallel.transfer.Channel`), which both sides must issue in the same order. The order
is the fixed schedule's (``async_rl.fixed``, k = ``async_rl.max_staleness``): step s is
sampled by theta_v, v = max(0, s - 1 - k), so the sampler sends b_1 .. b_{k+1} with the
starting parameters, then gets v_1 before b_{k+2}, v_2 before b_{k+3}, ...
(`transfer_order`). The learner sends v_{t-k} once it has taken b_t, before its updates
of step t, so the sampler samples step t + 1 while the learner updates on step t.

At the start the learner, having restored its checkpoint, posts the step it starts from
and the prompt stream's position (each learner process its own, to the sampler process
at its place), and sends its lagged copies (the versions steps start + 1 .. start + k + 1
sample with); at the end (or on an error) it posts "end", which the sampler waits for
before it exits. A sampler that fails posts "failed" with its error, which the learner
raises. A SIGTERM to a sampling process is passed on to the learner, which stops after
its step, saves it and ends the samplers with it: every process exits with
`preemption.EXIT_STATUS`, as a SIGTERM to a learner process does.
"""

import contextlib
import functools
import os
import signal
import time
import traceback
from collections.abc import Callable, Iterator

import jax
import ml_collections
from flax import nnx

from grpo_jax import parallel
from grpo_jax.parallel import transfer
from grpo_jax.training import async_rl, policy as policy_lib, preemption, programs, rollout
from grpo_jax.training import steps
from grpo_jax.training import task as task_lib

CHANNEL = "async_rl"


def split(mesh: jax.sharding.Mesh, rollout_mesh: jax.sharding.Mesh) -> bool:
    """Whether the two meshes are on different processes (roles), not one process's."""
    return not set(parallel.mesh_processes(mesh)) & set(parallel.mesh_processes(rollout_mesh))


def samples(rollout_mesh: jax.sharding.Mesh) -> bool:
    """Whether this process is one of the rollout mesh's (a sampler)."""
    return jax.process_index() in parallel.mesh_processes(rollout_mesh)


@contextlib.contextmanager
def acting(mesh: jax.sharding.Mesh, rollout_mesh: jax.sharding.Mesh) -> Iterator[None]:
    """Within it, this process's collectives span its role's processes (those of
    `rollout_mesh` for a sampler, of `mesh` for a learner)."""
    own = rollout_mesh if samples(rollout_mesh) else mesh
    with parallel.process_group(parallel.mesh_processes(own)):
        yield


def starting_versions(start: int, k: int) -> list[int]:
    """The versions of the learner's k lagged copies after step `start`, oldest first:
    max(0, start - k + i) for i < k (all theta_0 before step 1)."""
    return [max(0, start - k + i) for i in range(k)]


def transfer_order(start: int, last: int, k: int) -> list[tuple[str, int]]:
    """The messages between the roles after the lagged copies, in the order both sides
    issue them: ``("batch", s)`` for each step s in start + 1 .. last, each preceded by
    ``("params", v)`` the first time it needs a version v = max(0, s - 1 - k) that the
    sampler does not hold yet.

    >>> transfer_order(0, 5, 1)  # doctest: +NORMALIZE_WHITESPACE
    [('batch', 1), ('batch', 2), ('params', 1), ('batch', 3), ('params', 2), ('batch', 4),
     ('params', 3), ('batch', 5)]
    """
    held, order = set(starting_versions(start, k)), []
    for step in range(start + 1, last + 1):
        version = async_rl.version_for(step, k)
        if version not in held:
            held.add(version)
            order.append(("params", version))
        order.append(("batch", step))
    return order


@contextlib.contextmanager
def learning(rollout_mesh: jax.sharding.Mesh) -> Iterator[Callable[..., "Learner"]]:
    """The learner's side of the roles: yields `Learner` with its first two arguments
    bound; at the exit, an error's included, tells the sampling processes to end (they
    wait for it before exiting, or stop waiting for the learner's messages)."""
    channel, stopped = transfer.Channel(CHANNEL), None
    try:
        yield functools.partial(Learner, channel, rollout_mesh)
    except preemption.Stopped as error:   # the samplers stop with the same status
        stopped = error.step, error.checkpoint_dir
        raise
    finally:
        channel.post("end", stopped, parallel.mesh_processes(rollout_mesh))


class Learner:
    """The learner's side of the roles, the run's rollout source (`rollout_source`: the
    same `publish`, `take`, `sigterm_passed_on` and `close`; `learning` ends the samplers):
    it sends the versions the sampler needs and receives each step's batch on the training
    mesh, in `transfer_order`.

    Args:
      channel: the `transfer.Channel` of the roles; rollout_mesh: the sampler's mesh.
      run: the `rl_run.Run` (its mesh, lagged copies and prompt stream position).
      start, last: the steps to take, start + 1 .. last.
      taken: called with (step, batch) once a batch is on the training mesh (the rollouts
        the run logs).
    """

    def __init__(self, channel, rollout_mesh, run, *, start, last, taken):
        self._mesh, self._rollout_mesh, self._taken = run.mesh, rollout_mesh, taken
        self._k = run.config.async_rl.max_staleness
        self._channel = channel
        self._order, self._next, self._versions = transfer_order(start, last, self._k), 0, {}
        self._samplers = parallel.mesh_processes(rollout_mesh)
        self._channel.post("start", (start, run.train_iter.get_state()),
                           [transfer.peer(run.mesh, rollout_mesh)])
        self._channel.send("lagged", run.lagged, run.mesh, rollout_mesh)

    def publish(self, version: int, trained: nnx.State) -> None:
        """Makes theta_version available to send (`take` sends it when the order says)."""
        self._versions[version] = trained

    def take(self, step: int) -> async_rl.Produced:
        """The `async_rl.Produced` of step `step`, received from the sampler; then sends the
        versions the order puts next, so the sampler goes on while this process updates.
        Its metrics gain ``time_rollout_wait``, the seconds this took."""
        begin, produced = time.time(), None
        while self._next < len(self._order):
            kind, number = self._order[self._next]
            if kind == "batch" and produced is not None:
                break
            if kind == "params":
                if number not in self._versions:   # not published yet: the next `take`
                    break
                self._channel.send(f"params/{number}", self._versions.pop(number), self._mesh,
                                   self._rollout_mesh)
            else:
                produced = self._receive(number)
            self._next += 1
        if produced is None or produced.step != step:   # `rl._rollouts` asks in order
            raise RuntimeError(f"the learner asked for step {step}'s batch; the transfer order "
                               f"had {produced and produced.step} next")
        produced.metrics["time_rollout_wait"] = time.time() - begin
        return produced

    def _receive(self, step):
        try:
            batch, host, seconds = self._channel.receive(
                f"batch/{step}", self._rollout_mesh, self._mesh, watch=("failed",))
        except transfer.Ended as ended:
            raise RuntimeError(f"the sampling processes {self._samplers} failed before step "
                               f"{step}:\n{ended.value}") from None
        metrics, examples, position, sampled = host
        self._taken(step, batch)
        return async_rl.Produced(step, async_rl.version_for(step, self._k), batch,
                                 {**metrics, "time_batch_transfer": seconds}, examples, position,
                                 sampled)

    def sigterm_passed_on(self) -> bool:
        """Whether a sampling process passed a SIGTERM on (`preemption.Preemption`'s
        `passed_on`)."""
        return self._channel.posted("sigterm")

    def close(self) -> None:
        """Nothing to end here: `learning` tells the sampling processes to end."""


def sample(config: ml_collections.ConfigDict, workdir: str, mesh: jax.sharding.Mesh,
           rollout_mesh: jax.sharding.Mesh, *, last: int, scorer: task_lib.Scorer) -> None:
    """The sampler's role: samples steps start + 1 .. `last` on `rollout_mesh` with the
    versions the learner sends and sends each batch to `mesh`, in `transfer_order`, then
    waits for the learner's end. Its policy (the frozen part a LoRA run keeps: the base)
    is the run's starting one, built here; `scorer` grades its rollouts."""
    channel, learners = transfer.Channel(CHANNEL), parallel.mesh_processes(mesh)
    previous = signal.signal(signal.SIGTERM, _passing_on(channel, learners))
    try:
        _sample(channel, config, workdir, mesh, rollout_mesh, last, scorer)
        stopped = channel.wait("end")
    except transfer.Ended as ended:   # the learner ended first (a time limit, a SIGTERM)
        stopped = ended.value
    except BaseException:
        channel.post("failed", traceback.format_exc(), learners)
        raise
    finally:
        scorer.close()
        signal.signal(signal.SIGTERM, previous)
    if stopped is not None:   # exits as the learner does: resumable
        raise preemption.Stopped(*stopped)


def _passing_on(channel, learners):
    """A SIGTERM handler that passes the first SIGTERM on to the learner's processes
    (which stop after their step, save it and then end this process); the second ends
    this process at once."""
    def on_sigterm(signum, frame):
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        channel.post("sigterm", None, learners)
        os.write(2, b"SIGTERM: passed on to the learner, which stops once its step is saved; "
                    b"send SIGTERM again to stop this process at once\n")
    return on_sigterm


def _sample(channel, config, workdir, mesh, rollout_mesh, last, scorer):
    k = config.async_rl.max_staleness
    start, position = channel.wait("start", watch=("end",))
    source = task_lib.data_source(config.task, "train")
    train_iter = iter(task_lib.loader(source, config, batch_size=config.rollout.prompts_per_batch))
    train_iter.set_state(position)
    policy = policy_lib.start_policy(
        config, rollout_mesh, workdir,
        None if config.model.path else task_lib.tokenizer_corpus(source),
    )
    precision = policy_lib.RolloutPrecision.of(config, policy)   # rollout.dtype
    if precision is not None:   # the parameters cast once, as they arrive
        policy = precision.policy(policy)
    own = (lambda trained: trained) if precision is None else precision.params
    frozen = nnx.filter_state(policy.params, nnx.Not(programs.trained_filter(config)))
    method, episodic = (
        rollout.sampling_method(config), rollout.Episodic.of(config, policy.tokenizer),
    )
    lagged, _, seconds = channel.receive("lagged", mesh, rollout_mesh, watch=("end",))
    # version -> (its trained parameters, the seconds their copy took)
    versions = {v: (own(trained), seconds)
                for v, trained in zip(starting_versions(start, k), lagged)}
    try:
        for kind, number in transfer_order(start, last, k):
            if kind == "params":
                trained, _, seconds = channel.receive(f"params/{number}", mesh, rollout_mesh,
                                                      watch=("end",))
                versions[number] = own(trained), seconds
                continue
            version = async_rl.version_for(number, k)
            versions = {v: held for v, held in versions.items() if v >= version}
            trained, seconds = versions[version]
            behaviour = policy_lib.sampling_policy(policy.graphdef, frozen, trained,
                                                   policy.tokenizer)
            begin = time.time()
            batch, metrics, examples = rollout.collect(
                behaviour, rollout_mesh, train_iter, config=config, scorer=scorer, method=method,
                rng=steps.step_rng(config.seed, "rollout", number), episodic=episodic)
            channel.send(f"batch/{number}", batch, rollout_mesh, mesh, host=(
                {**metrics, "time_weight_transfer": seconds}, examples, train_iter.get_state(),
                time.time() - begin))
    finally:
        if episodic is not None:
            episodic.close()
