"""CISPO: clip the importance weight, keep every token's gradient.

Group-normalised advantages; the loss -sg(clip(r, 1 - eps_low, 1 + eps_high)) A log pi
never zeroes a token, so rare reflective tokens ("Wait", "However") keep learning.
As in MiniMax-M1 only the upper bound is used: eps_low = 1 makes the lower bound 0,
which a ratio never crosses; the weight is capped at 1 + eps_high = 4 (MiniMax-M1 tunes
eps_high without publishing it; 4 is the cap ScaleRL-style setups use). Token-mean
aggregation, no KL.

Paper: MiniMax, MiniMax-M1 (arXiv:2506.13585), sec. 3.1, eq. 4-5.
Load: `config_lib.load_config("configs/cispo.py:runlocal=True")`.
"""

from grpo_jax import config_lib


def get_config(arg=None):
    config = config_lib.load_sibling(__file__, "base").get_config(arg)
    obj = config.objective
    obj.advantage.scale = "group"
    obj.loss.kind = "cispo"
    obj.loss.eps_low, obj.loss.eps_high = 1.0, 3.0
    obj.aggregation.mode = "token-mean"
    obj.kl.beta = 0.0
    return config
