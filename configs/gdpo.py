"""GDPO: several rewards, each normalised within its group before they are summed.

With K rewards per answer (here correctness and a length budget), normalising their sum
once lets different reward combinations collapse to the same advantage; GDPO normalises
each reward within its group, takes the weighted sum (the weights of reward.specs), then
normalises that over the batch. The length reward is the paper's: 1 when the answer has
at most l tokens, l = half the completion budget (4,000 of 8,000). Weights 1 and 1 (the
paper's default). PPO clip 0.2/0.28, token-mean aggregation and dynamic sampling (the
DAPO setting the paper follows), no KL.

Regime (sec. 4.2): 16 answers per prompt, batch 512, 8,000 new tokens; the updates per
rollout are DAPO's (512 x 16 answers in 16 minibatches), learning rate 1e-6.
``runlocal``: 16 prompts x 4 answers, 4 updates, 48 tokens (configs/base.py set_regime),
and a length budget of 3/4 of them (36 tokens): at half (24) no 3-digit scratchpad
(30-37 tokens) would ever earn the length reward, so it could not act; at 36 the answers
with a 4-digit sum (37) miss it and the others earn it.

Paper: Liu et al., GDPO: Group reward-Decoupled Normalization Policy Optimization for
Multi-reward RL Optimization (arXiv:2601.05242), eq. 4-7, sec. 4.2.
Load: `config_lib.load_config("configs/gdpo.py:runlocal=True")`.
"""

from grpo_jax import config_lib
from grpo_jax.objectives import presets


def get_config(arg=None):
    arg = config_lib.parse_arg(arg, runlocal=False)
    base = config_lib.load_sibling(__file__, "base")
    config = base.get_config(f"runlocal={arg.runlocal}")
    base.set_regime(config, prompts=512, group_size=16, updates=16, max_new_tokens=8000,
                    learning_rate=1e-6, warmup_steps=20, runlocal=arg.runlocal)
    correct = config.reward.correct
    fraction = 0.75 if arg.runlocal else 0.5
    config.reward.specs = ((correct, 1.0), ("length_budget", 1.0, {"budget_fraction": fraction}))
    config_lib.set_objective(config, presets.gdpo(group_size=config.objective.group_size))
    config.filtering.dynamic_sampling = True
    config.filtering.max_gen_batches = 10
    return config
