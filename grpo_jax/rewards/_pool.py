"""A process pool for graders that may hang, with a time budget per call.

`concurrent.futures` cannot stop one hung task (sympy can spin for hours inside a
single big-integer power, holding the GIL, deaf to signals). Here every worker is a
process with its own pipe: a call past its budget gets its worker killed and replaced,
and the row scores 0 with status "timeout"; a call that raises scores 0 with status
"error"; a worker that dies is replaced. The pool itself never raises for a grader.

Workers come from a forkserver that has already imported `grpo_jax.rewards`, so a
replacement starts in milliseconds and never forks the (multithreaded) trainer process.
"""

import collections
import dataclasses
import importlib
import math
import multiprocessing
import multiprocessing.connection
import os
import resource
import signal
import time
from typing import Callable, Literal, Sequence

import numpy as np

Status = Literal["ok", "error", "timeout"]
_STARTUP_TIMEOUT_S = 120.0


@dataclasses.dataclass(frozen=True)
class Outcome:
    """The result of one grader call: the reward (0.0 unless status is "ok") and what
    happened. With `GraderPool.map(..., as_reward=False)` (a tool), `value` is what the
    call returned, None unless status is "ok"."""

    value: object
    status: Status
    detail: str = ""


def error_outcome(error: BaseException) -> Outcome:
    """A 0.0 "error" outcome that names the exception."""
    return Outcome(0.0, "error", f"{type(error).__name__}: {error}")


# The largest reward kept: rewards are float32 on the devices, where a larger one is inf.
MAX_REWARD = float(np.finfo(np.float32).max)


def to_outcome(value: object) -> Outcome:
    """A grader's return value as an Outcome; a non-finite value, or one past float32's
    range (`MAX_REWARD`: it would be inf on the devices), is an "error"."""
    value = float(value)
    if not math.isfinite(value):
        return Outcome(0.0, "error", f"non-finite reward {value}")
    if abs(value) > MAX_REWARD:
        return Outcome(0.0, "error", f"reward {value} is past float32's range (+-{MAX_REWARD:.4g})")
    return Outcome(value, "ok")


def run_contained(
    fn: Callable[..., object], args: tuple, kwargs: dict, as_reward: bool = True
) -> Outcome:
    """Calls `fn(*args, **kwargs)`; a TimeoutError (a grader's own time limit) becomes a 0.0
    "timeout", any other exception or a non-finite value a 0.0 "error". With `as_reward`
    False the value is kept as returned (a tool's output; None on failure)."""
    failed = 0.0 if as_reward else None
    try:
        value = fn(*args, **kwargs)
        return to_outcome(value) if as_reward else Outcome(value, "ok")
    except TimeoutError as error:
        return Outcome(failed, "timeout", str(error))
    except (Exception, SystemExit) as error:  # a grader bug (or sys.exit) must not stop training
        return dataclasses.replace(error_outcome(error), value=failed)


def _worker_main(conn, memory_limit_bytes: int | None) -> None:
    # A process group of its own: killing the worker kills what a grader started too.
    os.setpgid(0, 0)
    # Before "ready", so no call's budget pays for imports (free when the forkserver
    # preloaded them).
    importlib.import_module("grpo_jax.rewards")
    if memory_limit_bytes:  # a runaway grader gets MemoryError instead of waking the OOM killer
        resource.setrlimit(resource.RLIMIT_AS, (memory_limit_bytes, memory_limit_bytes))
    conn.send("ready")
    while True:
        try:
            fn, args, kwargs, as_reward = conn.recv()
        except EOFError:  # the pool closed its end
            return
        except Exception as error:  # the grader could not be unpickled, e.g. not importable
            conn.send(error_outcome(error))
            continue
        conn.send(run_contained(fn, args, kwargs, as_reward))


class _Worker:
    def __init__(self, context, memory_limit_bytes: int | None):
        self.conn, child_conn = context.Pipe()
        self.process = context.Process(
            target=_worker_main, args=(child_conn, memory_limit_bytes), daemon=True
        )
        self.process.start()
        child_conn.close()
        try:
            started = self.conn.poll(_STARTUP_TIMEOUT_S) and self.conn.recv() == "ready"
        except EOFError:  # it died while starting; its traceback is on stderr
            started = False
        if not started:
            self.kill()
            raise RuntimeError(f"a grader worker failed to start within {_STARTUP_TIMEOUT_S} s; "
                               "see its error above")

    def kill(self) -> None:
        """Kills the worker and every process of its group (a grader's children too)."""
        try:   # the worker is not reaped yet, so its pid (and group id) is still its own
            os.killpg(self.process.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):   # never started its own group
            pass
        self.process.kill()
        self.process.join()
        self.conn.close()


class GraderPool:
    """Runs a grader over many rows in worker processes, each call under `timeout_s`.

    Workers start like multiprocessing's "forkserver" children: they re-import the main
    module, so a script that makes a pool keeps its top-level work under
    `if __name__ == "__main__":` (`python -m grpo_jax.main` already does).

    Args:
      num_workers: worker processes; defaults to min(8, CPU count).
      timeout_s: budget per call, from when the row is handed to a worker.
      memory_limit_gb: address-space limit of each worker (None: no limit); a grader
        that needs more gets MemoryError, an "error" outcome.

    Example:
      >>> from grpo_jax.rewards import math_reward
      >>> with GraderPool(1, timeout_s=5.0) as pool:
      ...     pool.map(math_reward, [("Q", "\\\\boxed{4}", {"answer": "4"}),
      ...                            ("Q", "", {"answer": "4"})])
      [Outcome(value=1.0, status='ok', detail=''), Outcome(value=0.0, status='ok', detail='')]
    """

    def __init__(
        self, num_workers: int | None = None, *, timeout_s: float = 10.0,
        memory_limit_gb: float | None = 4.0,
    ):
        if num_workers is None:
            num_workers = min(8, os.cpu_count() or 1)
        if num_workers < 1:
            raise ValueError(f"num_workers must be >= 1, got {num_workers}")
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        if memory_limit_gb is not None and not memory_limit_gb > 0:
            raise ValueError(f"memory_limit_gb must be > 0 or None, got {memory_limit_gb}")
        self.timeout_s = timeout_s
        self._memory_limit_bytes = int(memory_limit_gb * 2**30) if memory_limit_gb else None
        self.replaced_workers = 0  # hung or dead workers killed and replaced, over the pool's life
        self._context = multiprocessing.get_context("forkserver")
        self._context.set_forkserver_preload(["grpo_jax.rewards"])
        self._workers = [self._start_worker() for _ in range(num_workers)]

    def map(self, fn: Callable[..., object], calls: Sequence[tuple], kwargs: dict | None = None,
            *, as_reward: bool = True) -> list[Outcome]:
        """`[fn(*args, **kwargs) for args in calls]` as Outcomes, in order, never raising for `fn`.

        `fn` must be importable by name (a module-level function), as for any process pool.
        With `as_reward` False the values are kept as returned (a tool's text), None where
        the call failed or timed out.
        """
        kwargs = dict(kwargs or {})
        failed = 0.0 if as_reward else None
        outcomes: list[Outcome | None] = [None] * len(calls)
        waiting = collections.deque(range(len(calls)))
        idle = list(self._workers)
        running: dict[_Worker, tuple[int, float]] = {}  # worker -> (row, deadline)
        while waiting or running:
            while waiting and idle:
                row, worker = waiting.popleft(), idle.pop()
                try:
                    worker.conn.send((fn, calls[row], kwargs, as_reward))
                except OSError:  # died while idle: replace, retry the row
                    idle.append(self._replace(worker))
                    waiting.appendleft(row)
                    continue
                except Exception as error:  # could not pickle the call; nothing was sent
                    outcomes[row] = dataclasses.replace(error_outcome(error), value=failed)
                    idle.append(worker)
                    continue
                running[worker] = (row, time.monotonic() + self.timeout_s)
            if not running:
                continue
            next_deadline = min(deadline for _, deadline in running.values())
            by_conn = {worker.conn: worker for worker in running}
            ready = multiprocessing.connection.wait(
                list(by_conn), max(0.0, next_deadline - time.monotonic())
            )
            for conn in ready:
                worker = by_conn[conn]
                row, _ = running.pop(worker)
                try:
                    outcome = conn.recv()
                    if outcome.status != "ok":   # a failed unpickle sends a reward's 0.0
                        outcome = dataclasses.replace(outcome, value=failed)
                    outcomes[row] = outcome
                    idle.append(worker)
                except (EOFError, OSError):  # the worker died mid-call (crash, OOM kill)
                    outcomes[row] = Outcome(failed, "error", "grader worker died")
                    idle.append(self._replace(worker))
            now = time.monotonic()
            for worker, (row, deadline) in list(running.items()):
                if deadline <= now:
                    del running[worker]
                    outcomes[row] = Outcome(failed, "timeout", f"over {self.timeout_s} s")
                    idle.append(self._replace(worker))
        return outcomes

    def _replace(self, worker: _Worker) -> _Worker:
        worker.kill()
        self.replaced_workers += 1
        fresh = self._start_worker()
        self._workers[self._workers.index(worker)] = fresh
        return fresh

    def _start_worker(self) -> _Worker:
        return _Worker(self._context, self._memory_limit_bytes)

    def close(self) -> None:
        """Kills every worker; the pool cannot be used afterwards."""
        for worker in self._workers:
            worker.kill()
        self._workers = []

    def __enter__(self) -> "GraderPool":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()
