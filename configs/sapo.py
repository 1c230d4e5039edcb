"""SAPO: a smooth, asymmetric sigmoid gate instead of the hard clip.

Group-normalised advantages; each token's ratio passes through
f(r) = sigmoid(tau (r - 1)) * 4 / tau, which equals the plain policy gradient on-policy
and fades smoothly off-policy, a little faster for negative advantages
(tau_neg 1.05 > tau_pos 1.0). Per-answer aggregation (seq-mean-token-mean), no KL.

Paper: Gao et al., Soft Adaptive Policy Optimization (arXiv:2511.20347).
Load: `config_lib.load_config("configs/sapo.py:runlocal=True")`.
"""

from grpo_jax import config_lib


def get_config(arg=None):
    config = config_lib.load_sibling(__file__, "base").get_config(arg)
    obj = config.objective
    obj.advantage.scale = "group"
    obj.loss.kind = "sapo"
    obj.loss.tau_pos, obj.loss.tau_neg = 1.0, 1.05
    obj.aggregation.mode = "seq-mean-token-mean"
    obj.kl.beta = 0.0
    return config
