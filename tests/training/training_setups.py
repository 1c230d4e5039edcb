"""Tiny end-to-end settings for the trainer tests: a few rows, a few tokens, shared data."""

import pathlib

from grpo_jax import config_lib

REPO = pathlib.Path(__file__).resolve().parents[2]


def tiny_config(recipe, data_dir, **overrides):
    """`configs/<recipe>.py:runlocal=True`, shrunk further so a step takes seconds.

    The task is 2-digit addition with a scratchpad, and the RL policy starts from a
    supervised warm start (200 steps, built once per data_dir and cached) that answers
    right some of the time: its groups have signal, so the losses and gradients are real.
    """
    config = config_lib.load_config(f"{REPO / 'configs' / recipe}.py:runlocal=True")
    config.task.data_dir = data_dir
    config.task.knobs.digits = 2
    config.task.knobs.num_train = 512
    config.task.knobs.num_test = 16
    config.rollout.prompts_per_batch = 4
    config.objective.group_size = 4
    config.rollout.max_new_tokens = 28
    config.train.minibatches = 2
    config.train.epochs = 1
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
