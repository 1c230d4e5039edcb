"""GDPO: several rewards, each normalised within its group before they are summed.

With K rewards per answer (e.g. correctness and format), normalising their sum once
lets the widest-ranging reward drown the others; GDPO normalises each reward within its
group, takes the weighted sum, then normalises that over the batch. PPO clip 0.2/0.28,
token-mean aggregation, no KL. Here the rewards are correctness and DAPO's soft length
penalty, weighted 1 and 0.5 after normalisation (`objective.advantage.reward_weights`, in
the order of `reward.specs`).

Paper: Liu et al., GDPO: Group reward-Decoupled Normalization Policy Optimization for
Multi-reward RL Optimization (arXiv:2601.05242).
Load: `config_lib.load_config("configs/gdpo.py:runlocal=True")`.
"""

from grpo_jax import config_lib


def get_config(arg=None):
    arg = config_lib.parse_arg(arg, runlocal=False)
    config = config_lib.load_sibling(__file__, "base").get_config(f"runlocal={arg.runlocal}")
    # Correctness and DAPO's soft length penalty as two separately normalised rewards.
    correct = config.reward.correct
    cache = config.rollout.max_new_tokens // 5
    config.reward.specs = ((correct, 1.0),
                           ("overlong", 1.0, {"max_len": config.rollout.max_new_tokens,
                                              "cache_len": cache}))
    obj = config.objective
    obj.advantage.estimator = "gdpo"
    obj.advantage.reward_weights = (1.0, 0.5)
    obj.loss.eps_low, obj.loss.eps_high = 0.2, 0.28
    obj.aggregation.mode = "token-mean"
    obj.kl.beta = 0.0
    return config
