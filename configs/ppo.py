"""PPO with a critic: per-token GAE advantages from a learned value model.

A value model (the policy's decoder with a scalar head, its own optimizer, started from
the policy's weights) gives every completion token its value V(s_t); the outcome reward
sits on the answer's last token; GAE with gamma 1 and lambda 0.95 gives the policy's
advantages, and the critic regresses onto the GAE returns of the same lambda with PPO's
clipped value loss (clip 0.2, OpenAI baselines' ppo2: the policy's clip range). The
advantages are whitened over all valid tokens of the rollout batch (mean and unbiased
std of the whole batch, as Ziegler et al.'s lm-human-preferences and verl do; OpenAI
baselines whiten each minibatch instead). PPO clip 0.2/0.2, each answer's loss averaged
over its own tokens (seq-mean-token-mean), no KL.

Regime: the vanilla-PPO baseline of VAPO (Yue et al., sec. 4.1): 8,192 answers per
rollout batch, one per prompt (no group sampling), mini-batches of 512 (16 updates,
off-policy after the first), actor learning rate 1e-6 and critic 2e-6, lambda 0.95,
gamma 1; 20,480 new tokens (VAPO's comparison budget, as DAPO's). The paper gives no
warmup: 20 steps as DAPO, for both.
``runlocal``: 64 prompts x 1 answer (the 64 rows of the other runlocal regimes), 4
updates, 48 tokens, learning rate 1e-4 and critic 2e-4 (twice the policy's, as the
paper's ratio) (configs/base.py set_regime).

Papers: Schulman et al., Proximal Policy Optimization Algorithms (arXiv:1707.06347) and
High-Dimensional Continuous Control Using GAE (arXiv:1506.02438); Ouyang et al., InstructGPT
(arXiv:2203.02155), sec. 3.5; Yue et al., VAPO (arXiv:2504.05118), sec. 4.1 (the baseline).
Load: `config_lib.load_config("configs/ppo.py:runlocal=True")`.
"""

from grpo_jax import config_lib
from grpo_jax.objectives import presets


def get_config(arg=None):
    arg = config_lib.parse_arg(arg, runlocal=False)
    base = config_lib.load_sibling(__file__, "base")
    config = base.get_config(f"runlocal={arg.runlocal}")
    base.set_regime(config, prompts=8192, group_size=1, updates=16, max_new_tokens=20480,
                    learning_rate=1e-6, warmup_steps=20, runlocal=arg.runlocal)
    if arg.runlocal:   # one answer per prompt: as many prompts as the others have rows
        config.rollout.prompts_per_batch = 64
    config_lib.set_objective(config, presets.ppo(group_size=config.objective.group_size))
    obj = config.objective
    critic = config.critic
    critic.enabled = True
    critic.lam = obj.advantage.get_ref("lam")   # one lambda for both (VAPO decouples them)
    critic.value_clip = 0.2
    critic.optimizer.learning_rate = 2 * config.optimizer.learning_rate
    critic.optimizer.warmup_steps = config.optimizer.warmup_steps
    return config
