"""Ablation: loss aggregation on the long-answer testbed, where wrong answers ramble.

Claim (Liu et al., arXiv:2503.20783, sec. 3.1): per-answer mean aggregation (GRPO) lets
wrong answers grow longer; token-mean (DAPO) and Dr. GRPO's constant divisor do not.
`loss_aggregation.py` could not test it: there answer length is independent of
correctness. Here (`_testbed.py`) wrong answers are twice as long as right ones from the
warm start on, under a 160-token budget.

Setting: GRPO on the testbed (16 updates per batch, lr 3e-5, no KL), `_testbed.STEPS`
steps; only objective.aggregation.mode changes, as in `loss_aggregation.py`.

Measured: the length of wrong and correct drawn answers early and late, the truncation
rate, held-out accuracy. The claim predicts wrong answers longer late than early under
seq-mean-token-mean only.

    python -m grpo_jax.sweep --config configs/ablations/long_loss_aggregation.py \\
        --workdir_root runs/long_loss_aggregation --seeds 0,1,2 --parallel 2
    python -m grpo_jax.report runs/long_loss_aggregation
"""

from grpo_jax import config_lib

testbed = config_lib.load_sibling(__file__, "_testbed")
runlocal = config_lib.load_sibling(__file__, "loss_aggregation")


def get_config(arg=None):
    return testbed.recipe("grpo", steps=testbed.parse(arg).steps)


get_sweep = runlocal.get_sweep


def get_report():
    spec = runlocal.get_report()
    spec["table"] += (("truncation_rate", "early"), ("truncation_rate", "late"))
    # The claim's own measure, paired per seed: the length of wrong answers late in training.
    spec["paired"] = (("response_length_wrong", "late"), ("response_length_correct", "late"),
                      ("eval_accuracy", "last_k"), ("eval_accuracy", "auc"))
    spec["gaps"] = {"eval_accuracy": 0.05, "response_length_wrong": 5.0}
    spec["windows"] = testbed.MECHANISMS
    return spec
