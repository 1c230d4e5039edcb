"""Ablation: the baseline subtracted from the reward: GRPO, RLOO, REINFORCE++ (+ baseline).

Claims: RLOO (Ahmadian et al., arXiv:2402.14740) argues a leave-one-out mean over the
group is an unbiased baseline that matches PPO at a fraction of its cost; REINFORCE++
(Hu et al., arXiv:2501.03262) whitens returns over the whole batch instead of per group,
which they find more stable than GRPO's per-prompt normalisation, and its "baseline"
variant subtracts the group mean first. GRPO (Shao et al., arXiv:2402.03300) divides by
the group's std.

Setting: GRPO (configs/grpo.py) at the runlocal scale (16 prompts x 4 answers, 4
updates per batch), 200 steps, on 3-digit addition, with the same PPO clip 0.2/0.2,
token-mean aggregation and no KL for all four; only objective.advantage (estimator,
baseline) changes.

Measured: held-out accuracy (greedy and mean@4), the drawn answers' accuracy late in
training, the gradient norm and its spread over a step's updates.

    python -m grpo_jax.sweep --config configs/ablations/baselines.py \\
        --workdir_root runs/baselines --seeds 0,1,2 --parallel 2
    python -m grpo_jax.report runs/baselines
"""

from grpo_jax import config_lib

tiny = config_lib.load_sibling(__file__, "_tiny")


def get_config(arg=None):
    arg = tiny.parse(arg, steps=200)
    config = tiny.recipe("grpo", steps=arg.steps)
    config.objective.aggregation.mode = "token-mean"
    config.objective.kl.beta = 0.0
    config.train.ref_reset_every = 0
    return config


def get_sweep():
    return [
        {"objective.advantage.estimator": "group", "objective.advantage.baseline": False},
        {"objective.advantage.estimator": "rloo", "objective.advantage.baseline": False},
        {"objective.advantage.estimator": "reinforce_pp", "objective.advantage.baseline": False},
        {"objective.advantage.estimator": "reinforce_pp", "objective.advantage.baseline": True},
    ]


def get_report():
    return {
        # The one primary outcome (every other measure is secondary): held-out accuracy,
        # the mean of the last evaluations, paired by seed.
        "primary": ("eval_accuracy", "last_k"),
        "table": (
            ("eval_accuracy", "final"), ("eval_mean_at_k", "final"), ("accuracy", "late"),
            ("grad_norm", "mean"), ("grad_norm_std", "mean"),
        ),
        "plots": ("eval_accuracy", "eval_mean_at_k", "reward_mean", "grad_norm"),
        "labels": (
            "GRPO (group mean, std)", "RLOO (leave-one-out)", "REINFORCE++ (batch whitening)",
            "REINFORCE++ baseline (group mean, then batch whitening)",
        ),
    }
