"""End-to-end settings for the trainer tests: each recipe's runlocal regime on a smaller task.

Every RL test starts from a supervised warm start (200 steps on 2-digit addition with a
scratchpad, built once per data_dir and cached) that answers right some of the time: its
groups have signal, so the losses, gradients and clip activity are real.
"""

import pathlib

from grpo_jax import config_lib

REPO = pathlib.Path(__file__).resolve().parents[2]


def runlocal_config(recipe, data_dir, **overrides):
    """`configs/<recipe>.py:runlocal=True` as it is (prompts, G, updates per rollout batch,
    learning rate), on 2-digit addition with a 34-token budget and a shorter warm start."""
    config = config_lib.load_config(f"{REPO / 'configs' / recipe}.py:runlocal=True")
    config.task.data_dir = data_dir
    if config.task.name == "arithmetic":
        config.task.knobs.digits = 2
        config.task.knobs.num_train = 512
        config.task.knobs.num_test = 16
        # A 2-digit scratchpad is at most 27 tokens with its stop token (DAPO's soft
        # overlong zone, the last fifth, starts at 27.2); a self-verification verdict adds ~25.
        config.rollout.max_new_tokens = 56 if config.task.knobs.get("verdicts") else 34
    else:   # rpt on the builtin corpus: fewer positions per document
        config.task.knobs.stride = 31
    config.train.steps = 2
    config.train.eval_every = 2
    config.train.checkpoint_every = 1
    config.train.export = False
    config.eval.num_prompts = 4
    config.eval.samples = 2
    config.sft.steps = 200
    config.sft.batch_size = 32
    config.sft.optimizer.learning_rate = 2e-3
    config.sft.eval_every = 200
    config.sft.log_every = 50
    return config_lib.apply_overrides(config, overrides)


def tiny_config(recipe, data_dir, **overrides):
    """`runlocal_config` with 4 prompts x 4 answers and 2 updates per batch: a step in seconds."""
    small = {"rollout.prompts_per_batch": 4, "objective.group_size": 4, "train.minibatches": 2,
             "train.epochs": 1}
    return runlocal_config(recipe, data_dir, **{**small, **overrides})
