"""Prints the runs of a recipe's sweep, one line each: ``NAME<TAB>FLAGS``.

    python tpu_scripts/sweep_runs.py "configs/dapo.py:runlocal=True"
    00_eps_high-0.2_mode-token-mean	--config.objective.loss.eps_high=0.2 --config...

NAME names the run's workdir; FLAGS, shell-quoted, set the entry's fields on the
trainer's command line (ml_collections config flags). Each entry is first applied to
a fresh config, so a sweep naming a field that does not exist fails here, before any
TPU time is spent. Run from the repository root (config paths are relative to it).
"""

import re
import shlex
import sys

from grpo_jax import config_lib


def flag_value(value):
    """How a config flag spells `value`: strings as they are, the rest as Python literals."""
    return value if isinstance(value, str) else repr(value)


def run_name(index, overrides):
    """``00_eps_high-0.2_mode-token-mean``: the entry's index, then each leaf field and value."""
    parts = [f"{index:02d}"] + [f"{dotted.rsplit('.', 1)[-1]}-{flag_value(value)}"
                                for dotted, value in overrides.items()]
    return re.sub(r"[^A-Za-z0-9._-]+", "-", "_".join(parts))


def override_flags(overrides):
    """``{"a.b": 0.2}`` -> ``--config.a.b=0.2``, each flag quoted for a shell."""
    return " ".join(shlex.quote(f"--config.{dotted}={flag_value(value)}")
                    for dotted, value in overrides.items())


def sweep_runs(spec):
    """`[(name, flags)]` for each entry of the `get_sweep()` of the recipe in `spec`."""
    path = spec.partition(":")[0]
    module = config_lib.load_module(path)
    if not hasattr(module, "get_sweep"):
        raise ValueError(f"{path} defines no get_sweep(); sweep a recipe that has one "
                         f"(or use run.sh for a single run)")
    runs = []
    for index, overrides in enumerate(module.get_sweep()):
        config_lib.apply_overrides(config_lib.load_config(spec), overrides)
        runs.append((run_name(index, overrides), override_flags(overrides)))
    return runs


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
