"""What the ablations in this folder share: a recipe's runlocal regime, trained longer.

Each ablation is one file with `get_config(arg)` (the recipe at the tiny CPU scale),
`get_sweep()` (its variants) and `get_report()` (what the report tables and plots):

    python -m grpo_jax.sweep --config configs/ablations/NAME.py --workdir_root DIR \\
        --seeds 0,1,2 --parallel 2
    python -m grpo_jax.report DIR

`recipe` is ``configs/<name>.py:runlocal=True``: 16 prompts x min(G, 4) answers,
min(updates, 4) optimizer updates per rollout batch (off-policy from the second, as the
recipe's paper), 48 new tokens, learning rate 1e-4, the 0.66M-parameter model on 3-digit
addition, from an SFT warm start built once per seed and task and cached (so a seed's
variants start from the same policy, and the spread over seeds includes the warm
start's). It trains for `steps` steps and evaluates every tenth of them on 500 held-out
prompts (the whole test split; one evaluation's binomial standard error is then at most
0.022, below the spread over seeds; the committed results were run with 200, SE up to
0.035): greedy pass@1 (``eval_accuracy``) and mean@4 / pass@4 at temperature 1.
"""

import pathlib

from grpo_jax import config_lib

CONFIGS = pathlib.Path(__file__).resolve().parents[1]
EVALUATIONS = 10   # held-out evaluations per run


def parse(arg, steps):
    """The ablations' one argument: ``steps=N`` trains for N steps instead (e.g. a smoke run)."""
    return config_lib.parse_arg(arg, steps=steps)


def recipe(name, *, steps):
    """``configs/<name>.py:runlocal=True`` trained for `steps` steps (see the module doc)."""
    config = config_lib.load_module(CONFIGS / f"{name}.py").get_config("runlocal=True")
    config.train.steps = steps
    config.train.eval_every = max(steps // EVALUATIONS, 1)
    config.train.checkpoint_every = max(steps // EVALUATIONS, 1)
    config.train.export = False
    config.eval.num_prompts = 500   # the whole runlocal test split
    config.eval.samples = 4
    return config


def varied_lengths(config, *, extra_columns, max_new_tokens):
    """Solutions that work 0..`extra_columns` more columns on zeros (`data.arithmetic`):
    the same answers at several lengths, so the policy's length can move without its
    correctness. A 3-digit sum takes 35 to 37 tokens, and 8 more per extra column."""
    config.task.knobs.extra_columns = extra_columns
    config.rollout.max_new_tokens = max_new_tokens
    return config
