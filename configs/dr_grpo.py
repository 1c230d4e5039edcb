"""Dr. GRPO: GRPO without its two length and difficulty biases.

Advantages are r - mean(group) with no division by the group's std (easy and hopeless
prompts are not amplified), and every answer's token sum is divided by one constant,
the completion budget (seq-mean-token-sum-norm), so long wrong answers are not diluted.
No KL; AdamW with beta2 0.95, as in the paper's Table 6.

Regime: the authors' Oat-Zero-7B script (the paper gives G, the budget and the clip in
Table 6, not the batch): 128 prompts x 8 answers per rollout, 8 optimizer steps of 128
answers (off-policy after the first), 3,000 new tokens, learning rate 1e-6 constant.
``runlocal``: 16 prompts x 4 answers, 4 updates, 48 tokens (configs/base.py set_regime).

Paper: Liu et al., Understanding R1-Zero-Like Training: A Critical Perspective
(arXiv:2503.20783), sec. 3.1 and Table 6.
Load: `config_lib.load_config("configs/dr_grpo.py:runlocal=True")`.
"""

from grpo_jax import config_lib
from grpo_jax.objectives import presets


def get_config(arg=None):
    arg = config_lib.parse_arg(arg, runlocal=False)
    base = config_lib.load_sibling(__file__, "base")
    config = base.get_config(f"runlocal={arg.runlocal}")
    base.set_regime(config, prompts=128, group_size=8, updates=8, max_new_tokens=3000,
                    learning_rate=1e-6, warmup_steps=0, runlocal=arg.runlocal)
    config.optimizer.b2 = 0.95
    config_lib.set_objective(config, presets.dr_grpo(
        group_size=config.objective.group_size, norm_len=config.rollout.max_new_tokens))
    # tied, so a command line that changes the budget moves the constant with it
    config.objective.aggregation.norm_len = config.rollout.get_ref("max_new_tokens")
    return config
