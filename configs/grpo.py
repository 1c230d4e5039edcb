"""GRPO: group-normalised advantages, PPO clip, per-answer token mean, KL to a reference.

The objective of DeepSeekMath (eq. 3): A = (r - mean) / std within each group of G
answers, the symmetric clip 0.2, each answer's loss averaged over its own length
(seq-mean-token-mean), and the k3 KL estimate to a frozen reference in the loss.

Regime: DeepSeek-R1-Zero's GRPO run (the paper's Methods, "Training details"): 512
prompts x 16 answers per rollout, split into 16 minibatches for one epoch (16 updates,
off-policy after the first), up to 32,768 new tokens, learning rate 3e-6, KL coefficient
0.001, temperature 1, and the reference replaced by the current policy every 400 steps.
(DeepSeekMath itself made one update per rollout, where the clip can never act.)
``runlocal``: 16 prompts x 4 answers, 4 updates, 48 tokens (configs/base.py set_regime).

Papers: Shao et al., DeepSeekMath (arXiv:2402.03300), sec. 4.1; Guo et al.,
DeepSeek-R1 (arXiv:2501.12948 v2, sec. 2.1).
Sweep: `get_sweep()` ablates the std (population vs unbiased vs none).
Load: `config_lib.load_config("configs/grpo.py:runlocal=True")`.
"""

from grpo_jax import config_lib
from grpo_jax.objectives import presets


def get_config(arg=None):
    arg = config_lib.parse_arg(arg, runlocal=False)
    base = config_lib.load_sibling(__file__, "base")
    config = base.get_config(f"runlocal={arg.runlocal}")
    base.set_regime(config, prompts=512, group_size=16, updates=16, max_new_tokens=32768,
                    learning_rate=3e-6, warmup_steps=0, runlocal=arg.runlocal)
    config_lib.set_objective(config, presets.grpo(group_size=config.objective.group_size))
    config.train.ref_reset_every = 400
    return config


def get_sweep():
    """Dividing by the group std: population vs unbiased vs not at all (Dr. GRPO sec. 3.1)."""
    return [
        {"objective.advantage.ddof": 0},
        {"objective.advantage.ddof": 1},
        {"objective.advantage.scale": "none"},
    ]
