"""GDPO: several rewards, each normalised within its group before they are summed.

With K rewards per answer (e.g. correctness and format), normalising their sum once
lets the widest-ranging reward drown the others; GDPO normalises each reward within its
group, takes the weighted sum, then normalises that over the batch. PPO clip 0.2/0.28,
token-mean aggregation, no KL. The rollout must deliver rewards as [B, K] columns in the
order of `objective.advantage.reward_weights`.

Paper: GDPO: Group reward-Decoupled Normalization Policy Optimization (Jan 2026).
Load: `config_lib.load_config("configs/gdpo.py:runlocal=True")`.
"""

from grpo_jax import config_lib


def get_config(arg=None):
    config = config_lib.load_sibling(__file__, "base").get_config(arg)
    obj = config.objective
    obj.advantage.estimator = "gdpo"
    obj.advantage.reward_weights = (1.0, 1.0)
    obj.loss.eps_low, obj.loss.eps_high = 0.2, 0.28
    obj.aggregation.mode = "token-mean"
    obj.kl.beta = 0.0
    return config
