"""REINFORCE++: token returns whitened over the whole batch, not per group.

The reward sits on each answer's last token, returns are discounted back over the
answer, and all valid tokens of the batch are whitened together (global normalisation
instead of GRPO's per-group std). PPO clip 0.2/0.2 with mini-batch updates,
token-mean aggregation.

Arguments: ``kl_in_reward=True`` folds -beta * KL(pi_old || pi_ref) (k1) into the token
rewards (the paper's KL-in-reward; beta 0.01 as OpenRLHF's example) instead of having no
KL; ``baseline=True`` subtracts each group's mean reward first (REINFORCE++-baseline).

Regime: OpenRLHF's REINFORCE++ example, which the paper's code is: rollouts of 1,024
answers, optimizer steps of 128 answers (8 updates, off-policy after the first), 1,024
new tokens, learning rate 5e-7; 4 answers per prompt (the example's group option; the
paper allows k >= 1), so 256 prompts.
``runlocal``: 16 prompts x 4 answers, 4 updates, 48 tokens (configs/base.py set_regime).

Paper: Hu, REINFORCE++: A Simple and Efficient Approach for Aligning Large Language
Models (arXiv:2501.03262), sec. 3 (eq. 4-7).
Load: `config_lib.load_config("configs/reinforce_pp.py:runlocal=True,kl_in_reward=True")`.
"""

from grpo_jax import config_lib
from grpo_jax.objectives import presets


def get_config(arg=None):
    arg = config_lib.parse_arg(arg, runlocal=False, kl_in_reward=False, baseline=False)
    base = config_lib.load_sibling(__file__, "base")
    config = base.get_config(f"runlocal={arg.runlocal}")
    base.set_regime(config, prompts=256, group_size=4, updates=8, max_new_tokens=1024,
                    learning_rate=5e-7, warmup_steps=0, runlocal=arg.runlocal)
    config_lib.set_objective(
        config,
        presets.reinforce_pp(
            group_size=config.objective.group_size, baseline=arg.baseline,
            kl_in_reward=arg.kl_in_reward,
        ),
    )
    return config
