"""GSPO: one importance ratio per answer, the geometric mean of its token ratios.

Group-normalised advantages; the sequence ratio s_i = (pi/pi_old)(y_i)^(1/|y_i|) is
clipped to [1 - 3e-4, 1 + 4e-4] as a whole (the paper's ranges: a sequence ratio moves
far less than token ratios do); aggregated per answer (seq-mean-token-mean), which makes
the token-form loss exactly GSPO's sequence objective. No KL. Made for MoE models, whose
token ratios are noisy when routing shifts.

Paper: Zheng et al., Group Sequence Policy Optimization (arXiv:2507.18071), eq. 5-7.
Load: `config_lib.load_config("configs/gspo.py:runlocal=True")`.
"""

from grpo_jax import config_lib


def get_config(arg=None):
    config = config_lib.load_sibling(__file__, "base").get_config(arg)
    obj = config.objective
    obj.advantage.scale = "group"
    obj.loss.kind = "gspo"
    obj.loss.eps_low, obj.loss.eps_high = 3e-4, 4e-4
    obj.aggregation.mode = "seq-mean-token-mean"
    obj.kl.beta = 0.0
    return config
