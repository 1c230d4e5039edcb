"""Ablation: loss aggregation and the length of wrong and correct answers.

Claim (Liu et al., "Understanding R1-Zero-Like Training: A Critical Perspective",
arXiv:2503.20783, sec. 3.1): averaging each answer's loss over its own length
(seq-mean-token-mean, GRPO) weighs a token of a short answer more than one of a long
answer, so correct answers are pushed shorter and wrong answers drift longer; token-mean
(DAPO) and Dr. GRPO's constant divisor (seq-mean-token-sum-norm, the budget T) weigh
every token alike and have no such bias.

Setting: GRPO (configs/grpo.py) at the runlocal scale, 200 steps, on 3-digit addition
whose reference solutions work 0, 1 or 2 extra columns of zeros (35 to 53 tokens, same
answers; 56-token budget), so an answer's length is the policy's choice and does not
decide its correctness. Only objective.aggregation.mode changes.

Measured: response_length_wrong and response_length_correct (tokens, over the step's
drawn answers) early and late in training, and held-out accuracy. The claim predicts
wrong answers growing (and correct ones shrinking) under seq-mean-token-mean only.

    python -m grpo_jax.sweep --config configs/ablations/loss_aggregation.py \\
        --workdir_root runs/loss_aggregation --seeds 0,1,2 --parallel 2
    python -m grpo_jax.report runs/loss_aggregation
"""

from grpo_jax import config_lib

tiny = config_lib.load_sibling(__file__, "_tiny")


def get_config(arg=None):
    arg = tiny.parse(arg, steps=200)
    config = tiny.recipe("grpo", steps=arg.steps)
    return tiny.varied_lengths(config, extra_columns=2, max_new_tokens=56)


def get_sweep():
    return [{"objective.aggregation.mode": mode}
            for mode in ("seq-mean-token-mean", "token-mean", "seq-mean-token-sum-norm")]


def get_report():
    return {
        # The one primary outcome (every other measure is secondary): held-out accuracy,
        # the mean of the last evaluations, paired by seed.
        "primary": ("eval_accuracy", "last_k"),
        "table": (("response_length_wrong", "early"), ("response_length_wrong", "late"),
                  ("response_length_correct", "early"), ("response_length_correct", "late"),
                  ("eval_accuracy", "final")),
        "plots": ("response_length_wrong", "response_length_correct", "eval_accuracy"),
        "labels": ("seq-mean-token-mean (GRPO)", "token-mean (DAPO)",
                   "seq-mean-token-sum-norm (Dr. GRPO)"),
    }
