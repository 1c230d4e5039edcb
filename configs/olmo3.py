"""Olmo 3's RL recipe (OlmoRL): the common set of GRPO fixes in one config.

Groups with no signal dropped and refilled (active sampling), token-mean loss, clip
higher than lower (0.2/0.272), no KL, no division by the group's std, and truncated
importance sampling (cap 2) against the sampler/trainer log-prob mismatch.

Regime (Table 49, 7B Think): 64 prompts x 8 answers per batch, one optimizer step per
batch, 32,768 new tokens, learning rate 1e-6 constant. Olmo 3's learner runs up to 8
steps behind its samplers (fully asynchronous); ``rollout.policy_lag`` reproduces that
staleness: rollouts come from the parameters of `policy_lag` steps before (8 here).
``runlocal``: 16 prompts x 4 answers, 1 update, 48 tokens, lag 2
(configs/base.py set_regime).

Paper: Team Olmo, Olmo 3 (arXiv:2512.13961), sec. 4.4 (eq. 1-2) and Table 49.
Load: `config_lib.load_config("configs/olmo3.py:runlocal=True")`.
"""

from grpo_jax import config_lib
from grpo_jax.objectives import presets


def get_config(arg=None):
    arg = config_lib.parse_arg(arg, runlocal=False)
    base = config_lib.load_sibling(__file__, "base")
    config = base.get_config(f"runlocal={arg.runlocal}")
    base.set_regime(config, prompts=64, group_size=8, updates=1, max_new_tokens=32768,
                    learning_rate=1e-6, warmup_steps=0, runlocal=arg.runlocal)
    config.rollout.policy_lag = 2 if arg.runlocal else 8
    config_lib.set_objective(
        config,
        presets.dapo(
            group_size=config.objective.group_size, advantage_scale="none", eps_low=0.2,
            eps_high=0.272, importance=True, importance_level="token", importance_mode="truncate",
            importance_high=2.0,
        ),
    )
    config.filtering.dynamic_sampling = True
    config.filtering.max_gen_batches = 10
    return config
