"""Calibration of a testbed whose mechanisms act for the whole run (one seed per setting).

The long-answer testbed (`_testbed.py`) made the ablations' mechanisms act, but only for
its first ~10 of 100 steps: its wrong answers are long because a forgetful teacher
rambles, a mode RL removes quickly; truncation then falls under 0.5%, the clip binds on
~0.1% of tokens, entropy sits at 0.05 nats per token, and held-out accuracy ends at
0.94-0.98. A testbed that keeps them acting needs (each measured by this sweep's
mechanism table, per 10-step window):

- held-out accuracy between ~0.3 and ~0.7 throughout: problems of several sizes
  (``min_digits``: each operand's digit count uniform in min_digits..digits), the larger
  ones beyond what the 0.66M-parameter model masters in 100 steps;
- wrong answers long because reasoning failed: an answer's length follows its problem's
  size (8 tokens per column), and larger problems have more carries to drop, so wrong
  answers are longer on average with no rambling mode to unlearn (``ramble_columns`` 0);
- the budget cuts >= 5% of answers late: ``max_new_tokens`` below the longest problems'
  solutions, so the largest sums can only be finished by writing fewer extra columns;
- the upper clip binds on >= 1% of tokens: a shorter SFT warm start (higher entropy),
  16 updates per rollout batch and a higher learning rate.

Settings (the warm start's teacher drops each carry with probability ``forget_carry_p``
on 60% of the targets, runlocal's ``teacher_fraction``): (a) 2-6 digits, p 0.15, 600 SFT
steps, 72 new tokens, lr 3e-5; (b) 2-7 digits, p 0.3, 400 SFT steps, 80 new tokens, lr
5e-5; (c) 2-8 digits, p 0.5, 200 SFT steps, every solution 0..2 extra columns (so one
problem's answers differ in length by up to 16 tokens), 80 new tokens (a 7-digit sum with
2 extra columns, or an 8-digit one with 1, does not fit), lr 5e-5; (d) (b) at lr 3e-5.
GRPO (PPO-clip 0.2/0.2, per-answer mean), 16 updates per batch, no KL, `STEPS` steps, one seed each:

    python -m grpo_jax.sweep --config configs/ablations/hard_testbed_calibration.py \\
        --workdir_root runs/hard_testbed_calibration --seeds 0 --parallel 2
    python -m grpo_jax.report runs/hard_testbed_calibration

Measured (seed 0, one run per setting, AMD EPYC 2-core host; (a) at 13428fe, (b)-(d) at
f7c9fec; per 10-step window, experiments/ablations/hard_testbed_calibration/report.md):

- (a) fails every criterion but the length gap: held-out greedy accuracy 0.88-0.97; wrong
  answers 2-6 tokens longer than right ones; the 72-token budget cuts 0-0.16% of answers;
  the clips bind on 0.09-0.22% (low) and 0.04-0.09% (high) of tokens; entropy 0.036 to
  0.021. The tiny model adds 6-digit numbers far better than its forgetful teacher.
- (b) collapses: held-out accuracy 0.53 in steps 1-10, 0.12-0.22 from step 11 and 0.04 at
  step 100 (lr 5e-5 with 16 updates per batch is past this model's stable step size).
- (c) never learns: 0 accuracy at every evaluation, so no group has signal; the budget
  cuts 28-43% of answers. The 200-step warm start on 8-digit sums is too short.
- (d) keeps two mechanisms acting to the end: held-out accuracy 0.61-0.76 in every window,
  wrong answers 7-12 tokens longer than right ones in every window (6.8 in steps 91-100),
  entropy 0.10 falling to 0.06. It fails the other two: truncation 0.16-1.4% (not >= 5%)
  and the upper clip binds on 0.07-0.11% of tokens (not >= 1%).

So (d) is a testbed for the length-gap claims (loss aggregation) and not yet for
clip-higher or the overlong penalty: those need a budget and an update size that bind
without (b)'s collapse (e.g. (d) with 64 new tokens, and 32 updates per batch at lr 3e-5).
"""

from grpo_jax import config_lib

tiny = config_lib.load_sibling(__file__, "_tiny")

STEPS = 100
MECHANISMS = {"size": 10, "measures": (
    "eval_accuracy", "response_length_wrong - response_length_correct", "truncation_rate",
    "clip_low", "clip_high", "entropy")}
SETTINGS = {
    "a": {"task.knobs.digits": 6, "task.knobs.forget_carry_p": 0.15, "sft.steps": 600,
          "rollout.max_new_tokens": 72, "optimizer.learning_rate": 3e-5},
    "b": {"task.knobs.digits": 7, "task.knobs.forget_carry_p": 0.3, "sft.steps": 400,
          "rollout.max_new_tokens": 80, "optimizer.learning_rate": 5e-5},
    "c": {"task.knobs.digits": 8, "task.knobs.forget_carry_p": 0.5, "sft.steps": 200,
          "task.knobs.extra_columns": 2, "rollout.max_new_tokens": 80,
          "optimizer.learning_rate": 5e-5},
    "d": {"task.knobs.digits": 7, "task.knobs.forget_carry_p": 0.3, "sft.steps": 400,
          "rollout.max_new_tokens": 80, "optimizer.learning_rate": 3e-5},
}


def get_config(arg=None):
    arg = tiny.parse(arg, steps=STEPS)
    config = tiny.recipe("grpo", steps=arg.steps)
    config.task.knobs.min_digits = 2
    config.task.knobs.extra_columns = 0   # the task's default, named so an entry can set it
    config.train.minibatches, config.train.epochs = 16, 1
    config.objective.kl.beta, config.train.ref_reset_every = 0.0, 0
    config.train.eval_at_start = True
    return config


def get_sweep():
    return list(SETTINGS.values())


def get_report():
    return {
        "primary": ("eval_accuracy", "last_k"),
        "table": (("eval_accuracy", "early"), ("eval_accuracy", "final"),
                  ("truncation_rate", "late"), ("clip_high", "late"), ("entropy", "late"),
                  ("response_length_wrong", "late"), ("response_length_correct", "late")),
        "plots": ("eval_accuracy", "truncation_rate", "clip_high", "entropy"),
        "labels": tuple(f"setting ({name})" for name in SETTINGS),
        "paired": (),
        "windows": MECHANISMS,
    }
