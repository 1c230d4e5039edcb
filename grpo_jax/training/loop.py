"""The end of a trainer's step, the same in every loop (`rl.train`, `sft.train`): the time
limit, a SIGTERM's stop, the checkpoint and `preemption.Stopped`.

    tail = loop.Tail(last_step=T, seconds=None, checkpoint_every=10, save=save,
                     directory=checkpointer.directory)
    try:
        for step in ...:
            ...                                   # the step, its metrics written
            if tail.end(step, tail.is_last(step)):
                break
    finally:
        tail.close()

Every process calls `is_last` and `end` at every step, in that order: both are
collectives on several processes.
"""

import time
from typing import Callable

from grpo_jax import parallel
from grpo_jax.training import preemption


class Tail:
    """A loop's step ends: the last step (`is_last`), then the checkpoint and a SIGTERM's
    stop (`end`). Construction starts the wall-time clock and installs the SIGTERM handler
    (`preemption.Preemption`); `close` puts the previous handler back.

    Args:
      last_step: the run's last step.
      seconds: with a number, the run also ends after the first step that finishes past
        that much wall time from construction (for comparisons at equal time); None: no
        limit.
      checkpoint_every: steps between checkpoints (the last step and a stopped one are
        saved too).
      save: ``save(step)`` writes the step's checkpoint, the metric rows up to it first.
      directory: the checkpoints' directory, named by `preemption.Stopped`.
      passed_on: `preemption.Preemption`'s (whether another process passed a SIGTERM on).
    """

    def __init__(self, *, last_step: int, seconds: float | None, checkpoint_every: int,
                 save: Callable[[int], None], directory: str,
                 passed_on: Callable[[], bool] | None = None):
        self._last_step, self._seconds, self._every = last_step, seconds, checkpoint_every
        self._save, self._directory = save, directory
        self._started = time.time()
        self._stop = preemption.Preemption(passed_on)   # SIGTERM: finish the step, save, stop

    def is_last(self, step: int) -> bool:
        """Whether `step` ends the run: the last step, or past the time limit (agreed by
        every process)."""
        out_of_time = self._seconds is not None and bool(
            parallel.agree_max(int(time.time() - self._started >= self._seconds)))
        return step == self._last_step or out_of_time

    def end(self, step: int, last: bool) -> bool:
        """Saves `step` every ``checkpoint_every`` steps, at the last one (`last`) and when a
        SIGTERM stops the run (agreed by every process), then raises `preemption.Stopped`
        in that case; returns `last`, whether the loop ends here."""
        stopping = self._stop.requested() and not last
        if step % self._every == 0 or last or stopping:
            self._save(step)
        if stopping:
            raise preemption.Stopped(step, self._directory)
        return last

    def close(self) -> None:
        """Puts back the SIGTERM handler that was there before."""
        self._stop.close()
