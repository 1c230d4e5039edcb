"""DeepSeek-V3.2's GRPO: the off-policy corrections that make a large run stable.

GRPO with the advantage r - mean(group) (no division by the std), per-answer token means,
and four corrections for training off the sampling policy (sec. 3.1):
- the unbiased KL estimate: k3 weighted by pi_theta/pi_old (objective.kl.kind="k3_unbiased");
- off-policy sequence masking: answers with a negative advantage whose mean
  log(pi_old/pi_theta) exceeds delta leave the loss (objective.offpolicy_mask);
- keep routing: an MoE's training forward replays the experts the sampler chose
  (rollout.keep_routing; acts on MoE models only);
- keep sampling mask: the top-p truncation of every sampled position is kept and pi_old and
  pi_theta are both renormalised over it (rollout.keep_sampling_mask, with top_p 0.95).
The paper gives no values for the KL weight (a weak or no penalty for mathematics), delta,
top-p or the regime beyond "a large batch split into several minibatches": the KL weight
is R1's 0.001, delta 0.5 (TRL's suggested start), top-p 0.95, and the regime DeepSeek-R1's
(512 prompts x 16 answers, 16 updates, 32,768 tokens, learning rate 3e-6).
``runlocal``: the tiny MoE model (so keep routing acts), 16 prompts x 4 answers, 4 updates,
48 tokens (configs/base.py set_regime).

Paper: DeepSeek-AI, DeepSeek-V3.2 (arXiv:2512.02556), sec. 3.1, eq. 5-9.
Load: `config_lib.load_config("configs/deepseek_v32.py:runlocal=True")`.
"""

from grpo_jax import config_lib
from grpo_jax.objectives import presets


def get_config(arg=None):
    arg = config_lib.parse_arg(arg, runlocal=False)
    base = config_lib.load_sibling(__file__, "base")
    config = base.get_config(f"runlocal={arg.runlocal}")
    base.set_regime(config, prompts=512, group_size=16, updates=16, max_new_tokens=32768,
                    learning_rate=3e-6, warmup_steps=0, runlocal=arg.runlocal)
    if arg.runlocal:
        config.model.name = "tiny_moe"
    config.rollout.top_p = 0.95
    config.rollout.keep_sampling_mask = True
    config.rollout.keep_routing = True
    config_lib.set_objective(
        config,
        presets.grpo(
            group_size=config.objective.group_size, advantage_scale="none", kl_beta=0.001,
            kl_kind="k3_unbiased", offpolicy_mask=True, offpolicy_delta=0.5,
        ),
    )
    return config
