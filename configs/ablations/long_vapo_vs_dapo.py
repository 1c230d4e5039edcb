"""Ablation: VAPO beside DAPO on the long-answer testbed, with the same tuning for each.

Claim (Yue et al., arXiv:2504.05118, Table 1): a value model, pre-trained and with
decoupled and length-adaptive GAE, assigns credit within long answers better than a
group baseline, and VAPO beats DAPO. A critic can only help where an answer's
correctness shows in its prefix. On the testbed (`_testbed.py`) it does: the scratchpad
works the columns one by one, and a column that drops its carry makes the answer wrong
before the answer is written (the warm start's wrong answers, 42% of its targets, drop
one early); on runlocal's 3-digit addition a critic explained 1-4% of the returns'
variance, and DAPO led (docs/recipes.md).

Setting: the testbed's regime for both (16 prompts x 4 answers, 16 updates per batch,
160 new tokens, no KL, `_testbed.STEPS` steps) with each method's own recipe otherwise:
DAPO (`configs/dapo.py`: group advantages, clip 0.2/0.28, token-mean, dynamic sampling,
the soft overlong penalty) and VAPO (`configs/vapo.py`: GAE from a critic pre-trained
for 5 steps, critic lambda 1, length-adaptive policy lambda with alpha scaled to the
160-token budget (0.05 x 20,480 / 160 = 6.4, so an answer filling the same share of its
budget gets the paper's lambda), clip 0.2/0.28, token-mean, the 0.1 x NLL of correct
answers, the critic's learning rate twice the policy's). The fields only VAPO reads
(critic lambda, alpha, the critic's warm-up) are set in the base config, where DAPO
ignores them; each entry sets the fields that switch the method on.

Tuning, equal for both: the same search over the policy's learning rate, {1e-5, 3e-5}
(3e-5 is the highest rate at which the stability frontier saw no collapse with 16
updates per batch), 3 seeds each; each method is read at the rate with the higher mean
training reward over the last fifth of its steps (not the held-out accuracy, so the
held-out prompts stay out of the choice); the report's "Methods at their tuned settings"
makes that choice and pairs the two picks seed by seed.

Measured: held-out accuracy (mean of the last 3 evaluations, area under the curve),
the training reward, the critic's explained variance (how much of the return the prefix
predicts; undefined at a step whose returns are all equal, and its late mean taken over
the steps where it is defined), answer length and truncation.

    python -m grpo_jax.sweep --config configs/ablations/long_vapo_vs_dapo.py \\
        --workdir_root runs/long_vapo_vs_dapo --seeds 0,1,2 --parallel 2
    python -m grpo_jax.report runs/long_vapo_vs_dapo
"""

from grpo_jax import config_lib

testbed = config_lib.load_sibling(__file__, "_testbed")

LEARNING_RATES = (1e-5, 3e-5)
PAPER_MAX_NEW_TOKENS = 20480


def get_config(arg=None):
    config = testbed.recipe("dapo", steps=testbed.parse(arg).steps)
    # Read only with critic.enabled and estimator "gae" (the VAPO entries):
    config.critic.lam = 1.0
    config.critic.optimizer.warmup_steps = config.optimizer.warmup_steps
    config.objective.advantage.lam_alpha = (
        0.05 * PAPER_MAX_NEW_TOKENS / config.rollout.max_new_tokens)
    return config


def _vapo(learning_rate):
    """The fields that turn the base (DAPO) into VAPO at `learning_rate`."""
    return {"critic.enabled": True, "critic.pretrain_steps": 5,
            "objective.advantage.estimator": "gae", "filtering.dynamic_sampling": False,
            "objective.positive_nll_weight": 0.1, "reward.specs": (("integer_answer", 1.0),),
            "optimizer.learning_rate": learning_rate,
            "critic.optimizer.learning_rate": 2 * learning_rate}


def get_sweep():
    return ([{"optimizer.learning_rate": lr} for lr in LEARNING_RATES]
            + [_vapo(lr) for lr in LEARNING_RATES])


def get_report():
    return {
        # The one primary outcome (every other measure is secondary): held-out accuracy,
        # the mean of the last evaluations, paired by seed.
        "primary": ("eval_accuracy", "last_k"),
        "table": (("eval_accuracy", "final"), ("reward_mean", "late"),
                  ("explained_variance", "late"), ("response_length_mean", "late"),
                  ("truncation_rate", "late")),
        "plots": ("eval_accuracy", "reward_mean", "explained_variance", "response_length_mean"),
        "labels": tuple(f"{method}, lr {lr:g}" for method in ("DAPO", "VAPO")
                        for lr in LEARNING_RATES),
        "paired": (("eval_accuracy", "last_k"), ("eval_accuracy", "auc")),
        "windows": testbed.MECHANISMS,
        # Each method at the rate its own training reward picks, then VAPO - DAPO per seed.
        "tuned": {"by": ("reward_mean", "late"),
                  "methods": (("DAPO", tuple(range(len(LEARNING_RATES)))),
                              ("VAPO", tuple(range(len(LEARNING_RATES),
                                                   2 * len(LEARNING_RATES)))))},
    }
