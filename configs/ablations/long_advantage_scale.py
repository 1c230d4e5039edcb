"""Ablation: advantage std scaling on the long-answer testbed.

Claim (Liu et al., arXiv:2503.20783, sec. 3.1): dividing by the group's reward std
overweights nearly-solved and nearly-failed prompts; Dr. GRPO drops the division,
REINFORCE++ (Hu et al., arXiv:2501.03262) divides by the batch's. `advantage_scale.py`
showed the weights move as predicted but not whether it matters; here (`_testbed.py`)
42% of the warm start's targets are wrong and long, so more groups are mixed.

Setting: GRPO on the testbed (16 updates per batch, lr 3e-5, no KL) with 8 prompts x 8
answers (as `advantage_scale.py`), `_testbed.STEPS` steps; only
objective.advantage.scale changes.

Measured: the share of the advantage mass on nearly-solved and nearly-failed groups,
their counts, held-out accuracy.

    python -m grpo_jax.sweep --config configs/ablations/long_advantage_scale.py \\
        --workdir_root runs/long_advantage_scale --seeds 0,1,2 --parallel 2
    python -m grpo_jax.report runs/long_advantage_scale
"""

from grpo_jax import config_lib

testbed = config_lib.load_sibling(__file__, "_testbed")
runlocal = config_lib.load_sibling(__file__, "advantage_scale")


def get_config(arg=None):
    config = testbed.recipe("grpo", steps=testbed.parse(arg).steps)
    config.rollout.prompts_per_batch = 8
    config.objective.group_size = 8
    return config


get_sweep = runlocal.get_sweep


def get_report():
    return runlocal.get_report() | {"windows": testbed.MECHANISMS}
