"""Ablation: overlong handling on the hard testbed, where the budget cuts answers to the end.

Claim (Yu et al., DAPO, arXiv:2503.14476, sec. 3.4): a cut answer's reward punishes
reasoning that may have been sound; leaving cut answers out of the loss ("overlong
filtering") or a soft length penalty over the budget's last part (eq. 13) stabilises
training and raises accuracy. `long_overlong.py` could not test it late in the run: its
truncation fell under 0.5% after ~10 steps.

Testbed: `hard_testbed_calibration_2.py`'s setting (e) (seed 0: the 64-token budget cuts
14-36% of answers in every 10-step window to step 100, the cut falling on the largest
sums, held-out accuracy 0.31-0.42): 2-7 digit sums, a warm start whose teacher drops each
carry with probability 0.3 (400 SFT steps), 16 updates per rollout batch at lr 3e-5, no KL,
100 steps. The testbed's objective (PPO-clip 0.2/0.2, per-answer mean) stays fixed so the
overlong handling is the only change; the variants of `overlong.py`: cut answers score 0
("none"), cut answers leave the loss ("mask"), and the soft penalty over the budget's last
fifth (13 tokens: 0 up to 51 tokens, -1 at 64).

Primary outcome (named before the runs): held-out greedy accuracy, the mean of the last 3
evaluations, paired by seed against "none"; its two rows tested with the exact sign-flip
test, Holm-adjusted. Secondary: accuracy's AUC over the run, the late truncation rate and
answer length. The task grades a cut answer wrong whatever the variant (its final sum is
missing), so a variant can only raise accuracy by changing what the policy learns from
the cut answers, which is the claim.

Seeds: 8, the fewest at which the exact test can reach a Holm-adjusted p below 0.05 with
one seed disagreeing in sign; the report's power column says from the pooled sd how many
seeds a 0.05 accuracy gap needs.

    python -m grpo_jax.sweep --config configs/ablations/hard_overlong.py \\
        --workdir_root runs/hard_overlong --seeds 0,1,2,3,4,5,6,7 --parallel 2
    python -m grpo_jax.report runs/hard_overlong
"""

from grpo_jax import config_lib

testbed = config_lib.load_sibling(__file__, "hard_loss_aggregation")
runlocal = config_lib.load_sibling(__file__, "overlong")

get_config = testbed.get_config
get_sweep = runlocal.get_sweep


def get_report():
    return {
        "primary": ("eval_accuracy", "last_k"),
        "paired": (("eval_accuracy", "last_k"), ("eval_accuracy", "auc"),
                   ("truncation_rate", "late"), ("response_length_mean", "late")),
        "gaps": {"eval_accuracy": 0.05, "truncation_rate": 0.05, "response_length_mean": 3.0},
        "table": (("eval_accuracy", "final"), ("truncation_rate", "early"),
                  ("truncation_rate", "late"), ("response_length_mean", "late"),
                  ("response_length_wrong", "late"), ("response_length_correct", "late")),
        "plots": ("eval_accuracy", "truncation_rate", "response_length_mean"),
        "labels": runlocal.get_report()["labels"],
        "windows": testbed.get_report()["windows"],
    }
