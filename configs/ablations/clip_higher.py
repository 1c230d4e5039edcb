"""Ablation: clip-higher, a wider upper clip range (0.2/0.2 vs 0.2/0.28).

Claim (Yu et al., DAPO, arXiv:2503.14476, sec. 3.1 and fig. 2): with the symmetric clip
the upper bound stops low-probability tokens from gaining probability, so the policy's
entropy collapses early; raising eps_high to 0.28 keeps the entropy up (more diverse
samples) and improves accuracy.

Setting: GRPO (configs/grpo.py) at the runlocal scale, 200 steps, on 3-digit addition,
with two passes over each rollout batch (8 optimizer updates per batch instead of 4) so
that the policy moves far enough off the sampling policy for the clip to bind. Only
objective.loss.eps_high changes.

Measured: entropy early and late, clip_low and clip_high (the share of tokens each bound
binds), held-out greedy accuracy and pass@4. The claim predicts, with 0.28, a higher
late entropy and pass@4; clip_high falls by construction (fewer ratios pass 1.28 than 1.2).

    python -m grpo_jax.sweep --config configs/ablations/clip_higher.py \\
        --workdir_root runs/clip_higher --seeds 0,1,2 --parallel 2
    python -m grpo_jax.report runs/clip_higher
"""

from grpo_jax import config_lib

tiny = config_lib.load_sibling(__file__, "_tiny")


def get_config(arg=None):
    arg = tiny.parse(arg, steps=200)
    config = tiny.recipe("grpo", steps=arg.steps)
    config.train.epochs = 2
    return config


def get_sweep():
    return [{"objective.loss.eps_high": eps_high} for eps_high in (0.2, 0.28)]


def get_report():
    return {
        # The one primary outcome (every other measure is secondary): held-out accuracy,
        # the mean of the last evaluations, paired by seed.
        "primary": ("eval_accuracy", "last_k"),
        "table": (("entropy", "early"), ("entropy", "late"), ("clip_low", "mean"),
                  ("clip_high", "mean"), ("eval_accuracy", "final"), ("eval_pass_at_k", "final")),
        "plots": ("entropy", "clip_high", "clip_low", "eval_accuracy"),
        "labels": ("0.2 / 0.2", "0.2 / 0.28 (clip-higher)"),
    }
