"""Stopping at a step boundary when the machine is about to go: SIGTERM in, a checkpoint out.

Spot and queued TPU VMs are preempted with a SIGTERM shortly before they go (about 30 s
on Compute Engine spot VMs), and schedulers stop jobs the same way. A loop that holds a
`Preemption` asks it at the end of every step whether to stop; the first SIGTERM makes
the answer yes, the loop saves the step it just finished and raises `Stopped`, and
``python -m grpo_jax.main`` exits with `EXIT_STATUS` (75, sysexits' EX_TEMPFAIL: "try
again"). Re-running the command resumes from that checkpoint, so no finished step is
lost. The step in progress is finished, not abandoned: a step longer than the grace
period is cut by the SIGKILL that follows, and the run resumes from its last periodic
checkpoint instead.

A second SIGTERM ends the process at once (the default action: status -15, 143 in a
shell), for a stop that must not wait for the step.

With several processes the answer is agreed: every process asks at every step boundary,
and the stop comes after the same step on all of them as soon as any one was signalled
(`parallel.agree_max` of the flags). JAX's own preemption notice
(`multihost_utils.reached_preemption_sync_point`, from `jax.distributed.initialize`'s
preemption service) is the same SIGTERM, caught by a C handler that this module's
handler replaces once installed. It is still consulted: a SIGTERM that reached the C
handler between `jax.distributed.initialize` and the loop (during compilation) stops the
run at the step boundary the service names, the same on every process.
"""

import os
import signal

from jax.experimental import multihost_utils

from grpo_jax import parallel

EXIT_STATUS = 75   # EX_TEMPFAIL: stopped on request, resumable; `main` exits with it


class Stopped(Exception):
    """The run stopped on a SIGTERM after saving the checkpoint of `step`."""

    def __init__(self, step, checkpoint_dir):
        self.step, self.checkpoint_dir = step, checkpoint_dir
        super().__init__(f"stopped by SIGTERM after step {step}; its checkpoint is "
                         f"{checkpoint_dir}/{step}. Re-run the same command to resume from it")


def _notice_from_jax(count):
    """True at the `count`-th step boundary if JAX's preemption service chose it (it
    picks one past the furthest count any process had reported; only with jax.distributed)."""
    try:
        return multihost_utils.reached_preemption_sync_point(count)
    except RuntimeError:   # distributed, with jax_enable_preemption_service turned off
        return False


class Preemption:
    """Holds SIGTERM for the loop: `requested()` at each step boundary, `close()` after.

    Installs its handler on construction (from the main thread); `close` puts back the
    handler that was there before. `passed_on`: a function saying whether another process
    passed a SIGTERM on to this one (process roles: a sampling process to the learner,
    `roles.Learner.sigterm_passed_on`), asked at each boundary; the run then stops as if
    this process had got it.
    """

    def __init__(self, passed_on=None):
        self.signalled = False
        self._passed_on = passed_on
        self._boundaries = 0   # calls of `requested`: what JAX's service counts in
        self._previous = signal.signal(signal.SIGTERM, self._on_sigterm)

    def _on_sigterm(self, signum, frame):
        self.signalled = True
        signal.signal(signal.SIGTERM, signal.SIG_DFL)   # the next one ends the process
        os.write(2, b"SIGTERM: stopping once the step in progress is done and saved; "
                    b"send SIGTERM again to stop at once, losing it\n")   # no print: reentrancy

    def requested(self) -> bool:
        """Whether to stop at this step boundary: the same answer on every process.

        Every process must call it at every step boundary: with several processes it is a
        collective, and JAX's service counts the calls (from 1 in every loop, so a notice
        that came before the loop stops it at its first boundary, resumed or not).
        """
        self._boundaries += 1
        if self._passed_on is not None and self._passed_on():
            self.signalled = True
        return bool(parallel.agree_max(int(self.signalled)) or _notice_from_jax(self._boundaries))

    def close(self) -> None:
        signal.signal(signal.SIGTERM, self._previous)
