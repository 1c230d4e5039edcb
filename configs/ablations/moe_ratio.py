"""Ablation: token ratios of an MoE policy, GSPO's sequence ratio and keep routing.

Claims: in a mixture-of-experts policy the experts a token is routed to change between
the forward that sampled it and the trainer's forwards (after an update, or by rounding),
so each token's ratio pi_theta / pi_old mixes the policy's change with a routing change;
these noisy token ratios make GRPO's token-level clip unstable, and GSPO's one
sequence-level ratio per answer is robust to them without any routing fix (Zheng et al.,
arXiv:2507.18071, sec. 5.3, where GRPO needs "routing replay" to converge on MoE models).
Keep routing (DeepSeek-V3.2, arXiv:2512.02556, sec. 3.1) is the other fix: the training
forward replays the sampler's experts, so both policies use the same expert parameters.

Setting: configs/grpo.py's runlocal regime (16 prompts x 4 answers, 48 new tokens,
3-digit addition, no KL) on the tiny MoE (``tiny_moe``: 3 layers of 8 routed experts,
top 2, ~1.4M parameters) from its SFT warm start, with `UPDATES` optimizer updates per
rollout batch (8 answers each), so the later updates run on parameters whose router has
moved off the sampler's; `STEPS` steps, evaluated from step 0 (``train.eval_at_start``).
Variants: GRPO (PPO-clip 0.2/0.2 on token ratios), GSPO (configs/gspo.py's loss and
clip), GRPO + keep routing (``rollout.keep_routing``).

Measured: held-out greedy accuracy (the primary outcome: the mean of each run's last
evaluations), the mechanism (``routing_churn``: the share of loss tokens x MoE layers whose
top-k experts the trainer's router picks differently from the sampler's, the set the
replay overrides with keep routing; ``log_ratio_std``: the spread of the token
log-ratios), the clip activity, and collapse: held-out accuracy below half the step-0
value at 2 consecutive evaluations (read from the accuracy curves).

Measured before the seeds (a 20-step GRPO run of seed 0, evaluated every 2 steps; AMD
EPYC at df28e6f; not committed): the mechanism acts. The trainer's router picks
other experts than the sampler's for 1.5-5% of (token, MoE layer) pairs in every step, the
token log-ratios spread by 0.05-0.25 (std), and the clips bind on 0.1-1.6% (lower) and
0-0.4% (upper) of tokens. Held-out accuracy moves 0.36 -> 0.68-0.91, swinging by up to
0.2 between evaluations two steps apart, which is what the collapse and AUC measures read.

Seeds: 8, the fewest that detect a 0.05 gap with power 0.8 at a pooled paired sd of 0.04
(`report.stats.seeds_needed`; the committed runlocal ablations' primary outcomes had
0.02-0.13, 0.38 where runs collapsed):

    python -m grpo_jax.sweep --config configs/ablations/moe_ratio.py \\
        --workdir_root runs/moe_ratio --seeds 0,1,2,3,4,5,6,7 --parallel 2
    python -m grpo_jax.report runs/moe_ratio
"""

from grpo_jax import config_lib

tiny = config_lib.load_sibling(__file__, "_tiny")
ratio_level = config_lib.load_sibling(__file__, "ratio_level")

STEPS = 100
UPDATES = 8


def get_config(arg=None):
    arg = tiny.parse(arg, steps=STEPS)
    config = tiny.recipe("grpo", steps=arg.steps)
    config.model.name = "tiny_moe"
    config.objective.kl.beta = 0.0
    config.train.ref_reset_every = 0
    config.train.minibatches, config.train.epochs = UPDATES, 1
    config.train.eval_at_start = True
    return config


def get_sweep():
    return [ratio_level._objective_of("grpo"), ratio_level._objective_of("gspo"),
            {**ratio_level._objective_of("grpo"), "rollout.keep_routing": True}]


def get_report():
    return {
        "primary": ("eval_accuracy", "last_k"),
        "table": (("eval_accuracy", "final"), ("eval_accuracy", "early"),
                  ("routing_churn", "mean"), ("routing_churn", "late"),
                  ("log_ratio_std", "mean"), ("clip_low", "mean"), ("clip_high", "mean"),
                  ("grad_norm", "std")),
        "plots": ("eval_accuracy", "routing_churn", "log_ratio_std", "clip_high"),
        "labels": ("GRPO (token ratio)", "GSPO", "GRPO + keep routing"),
        "paired": (("eval_accuracy", "last_k"), ("eval_accuracy", "auc"),
                   ("log_ratio_std", "mean")),
    }
