"""Metrics every step: JSONL and TensorBoard in the workdir, one concise console line.

TensorBoard files are written by tensorboardX (no TensorFlow). Only process 0 writes.
"""

import json
import math
import os
import sys
import time

import jax

# The console line: (metric, label, format). Everything else goes to the files only.
CONSOLE = (
    ("reward_mean", "reward", "{:.3f}"),
    ("accuracy", "acc", "{:.3f}"),
    ("response_length_mean", "len", "{:.1f}"),
    ("entropy", "ent", "{:.3f}"),
    ("clip_high", "clip+", "{:.3f}"),
    ("approx_kl", "kl", "{:.4f}"),
    ("groups_without_signal", "nosig", "{:.2f}"),
    ("gen_batches", "draws", "{:.0f}"),
    ("loss", "loss", "{:.4f}"),
    ("eval_accuracy", "EVAL", "{:.3f}"),
)


def progress_bar(done, total, width=20):
    filled = min(int(width * done / max(total, 1)), width)
    return "[" + "#" * filled + "." * (width - filled) + "]"


class MetricWriter:
    """Writes scalar metrics to ``workdir/metrics.jsonl``, TensorBoard and the console."""

    def __init__(self, workdir, *, total_steps, total_seconds=None, prefix="", stream=sys.stdout):
        self.total_steps = total_steps
        self.total_seconds = total_seconds   # a run bounded by wall time shows time progress
        self.prefix = prefix
        self.stream = stream
        self.is_main = jax.process_index() == 0
        self._start = time.time()
        self._first_step = None
        self._jsonl = self._tb = None
        if self.is_main:
            os.makedirs(workdir, exist_ok=True)
            self._jsonl = open(os.path.join(workdir, "metrics.jsonl"), "a", encoding="utf-8")
            import tensorboardX   # imported lazily: only the writing process needs it
            self._tb = tensorboardX.SummaryWriter(os.path.join(workdir, "tensorboard"))

    def write(self, step, metrics):
        """Records `metrics` (name -> number) for `step` and prints the console line."""
        metrics = {k: float(v) for k, v in metrics.items()}
        if not self.is_main:
            return
        self._jsonl.write(json.dumps({"step": step, "time": time.time(), **metrics}) + "\n")
        self._jsonl.flush()
        for name, value in metrics.items():
            if math.isfinite(value):
                self._tb.add_scalar(f"{self.prefix}{name}", value, step)
        self._tb.flush()
        print(self._console_line(step, metrics), file=self.stream, flush=True)

    def _console_line(self, step, metrics):
        if self._first_step is None:   # a resumed run counts from where it resumed
            self._first_step = step - 1
        elapsed = time.time() - self._start
        per_step = elapsed / max(step - self._first_step, 1)
        shown = " ".join(label + " " + fmt.format(metrics[name])
                         for name, label, fmt in CONSOLE if name in metrics)
        if self.total_seconds:
            progress = f"step {step:>5d} {progress_bar(elapsed, self.total_seconds)}"
            eta = max(self.total_seconds - elapsed, 0.0)
        else:
            progress = f"step {step:>5d}/{self.total_steps} {progress_bar(step, self.total_steps)}"
            eta = per_step * (self.total_steps - step)
        return f"{self.prefix}{progress} {shown} | {per_step:.2f}s/step eta {eta / 60:.1f}m"

    def close(self):
        if self.is_main:
            self._jsonl.close()
            self._tb.close()
