"""Prints the runs of a recipe's sweep, one line each: ``NAME<TAB>FLAGS``.

    python tpu_scripts/sweep_runs.py "configs/dapo.py:runlocal=True"
    00_eps_high-0.2_mode-token-mean	--config.objective.loss.eps_high=0.2 --config...

NAME names the run's workdir; FLAGS, shell-quoted, set the entry's fields on the
trainer's command line (ml_collections config flags). Both come from `grpo_jax.sweep`,
the local sweep launcher, so an entry's workdir and flags are the same on a pod and on
one machine. Each entry is first applied to a fresh config, so a sweep naming a field
that does not exist fails here, before any TPU time is spent. Run from the repository
root (config paths are relative to it).
"""

import shlex
import sys

from grpo_jax import sweep


def sweep_runs(spec):
    """`[(name, flags)]` for each entry of the `get_sweep()` of the recipe in `spec`."""
    return [(name, " ".join(map(shlex.quote, sweep.override_args(overrides))))
            for name, overrides in sweep.sweep_entries(spec)]


def main(argv):
    if len(argv) != 2:
        sys.exit(f"usage: {argv[0]} CONFIG_FILE[:ARGS]")
    try:
        runs = sweep_runs(argv[1])
    except (FileNotFoundError, KeyError, ValueError) as error:
        sys.exit(f"{argv[0]}: {error}")
    for name, flags in runs:
        print(f"{name}\t{flags}")


if __name__ == "__main__":
    main(sys.argv)
