"""DAPO: clip-higher, token-level loss, dynamic sampling, soft overlong penalty.

Group-normalised advantages; PPO clip with eps_low 0.2 and eps_high 0.28 so rare tokens
can grow; the loss averaged over all tokens of the batch (token-mean); groups whose
answers all score the same are dropped and more prompts drawn until the batch is full
(dynamic sampling; at most 10 draws, as the authors' verl recipe, then an error); and the
soft length penalty as a reward over the last fifth of the budget (4,096 of 20,480
tokens). No KL.

Regime (sec. 4.1): 512 prompts x 16 answers per rollout, mini-batches of 512 answers:
16 updates per rollout (off-policy after the first), 20,480 new tokens, learning rate
1e-6 with 20 warmup steps.
``runlocal``: 16 prompts x 4 answers, 4 updates, 48 tokens (configs/base.py set_regime).

Paper: Yu et al., DAPO: An Open-Source LLM Reinforcement Learning System at Scale
(arXiv:2503.14476), sec. 3 (eq. 8-13) and 4.1.
Sweep: `get_sweep()` crosses clip-higher with the loss aggregation (DAPO sec. 3.1 and 3.3).
Load: `config_lib.load_config("configs/dapo.py:runlocal=True")`.
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
    config_lib.set_objective(config, presets.dapo(group_size=config.objective.group_size))
    config.filtering.dynamic_sampling = True
    config.filtering.max_gen_batches = 10
    return config


def get_sweep():
    """Clip-higher on/off crossed with the aggregation mode."""
    return [{"objective.loss.eps_high": eps_high, "objective.aggregation.mode": mode}
            for eps_high in (0.2, 0.28)
            for mode in ("token-mean", "seq-mean-token-mean")]
