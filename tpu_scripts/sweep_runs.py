"""Prints the runs of a recipe's sweep, one line each: ``NAME<TAB>FLAGS``.

    python tpu_scripts/sweep_runs.py "configs/dapo.py:runlocal=True"
    00_eps_high-0.2_mode-token-mean	--config.objective.loss.eps_high=0.2 --config...

NAME names the run's workdir; FLAGS, shell-quoted, set the entry's fields on the
trainer's command line (ml_collections config flags). Both come from `grpo_jax.sweep`,
the local sweep launcher, so an entry's workdir and flags are the same on a pod and on
one machine. Each entry is first applied to a fresh config, so a sweep naming a field
that does not exist fails here, before any TPU time is spent. Run from the repository
root (config paths are relative to it).

    python tpu_scripts/sweep_runs.py CONFIG --record_into WORKDIR --entries "0 2" --machine M

writes instead, for each entry given (default all), ``WORKDIR/NAME/sweep_run.json``
(`grpo_jax.sweep.write_record`; WORKDIR may be ``gs://...``), so `grpo_jax.report` reads
the sweep's runs where the pods left them.
"""

import argparse
import dataclasses
import shlex
import sys

from grpo_jax import paths, sweep


def sweep_runs(spec):
    """`[(name, flags)]` for each entry of the `get_sweep()` of the recipe in `spec`."""
    return [(name, " ".join(map(shlex.quote, sweep.override_args(overrides))))
            for name, overrides in sweep.sweep_entries(spec)]


def record_runs(spec, root, *, entries=None, machine):
    """Writes the ``sweep_run.json`` of each entry in `entries` (indices; default all) of
    the sweep in `spec` into ``root/NAME``, the workdir `tpu_scripts/sweep.sh` gives it,
    with the trainer's command as `tpu_scripts/run.sh` runs it there; returns their workdirs."""
    runs = [run for run in sweep.expand(spec, root) if entries is None or run.entry in entries]
    written = []
    for run in runs:
        workdir = paths.join(root, run.entry_name)
        command = ("python", "-m", "grpo_jax.main", f"--config={spec}", f"--workdir={workdir}",
                   *sweep.override_args(run.overrides))
        sweep.write_record(dataclasses.replace(run, workdir=workdir, command=command),
                           commit=sweep.source_commit(), machine=machine)
        written.append(workdir)
    return written


def main(argv):
    parser = argparse.ArgumentParser(prog="tpu_scripts/sweep_runs.py")
    parser.add_argument("config", help="the recipe, path/to/config.py[:args], with a get_sweep()")
    parser.add_argument("--record_into", metavar="WORKDIR", default=None,
                        help="write each entry's sweep_run.json into WORKDIR/NAME instead")
    parser.add_argument("--entries", default=None, help='the entry indices to record ("0 2")')
    parser.add_argument("--machine", default="Cloud TPU", help="where the runs run, for the record")
    args = parser.parse_args(argv[1:])
    try:
        if args.record_into:
            entries = None if args.entries is None else {int(i) for i in args.entries.split()}
            for workdir in record_runs(args.config, args.record_into, entries=entries,
                                       machine=args.machine):
                print(f"recorded {workdir}/{sweep.RUN_RECORD}")
            return
        runs = sweep_runs(args.config)
    except (FileNotFoundError, ImportError, KeyError, ValueError) as error:
        sys.exit(f"{argv[0]}: {error}")
    for name, flags in runs:
        print(f"{name}\t{flags}")


if __name__ == "__main__":
    main(sys.argv)
