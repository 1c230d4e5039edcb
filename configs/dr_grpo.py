"""Dr. GRPO: GRPO without its two length and difficulty biases.

Advantages are r - mean(group) with no division by the group's std (easy and hopeless
prompts are not amplified), and every answer's token sum is divided by one constant,
the maximum response length (seq-mean-token-sum-norm), so long wrong answers are not
diluted. No KL.

Paper: Liu et al., Understanding R1-Zero-Like Training: A Critical Perspective
(arXiv:2503.20783), sec. 3.1.
Load: `config_lib.load_config("configs/dr_grpo.py:runlocal=True")`.
"""

from grpo_jax import config_lib


def get_config(arg=None):
    config = config_lib.load_sibling(__file__, "base").get_config(arg)
    obj = config.objective
    obj.advantage.scale = "none"
    obj.aggregation.mode = "seq-mean-token-sum-norm"
    obj.aggregation.norm_len = config.rollout.get_ref("max_new_tokens")
    obj.loss.eps_low, obj.loss.eps_high = 0.2, 0.2
    obj.kl.beta = 0.0
    return config
