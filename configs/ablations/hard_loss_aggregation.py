"""Ablation: loss aggregation on the hard testbed, where wrong answers stay long.

Claim (Liu et al., "Understanding R1-Zero-Like Training: A Critical Perspective",
arXiv:2503.20783, sec. 3.1): averaging each answer's loss over its own length
(seq-mean-token-mean, GRPO) weighs a token of a long answer less than one of a short
answer, so wrong answers (the long ones) are penalised less per token and drift longer;
token-mean (DAPO, arXiv:2503.14476 eq. 12) and Dr. GRPO's constant divisor
(seq-mean-token-sum-norm, the budget T) weigh every token alike and have no such bias.

Testbed: `hard_testbed_calibration_2.py`'s setting (e), the one where the claim's
mechanism acts for the whole run (seed 0: held-out accuracy 0.31-0.42, wrong answers
10-15 tokens longer than right ones and 14-36% of answers cut by the 64-token budget in
every 10-step window to step 100): 2-7 digit sums, a warm start whose teacher drops each
carry with probability 0.3 (400 SFT steps), GRPO with PPO-clip 0.2/0.2, 16 updates per
rollout batch at lr 3e-5, no KL, 100 steps. Only objective.aggregation.mode changes.

Primary outcome (named before the runs): the claim's own differential, wrong-answer minus
right-answer length over the drawn answers in the last fifth of the run (steps 81-100),
paired by seed against seq-mean-token-mean; the claim predicts it smaller under
token-mean and seq-mean-token-sum-norm. Its two rows are tested with the exact sign-flip
test, Holm-adjusted. Secondary: held-out accuracy (last 3 evaluations, and its AUC), the
late lengths of wrong and right answers, truncation.

Seeds: 8, the fewest at which the exact test can reach a Holm-adjusted p below 0.05 with
one of the seeds disagreeing in sign (2 of 256 sign patterns as extreme, x2 for Holm).
The report's power column says, from the sd pooled over these runs, how many seeds a
3-token difference in the primary outcome (and 0.05 in accuracy) needs; a non-detection
below that power reads "untested at this power", not "no effect".

    python -m grpo_jax.sweep --config configs/ablations/hard_loss_aggregation.py \\
        --workdir_root runs/hard_loss_aggregation --seeds 0,1,2,3,4,5,6,7 --parallel 2
    python -m grpo_jax.report runs/hard_loss_aggregation
"""

from grpo_jax import config_lib

calibration = config_lib.load_sibling(__file__, "hard_testbed_calibration")
calibration_2 = config_lib.load_sibling(__file__, "hard_testbed_calibration_2")

TESTBED = calibration_2.SETTINGS["e"]
MODES = {"seq-mean-token-mean": "seq-mean-token-mean (GRPO)",
         "token-mean": "token-mean (DAPO)",
         "seq-mean-token-sum-norm": "seq-mean-token-sum-norm (Dr. GRPO)"}
LENGTH_GAP = "response_length_wrong - response_length_correct"


def get_config(arg=None):
    return config_lib.apply_overrides(calibration.get_config(arg), TESTBED)


def get_sweep():
    return [{"objective.aggregation.mode": mode} for mode in MODES]


def get_report():
    return {
        "primary": (LENGTH_GAP, "late"),
        "paired": ((LENGTH_GAP, "late"), ("eval_accuracy", "last_k"), ("eval_accuracy", "auc"),
                   ("response_length_wrong", "late"), ("response_length_correct", "late")),
        "gaps": {LENGTH_GAP: 3.0, "eval_accuracy": 0.05, "response_length_wrong": 5.0,
                 "response_length_correct": 5.0},
        "table": ((LENGTH_GAP, "early"), (LENGTH_GAP, "late"),
                  ("response_length_wrong", "late"), ("response_length_correct", "late"),
                  ("truncation_rate", "late"), ("eval_accuracy", "final")),
        "plots": ("response_length_wrong", "response_length_correct", "truncation_rate",
                  "eval_accuracy"),
        "labels": tuple(MODES.values()),
        "windows": calibration.MECHANISMS,
    }
