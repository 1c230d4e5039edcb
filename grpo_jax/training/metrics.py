"""Metrics every step: JSONL and TensorBoard in the workdir, one concise console line.

TensorBoard files are written by tensorboardX (no TensorFlow). Only process 0 writes.
The console line's time per step and ETA leave out the time JAX spends tracing and
compiling (counted through `jax.monitoring`), which is reported on its own: the first
steps of a run compile every program, and would otherwise inflate the ETA many times.
"""

import json
import math
import os
import sys
import time

import jax

from grpo_jax import parallel

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


def compile_seconds():
    """Seconds this process has spent tracing, lowering and compiling since it first asked."""
    if not _listening[0]:
        jax.monitoring.register_event_duration_secs_listener(_count_compile_time)
        _listening[0] = True
    return _compile_seconds[0]


WATCHED = ("loss", "policy_loss", "grad_norm", "update_norm", "kl_ref", "kl_old", "value_loss",
           "critic_grad_norm")


def stop_if_not_finite(metrics, step, checkpointer):
    """Raises FloatingPointError before a non-finite step can be saved over a good one."""
    for name in WATCHED:
        if name in metrics and not math.isfinite(metrics[name]):
            checkpointer.wait()
            raise FloatingPointError(
                f"step {step}: {name} = {metrics[name]} is not finite; stopping without saving. "
                f"The last good checkpoint is step {checkpointer.latest_step()}; lower "
                "optimizer.learning_rate or optimizer.grad_clip and re-run to resume from it.")


def progress_bar(done, total, width=20):
    filled = min(int(width * done / max(total, 1)), width)
    return "[" + "#" * filled + "." * (width - filled) + "]"


def _drop_steps_after(path, step):
    """Removes from a metrics.jsonl the rows of steps after `step`: a resumed run redoes
    them, and each step keeps one row."""
    if not os.path.exists(path):
        return
    with open(path, encoding="utf-8") as f:
        lines = f.readlines()
    kept = [line for line in lines if line.strip() and json.loads(line)["step"] <= step]
    if len(kept) != len(lines):
        with open(path, "w", encoding="utf-8") as f:
            f.writelines(kept)


class MetricWriter:
    """Writes scalar metrics to ``workdir/metrics.jsonl``, TensorBoard and the console.

    A run resumed at `start_step` first drops the rows of later steps from
    metrics.jsonl (written before an interruption, and about to be redone).
    """

    def __init__(self, workdir, *, total_steps, start_step=0, total_seconds=None, prefix="",
                 stream=sys.stdout):
        self.total_steps = total_steps
        self.start_step = start_step         # the step a resumed run starts after
        self.total_seconds = total_seconds   # a run bounded by wall time shows time progress
        self.prefix = prefix
        self.stream = stream
        self._start = time.time()
        self._compile_at_start = self._compile_at_last_write = compile_seconds()
        self._jsonl = self._tb = None
        if parallel.is_main():
            os.makedirs(workdir, exist_ok=True)
            path = os.path.join(workdir, "metrics.jsonl")
            _drop_steps_after(path, start_step)
            self._jsonl = open(path, "a", encoding="utf-8")
            import tensorboardX   # imported lazily: only the writing process needs it
            self._tb = tensorboardX.SummaryWriter(os.path.join(workdir, "tensorboard"))

    def write(self, step, metrics):
        """Records `metrics` (name -> number) for `step` and prints the console line."""
        compiled = compile_seconds()
        metrics = {k: float(v) for k, v in metrics.items()}
        metrics["time_compile"] = compiled - self._compile_at_last_write
        self._compile_at_last_write = compiled
        if not parallel.is_main():
            return
        self._jsonl.write(json.dumps({"step": step, "time": time.time(), **metrics}) + "\n")
        self._jsonl.flush()
        for name, value in metrics.items():
            if math.isfinite(value):
                self._tb.add_scalar(f"{self.prefix}{name}", value, step)
        self._tb.flush()
        print(self._console_line(step, metrics), file=self.stream, flush=True)

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

    def close(self):
        if parallel.is_main():
            self._jsonl.close()
            self._tb.close()
