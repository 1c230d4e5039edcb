"""Runs a recipe's sweep on this machine: every `get_sweep()` entry with every seed, one
workdir each, a few runs at a time, each on its own share of the cores.

    python -m grpo_jax.sweep --config configs/ablations/clip_higher.py \\
        --workdir_root runs/clip_higher --seeds 0,1,2 --parallel 2 [--dry_run]

A run is the trainer's command, ``python -m grpo_jax.main --config=SPEC
--workdir=ROOT/ENTRY/seed-S --config.<field>=<value> ... --config.seed=S``, where ENTRY
names the entry by its index and its fields' values (``00_eps_high-0.2``). Beside the
trainer's files, a run's workdir holds ``train.log`` (its output, appended on every
start) and ``sweep_run.json`` (the entry, the seed, the command, the full config and the
commits it ran at), which `grpo_jax.report` reads.

- **Finished** means the workdir holds the complete checkpoint of the config's last step
  (``train.steps``, or ``sft.steps`` in mode "sft") and metrics.jsonl ends with that
  step's row. Finished runs are skipped. Any other run is started with its command, and
  the trainer resumes it from its newest checkpoint (step 0 when there is none).
- **Cores**: ``--parallel N`` splits the cores this process may use (its CPU affinity)
  into N equal shares. A run gets one share as its affinity, so the trainer makes one XLA
  device per core of it (`parallel.use_cpu_cores`) and XLA's thread pools size to it;
  OMP, OpenBLAS and MKL get the share's size as their thread counts.
- **Shared inputs**: runs can share a dataset and an SFT warm start
  (`training.warm_start`); the first run that needs one builds it. A run whose dataset or
  warm start is not built yet starts only while no other such run is running, so no two
  runs build into one directory at once; runs whose inputs exist use the other shares.
- **Stopping**: SIGINT or SIGTERM to the sweep sends SIGTERM to every run, which saves
  its step and exits (status 75); running the command again resumes them. A run that
  fails does not stop the others: the sweep ends with status 1, naming it and its log.

On Cloud TPU, ``tpu_scripts/sweep.sh`` runs a recipe's entries on pods, one run per pod
at a time, through ``tpu_scripts/run.sh``; its ``sweep_runs.py`` takes the entries'
names and flags from this module, so an entry's workdir and flags are the same on both.
It runs the config's seed (add ``--config.seed=S`` to EXTRA_ARGS and a WORKDIR per seed
for more). This launcher is for one machine's CPUs.
"""

import argparse
import dataclasses
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any

from grpo_jax import _extras

_extras.require("grpo_jax.sweep")   # before the imports it guards

import ml_collections
from absl import logging as absl_logging

from grpo_jax import config_lib, paths, run_files
from grpo_jax.run_files import LOG, RUN_RECORD   # a run's files, named where they are owned
STOPPED = 75   # the trainer's exit status after a SIGTERM (training.preemption.EXIT_STATUS)


# --- entries and runs -------------------------------------------------------------------

def flag_value(value):
    """How a config flag spells `value`: strings as they are, the rest as Python literals."""
    return value if isinstance(value, str) else repr(value)


def entry_name(index, overrides):
    """``00_eps_high-0.2_mode-token-mean``: the entry's index, then each leaf field and value."""
    parts = [f"{index:02d}"] + [f"{dotted.rsplit('.', 1)[-1]}-{flag_value(value)}"
                                for dotted, value in overrides.items()]
    return re.sub(r"[^A-Za-z0-9._-]+", "-", "_".join(parts))


def override_args(overrides):
    """``{"a.b": 0.2}`` -> ``["--config.a.b=0.2"]``: the trainer's flags for the entry."""
    return [f"--config.{dotted}={flag_value(value)}" for dotted, value in overrides.items()]


def sweep_entries(spec):
    """`[(name, overrides)]` for each entry of the `get_sweep()` of the recipe in `spec`.

    Each entry is applied to a fresh config first, so a field that does not exist fails
    here, before any run starts.
    """
    path = spec.partition(":")[0]
    module = config_lib.load_module(path)
    if not hasattr(module, "get_sweep"):
        raise ValueError(f"{path} defines no get_sweep(); sweep a recipe that has one "
                         f"(or run it alone with python -m grpo_jax.main)")
    entries = []
    for index, overrides in enumerate(module.get_sweep()):
        config_lib.apply_overrides(config_lib.load_config(spec), overrides)
        entries.append((entry_name(index, overrides), dict(overrides)))
    return entries


@dataclasses.dataclass(frozen=True, eq=False)
class Run:
    """One entry with one seed: its workdir, the trainer's command, the config it builds."""

    spec: str
    entry: int
    entry_name: str
    overrides: dict[str, Any]
    seed: int
    workdir: str
    command: tuple[str, ...]
    config: ml_collections.ConfigDict

    @property
    def name(self):
        return f"{self.entry_name}/seed-{self.seed}"


def final_step(config):
    """The step whose checkpoint ends a run of `config` (in mode "rl",
    `config_lib.last_rl_step`: value pre-training, then the RL steps)."""
    if config.mode == "rl":
        return config_lib.last_rl_step(config)
    if config.mode == "sft":
        return config.sft.steps
    raise ValueError(f"a sweep runs configs of mode 'rl' or 'sft', whose runs end at a "
                     f"checkpoint of their last step; this one has mode {config.mode!r}")


def expand(spec, workdir_root, *, seeds=None, python=sys.executable):
    """Every entry of the sweep in `spec` with every seed (default: the config's), in
    entry order, seeds inner; workdirs under `workdir_root` (made absolute)."""
    root = paths.resolve(workdir_root)
    paths.check_reachable(root, "--workdir_root")
    seeds = [config_lib.load_config(spec).seed] if seeds is None else list(seeds)
    if len(set(seeds)) != len(seeds):
        raise ValueError(f"--seeds repeats a seed: {seeds}")
    runs = []
    for index, (name, overrides) in enumerate(sweep_entries(spec)):
        if "seed" in overrides:
            raise ValueError(f"sweep entry {index} of {spec} sets 'seed'; give seeds with --seeds")
        for seed in seeds:
            config = config_lib.apply_overrides(config_lib.load_config(spec),
                                                {**overrides, "seed": seed})
            final_step(config)
            workdir = paths.join(root, name, f"seed-{seed}")
            command = (python, "-m", "grpo_jax.main", f"--config={spec}", f"--workdir={workdir}",
                       *override_args(overrides), f"--config.seed={seed}")
            runs.append(Run(spec, index, name, overrides, seed, workdir, command, config))
    return runs


# --- where a run stands -----------------------------------------------------------------

def checkpointed_steps(workdir):
    from grpo_jax.training import checkpoint   # imports orbax: only when runs are looked at
    return checkpoint.complete_steps(paths.join(workdir, run_files.CHECKPOINTS))


def is_finished(run):
    """The last step's checkpoint is complete and metrics.jsonl ends with its row."""
    last = final_step(run.config)
    return (last in checkpointed_steps(run.workdir)
            and run_files.last_logged_step(run.workdir) == last)


def describe_state(run):
    """"finished", "resumes from step N" or "new"."""
    if is_finished(run):
        return "finished"
    steps = checkpointed_steps(run.workdir)
    return f"resumes from step {steps[-1]}" if steps else "new"


def missing_inputs(config):
    """What a run of `config` would build in a shared directory before it trains: its
    dataset, its SFT warm start ([] when both exist)."""
    from grpo_jax.training import task, warm_start   # imports tfds and jax
    # As the trainer does first: the warm start's key covers the resolved paths.
    config = config_lib.resolve_paths(config)
    missing = []
    if not task.is_prepared(config.task):
        missing.append(f"the {config.task.name} dataset in {config.task.data_dir}")
    if warm_start.needed(config) and not warm_start.is_built(config):
        missing.append(f"the warm start {warm_start.warm_start_dir(config)}")
    return missing


def check_workdirs_belong(runs):
    """Raises ValueError when a run's workdir holds a run of another sweep config."""
    for run in runs:
        record = read_record(run.workdir)
        if record and record["sweep_config"] != run.spec:
            raise ValueError(f"{run.workdir} holds a run of the sweep of "
                             f"{record['sweep_config']!r}, not {run.spec!r}; use another "
                             "--workdir_root")


def read_record(workdir):
    """The run's ``sweep_run.json`` as a dict, or None."""
    text = paths.read_text_or_none(paths.join(workdir, RUN_RECORD))
    return None if text is None else json.loads(text)


def write_record(run, *, commit, machine):
    """Writes ``sweep_run.json``, adding this start's commit and machine to the earlier ones."""
    previous = read_record(run.workdir) or {}
    record = {"sweep_config": run.spec, "entry": run.entry, "entry_name": run.entry_name,
              "overrides": run.overrides, "seed": run.seed, "command": list(run.command),
              "starts": previous.get("starts", []) + [{"commit": commit, "machine": machine}],
              "config": json.loads(run.config.to_json_best_effort(sort_keys=True))}
    paths.write_whole(paths.join(run.workdir, RUN_RECORD),
                      json.dumps(record, indent=1, sort_keys=True, default=repr) + "\n")


def source_commit():
    """``git describe --always --dirty`` of this checkout, or "unknown"."""
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        out = subprocess.run(["git", "-C", repo, "describe", "--always", "--dirty"],
                             capture_output=True, text=True, timeout=30, check=False)
    except OSError:
        return "unknown"
    return out.stdout.strip() or "unknown"


def machine_description(cores_per_run):
    """``"Intel(R) Xeon(R) ..., 2 cores, 1 per run"``: what a run's numbers were measured on."""
    model = "unknown CPU"
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            model = next((line.split(":", 1)[1].strip() for line in f
                          if line.startswith("model name")), model)
    except OSError:
        pass
    return f"{model}, {os.cpu_count()} cores, {cores_per_run} per run"


# --- cores ------------------------------------------------------------------------------

def core_shares(parallel, cores=None):
    """`parallel` equal, disjoint lists of this process's cores (leftovers unused)."""
    cores = sorted(os.sched_getaffinity(0) if cores is None else cores)
    if not 1 <= parallel <= len(cores):
        raise ValueError(f"--parallel must be between 1 and the {len(cores)} cores this process "
                         f"may use, got {parallel}")
    size = len(cores) // parallel
    return [cores[i * size:(i + 1) * size] for i in range(parallel)]


def run_environment(cores, base=None):
    """The environment of a run on `cores`: thread pools sized to them."""
    threads = str(len(cores))
    env = dict(os.environ if base is None else base)
    env.update(OMP_NUM_THREADS=threads, OPENBLAS_NUM_THREADS=threads, MKL_NUM_THREADS=threads,
               PYTHONUNBUFFERED="1")
    return env


def cores_text(cores):
    return ",".join(map(str, cores))


# --- running ----------------------------------------------------------------------------

@dataclasses.dataclass(eq=False)
class _Started:
    run: Run
    cores: list[int]
    process: subprocess.Popen
    began: float
    building: bool   # started before its dataset or warm start existed
    log: str   # the local file its output goes to (`local_log`)
    terms_sent: int = 0   # SIGTERMs forwarded to it

    def still_building(self):
        """Started to build inputs and has not written metrics yet: what it builds may be
        half written. (The trainer writes its first metrics after the dataset and the
        warm start are built and loaded.)"""
        metrics = paths.path(self.run.workdir) / run_files.METRICS
        return self.building and not (metrics.exists()
                                      and metrics.stat().mtime >= int(self.began))


def local_log(workdir):
    """The local file a run's output goes to while it runs: ``workdir/train.log`` itself,
    or, for a workdir in a bucket (where a file cannot grow), a new temporary file that
    `keep_log` adds to the bucket's train.log when the run ends."""
    if not paths.is_url(workdir):
        paths.path(workdir).mkdir(parents=True, exist_ok=True)
        return paths.join(workdir, LOG)
    handle, name = tempfile.mkstemp(prefix="grpo_jax-sweep-", suffix=f"-{LOG}")
    os.close(handle)
    return name


def keep_log(workdir, log):
    """Appends the output in `log` (`local_log`) to the train.log of a workdir in a bucket
    (rewriting it whole) and deletes `log`; a local workdir's log is already in place."""
    if log == paths.join(workdir, LOG):
        return
    earlier = paths.read_text_or_none(paths.join(workdir, LOG)) or ""
    paths.write_whole(paths.join(workdir, LOG), earlier + _text(log))
    paths.path(log).unlink()


class Launcher:
    """Runs a list of runs, ``len(shares)`` at a time, each pinned to a free share."""

    def __init__(self, shares, *, stream=sys.stdout, poll_seconds=1.0):
        self.shares = shares
        self.stream = stream
        self.poll_seconds = poll_seconds
        self.commit = source_commit()
        self.machine = machine_description(len(shares[0]))
        self._stops = 0
        self._signal_names, self._announced = [], []
        self._running = []
        self._ready = set()   # names of runs whose shared inputs were found built

    def say(self, text):
        print(text, file=self.stream, flush=True)

    def run(self, runs):
        """Runs `runs` (none finished) to the end; returns ``(failed, stopped)`` run names."""
        pending, failed, stopped, done = list(runs), [], [], 0
        previous = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            while pending or self._running:
                while pending and not self._stops and len(self._running) < len(self.shares):
                    run = self._next_startable(pending)
                    if run is None:
                        break
                    pending.remove(run)
                    self._start(run, done, len(runs))
                self._forward_stops()
                time.sleep(self.poll_seconds)
                for started in [s for s in self._running if s.process.poll() is not None]:
                    self._running.remove(started)
                    done += 1
                    outcome = self._finish(started, done, len(runs))
                    if outcome == "failed":
                        failed.append(started.run.name)
                    elif outcome == "stopped":
                        stopped.append(started.run.name)
                if self._stops and not self._running:
                    stopped += [run.name for run in pending]
                    pending = []
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)
        return failed, stopped

    def _on_signal(self, signum, frame):
        # Only counted here: the loop forwards it, so a run being started as it arrives
        # gets it too.
        self._stops += 1
        self._signal_names.append(signal.Signals(signum).name)

    def _forward_stops(self):
        """One SIGTERM to each running run per signal the sweep received."""
        for name in self._signal_names[len(self._announced):]:
            self._announced.append(name)
            self.say(f"[sweep] {name}: stopping; SIGTERM to {len(self._running)} run(s), each "
                     "saves its step (a second signal: they exit at once)")
        for started in self._running:
            while started.terms_sent < self._stops and started.process.poll() is None:
                started.process.send_signal(signal.SIGTERM)
                started.terms_sent += 1

    def _next_startable(self, pending):
        """The first pending run whose shared inputs exist; else, while no run is building
        inputs, the first pending run (which builds them); else None."""
        building = any(s.still_building() for s in self._running)
        for run in pending:
            if run.name in self._ready or (not building and not missing_inputs(run.config)):
                self._ready.add(run.name)
                return run
        return None if building else pending[0]

    def _start(self, run, done, total):
        busy = [s.cores for s in self._running]
        cores = next(share for share in self.shares if share not in busy)
        building = run.name not in self._ready
        state = describe_state(run)
        write_record(run, commit=self.commit, machine=self.machine)
        log_path = local_log(run.workdir)
        with paths.path(log_path).open("a", encoding="utf-8") as log:
            log.write(f"=== grpo_jax.sweep: {shlex.join(run.command)} on cores "
                      f"{cores_text(cores)} ({state}) ===\n")
            log.flush()
            process = subprocess.Popen(run.command, stdout=log, stderr=subprocess.STDOUT,
                                       env=run_environment(cores), start_new_session=True,
                                       preexec_fn=lambda: os.sched_setaffinity(0, cores))
        self._running.append(_Started(run, cores, process, time.time(), building, log_path))
        also = "; builds " + " and ".join(missing_inputs(run.config)) if building else ""
        kept = (f", added to {paths.join(run.workdir, LOG)} when the run ends"
                if paths.is_url(run.workdir) else "")
        self.say(f"[sweep {done}/{total}] start {run.name} ({state}) on cores "
                 f"{cores_text(cores)}{also}; log {log_path}{kept}")

    def _finish(self, started, done, total):
        """Reports a run that exited; returns "finished", "stopped" or "failed"."""
        run, status = started.run, started.process.returncode
        minutes = (time.time() - started.began) / 60
        tail = _tail(started.log)
        keep_log(run.workdir, started.log)
        log_path = paths.join(run.workdir, LOG)
        if status == 0 and is_finished(run):
            self.say(f"[sweep {done}/{total}] finished {run.name} in {minutes:.1f} min")
            return "finished"
        if status == STOPPED or (self._stops and status in (-signal.SIGTERM, 128 + signal.SIGTERM)):
            self.say(f"[sweep {done}/{total}] stopped {run.name} after {minutes:.1f} min "
                     f"(resumable); log {log_path}")
            return "stopped"
        why = (f"exit status {status}" if status else
               f"exited 0 but has no complete checkpoint of step {final_step(run.config)}")
        self.say(f"[sweep {done}/{total}] FAILED {run.name} ({why}) after {minutes:.1f} min; "
                 f"log {log_path}:\n" + "".join(f"    {line}" for line in tail))
        return "failed"


def _text(path):
    """A log's text (its undecodable bytes replaced)."""
    return paths.path(path).read_bytes().decode("utf-8", errors="replace")


def _tail(path, lines=8):
    return _text(path).splitlines(True)[-lines:]


# --- command line -----------------------------------------------------------------------

def parse_seeds(text):
    try:
        return [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--seeds takes integers separated by commas, "
                                         f"e.g. 0,1,2; got {text!r}") from None


def parse_args(argv):
    parser = argparse.ArgumentParser(prog="python -m grpo_jax.sweep", description=(
        "Runs every get_sweep() entry of a recipe with every seed, one workdir each."))
    parser.add_argument("--config", required=True,
                        help="the recipe, path/to/config.py[:args], with a get_sweep()")
    parser.add_argument("--workdir_root", required=True,
                        help="runs go to WORKDIR_ROOT/ENTRY/seed-S")
    parser.add_argument("--seeds", type=parse_seeds, default=None,
                        help="seeds to run each entry with, e.g. 0,1,2 (default: the config's)")
    parser.add_argument("--parallel", type=int, default=1,
                        help="runs at a time, each on an equal share of the cores (default 1)")
    parser.add_argument("--dry_run", action="store_true",
                        help="print the runs, their state and their commands; run nothing")
    return parser.parse_args(argv)


def print_plan(runs, shares, states, stream):
    to_run = sum(state != "finished" for state in states)
    entries = len({run.entry for run in runs})
    seeds = len({run.seed for run in runs})
    print(f"[sweep] {runs[0].spec}: {entries} entries x {seeds} seed(s) = {len(runs)} runs, "
          f"{len(runs) - to_run} finished, {to_run} to run, {len(shares)} at a time "
          f"(cores {' | '.join(map(cores_text, shares))}; each run pinned to its share with "
          f"OMP_NUM_THREADS={len(shares[0])})", file=stream)
    for run, state in zip(runs, states):
        print(f"  {run.name}: {state}\n    {shlex.join(run.command)}", file=stream)
    stream.flush()


def main(argv=None, stream=sys.stdout):
    """Returns the exit status: 0 when every run is finished."""
    args = parse_args(sys.argv[1:] if argv is None else argv)
    absl_logging.set_verbosity(absl_logging.ERROR)   # tfds logs every dataset it looks at
    try:
        runs = expand(args.config, args.workdir_root, seeds=args.seeds)
        shares = core_shares(args.parallel)
        check_workdirs_belong(runs)
    except (FileNotFoundError, ImportError, KeyError, ValueError) as error:
        print(f"grpo_jax.sweep: {error}", file=sys.stderr)
        return 2
    states = [describe_state(run) for run in runs]
    print_plan(runs, shares, states, stream)
    if args.dry_run:
        return 0
    todo = [run for run, state in zip(runs, states) if state != "finished"]
    failed, stopped = Launcher(shares, stream=stream).run(todo)
    finished = len(runs) - len(failed) - len(stopped)
    print(f"[sweep] {finished} of {len(runs)} runs finished", file=stream, end="")
    if failed or stopped:
        print(f"; failed: {', '.join(failed) or 'none'}; stopped: {', '.join(stopped) or 'none'}. "
              "Running the same command again resumes them.", file=stream)
        return 1
    print(file=stream, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
