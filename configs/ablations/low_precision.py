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
no KL), `STEPS` steps. The sampler holds the weights in 4-bit FP4 E2M1 with one scale per
16 weights, as NVFP4 rollouts do (QeRL, Huang et al., arXiv:2510.11696), computing in
bfloat16 (``rollout.dtype="float4_e2m1fn"``, `policy.quantised_weights`), x the
correction: none (PPO-clip 0.2/0.2, the arm every other is paired against), TIS
(``objective.importance``, token level, truncated at 2), MIS / IcePop (token level,
masked outside [0.5, 5]) and CISPO (configs/cispo.py's loss, no importance weight); and
the float32 sampler without a correction, which measures what the precision itself
costs. pi_old is recomputed by the trainer in float32 (``train.old_logp="recompute"``), so
every correction weighs pi_old against the sampler's own log-probs.

Measured: held-out greedy accuracy (the primary outcome: the mean of each run's last
evaluations; evaluation samples with the trainer's float32 parameters), and the
mechanism: the sampler/trainer gap (mismatch/abs_diff_mean, mismatch/k3_kl,
mismatch/chi2_token) and how often the correction acts (importance_truncated,
importance_masked, clip_low / clip_high).

Why FP4 (measured before the seeds on an AMD EPYC; the runs are not committed): with a
bf16 sampler (15 runs of seeds 0-1 at 13428fe and fa6bed5) the sampler is 1.1-1.5e-3
nats per token from the fp32 trainer on this 0.66M-parameter model and IcePop masks 9e-6
of the tokens (the mechanism idle). 20-step runs of seed 0 with IcePop: FP8 E4M3 weights
(at 08e8e1d, one scale per channel of the last axis, before the groups of 128) move it to
4e-3 to 1e-2 nats, the largest gap 0.4-1.1 nats, IcePop masking 0 to 1e-3; FP4 E2M1 (at
628b873, blocks of 16 as run here) to 1.3-4.4e-2 nats (k3 KL
4e-3 to 1.8e-2, 50-100x bf16's), the largest gap 1.5-3.5 nats, and IcePop masks 0.3-1.3%
of the tokens in every step: the corrections act.

Seeds: 8, the fewest that detect a 0.05 gap with power 0.8 at a pooled paired sd of 0.04
(`report.stats.seeds_needed`; the committed runlocal ablations' primary outcomes had
0.02-0.13, 0.38 where runs collapsed):

    python -m grpo_jax.sweep --config configs/ablations/low_precision.py \\
        --workdir_root runs/low_precision --seeds 0,1,2,3,4,5,6,7 --parallel 2
    python -m grpo_jax.report runs/low_precision
"""

from grpo_jax import config_lib

tiny = config_lib.load_sibling(__file__, "_tiny")
ratio_level = config_lib.load_sibling(__file__, "ratio_level")

STEPS = 100
LOW = "float4_e2m1fn"   # the sampler's weight format (`policy.WEIGHT_FORMATS`)
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
    """FP4 rollouts x every correction ("none" first: the paired baseline), then float32
    rollouts without a correction."""
    return ([{"rollout.dtype": LOW, **CORRECTIONS[correction]} for correction in CORRECTIONS]
            + [{"rollout.dtype": ""}])


def get_report():
    return {
        "primary": ("eval_accuracy", "last_k"),
        "table": (("eval_accuracy", "final"), ("mismatch/abs_diff_mean", "mean"),
                  ("mismatch/k3_kl", "mean"), ("mismatch/chi2_token", "mean"),
                  ("importance_truncated", "mean"), ("importance_masked", "mean"),
                  ("clip_low", "mean"), ("clip_high", "mean")),
        "plots": ("eval_accuracy", "mismatch/abs_diff_mean", "mismatch/k3_kl"),
        "labels": (*(f"fp4 rollouts, {correction}" for correction in CORRECTIONS),
                   "fp32 rollouts, none"),
        "paired": (("eval_accuracy", "last_k"), ("eval_accuracy", "auc"),
                   ("mismatch/k3_kl", "mean")),
    }
