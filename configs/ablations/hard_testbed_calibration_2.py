"""Calibration of the hard testbed, second round (one seed per setting).

`hard_testbed_calibration.py`'s setting (d) (2-7 digit sums, the warm start's teacher
dropping each carry with probability 0.3, 400 SFT steps, lr 3e-5, 16 updates per batch)
keeps held-out accuracy at 0.61-0.76 and wrong answers 7-12 tokens longer than right ones
to step 100, but its 80-token budget cuts at most 1.4% of answers and its upper clip binds
on at most 0.11% of tokens: the overlong and clip-higher claims' mechanisms barely act.
This round changes (d) in the two directions that should make them act, alone and
together: (e) a 64-token budget (the longest 7-digit solutions no longer fit, so the cut
falls on the largest problems, which are also the ones most often wrong); (f) 2 epochs
over each rollout batch (32 updates, the policy drifts further from the one that sampled);
(g) both. The targets are the first round's: accuracy within ~0.3-0.7, truncation >= 5%
and the upper clip >= 1% of tokens in the last third of the run. Settings (b) (lr 5e-5)
collapsed, so the learning rate stays at 3e-5.

    python -m grpo_jax.sweep --config configs/ablations/hard_testbed_calibration_2.py \\
        --workdir_root runs/hard_testbed_calibration_2 --seeds 0 --parallel 2
    python -m grpo_jax.report runs/hard_testbed_calibration_2

Measured (seed 0, AMD EPYC 2-core host at 8e179f2, per 10-step window;
experiments/ablations/hard_testbed_calibration_2/report.md):

- (e) meets three of the four targets in every window to step 100: held-out accuracy
  0.31-0.42, wrong answers 10-15 tokens longer than right ones, the budget cuts 14-36% of
  answers; entropy 0.16 falling to 0.12. The upper clip binds on 0.07-0.15% of tokens,
  not >= 1%. Its warm start differs from (d)'s (the budget is part of the warm start's
  settings): 0.32 held-out at step 0, as the 64-token budget makes cut answers wrong.
- (f) doubles the clip fractions of (d) (upper 0.12-0.20%, lower 0.55-0.82%) and keeps
  accuracy at 0.57-0.66 and the length gap at 8-12 tokens; truncation stays <= 1.4%.
- (g) collapses: held-out accuracy 0.10-0.17 in steps 1-50, 0.01 at step 100.

So (e) is the testbed for the length-gap and overlong claims (loss aggregation, the soft
overlong penalty, overlong masking). The upper clip stays far below 1% in every setting
that does not collapse: clip-higher's mechanism is still untested here.
"""

from grpo_jax import config_lib

first = config_lib.load_sibling(__file__, "hard_testbed_calibration")

SETTING_D = first.SETTINGS["d"]
SETTINGS = {
    "e": {**SETTING_D, "rollout.max_new_tokens": 64},
    "f": {**SETTING_D, "train.epochs": 2},
    "g": {**SETTING_D, "rollout.max_new_tokens": 64, "train.epochs": 2},
}


def get_config(arg=None):
    return first.get_config(arg)


def get_sweep():
    return list(SETTINGS.values())


def get_report():
    return {**first.get_report(), "labels": tuple(f"setting ({name})" for name in SETTINGS)}
