"""Ablation: dividing advantages by the group std, the batch std, or nothing.

Claim (Liu et al., arXiv:2503.20783, sec. 3.1, "question-level difficulty bias"):
dividing by the group's reward std gives the groups whose answers nearly all agree
(nearly solved or nearly failed prompts, whose std is small) more weight than the others;
Dr. GRPO drops the division. Hu et al. (REINFORCE++, arXiv:2501.03262) normalise by the
batch instead, which keeps the groups' relative weights.

Setting: GRPO (configs/grpo.py) at the runlocal scale, 200 steps, with 8 prompts x 8
answers per batch (the same 64 rows; groups of 8 resolve 1/8 steps of difficulty), on
3-digit addition. Only objective.advantage.scale changes.

Measured: advantage_share_nearly_solved / _nearly_failed, the share of the batch's
summed |advantage| carried by groups with 3/4 or more (but not all) / 1/4 or less (but
some) answers correct, next to groups_nearly_solved / _nearly_failed (how many such
groups there are), and held-out accuracy. With groups of 8 the std division multiplies
a 1-of-8 group's weight by 1/std = 3.0 and a 4-of-8 group's by 2.0, so the claim
predicts larger shares under "group" than under "none" and "batch", which should match.

    python -m grpo_jax.sweep --config configs/ablations/advantage_scale.py \\
        --workdir_root runs/advantage_scale --seeds 0,1,2 --parallel 2
    python -m grpo_jax.report runs/advantage_scale
"""

from grpo_jax import config_lib

tiny = config_lib.load_sibling(__file__, "_tiny")


def get_config(arg=None):
    arg = tiny.parse(arg, steps=200)
    config = tiny.recipe("grpo", steps=arg.steps)
    config.rollout.prompts_per_batch = 8
    config.objective.group_size = 8
    return config


def get_sweep():
    return [{"objective.advantage.scale": scale} for scale in ("group", "none", "batch")]


def get_report():
    return {
        # The one primary outcome (every other measure is secondary): held-out accuracy,
        # the mean of the last evaluations, paired by seed.
        "primary": ("eval_accuracy", "last_k"),
        "table": (
            ("advantage_share_nearly_solved", "mean"), ("advantage_share_nearly_failed", "mean"),
            ("groups_nearly_solved", "mean"), ("groups_nearly_failed", "mean"),
            ("accuracy", "late"), ("eval_accuracy", "final"),
        ),
        "plots": (
            "advantage_share_nearly_solved", "advantage_share_nearly_failed", "eval_accuracy",
        ),
        "labels": ("group std (GRPO)", "none (Dr. GRPO)", "batch std"),
    }
