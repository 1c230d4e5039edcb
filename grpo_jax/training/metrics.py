"""Metrics every step: JSONL and TensorBoard in the workdir, one concise console line.

TensorBoard files are written by tensorboardX (no TensorFlow). Only process 0 writes:
row by row on a local disk, and in a bucket whole at each checkpoint (`MetricWriter`).
The console line's time per step and ETA leave out the time JAX spends tracing and
compiling (counted through `jax.monitoring`), which is reported on its own: the first
steps of a run compile every program, and would otherwise inflate the ETA many times.
"""

import functools
import json
import math
import os
import sys
import time
from typing import Any

import jax
import jax.numpy as jnp

from grpo_jax import parallel, paths, run_files

# The console line: (metric, label, format). Everything else goes to the files only.
CONSOLE = (
    ("reward_mean", "reward", "{:.3f}"),
    ("accuracy", "acc", "{:.3f}"),
    ("response_length_mean", "len", "{:.1f}"),
    ("entropy", "ent", "{:.3f}"),
    ("clip_low", "clip-", "{:.3f}"),
    ("clip_high", "clip+", "{:.3f}"),
    ("gate_scale", "gate", "{:.3f}"),
    ("kl_old", "kl_old", "{:.4f}"),
    ("kl_ref", "kl_ref", "{:.4f}"),
    ("groups_without_signal", "nosig", "{:.2f}"),
    ("gen_batches", "draws", "{:.0f}"),
    ("loss", "loss", "{:.4f}"),
    ("value_loss", "vloss", "{:.4f}"),
    ("explained_variance", "ev", "{:.2f}"),
    ("eval_accuracy", "EVAL", "{:.3f}"),
)


# What JAX reports of the time it spends turning a function into an executable.
_COMPILE_EVENTS = ("/jax/core/compile/jaxpr_trace_duration",
                   "/jax/core/compile/jaxpr_to_mlir_module_duration",
                   "/jax/core/compile/backend_compile_duration")
_compile_seconds = [0.0]
_listening = [False]


def _count_compile_time(event, duration_secs, **kwargs):
    if event in _COMPILE_EVENTS:
        _compile_seconds[0] += duration_secs


def compile_seconds() -> float:
    """Seconds this process has spent tracing, lowering and compiling since it first asked."""
    if not _listening[0]:
        jax.monitoring.register_event_duration_secs_listener(_count_compile_time)
        _listening[0] = True
    return _compile_seconds[0]


WATCHED = ("loss", "policy_loss", "grad_norm", "update_norm", "kl_ref", "kl_old", "value_loss",
           "critic_grad_norm")


NEARLY = 0.25   # a group is nearly solved (failed) when at most this share of it is wrong (right)


@functools.partial(jax.jit, static_argnames=("group_size",))
def advantage_statistics(advantages: jax.Array, correct: jax.Array, row_valid: jax.Array,
                         loss_mask: jax.Array, *, group_size: int) -> dict[str, jax.Array]:
    """Where the train batch's advantage weight sits, by how well each group was solved.

    A row's weight is its |advantage| (the mean |A_t| over its loss tokens for per-token
    advantages), on real rows only. Dividing by the group std (GRPO) gives more weight to
    the groups whose answers nearly all agree than not dividing does (Liu et al.,
    arXiv:2503.20783, sec. 3.1, "question-level difficulty bias").

    Args:
      advantages: `[B]` or `[B, T]`, B = P G.
      correct: `[B]` bool.
      row_valid: `[B]` bool, False on padding rows.
      loss_mask: `[B, T]`, the tokens the loss counts.
      group_size: G.

    Returns:
      ``advantage_share_nearly_solved`` / ``_nearly_failed``: the share of the batch's
      summed row weight carried by nearly-solved groups (3/4 <= share correct < 1) /
      nearly-failed ones (0 < share correct <= 1/4), 0 when every weight is 0;
      ``groups_nearly_solved`` / ``_nearly_failed``: the share of the real groups that are.
    """
    if advantages.ndim == 2:
        mask = loss_mask.astype(jnp.float32)
        weight = jnp.sum(jnp.abs(advantages) * mask, axis=1) / jnp.maximum(jnp.sum(mask, axis=1), 1)
    else:
        weight = jnp.abs(advantages)
    weight = weight * row_valid
    solved = jnp.mean(correct.reshape(-1, group_size).astype(jnp.float32), axis=1)   # [P]
    real = row_valid.reshape(-1, group_size)[:, 0]
    groups = {"nearly_solved": (solved >= 1 - NEARLY) & (solved < 1),
              "nearly_failed": (solved > 0) & (solved <= NEARLY)}
    total = jnp.sum(weight)
    stats = {}
    for name, where in groups.items():
        carried = jnp.sum(weight * jnp.repeat(where, group_size))
        stats[f"advantage_share_{name}"] = jnp.where(
            total > 0, carried / jnp.where(total > 0, total, 1), 0.0
        )
        stats[f"groups_{name}"] = jnp.sum(where & real) / jnp.maximum(jnp.sum(real), 1)
    return stats


def stop_if_not_finite(metrics: dict[str, float], step: int, checkpointer: Any) -> None:
    """Raises FloatingPointError before a non-finite step can be saved over a good one."""
    for name in WATCHED:
        if name in metrics and not math.isfinite(metrics[name]):
            checkpointer.wait()
            raise FloatingPointError(
                f"step {step}: {name} = {metrics[name]} is not finite; stopping without saving. "
                f"The last good checkpoint is step {checkpointer.latest_step()}; lower "
                "optimizer.learning_rate or optimizer.grad_clip and re-run to resume from it.")


def progress_bar(done: int, total: int, width: int = 20) -> str:
    filled = min(int(width * done / max(total, 1)), width)
    return "[" + "#" * filled + "." * (width - filled) + "]"


def kept_lines(text: str, step: int, name: str = run_files.METRICS) -> list[str]:
    """The lines of a metrics.jsonl's `text` (read from the file `name`) whose rows are of
    steps up to `step`: a resumed run redoes the later ones, and each step keeps one row.
    A run starting at step 0 keeps none (it redoes ``train.eval_at_start``'s step-0 row too).

    A last line that is not a whole row (an append cut short: a full disk, a lost machine)
    is dropped, with a line naming the file: its step was not saved, so the resume redoes
    it. Any other line that is not a row is an error naming the file and the line
    (`run_files.parse_rows`).
    """
    rows, torn = run_files.parse_rows(text, name)
    if torn is not None:
        print(f"{name}:{torn.number}: dropping a torn last row ({len(torn.line)} characters, "
              f"{torn.error}); its step is redone", flush=True)
    return [line + "\n" for line, row in rows if step > 0 and row["step"] <= step]


class MetricWriter:
    """Writes scalar metrics to ``workdir/metrics.jsonl``, TensorBoard and the console.

    On a local disk each row is appended to metrics.jsonl (and TensorBoard flushed) as it
    comes. In a bucket (``gs://``), where an object cannot be appended to, metrics.jsonl
    is rewritten whole (`paths.write_whole`) at each `flush`, which the loop calls when it
    saves a checkpoint, and which also runs when a row comes `FLUSH_SECONDS` after the
    last flush and at `close`: a run killed at any moment leaves every row up to its last
    checkpoint, and the rows after it are redone on resume. TensorBoard's event file
    (tensorboardX writes gs:// itself, also whole) is flushed at the same points there.
    The console line comes every step. `whole_file` chooses the bucket's way on any
    workdir (None: by where the workdir is).

    A run resumed at `start_step` keeps the rows of steps up to it and drops the later
    ones (written before an interruption, and about to be redone).
    """

    FLUSH_SECONDS = 60.0

    def __init__(self, workdir, *, total_steps, start_step=0, total_seconds=None, prefix="",
                 stream=sys.stdout, whole_file=None):
        self.total_steps = total_steps
        self.start_step = start_step         # the step a resumed run starts after
        self.total_seconds = total_seconds   # a run bounded by wall time shows time progress
        self.prefix = prefix
        self.stream = stream
        self._start = self._flushed_at = time.time()
        self._compile_at_start = self._compile_at_last_write = compile_seconds()
        self._tb = self._appending = None
        self.whole_file = paths.is_url(workdir) if whole_file is None else whole_file
        if parallel.is_main():
            self._path = paths.path(workdir) / run_files.METRICS
            text = paths.read_text_or_none(self._path)
            self._lines = kept_lines(text, start_step, name=str(self._path))
            if not self.whole_file:
                if text is not None and "".join(self._lines) != text:
                    paths.write_whole(self._path, "".join(self._lines))
                self._path.parent.mkdir(parents=True, exist_ok=True)
                self._appending = self._path.open("a", encoding="utf-8")
                self._lines = None   # the file holds them
            import tensorboardX   # imported lazily: only the writing process needs it
            self._tb = tensorboardX.SummaryWriter(str(paths.path(workdir) / run_files.TENSORBOARD))

    def write(self, step: int, metrics: dict[str, Any]) -> None:
        """Records `metrics` (name -> number) for `step` and prints the console line."""
        compiled = compile_seconds()
        metrics = {k: float(v) for k, v in metrics.items()}
        metrics["time_compile"] = compiled - self._compile_at_last_write
        self._compile_at_last_write = compiled
        if not parallel.is_main():
            return
        line = json.dumps({"step": step, "time": time.time(), **metrics}) + "\n"
        for name, value in metrics.items():
            if math.isfinite(value):
                self._tb.add_scalar(f"{self.prefix}{name}", value, step)
        print(self._console_line(step, metrics), file=self.stream, flush=True)
        if not self.whole_file:
            self._append(step, line)
            self._tb.flush()
            return
        self._lines.append(line)
        if time.time() - self._flushed_at >= self.FLUSH_SECONDS:
            self.flush()

    def _append(self, step, line):
        """Appends `line` to metrics.jsonl; a failed write (a full disk) closes the file
        and raises OSError naming it and the fix (the torn row it may leave is dropped by
        the re-run, `kept_lines`)."""
        if self._deleted():   # else every row from here on goes to a file no one can read
            print(f"{self._path} was deleted while the run wrote it; the rows from step {step} "
                  "on go to a new one (the rows before are gone with the old file)", flush=True)
            self._appending.close()
            self._appending = self._path.open("a", encoding="utf-8")
        try:
            self._appending.write(line)
            self._appending.flush()
        except OSError as error:
            appending, self._appending = self._appending, None
            try:   # close() flushes what is buffered again, and fails again: nothing to keep
                appending.close()
            except OSError:
                pass
            raise OSError(
                error.errno, f"appending the metrics row of step {step} to {self._path} "
                f"failed: {error.strerror or error}. The rows before it are kept (a torn "
                "last row is dropped on resume) and so are the checkpoints saved before it. "
                "Free some space (or make the directory writable, or use another --workdir) "
                "and re-run the same command: it resumes from the last checkpoint") from error

    def _deleted(self):
        """Whether the metrics.jsonl being appended to was deleted (no name links to it)."""
        try:
            return os.fstat(self._appending.fileno()).st_nlink == 0
        except (AttributeError, OSError, ValueError):   # a file object without a descriptor
            return False

    def flush(self) -> None:
        """Writes every row so far to metrics.jsonl and TensorBoard's event file (on a
        local disk they are there already)."""
        if not parallel.is_main() or not self.whole_file:
            return
        paths.write_whole(self._path, "".join(self._lines))
        self._tb.flush()
        self._flushed_at = time.time()

    def _console_line(self, step, metrics):
        elapsed = time.time() - self._start
        compiling = compile_seconds() - self._compile_at_start
        per_step = max(elapsed - compiling, 0.0) / max(step - self.start_step, 1)
        shown = " ".join(label + " " + fmt.format(metrics[name])
                         for name, label, fmt in CONSOLE if name in metrics)
        if self.total_seconds:
            progress = f"step {step:>5d} {progress_bar(elapsed, self.total_seconds)}"
            eta = max(self.total_seconds - elapsed, 0.0)
        else:
            progress = f"step {step:>5d}/{self.total_steps} {progress_bar(step, self.total_steps)}"
            eta = per_step * (self.total_steps - step)
        return (f"{self.prefix}{progress} {shown} | {per_step:.2f}s/step eta {eta / 60:.1f}m"
                f" | compile {compiling:.0f}s")

    def close(self) -> None:
        """Flushes (`flush`) and closes the TensorBoard writer."""
        if parallel.is_main():
            self.flush()
            if self._appending is not None:
                self._appending.close()
            self._tb.close()
