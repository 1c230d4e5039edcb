"""VAPO: PPO with a critic made to work on long chains of thought, every piece a field.

On top of configs/ppo.py's PPO (GAE from a value model, clipped value loss, whitened
advantages), the seven pieces of the paper, each a config field:

- value pre-training (``critic.pretrain_steps``): before RL, steps that train only the
  critic, on rollouts of the frozen starting policy, toward Monte-Carlo returns
  (lambda = 1): 50 steps;
- decoupled GAE: the critic's targets with ``critic.lam = 1.0`` (unbiased, no reward
  decay over long answers), the policy's advantages with their own lambda;
- length-adaptive GAE (``objective.advantage.lam_alpha``): the policy's lambda per answer
  of l tokens is 1 - 1/(alpha l), alpha = 0.05 (eq. 7; answers of <= 20 tokens get 0);
- clip-higher (``objective.loss.eps_low/eps_high`` 0.2/0.28, from DAPO);
- token-level loss (``objective.aggregation.mode = "token-mean"``);
- the positive-example LM loss (``objective.positive_nll_weight``): mu = 0.1 times the
  NLL of the batch's correct answers;
- group sampling (``objective.group_size``): 16 answers per prompt, 512 prompts.
No KL; gamma 1; advantages whitened over the batch's tokens (as configs/ppo.py).

Regime (sec. 4.1): 512 prompts x 16 answers per rollout, mini-batches of 512 answers (16
updates, off-policy after the first), actor learning rate 1e-6 and critic 2e-6; 20,480
new tokens (the paper compares VAPO with DAPO under identical settings: DAPO's budget).
The paper gives no warmup: 20 steps as DAPO, for both.
``runlocal``: 16 prompts x 4 answers, 4 updates, 48 tokens, learning rate 1e-4 and critic
2e-4 (twice the policy's, as the paper's ratio) (configs/base.py set_regime); 5 steps of
value pre-training before the 20 RL steps. alpha is scaled with the token budget
(0.05 x 20,480 / 48 = 21.3), so that an answer filling the same share of its budget gets
the paper's lambda: there, answers of 1,000 to 20,000 tokens get lambda 0.98 to 0.999, a
GAE horizon 1/(1 - lambda) of 50 to 1,000 tokens that carries the outcome from the final
answer back into the reasoning. Unscaled, a 30-token runlocal answer would get lambda 1/3
(a horizon of 1.5 tokens): the reward's credit would stop at the stop token, every other
token would learn from the critic alone, and the tiny task's critic explains almost none
of the returns' variance (measured: explained variance below 0.05 after 800 steps).
That run collapsed to 0 held-out accuracy in 3 seeds of 3.

Paper: Yue et al., VAPO: Efficient and Reliable Reinforcement Learning for Advanced
Reasoning Tasks (arXiv:2504.05118), sec. 3-4 (Table 1 ablates each piece).
Sweep: `get_sweep()` removes one piece at a time (Table 1's rows); "w/o group sampling"
is ``objective.group_size=1`` with 16 times the prompts.
Load: `config_lib.load_config("configs/vapo.py:runlocal=True")`.
"""

from grpo_jax import config_lib
from grpo_jax.objectives import presets


PAPER_MAX_NEW_TOKENS = 20480


def get_config(arg=None):
    arg = config_lib.parse_arg(arg, runlocal=False)
    config = config_lib.load_sibling(__file__, "ppo").get_config(f"runlocal={arg.runlocal}")
    base = config_lib.load_sibling(__file__, "base")
    base.set_regime(config, prompts=512, group_size=16, updates=16,
                    max_new_tokens=PAPER_MAX_NEW_TOKENS,
                    learning_rate=1e-6, warmup_steps=20, runlocal=arg.runlocal)
    config_lib.set_objective(
        config,
        presets.vapo(
            group_size=config.objective.group_size,
            lam_alpha=0.05 * PAPER_MAX_NEW_TOKENS / config.rollout.max_new_tokens,
        ),
    )
    critic = config.critic
    del critic["lam"]   # decoupled GAE: unlink it from the policy's lambda (ppo.py ties them)
    critic.lam = 1.0
    critic.pretrain_steps = 5 if arg.runlocal else 50
    critic.optimizer.learning_rate = 2 * config.optimizer.learning_rate
    critic.optimizer.warmup_steps = config.optimizer.warmup_steps
    return config


def get_sweep():
    """VAPO without one piece at a time (Table 1)."""
    return [
        {"critic.pretrain_steps": 0},                       # w/o value pre-training
        {"critic.lam": 0.95},                               # w/o decoupled GAE
        {"objective.advantage.lam_alpha": 0.0},             # w/o length-adaptive GAE (0.95)
        {"objective.loss.eps_high": 0.2},                   # w/o clip-higher
        {"objective.aggregation.mode": "seq-mean-token-mean"},   # w/o token-level loss
        {"objective.positive_nll_weight": 0.0},             # w/o positive-example LM loss
    ]
