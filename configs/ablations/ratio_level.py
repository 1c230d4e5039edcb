"""Ablation: where the importance ratio acts: PPO's token ratio, GSPO, CISPO, SAPO.

Claims: GSPO (Zheng et al., arXiv:2507.18071, sec. 3-4) clips one sequence-level ratio
instead of every token's, which they find steadier (token ratios add high-variance noise
to the gradient) and more sample-efficient; CISPO (MiniMax-M1, arXiv:2506.13585, sec.
3.1) clips the ratio's weight but keeps every token's gradient; SAPO (Gao et al.,
arXiv:2511.20347) replaces the hard clip with a smooth gate.

Setting: each objective as its recipe defines it (loss kind, clip or gate, aggregation:
configs/grpo.py's ppo_clip 0.2/0.2 per-answer mean, gspo.py, cispo.py, sapo.py), at the
runlocal scale (16 prompts x 4 answers, 4 updates per batch), 200 steps, on 3-digit
addition, group-std advantages and no KL for all four.

Measured: the clip or gate activity (clip_low, clip_high: the share of tokens where a
bound binds, for GSPO the tokens of clipped answers, for CISPO where its weight is
capped; gate_scale: SAPO's factor on the gradient), the gradient norm, its spread over a
step's 4 updates (grad_norm_std) and over steps, and held-out accuracy.

    python -m grpo_jax.sweep --config configs/ablations/ratio_level.py \\
        --workdir_root runs/ratio_level --seeds 0,1,2 --parallel 2
    python -m grpo_jax.report runs/ratio_level
"""

from grpo_jax import config_lib

tiny = config_lib.load_sibling(__file__, "_tiny")



def get_config(arg=None):
    arg = tiny.parse(arg, steps=200)
    config = tiny.recipe("grpo", steps=arg.steps)
    config.objective.kl.beta = 0.0
    config.train.ref_reset_every = 0
    return config


def _objective_of(recipe):
    """``configs/<recipe>.py``'s loss kind, its clip range (SAPO: gate temperatures) and
    aggregation, as sweep overrides."""
    objective = config_lib.load_module(tiny.CONFIGS / f"{recipe}.py").get_config().objective
    loss = objective.loss
    knobs = ("tau_pos", "tau_neg") if loss.kind == "sapo" else ("eps_low", "eps_high")
    return {"objective.loss.kind": loss.kind,
            **{f"objective.loss.{knob}": loss[knob] for knob in knobs},
            "objective.aggregation.mode": objective.aggregation.mode}


def get_sweep():
    return [_objective_of(recipe) for recipe in ("grpo", "gspo", "cispo", "sapo")]


def get_report():
    return {
        # The one primary outcome (every other measure is secondary): held-out accuracy,
        # the mean of the last evaluations, paired by seed.
        "primary": ("eval_accuracy", "last_k"),
        "table": (("clip_low", "mean"), ("clip_high", "mean"), ("gate_scale", "mean"),
                  ("grad_norm", "mean"), ("grad_norm_std", "mean"), ("grad_norm", "std"),
                  ("eval_accuracy", "final")),
        "plots": ("grad_norm", "grad_norm_std", "clip_high", "eval_accuracy"),
        "labels": ("PPO token ratio (GRPO)", "GSPO", "CISPO", "SAPO"),
        # The spread of the gradient norm over steps, raw and divided by its mean (a
        # smaller gradient has a smaller spread at the same relative noise).
        "paired": (("eval_accuracy", "last_k"), ("eval_accuracy", "auc"),
                   ("grad_norm", "std"), ("grad_norm", "cv")),
    }
