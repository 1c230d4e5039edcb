"""RLOO: REINFORCE with a leave-one-out baseline.

Each answer's baseline is the mean reward of the other G - 1 answers to the same
prompt, A_i = G/(G-1) (r_i - mean): unbiased, no critic, no std. PPO clip 0.2/0.2,
token-mean aggregation, no KL.

Paper: Ahmadian et al., Back to Basics: Revisiting REINFORCE-Style Optimization for
Learning from Human Feedback in LLMs (arXiv:2402.14740).
Load: `config_lib.load_config("configs/rloo.py:runlocal=True")`.
"""

from grpo_jax import config_lib


def get_config(arg=None):
    config = config_lib.load_sibling(__file__, "base").get_config(arg)
    obj = config.objective
    obj.advantage.estimator = "rloo"
    obj.loss.eps_low, obj.loss.eps_high = 0.2, 0.2
    obj.aggregation.mode = "token-mean"
    obj.kl.beta = 0.0
    return config
