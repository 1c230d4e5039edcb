"""What the paper-scale configs in this folder share: a recipe at a paper's model and data.

Each config here is one claim of a paper at its scale: `get_config(arg)` is the recipe
(configs/<recipe>.py) with the paper's model, training set, prompt template, number of
steps and evaluation suite, sized for a TPU slice (bf16 weights and compute, scanned
layers, full remat, splash attention, FSDP rules); `get_sweep()` where the claim is a
comparison. Arguments after the colon:

* ``path=DIR``: the HF checkpoint (local or ``gs://``); the default is a placeholder
  (``gs://YOUR-BUCKET/...``) that the trainer refuses, naming ``model.path``;
* ``data=DIR``: ``task.manual_dir``, the training set's release file (the builder's
  error names the file and where it is published);
* ``suite_dir=DIR``: ``eval.suite_dir``, one folder per benchmark of the suite;
* ``runlocal=True``: the recipe's runlocal setting (the tiny model on bundled 3-digit
  addition) with the paper's objective, for 2 steps: a smoke run on a CPU.

``model.name`` names the architecture (grpo_jax/models/named.py, the checkpoint's
config.json shape): the trainer reads ``model.path``, and ``python -m grpo_jax.aot
--plan_cost`` compiles the named shape, so the cost is known before the checkpoint is.

Training's evaluation every ``train.eval_every`` steps also measures the suite (so a run
needs ``suite_dir=DIR``); evaluate a trained run (its export) on the suite with
``--config.mode=eval --config.model.path=WORKDIR/export``.
"""

import pathlib

from grpo_jax import config_lib

CONFIGS = pathlib.Path(__file__).resolve().parents[1]
PLACEHOLDER = "gs://YOUR-BUCKET/checkpoints/"   # + the hub name: the user's own copy
RUNLOCAL_STEPS = 2


def parse(arg):
    """The arguments every paper config takes (module docstring)."""
    return config_lib.parse_arg(arg, runlocal=False, path="", data="", suite_dir="")


def recipe(name, arg):
    """``configs/<name>.py`` at its paper regime, or its runlocal setting."""
    module = config_lib.load_module(CONFIGS / f"{name}.py")
    return module.get_config(f"runlocal={arg.runlocal}")


def at_scale(config, arg, *, model, hub_name, task, template, steps, suite, samples,
             eval_split="test"):
    """`config` with a paper's model, data, template, steps and evaluation (TPU settings).

    Args:
      config: a recipe's config at its paper regime.
      arg: the parsed arguments (`parse`).
      model: the named architecture (``model.name``).
      hub_name: the checkpoint's Hugging Face name, the placeholder path's last part.
      task: the training set (``task.name``), graded by the ``math`` reward.
      template: ``task.prompt_template`` (grpo_jax/data/templates.py).
      steps: the paper's number of RL steps.
      suite: ``eval.suite`` (grpo_jax/training/suites.py), `samples` answers per problem.
      eval_split: the split of `task` that training's periodic evaluation reads (a training
        set without a test split: "train", a check of fit, not of generalisation).
    """
    config.model.name = model
    config.model.path = arg.path or PLACEHOLDER + hub_name
    config.model.dtype = config.model.param_dtype = "bfloat16"
    config.model.scan_layers = True
    config.model.remat = "full"
    config.model.attention = "splash"
    config.task.name = task
    config.task.manual_dir = arg.data
    config.task.prompt_template = template
    config.task.eval_split = eval_split
    specs = tuple(s for s in config.reward.specs if s[0] == "overlong")
    config.reward.specs = (("math", 1.0), *specs)
    config.reward.correct = "math"
    config.train.steps = steps
    config.eval.suite = suite
    config.eval.suite_dir = arg.suite_dir
    config.eval.samples = samples
    return config


def runlocal(config):
    """The runlocal setting for `RUNLOCAL_STEPS` steps, evaluated and checkpointed at the end."""
    config.train.steps = RUNLOCAL_STEPS
    config.train.eval_every = RUNLOCAL_STEPS
    config.train.checkpoint_every = RUNLOCAL_STEPS
    return config
