"""RLOO: REINFORCE with a leave-one-out baseline, on-policy.

Each answer's baseline is the mean reward of the other k - 1 answers to the same
prompt, A_i = k/(k-1) (r_i - mean): unbiased, no critic, no std. The paper argues that
PPO's clipping is unnecessary for LLMs and trains on-policy with plain REINFORCE: one
update per rollout batch with the unclipped policy gradient (loss "pg": -r A, whose
gradient at r = 1 is -A grad log pi). Token-mean aggregation, no KL here.

Regime: k = 4 answers per prompt, one update per rollout batch; the paper's batch and
budget are not reproduced here (its tasks are TL;DR and Anthropic-HH with reward
models): 128 prompts x 4 answers, 1,024 new tokens, learning rate 1e-6.
``runlocal``: 16 prompts x 4 answers, 1 update, 48 tokens (configs/base.py set_regime).

Paper: Ahmadian et al., Back to Basics: Revisiting REINFORCE-Style Optimization for
Learning from Human Feedback in LLMs (arXiv:2402.14740).
Load: `config_lib.load_config("configs/rloo.py:runlocal=True")`.
"""

from grpo_jax import config_lib
from grpo_jax.objectives import presets


def get_config(arg=None):
    arg = config_lib.parse_arg(arg, runlocal=False)
    base = config_lib.load_sibling(__file__, "base")
    config = base.get_config(f"runlocal={arg.runlocal}")
    base.set_regime(config, prompts=128, group_size=4, updates=1, max_new_tokens=1024,
                    learning_rate=1e-6, warmup_steps=0, runlocal=arg.runlocal)
    config_lib.set_objective(config, presets.rloo(group_size=config.objective.group_size))
    return config
