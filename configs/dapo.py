"""DAPO: clip-higher, token-level loss, dynamic sampling, soft overlong penalty.

Group-normalised advantages; PPO clip with eps_low 0.2 and eps_high 0.28 so rare tokens
can grow; the loss averaged over all tokens of the batch (token-mean); groups whose
answers all score the same are dropped and more prompts drawn (dynamic sampling); and a
soft length penalty over the last fifth of the response budget. No KL.

Paper: Yu et al., DAPO: An Open-Source LLM Reinforcement Learning System at Scale
(arXiv:2503.14476), sec. 3 (eq. 8-13).
Sweep: `get_sweep()` crosses clip-higher with the loss aggregation (DAPO sec. 3.1 and 3.3).
Load: `config_lib.load_config("configs/dapo.py:runlocal=True")`.
"""

from grpo_jax import config_lib


def get_config(arg=None):
    config = config_lib.load_sibling(__file__, "base").get_config(arg)
    obj = config.objective
    obj.advantage.scale = "group"
    obj.aggregation.mode = "token-mean"
    obj.loss.eps_low, obj.loss.eps_high = 0.2, 0.28
    obj.kl.beta = 0.0
    obj.overlong.mode = "penalty"
    # DAPO: 4,096 of 20,480 tokens; the same fifth of whatever budget is configured.
    obj.overlong.cache_len = config.rollout.get_ref("max_new_tokens") // 5
    config.filtering.dynamic_sampling = True
    return config


def get_sweep():
    """Clip-higher on/off crossed with the aggregation mode."""
    return [{"objective.loss.eps_high": eps_high, "objective.aggregation.mode": mode}
            for eps_high in (0.2, 0.28)
            for mode in ("token-mean", "seq-mean-token-mean")]
