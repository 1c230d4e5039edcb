"""Ablation: low-precision rollouts (a bf16 sampler, an fp32 trainer) and their corrections.

Claims: a sampler that computes in lower precision than the trainer samples from another
policy than the one the trainer differentiates, so training on its tokens is off-policy by
pi_trainer / pi_sampler, which destabilises RL; weighting each token by that ratio,
truncated above (TIS: Yao et al., "Your Efficient RL Framework Secretly Brings You
Off-Policy RL Training", 2025) or masked outside a band (MIS / IcePop: Ring-1T,
arXiv:2510.18855), corrects it; MiniMax-M1 (arXiv:2506.13585) traced its own
training/inference probability gap to the precision of its LM head and trains with
CISPO, whose clipped weight keeps every token's gradient.

Setting: the runlocal regime of configs/grpo.py (16 prompts x 4 answers, 4 updates per
batch, 48 new tokens, 3-digit addition, the 0.66M-parameter model from its SFT warm start,
no KL), `STEPS` steps, x the sampler's precision (``rollout.dtype``: "" samples with the
trainer's float32 parameters, "bfloat16" with a bf16 copy computing in bf16, cast once per
step) x the correction: none (PPO-clip 0.2/0.2), TIS (``objective.importance``, token
level, truncated at 2), MIS / IcePop (token level, masked outside [0.5, 5]) and CISPO
(configs/cispo.py's loss, no importance weight). pi_old is recomputed by the trainer in
float32 (``train.old_logp="recompute"``), so every correction weighs pi_old against the
sampler's own log-probs. With float32 rollouts the weights are 1 up to rounding: the
control.

Measured: held-out greedy accuracy (the primary outcome: the mean of each run's last
evaluations), and the mechanism: the sampler/trainer gap (mismatch/abs_diff_mean,
mismatch/k3_kl, mismatch/chi2_token) and how often the correction acts
(importance_truncated, importance_masked, clip_low / clip_high). The tiny model's bf16 gap
is ~1e-3 nats per token (tests/training/test_rollout_dtype.py); read the mismatch columns
before reading the accuracy as "no effect".

Measured before the seeds (15 of the 64 runs, seeds 0-1, AMD EPYC at 13428fe and
fa6bed5; the runs are not committed): the mechanism does not act here. bf16 rollouts put
the sampler's log-probs 1.1-1.5e-3 nats per token from the trainer's (mean absolute
difference; k3 KL 5e-5 to 1.2e-4), so TIS truncates no token and IcePop masks 9e-6 of
them; with fp32 rollouts the TIS and IcePop runs are identical to each other. On this
0.66M-parameter model (a 512-entry vocabulary) the claim is untested; it needs a sampler
whose gap reaches the corrections' bounds (a larger vocabulary and LM head, as MiniMax-M1
traced, or a coarser sampler precision) before the seeds below are worth running.

Seeds: 8, the fewest that detect a 0.05 gap with power 0.8 at a pooled paired sd of 0.04
(`report.stats.seeds_needed`; the committed runlocal ablations' primary outcomes had
0.02-0.13, 0.38 where runs collapsed):

    python -m grpo_jax.sweep --config configs/ablations/low_precision.py \\
        --workdir_root runs/low_precision --seeds 0,1,2,3,4,5,6,7 --parallel 2
    python -m grpo_jax.report runs/low_precision
"""

import itertools

from grpo_jax import config_lib

tiny = config_lib.load_sibling(__file__, "_tiny")
ratio_level = config_lib.load_sibling(__file__, "ratio_level")

STEPS = 100
PRECISIONS = ("", "bfloat16")   # "": the trainer's model.dtype (float32)
CORRECTIONS = {
    "none": {},
    "tis": {"objective.importance.enabled": True, "objective.importance.level": "token",
            "objective.importance.mode": "truncate"},
    "icepop": {"objective.importance.enabled": True, "objective.importance.level": "token",
               "objective.importance.mode": "mask"},
    "cispo": ratio_level._objective_of("cispo"),
}


def get_config(arg=None):
    arg = tiny.parse(arg, steps=STEPS)
    config = tiny.recipe("grpo", steps=arg.steps)
    config.objective.kl.beta = 0.0
    config.train.ref_reset_every = 0
    return config


def get_sweep():
    return [{"rollout.dtype": dtype, **CORRECTIONS[correction]}
            for dtype, correction in itertools.product(PRECISIONS, CORRECTIONS)]


def get_report():
    return {
        "primary": ("eval_accuracy", "last_k"),
        "table": (("eval_accuracy", "final"), ("mismatch/abs_diff_mean", "mean"),
                  ("mismatch/k3_kl", "mean"), ("mismatch/chi2_token", "mean"),
                  ("importance_truncated", "mean"), ("importance_masked", "mean"),
                  ("clip_low", "mean"), ("clip_high", "mean")),
        "plots": ("eval_accuracy", "mismatch/abs_diff_mean", "mismatch/k3_kl"),
        "labels": tuple(f"{'bf16' if dtype else 'fp32'} rollouts, {correction}"
                        for dtype, correction in itertools.product(PRECISIONS, CORRECTIONS)),
        "paired": (("eval_accuracy", "last_k"), ("eval_accuracy", "auc"),
                   ("mismatch/k3_kl", "mean")),
    }
