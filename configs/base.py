"""The base config: every default of every recipe, set once.

Recipes in this folder start from `get_config` here and change only the fields that
make them what they are. Nothing in grpo_jax reads a field with a fallback default,
so a field missing here is a bug, not an option.

Arguments (after the colon of a config path): ``runlocal`` shrinks the run to the tiny
CPU model and a few prompts, so any recipe runs on a laptop.
"""

from ml_collections import config_dict

from grpo_jax import config_lib


def get_config(arg=None):
    arg = config_lib.parse_arg(arg, runlocal=False)
    config = config_dict.ConfigDict()
    config.seed = 0

    # Rollouts: P prompts x G completions, laid out consecutively (DESIGN.md).
    config.rollout = config_dict.ConfigDict()
    config.rollout.prompts_per_batch = 64
    config.rollout.max_new_tokens = 1024
    config.rollout.temperature = 1.0

    # DAPO dynamic sampling: keep only groups whose rewards differ, drawing more prompt
    # batches until the train batch is full, up to max_gen_batches.
    config.filtering = config_dict.ConfigDict()
    config.filtering.dynamic_sampling = False
    config.filtering.max_gen_batches = 3

    config.objective = _objective()
    config.rollout.group_size = config.objective.get_ref("group_size")
    config.objective.overlong.max_len = config.rollout.get_ref("max_new_tokens")

    if arg.runlocal:
        config.rollout.prompts_per_batch = 8
        config.rollout.max_new_tokens = 16
        config.objective.group_size = 4
    return config


def _objective():
    """The `objective` section that `grpo_jax.objectives.policy_objective` reads."""
    obj = config_dict.ConfigDict()
    obj.group_size = 8

    # Advantage estimator: "group" (GRPO, Dr. GRPO), "rloo", "reinforce_pp", "gdpo".
    obj.advantage = config_dict.ConfigDict()
    obj.advantage.estimator = "group"
    obj.advantage.scale = "group"        # group: divide by group std; batch; none (Dr. GRPO)
    obj.advantage.ddof = 0               # 0 = population std (the seed); 1 = TRL/verl
    obj.advantage.eps = 1e-6
    obj.advantage.gamma = 1.0            # reinforce_pp discount
    obj.advantage.baseline = False       # reinforce_pp: subtract the group mean first
    obj.advantage.reward_weights = ()    # gdpo: one weight per reward column; () = all 1

    # Per-token policy loss: "ppo_clip", "gspo", "cispo", "sapo".
    obj.loss = config_dict.ConfigDict()
    obj.loss.kind = "ppo_clip"
    obj.loss.eps_low = 0.2
    obj.loss.eps_high = 0.2
    obj.loss.dual_clip = config_dict.placeholder(float)   # None = off; else c > 1
    obj.loss.tau_pos = 1.0               # sapo gate temperature, A > 0
    obj.loss.tau_neg = 1.05              # sapo gate temperature, A <= 0

    obj.aggregation = config_dict.ConfigDict()
    obj.aggregation.mode = "token-mean"
    obj.aggregation.norm_len = config_dict.placeholder(int)  # seq-mean-token-sum-norm; None = T

    obj.kl = config_dict.ConfigDict()
    obj.kl.beta = 0.0                    # > 0 loads a frozen reference model
    obj.kl.kind = "k3"
    obj.kl.in_reward = False             # reinforce_pp: fold -beta*KL into token rewards

    obj.entropy_coef = 0.0

    # Overlong handling: "none", "mask" (drop truncated completions from the loss),
    # "penalty" (DAPO's soft penalty over the last cache_len tokens before max_len).
    obj.overlong = config_dict.ConfigDict()
    obj.overlong.mode = "none"
    obj.overlong.max_len = 0             # tied to rollout.max_new_tokens in get_config
    obj.overlong.cache_len = 0

    # Sampler/trainer mismatch correction (truncated importance sampling).
    obj.importance = config_dict.ConfigDict()
    obj.importance.enabled = False
    obj.importance.level = "token"
    obj.importance.cap = 2.0
    obj.importance.mode = "truncate"
    return obj
