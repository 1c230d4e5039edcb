"""Ablation: overlong handling on the long-answer testbed, where the budget binds.

Claim (Yu et al., DAPO, arXiv:2503.14476, sec. 3.4): masking cut answers and the soft
overlong penalty both stabilise training and raise accuracy; the penalty keeps answers
inside the budget. In `overlong.py` the penalty's effect was largely built in (its zone
fell on answers that the task made long). Here (`_testbed.py`) a third of the wrong SFT
targets and 5.5% of the right ones do not fit the 160-token budget.

Setting: DAPO (token-mean, clip 0.2/0.28) without dynamic sampling on the testbed (16
updates per batch, lr 3e-5), `_testbed.STEPS` steps; the variants of `overlong.py`: cut
answers score 0 ("none"), cut answers leave the loss ("mask"), and the soft penalty over
the budget's last fifth (from 128 tokens).

Measured: held-out accuracy, the truncation rate and answer length early and late, the
length of wrong and correct answers.

    python -m grpo_jax.sweep --config configs/ablations/long_overlong.py \\
        --workdir_root runs/long_overlong --seeds 0,1,2 --parallel 2
    python -m grpo_jax.report runs/long_overlong
"""

from grpo_jax import config_lib

testbed = config_lib.load_sibling(__file__, "_testbed")
runlocal = config_lib.load_sibling(__file__, "overlong")


def get_config(arg=None):
    config = testbed.recipe("dapo", steps=testbed.parse(arg).steps)
    config.filtering.dynamic_sampling = False
    config.reward.specs = (runlocal.CORRECT,)
    return config


get_sweep = runlocal.get_sweep


def get_report():
    spec = runlocal.get_report()
    spec["table"] += (("response_length_wrong", "late"), ("response_length_correct", "late"))
    spec["windows"] = testbed.MECHANISMS
    return spec
