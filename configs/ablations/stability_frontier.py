"""Ablation: the stability frontier: where each ratio-level objective stops learning and
collapses, over learning rate, updates per rollout and warm-up.

Claims: GSPO (Zheng et al., arXiv:2507.18071, sec. 1 and 5) reports that token-level
importance ratios make GRPO training unstable ("model collapse") where its sequence-level
ratio stays stable; CISPO (MiniMax-M1, arXiv:2506.13585, sec. 3.1) clips the ratio's
weight instead of dropping tokens' gradients, for stable training with more off-policy
updates; SAPO (Gao et al., arXiv:2511.20347) replaces the hard clip with a smooth gate for
more stable updates. Each claim is about where training stays stable, which a single
setting cannot show: at the runlocal setting (lr 1e-4, no KL) PPO-clip and CISPO alike
collapse at lr 2e-4 within a few steps.

Setting: the runlocal regime (16 prompts x 4 answers, 48 new tokens, 3-digit addition, the
0.66M-parameter model from its SFT warm start, no KL, group-std advantages), each objective
as its recipe defines it (`ratio_level.py`: PPO-clip 0.2/0.2, GSPO, CISPO, SAPO), and the
plain importance-weighted policy gradient (loss "pg", no clip or gate) as the control, x
learning rate {3e-5, 1e-4, 3e-4} x optimizer updates per rollout batch {1, 4, 16} (one
epoch of that many minibatches: 64, 16 and 4 answers each; from the second update on the
policy is off the one that sampled) x warm-up {none, linear over the first 20 optimizer
updates}. `STEPS` rollout steps each, scaled down from the papers' hundreds: past the
cliff, collapse came at a median step of 3 to 12 and was permanent (the policy emits no
correct answer to learn from). A run that collapses after its last evaluations is not
counted; the tables' mean final accuracy shows such runs (falling, not yet below the
threshold twice).

Collapse (`COLLAPSE`): held-out greedy accuracy below half the warm start's (the run's
step-0 evaluation, `train.eval_at_start`) at 2 consecutive evaluations. Evaluated every
`STEPS // EVALUATIONS` = 3 steps on the 500 held-out prompts, greedy only (the warm start
scores ~0.55, so the threshold is ~0.27, more than 10 standard errors of one evaluation
below any run that keeps learning).

Measured: per cell, the share of seeds that collapsed (the heat maps), the first step of
the collapse, the final and last-3 held-out accuracy, and the clip activity.

    python -m grpo_jax.sweep --config configs/ablations/stability_frontier.py \\
        --workdir_root runs/stability_frontier --seeds 0,1,2 --parallel 2
    python -m grpo_jax.report runs/stability_frontier
"""

import itertools

from grpo_jax import config_lib

tiny = config_lib.load_sibling(__file__, "_tiny")
ratio_level = config_lib.load_sibling(__file__, "ratio_level")

STEPS = 24
EVALUATIONS = 8
METHODS = ("pg", "grpo", "gspo", "cispo", "sapo")   # "pg": the unclipped control
LEARNING_RATES = (3e-5, 1e-4, 3e-4)
UPDATES = (1, 4, 16)
WARMUP_UPDATES = (0, 20)
COLLAPSE = {"metric": "eval_accuracy", "below": 0.5, "evaluations": 2}


def get_config(arg=None):
    arg = tiny.parse(arg, steps=STEPS)
    config = tiny.recipe("grpo", steps=arg.steps)
    config.objective.kl.beta = 0.0
    config.train.ref_reset_every = 0
    config.train.eval_every = max(arg.steps // EVALUATIONS, 1)
    config.train.checkpoint_every = arg.steps
    config.train.eval_at_start = True
    config.eval.num_prompts = 500
    config.eval.samples = 0
    return config


def _objective(method):
    if method == "pg":
        return {"objective.loss.kind": "pg", "objective.aggregation.mode": "seq-mean-token-mean"}
    return ratio_level._objective_of(method)


def get_sweep():
    return [{**_objective(method), "optimizer.learning_rate": lr, "train.minibatches": updates,
             "optimizer.warmup_steps": warmup}
            for method, lr, updates, warmup in itertools.product(
                METHODS, LEARNING_RATES, UPDATES, WARMUP_UPDATES)]


def get_report():
    return {
        "table": (("eval_accuracy", "final"), ("clip_low", "mean"), ("clip_high", "mean")),
        "plots": (),
        "paired": (),
        # The primary outcome: whether a run collapsed, paired with the plain policy
        # gradient's run of the same cell and seed (the seed-clustered test).
        "primary": "collapse",
        "frontier": {"collapse": COLLAPSE, "rows": "optimizer.learning_rate",
                     "columns": "train.minibatches",
                     "panels": ("objective.loss.kind", "optimizer.warmup_steps")},
    }
