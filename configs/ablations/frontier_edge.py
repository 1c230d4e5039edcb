"""Ablation: the stability frontier's edge cells, run long enough and with enough seeds to
decide, and PPO-clip at GSPO's clip tightness beside GSPO.

Claim (Zheng et al., GSPO, arXiv:2507.18071, sec. 1 and 5): token-level importance ratios
make GRPO (PPO-clip) training collapse where GSPO's sequence-level ratio stays stable.
`stability_frontier.py` (3 seeds, 24 steps) found the objectives differing only at lr 1e-4
with 4 or 16 updates per rollout batch, and could not decide there: its 1-update cells are
identical by construction (every ratio is 1) and its 3e-5 / 3e-4 cells saturate (no run,
or every run, collapses), a 24-step horizon censors slow declines, and GSPO's clip binds on
13-35% of tokens against PPO-clip's <= 1%, so ratio level and clip tightness were
confounded. This sweep keeps only the edge: lr 1e-4 x {4, 16} updates x warm-up {none, 20
updates}, for `STEPS` steps, and adds PPO-clip with a tight symmetric clip
(`TIGHT_EPS`), to be set so that its clip fraction matches GSPO's (a calibration of
PPO-clip's clip fraction over eps in {0.05, 0.02, 0.01} on 1 seed at 1e-4 x 16 updates,
before the seeds; the pick and its measured fraction go into this docstring).

Setting: `stability_frontier.py`'s runlocal regime and collapse rule (held-out accuracy
below half the warm start's at 2 consecutive evaluations), objectives plain PG (the
control), PPO-clip 0.2/0.2, PPO-clip at `TIGHT_EPS`, and GSPO, `STEPS` steps evaluated
every `STEPS // EVALUATIONS`.

Primary outcome, named before the runs: collapse, paired with plain PG's run of the same
cell and seed (the seed-clustered sign-flip test, Holm across objectives); secondary: time
to collapse (Kaplan-Meier, censored at the last evaluation), the paired area under the
held-out accuracy curve, the clip fractions. Seeds: in the committed frontier's runs at
these 4 cells, each seed's mean over the cells of an objective's area under the curve minus
PG's (PPO-clip +0.10..+0.18, GSPO +0.18..+0.22, CISPO and SAPO -0.10..+0.01 over 3 seeds)
has a pooled sd of 0.047 (df 8), so 9 seeds detect a 0.05 gap with power 0.8
(`report.stats.seeds_needed`):

    python -m grpo_jax.sweep --config configs/ablations/frontier_edge.py \\
        --workdir_root runs/frontier_edge --seeds 0,1,2,3,4,5,6,7,8 --parallel 2
    python -m grpo_jax.report runs/frontier_edge
"""

import itertools

from grpo_jax import config_lib

frontier = config_lib.load_sibling(__file__, "stability_frontier")

STEPS = 60
EVALUATIONS = 12
LEARNING_RATES = (1e-4,)
UPDATES = (4, 16)
WARMUP_UPDATES = (0, 20)
TIGHT_EPS = 0.02   # PPO-clip's symmetric clip at GSPO's clip fraction (see the docstring)


def get_config(arg=None):
    arg = frontier.tiny.parse(arg, steps=STEPS)
    config = frontier.get_config(f"steps={arg.steps}")
    config.train.eval_every = max(arg.steps // EVALUATIONS, 1)
    return config


def _objectives():
    """PG (its eps_high, which it does not read, set so every entry names one), PPO-clip,
    PPO-clip at `TIGHT_EPS`, GSPO."""
    tight = {**frontier._objective("grpo"), "objective.loss.eps_low": TIGHT_EPS,
             "objective.loss.eps_high": TIGHT_EPS}
    return [{**frontier._objective("pg"), "objective.loss.eps_high": 0.2},
            frontier._objective("grpo"), tight, frontier._objective("gspo")]


def get_sweep():
    return [{**objective, "optimizer.learning_rate": lr, "train.minibatches": updates,
             "optimizer.warmup_steps": warmup}
            for objective, lr, updates, warmup in itertools.product(
                _objectives(), LEARNING_RATES, UPDATES, WARMUP_UPDATES)]


def get_report():
    return {
        "table": (("eval_accuracy", "final"), ("clip_low", "mean"), ("clip_high", "mean")),
        "plots": ("eval_accuracy", "clip_high"),
        "paired": (),
        "primary": "collapse",
        # One panel per objective: the loss and its upper clip together, so PPO-clip at
        # 0.2 and at TIGHT_EPS are two objectives, each paired with PG's runs.
        "frontier": {"collapse": frontier.COLLAPSE, "rows": "train.minibatches",
                     "columns": "optimizer.warmup_steps",
                     "panels": (("objective.loss.kind", "objective.loss.eps_high"),)},
    }
