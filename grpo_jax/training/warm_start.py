"""A supervised warm start, built once and cached, for RL runs that start from a named shape.

RL from a randomly initialised model learns nothing: every answer is wrong, every group
has equal rewards, and every advantage and gradient is 0. A run with
``model.sft_warm_start = True`` (the ``runlocal`` setting of every recipe) first trains
the named model with the config's ``sft`` section on the task's reference solutions, and
starts RL from that checkpoint. The SFT run lives in
``task.data_dir/warm_starts/<model>-<hash>``, the hash covering everything the warm start
depends on (task, model, sft section, seed, completion budget), so every run with the same
settings reuses it, and an interrupted build resumes.
"""

import contextlib
import hashlib
import json
import os
from typing import Any

import jax

from grpo_jax import config_lib, parallel, paths, run_files

# The config sections and fields the warm-start checkpoint depends on.
_DEPENDS_ON = ("task", "model.name", "model.dtype", "model.param_dtype", "sft", "seed",
               "rollout.max_new_tokens", "mesh")


def _key(config):
    resolved = config.copy_and_resolve_references()
    parts = {}
    for dotted in _DEPENDS_ON:
        value = resolved
        for name in dotted.split("."):
            value = value[name]
        parts[dotted] = value.to_dict() if hasattr(value, "to_dict") else value
    text = json.dumps(parts, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def warm_start_dir(config: Any) -> str:
    """Where the warm start of `config` is (or will be) built."""
    return os.path.join(config.task.data_dir, "warm_starts",
                        f"{config.model.name}-{_key(config)}")


def needed(config: Any) -> bool:
    """Whether a run of `config` starts from a warm start (built or not)."""
    return bool(config.model.sft_warm_start) and not config.model.path


def is_built(config: Any) -> bool:
    """Whether the warm start of `config` is built (its export is in `warm_start_dir`)."""
    return os.path.exists(os.path.join(warm_start_dir(config), run_files.EXPORT, "config.json"))


def prepared(config: Any) -> Any:
    """The config a run of `config` trains: with ``model.sft_warm_start`` and no
    ``model.path``, a new one whose ``model.path`` is the warm start's export (built
    first unless it is cached); otherwise `config` itself. `config` is left as is."""
    if not needed(config):
        return config
    from grpo_jax.training import sft   # sft imports the trainer's modules; import late
    directory = warm_start_dir(config)
    export = os.path.join(directory, run_files.EXPORT)
    # Runs on one machine sharing the data dir (a sweep, test workers) build it once: the
    # others wait for the lock, then find it built. Several processes of one run build it
    # together (barriers inside), without the lock.
    alone = jax.process_count() == 1
    with paths.exclusive(directory + ".lock") if alone else contextlib.nullcontext():
        if not is_built(config):
            if parallel.is_main():
                print(f"building the SFT warm start ({config.sft.steps} steps) in {directory}",
                      flush=True)
            # the warm start trains every weight: it is the base a LoRA run adapts; the RL
            # run measures eval.suite, its warm start the held-out split alone
            sft.train(config_lib.replaced(config, {
                "mode": "sft", "model.sft_warm_start": False, "model.lora.rank": 0,
                "model.lora.dropout": 0.0, "model.lora.quantize": "", "eval.suite": ""}),
                directory)
        elif parallel.is_main():
            print(f"starting from the cached SFT warm start {export}", flush=True)
    return config_lib.replaced(config, {"model.path": export, "model.name": ""})
