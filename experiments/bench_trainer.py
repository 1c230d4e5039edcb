"""Step time split of the RL loop and the bytes it moves between host and devices per step.

    python experiments/bench_trainer.py [--steps 6] [--checkpoint DIR] [--config configs/demo.py]
        [--override train.minibatches=1 ...]

Runs `--steps` RL steps of the config (default: the demo's DAPO stage, 64 prompts x 8
completions, the tiny model) in a scratch workdir and prints the median of each timing
over the steps after the first (which compiles), and the host<->device traffic of those
steps: bytes copied from host to device (explicit `device_put`s and numpy arrays passed to
jitted functions, as JAX's transfer guard logs them) and from device to host (every
`jax.Array` read into numpy). With `--checkpoint`, starts from that HF checkpoint (e.g.
the demo's `workdirs/demo/sft/export`, so rewards have signal). Prints the machine and
commit so the table can be quoted. Like `python -m grpo_jax.main`, it runs on one CPU
device per core.

The accounting only needs `rl.train` and `MetricWriter.write`, so the same script
measures an older checkout: `PYTHONPATH=/path/to/old/checkout python experiments/bench_trainer.py`.
"""

import argparse
import ast
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile

import jax
import numpy as np

from grpo_jax import config_lib, parallel, run_files
from grpo_jax.training import metrics as metrics_lib, rl

TIMINGS = ("time_rollout", "time_old_logp", "time_update", "rollout_tokens_per_s",
           "update_tokens_per_s", "gen_batches")
_H2D = re.compile(r"host-to-device transfer: aval=ShapedArray\((\w+)\[([\d,]*)\]")


def _cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            return next(l.split(":", 1)[1].strip() for l in f if l.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or "unknown"


class DeviceToHost:
    """Counts the bytes of every `jax.Array` (or shard) converted to numpy while on.

    Three ways out of a device are counted: `jax.Array._value` (np.asarray and float()
    of an array), `jax.device_get`, and `parallel.local_rows`. The last two are counted
    by their results, because on CPU a single-device array converts through the buffer
    protocol without `_value` (a zero-copy view here; a real copy on an accelerator).
    """

    def __init__(self):
        from jax._src import array
        self.bytes, self.on = 0, False
        original = array.ArrayImpl._value

        def counted(arr):
            if self.on and arr._npy_value is None:
                self.bytes += arr.size * arr.dtype.itemsize
            return original.fget(arr)

        array.ArrayImpl._value = property(counted)
        self._wrap(jax, "device_get")
        try:
            from grpo_jax.parallel import hosts
        except ImportError:          # an older checkout without it
            return
        for module in (hosts, sys.modules["grpo_jax.parallel"]):
            self._wrap(module, "local_rows")

    def _wrap(self, module, name):
        original = getattr(module, name)

        def counted(*args, **kwargs):
            on, self.on = self.on, False      # not counted twice through `_value`
            try:
                result = original(*args, **kwargs)
            finally:
                self.on = on
            if on:
                self.bytes += sum(np.asarray(leaf).nbytes for leaf in jax.tree.leaves(result))
            return result

        setattr(module, name, counted)


def _host_to_device_bytes(log_text):
    """Sums the transfer guard's "host-to-device transfer" lines of a run's stderr."""
    total = 0
    for dtype, dims in _H2D.findall(log_text):
        shape = [int(d) for d in dims.split(",") if d]
        total += int(np.prod(shape)) * np.dtype(dtype).itemsize
    return total


def measure(args):
    """Runs the steps; prints one JSON line with the step timings and the D2H bytes; the
    H2D lines go to stderr (the transfer guard logs there), which the parent parses."""
    parallel.use_cpu_cores()
    config = config_lib.load_config(args.config)
    config.mode = "rl"
    overrides = {"train.steps": args.steps, "train.eval_every": 10**9,
                 "train.checkpoint_every": 10**9, "train.export": False}
    for item in args.override:
        key, _, value = item.partition("=")
        try:
            overrides[key] = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            overrides[key] = value
    config_lib.apply_overrides(config, overrides)
    if args.checkpoint:
        config.model.path, config.model.name = args.checkpoint, ""
    if args.data_dir:
        config.task.data_dir = args.data_dir
    d2h = DeviceToHost()
    write = metrics_lib.MetricWriter.write

    def write_and_count(writer, step, metrics):   # steps 2..N are measured, step 1 compiles
        d2h.on = False
        jax.config.update("jax_transfer_guard_host_to_device", "allow")
        write(writer, step, metrics)
        if step < args.steps:
            d2h.on = True
            jax.config.update("jax_transfer_guard_host_to_device", "log_explicit")

    metrics_lib.MetricWriter.write = write_and_count
    with tempfile.TemporaryDirectory() as workdir:
        rl.train(config, workdir)
        rows = list(run_files.read_metrics(workdir))[1:]
    print(json.dumps({"rows": rows, "d2h": d2h.bytes, "devices": jax.device_count(),
                      "platform": jax.devices()[0].platform, "jax": jax.__version__,
                      "prompts": config.rollout.prompts_per_batch,
                      "group": config.objective.group_size,
                      "updates": config.train.epochs * config.train.minibatches,
                      "tokens": config.rollout.max_new_tokens,
                      "model": config.model.path or config.model.name}))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/demo.py")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--checkpoint", default="")
    parser.add_argument("--data_dir", default="")
    parser.add_argument("--override", action="append", default=[],
                        help="config field=value, e.g. train.minibatches=1 (repeatable)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return measure(args)

    child = subprocess.run([sys.executable, __file__, "--child", *(argv or sys.argv[1:])],
                           capture_output=True, text=True)
    if child.returncode:
        sys.exit(child.stderr[-4000:])
    result = json.loads(child.stdout.strip().splitlines()[-1])
    rows, measured = result["rows"], args.steps - 1
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True, cwd=os.path.dirname(rl.__file__)).stdout.strip()
    print(f"# bench_trainer  commit {commit}  {_cpu_name()}, {os.cpu_count()} cores, "
          f"{result['platform']} x {result['devices']}, jax {result['jax']}, "
          f"load {os.getloadavg()[0]:.1f}")
    print(f"# {args.config} {' '.join(args.override)}: {result['prompts']} prompts x "
          f"{result['group']}, {result['updates']} update(s) per batch, max {result['tokens']} "
          f"new tokens, model {result['model']}; median of steps 2..{args.steps}")
    print(f"{'quantity':28s} {'median':>12s}")
    for name in TIMINGS:
        print(f"{name:28s} {statistics.median(r[name] for r in rows):12.2f}")
    step = statistics.median(
        r["time_rollout"] + r["time_old_logp"] + r["time_update"] for r in rows
    )
    print(f"{'step (sum of the three)':28s} {step:12.2f}")
    h2d = _host_to_device_bytes(child.stderr)
    print(f"{'host->device MB per step':28s} {h2d / measured / 1e6:12.3f}")
    print(f"{'device->host MB per step':28s} {result['d2h'] / measured / 1e6:12.3f}")


if __name__ == "__main__":
    main()
