"""Ablation: what to do with answers cut off at the budget (nothing, mask, soft penalty).

Claim (Yu et al., DAPO, arXiv:2503.14476, sec. 3.4 and fig. 5): scoring a truncated
answer as wrong punishes sound reasoning for its length and adds reward noise; dropping
truncated answers from the loss (overlong filtering) stabilises training, and a soft
penalty that grows over the last part of the budget (the soft overlong punishment)
teaches the policy to stay inside it, both improving accuracy.

Setting: DAPO (configs/dapo.py: token-mean, clip 0.2/0.28) without dynamic sampling, at
the runlocal scale, 200 steps, on 3-digit addition whose reference solutions work 0, 1
or 2 extra columns of zeros (35 to 53 tokens, same answers) under a 48-token budget:
the 2-column solutions do not fit, so the warm start writes answers that get cut off.
The variants: the correctness reward alone ("none": a cut answer scores 0), the same
with objective.overlong.mode = "mask" (cut answers leave the loss), and the correctness
reward plus DAPO's soft overlong penalty over the last 20% of the budget (from 38 to 48
tokens: it falls on the 1-column solutions, 43 to 45 tokens, and not on the plain ones).

Measured: held-out accuracy, the truncation rate and the mean answer length of the drawn
answers, early and late. The claim predicts higher accuracy with mask and with the soft
penalty than with none; the penalty should also bring truncation down.

    python -m grpo_jax.sweep --config configs/ablations/overlong.py \\
        --workdir_root runs/overlong --seeds 0,1,2 --parallel 2
    python -m grpo_jax.report runs/overlong
"""

from grpo_jax import config_lib

tiny = config_lib.load_sibling(__file__, "_tiny")

CORRECT = ("integer_answer", 1.0)
SOFT_PENALTY = ("overlong", 1.0, {"cache_fraction": 0.2})


def get_config(arg=None):
    arg = tiny.parse(arg, steps=200)
    config = tiny.recipe("dapo", steps=arg.steps)
    config.filtering.dynamic_sampling = False
    config.reward.specs = (CORRECT,)
    return tiny.varied_lengths(config, extra_columns=2, max_new_tokens=48)


def get_sweep():
    return [
        {"objective.overlong.mode": "none", "reward.specs": (CORRECT,)},
        {"objective.overlong.mode": "mask", "reward.specs": (CORRECT,)},
        {"objective.overlong.mode": "none", "reward.specs": (CORRECT, SOFT_PENALTY)},
    ]


def get_report():
    return {
        # The one primary outcome (every other measure is secondary): held-out accuracy,
        # the mean of the last evaluations, paired by seed.
        "primary": ("eval_accuracy", "last_k"),
        "table": (("eval_accuracy", "final"), ("truncation_rate", "early"),
                  ("truncation_rate", "late"), ("response_length_mean", "early"),
                  ("response_length_mean", "late"), ("accuracy", "late")),
        "plots": ("eval_accuracy", "truncation_rate", "response_length_mean"),
        "labels": ("none (cut = wrong)", "mask (overlong filtering)", "soft penalty"),
    }
