"""CISPO: clip the importance weight, keep every token's gradient.

Group-normalised advantages; the loss -sg(clip(r, 1 - eps_low, 1 + eps_high)) A log pi
never zeroes a token, so rare reflective tokens ("Wait", "However") keep learning.
As in MiniMax-M1 only the upper bound is used: eps_low = 1 makes the lower bound 0,
which a ratio never crosses; the weight is capped at 1 + eps_high = 1.28 (MiniMax-M1 tunes
eps_high without publishing it; 0.28 is DAPO's clip-higher, the common default of CISPO
implementations). Token-mean aggregation, no KL, and DAPO's dynamic sampling and soft
length penalty, which MiniMax-M1 uses with it (sec. 3.1).

Regime: "16 rounds of off-policy updates per generation batch" (sec. 3.1); the paper's
zero-RL comparison runs on DAPO's setting, so the rest is DAPO's: 512 prompts x 16
answers, 20,480 new tokens, learning rate 1e-6 with 20 warmup steps.
``runlocal``: 16 prompts x 4 answers, 4 updates, 48 tokens (configs/base.py set_regime).

Paper: MiniMax, MiniMax-M1 (arXiv:2506.13585), sec. 3.1, eq. 4-5.
Load: `config_lib.load_config("configs/cispo.py:runlocal=True")`.
"""

from grpo_jax import config_lib
from grpo_jax.objectives import presets


def get_config(arg=None):
    arg = config_lib.parse_arg(arg, runlocal=False)
    base = config_lib.load_sibling(__file__, "base")
    config = base.get_config(f"runlocal={arg.runlocal}")
    base.set_regime(config, prompts=512, group_size=16, updates=16, max_new_tokens=20480,
                    learning_rate=1e-6, warmup_steps=20, runlocal=arg.runlocal)
    config.reward.specs = (*config.reward.specs, ("overlong", 1.0, {"cache_fraction": 0.2}))
    config_lib.set_objective(config, presets.cispo(group_size=config.objective.group_size))
    config.filtering.dynamic_sampling = True
    config.filtering.max_gen_batches = 10
    return config
