"""The long-answer testbed: a CPU setting where the mechanisms the ablations test act.

The runlocal regime (`_tiny.py`) leaves them idle: a 3-digit scratchpad takes 35 to 37
tokens whether it is right or wrong (wrong SFT targets average 34 tokens, right ones 35),
so nothing ties length to correctness and a 48-token budget cuts almost nothing; with 4
updates per rollout batch PPO's clip binds on about 0.1% of tokens. The testbed changes
three things, each measured on 4,000 SFT targets with the tiny model's tokenizer:

- **Wrong answers ramble.** The forgetful teacher (half the targets; it drops every
  carry, so its answers are wrong whenever the sum carries) works 0..20 more columns of
  zeros (``ramble_columns=20``, `grpo_jax.data.arithmetic`), and every solution 0..4
  (``extra_columns=4``), so right answers can change length too. Wrong targets (42%)
  average 130 tokens (median 130), right ones 63 (median 53); the correlation of length
  with being wrong is 0.62. The warm start learns that correlation (the dropped carry is
  visible in its own scratchpad before it decides how long to go on): seed 0's, in its
  first two RL batches, wrote wrong answers of 96 and 128 tokens on average and right
  ones of 59, and scored 0.77 greedy on the held-out prompts. Per-answer mean
  aggregation (GRPO) weighs each token of a long wrong answer less than token-mean
  (DAPO) or a constant divisor (Dr. GRPO, Liu et al., arXiv:2503.20783, sec. 3.1), so
  under it wrong answers have room to grow.
- **The budget binds.** 160 new tokens: 33% of wrong targets and 5.5% of right ones do
  not fit (the warm start's first batches: 14% and 25% of answers cut), so truncation,
  overlong masking and the soft penalty (its last fifth, from 128 tokens) act on a real
  share of answers (DAPO, arXiv:2503.14476, sec. 3.4).
- **Clips bind.** 16 optimizer updates per rollout batch (one epoch of 16 minibatches of
  4 answers; DAPO's own regime is 16 updates per batch), at learning rate 3e-5, the
  highest rate at which the stability frontier (`stability_frontier.py`) saw no run of
  any objective collapse at 16 updates; there PPO's clip bound on 0.42% of tokens (0.09%
  with 4 updates) and GSPO's on 35%; here, on long answers, PPO's on 0.4-0.5% in the
  first steps.

The rest is runlocal's: the 0.66M-parameter model from its SFT warm start (600 SFT steps
here, for the longer targets), 16 prompts x 4 answers, no KL, 500 held-out prompts,
evaluated 10 times. `STEPS` steps (runlocal's ablations take 200; a step here costs ~2x,
an evaluation ~10x).
"""

from grpo_jax import config_lib

tiny = config_lib.load_sibling(__file__, "_tiny")

STEPS = 100
MAX_NEW_TOKENS = 160
# The report's mechanism table: whether each mechanism the ablations test still acts, per
# 10-step window (held-out accuracy; the wrong-minus-right answer length; the share of
# answers cut by the budget; the share of tokens each clip bound binds; entropy).
MECHANISMS = {"size": 10, "measures": (
    "eval_accuracy", "response_length_wrong - response_length_correct", "truncation_rate",
    "clip_low", "clip_high", "entropy")}


def parse(arg, steps=STEPS):
    """``steps=N`` trains for N steps instead (e.g. a smoke run)."""
    return tiny.parse(arg, steps)


def recipe(name, *, steps):
    """``configs/<name>.py:runlocal=True`` on the testbed (see the module doc)."""
    config = tiny.recipe(name, steps=steps)
    config.task.knobs.extra_columns = 4
    config.task.knobs.ramble_columns = 20
    config.rollout.max_new_tokens = MAX_NEW_TOKENS
    config.train.minibatches, config.train.epochs = 16, 1
    config.optimizer.learning_rate = 3e-5
    config.objective.kl.beta, config.train.ref_reset_every = 0.0, 0
    config.sft.steps = 600
    return config
