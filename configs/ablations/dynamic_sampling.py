"""Ablation: DAPO's dynamic sampling on and off, per generated token and per second.

Claim (Yu et al., DAPO, arXiv:2503.14476, sec. 3.2 and fig. 6): groups whose answers are
all right or all wrong have zero advantage and no gradient; drawing more prompts until
the batch holds only groups with signal costs more sampling per step but reaches a given
accuracy in fewer steps, and DAPO reports it sooner in wall time as well.

Setting: DAPO (configs/dapo.py: token-mean, clip 0.2/0.28) at the runlocal scale, 200
steps, on 3-digit addition, with the recipe's reward: correctness plus the soft overlong
penalty over the last 20% of the 48-token budget (38.4 to 48 tokens), which the 3-digit
answers (34 to 37 tokens) stay clear of. With dynamic sampling up to 10 prompt batches are
drawn per step and a batch still short is padded with masked groups
(filtering.short_batch = "pad"). Only filtering.dynamic_sampling changes.

Measured: held-out accuracy against the step, against the completion tokens generated
(every draw counted) and against the seconds spent sampling, scoring and updating
(time_rollout + time_old_logp + time_update: evaluation left out, compilation in the
first steps of both variants); the draws per step and the share of the batch with
signal. Seconds are comparable only between runs on an otherwise idle machine.

    python -m grpo_jax.sweep --config configs/ablations/dynamic_sampling.py \\
        --workdir_root runs/dynamic_sampling --seeds 0,1,2 --parallel 2
    python -m grpo_jax.report runs/dynamic_sampling
"""

from grpo_jax import config_lib

tiny = config_lib.load_sibling(__file__, "_tiny")

SECONDS = ("time_rollout", "time_old_logp", "time_update")


def get_config(arg=None):
    arg = tiny.parse(arg, steps=200)
    config = tiny.recipe("dapo", steps=arg.steps)
    config.filtering.short_batch = "pad"
    return config


def get_sweep():
    return [{"filtering.dynamic_sampling": on} for on in (False, True)]


def get_report():
    return {
        # The one primary outcome (every other measure is secondary): held-out accuracy,
        # the mean of the last evaluations, paired by seed.
        "primary": ("eval_accuracy", "last_k"),
        "table": (("eval_accuracy", "final"), ("generated_tokens", "sum"), ("time_rollout", "sum"),
                  ("time_update", "sum"), ("gen_batches", "mean"), ("batch_filled", "mean")),
        "plots": ("eval_accuracy", ("eval_accuracy", "generated_tokens"),
                  ("eval_accuracy", SECONDS), "batch_filled"),
        "labels": ("off", "on (up to 10 draws)"),
    }
