"""Ablation: clip-higher on the long-answer testbed, where the clip binds.

Claim (Yu et al., DAPO, arXiv:2503.14476, sec. 3.1): the symmetric clip's upper bound
keeps low-probability tokens from gaining probability, so entropy collapses; eps_high
0.28 keeps it up. `clip_higher.py` could not test it: with 8 updates per batch the upper
bound bound on 0.2% of tokens. Here (`_testbed.py`) 16 updates per batch on long answers.

Setting: GRPO on the testbed (16 updates per batch, lr 3e-5, no KL), `_testbed.STEPS`
steps; only objective.loss.eps_high changes (0.2 vs 0.28), as in `clip_higher.py`.

Measured: clip_low and clip_high (the share of tokens each bound binds), entropy early
and late, held-out greedy accuracy and pass@4. The claim predicts a higher late entropy
and pass@4 with 0.28.

    python -m grpo_jax.sweep --config configs/ablations/long_clip_higher.py \\
        --workdir_root runs/long_clip_higher --seeds 0,1,2 --parallel 2
    python -m grpo_jax.report runs/long_clip_higher
"""

from grpo_jax import config_lib

testbed = config_lib.load_sibling(__file__, "_testbed")
runlocal = config_lib.load_sibling(__file__, "clip_higher")


def get_config(arg=None):
    return testbed.recipe("grpo", steps=testbed.parse(arg).steps)


get_sweep = runlocal.get_sweep


def get_report():
    spec = runlocal.get_report()
    # The claim's measures, paired per seed: late entropy and sampled pass@4.
    spec["paired"] = (("entropy", "late"), ("eval_pass_at_k", "last_k"),
                      ("eval_accuracy", "last_k"), ("eval_accuracy", "auc"))
    spec["windows"] = testbed.MECHANISMS
    return spec
