"""GSPO: one importance ratio per answer, the geometric mean of its token ratios.

Group-normalised advantages; the sequence ratio s_i = (pi/pi_old)(y_i)^(1/|y_i|) is
clipped to [1 - 3e-4, 1 + 4e-4] as a whole (a sequence ratio moves far less than token
ratios do); aggregated per answer (seq-mean-token-mean, the only mode that is GSPO's
objective: others are rejected unless objective.aggregation.allow_other_modes). No KL.
Made for MoE models, whose token ratios are noisy when routing shifts.

Regime (sec. 5.1): each rollout batch split into 4 minibatches (4 updates, off-policy
after the first). The paper gives no batch, G or budget; these follow verl's GSPO
recipe: 512 prompts x 16 answers, 8,192 new tokens, learning rate 1e-6.
``runlocal``: 16 prompts x 4 answers, 4 updates, 48 tokens (configs/base.py set_regime).

Paper: Zheng et al., Group Sequence Policy Optimization (arXiv:2507.18071), eq. 5-7, sec. 5.1.
Load: `config_lib.load_config("configs/gspo.py:runlocal=True")`.
"""

from grpo_jax import config_lib
from grpo_jax.objectives import presets


def get_config(arg=None):
    arg = config_lib.parse_arg(arg, runlocal=False)
    base = config_lib.load_sibling(__file__, "base")
    config = base.get_config(f"runlocal={arg.runlocal}")
    base.set_regime(config, prompts=512, group_size=16, updates=4, max_new_tokens=8192,
                    learning_rate=1e-6, warmup_steps=0, runlocal=arg.runlocal)
    config_lib.set_objective(config, presets.gspo(group_size=config.objective.group_size))
    return config
