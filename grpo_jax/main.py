"""The entry point: one config file per experiment, one workdir per run.

    python -m grpo_jax.main --config configs/dapo.py:runlocal=True --workdir /tmp/dapo \\
        [--config.train.steps=50 ...]

``config.mode`` picks the loop: "rl" (default), "sft" (supervised warm start on the
task's reference solutions), "demo" (SFT warm start, then RL, then an equal-time SFT
control, ending with a before/after table) or "eval" (held-out pass@1, mean@k and pass@k
of the checkpoint in ``model.path``, written to ``workdir/eval.json``; with
``eval.suite``, avg@k, pass@k and maj@k per benchmark in ``workdir/eval_suite.json``).
Re-running a command resumes its workdir. Each mode reads its config, never writes it: it prints the
resolved config once and saves it as ``workdir/config.json``.

A SIGTERM (a preempted VM, a scheduler's stop) ends the step in progress, saves it and
exits with status 75 (`preemption.EXIT_STATUS`); re-running the command resumes from it.
A second SIGTERM exits at once. See `grpo_jax.training.preemption`.

On CPU the host is split into one XLA device per core (`parallel.use_cpu_cores`), so the
config's mesh runs on every core; XLA_FLAGS=--xla_force_host_platform_device_count=N
chooses N instead.
"""

import os
import sys

from grpo_jax import _extras

_extras.require("grpo_jax.main")   # before the imports it guards

from absl import app, flags, logging
from ml_collections import config_flags

_DEFAULT_CONFIG = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                               "configs", "demo.py")
_CONFIG = config_flags.DEFINE_config_file("config", _DEFAULT_CONFIG,
                                          "Experiment config: path/to/config.py[:args].")
_WORKDIR = flags.DEFINE_string("workdir", "workdirs/demo", "Where checkpoints, metrics and "
                               "exports go; re-running with the same workdir resumes.")

MODES = ("rl", "sft", "demo", "eval")


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments {argv[1:]}")
    logging.set_verbosity(logging.ERROR)   # orbax and tfds log every file (and config) otherwise
    config = _CONFIG.value
    if config.mode not in MODES:
        raise app.UsageError(f"config.mode must be one of {MODES}, got {config.mode!r}")
    import tensorflow_datasets as tfds
    tfds.disable_progress_bar()                 # one line per step is the progress output
    from grpo_jax import parallel
    parallel.use_cpu_cores()                    # on CPU, one device per core (see its docstring)
    from grpo_jax.training import demo, evaluation, preemption, rl, sft   # jax starts here
    workdir = _WORKDIR.value              # made absolute by each mode (grpo_jax.paths)
    try:
        {"rl": rl.train, "sft": sft.train, "demo": demo.run,
         "eval": evaluation.evaluate_to_file}[config.mode](config, workdir)
    except preemption.Stopped as stopped:   # the checkpoint is on disk: say so, exit "try again"
        if parallel.is_main():
            print(f"{stopped} (exit status {preemption.EXIT_STATUS})", flush=True)
        sys.exit(preemption.EXIT_STATUS)


if __name__ == "__main__":
    app.run(main)
