"""Tiny end-to-end settings for the trainer tests: a few rows, a few tokens, shared data."""

import pathlib

from grpo_jax import config_lib

REPO = pathlib.Path(__file__).resolve().parents[2]


def tiny_config(recipe, data_dir, **overrides):
    """`configs/<recipe>.py:runlocal=True`, shrunk further so a step takes seconds."""
    config = config_lib.load_config(f"{REPO / 'configs' / recipe}.py:runlocal=True")
    config.task.data_dir = data_dir
    config.task.knobs.num_train = 512
    config.task.knobs.num_test = 16
    config.rollout.prompts_per_batch = 4
    config.objective.group_size = 4
    config.rollout.max_new_tokens = 12
    config.train.steps = 2
    config.train.eval_every = 2
    config.train.checkpoint_every = 1
    config.train.export = False
    config.eval.num_prompts = 4
    config.eval.samples = 2
    config.sft.steps = 4
    config.sft.batch_size = 8
    config.sft.eval_every = 4
    config.sft.log_every = 1
    return config_lib.apply_overrides(config, overrides)
