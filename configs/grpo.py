"""GRPO: group-normalised advantages, PPO clip, per-answer token mean, KL to a reference.

The original recipe of DeepSeekMath and DeepSeek-R1: A = (r - mean) / std within each
group of G answers, the symmetric clip 0.2, each answer's loss averaged over its own
length (seq-mean-token-mean), and a k3 KL penalty (beta 0.04) to a frozen reference.

Paper: Shao et al., DeepSeekMath (arXiv:2402.03300), sec. 4.1.
Sweep: `get_sweep()` ablates the std (population vs unbiased vs none).
Load: `config_lib.load_config("configs/grpo.py:runlocal=True")`.
"""

from grpo_jax import config_lib


def get_config(arg=None):
    config = config_lib.load_sibling(__file__, "base").get_config(arg)
    obj = config.objective
    obj.advantage.scale = "group"
    obj.aggregation.mode = "seq-mean-token-mean"
    obj.loss.eps_low, obj.loss.eps_high = 0.2, 0.2
    obj.kl.beta = 0.04
    obj.kl.kind = "k3"
    return config


def get_sweep():
    """Dividing by the group std: population vs unbiased vs not at all (Dr. GRPO sec. 3.1)."""
    return [
        {"objective.advantage.ddof": 0},
        {"objective.advantage.ddof": 1},
        {"objective.advantage.scale": "none"},
    ]
