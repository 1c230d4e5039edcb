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
