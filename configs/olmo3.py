"""Olmo 3's RL recipe: the common set of GRPO fixes in one config.

Groups with no signal dropped and refilled (active sampling), token-mean loss, clip
higher than lower (0.2/0.28), no KL, no division by the group's std, and truncated
importance sampling (cap 2) against the sampler/trainer log-prob mismatch.

Paper: Team Olmo, Olmo 3 (arXiv:2512.13961), the RL (OlmoRL) section.
Load: `config_lib.load_config("configs/olmo3.py:runlocal=True")`.
"""

from grpo_jax import config_lib


def get_config(arg=None):
    config = config_lib.load_sibling(__file__, "base").get_config(arg)
    obj = config.objective
    obj.advantage.scale = "none"
    obj.loss.eps_low, obj.loss.eps_high = 0.2, 0.28
    obj.aggregation.mode = "token-mean"
    obj.kl.beta = 0.0
    obj.importance.enabled = True
    obj.importance.level = "token"
    obj.importance.cap = 2.0
    obj.importance.mode = "truncate"
    config.filtering.dynamic_sampling = True
    return config
