"""SAPO: a smooth, asymmetric sigmoid gate instead of the hard clip.

Group-normalised advantages; each token's ratio passes through
f(r) = sigmoid(tau (r - 1)) * 4 / tau, which equals the plain policy gradient on-policy
and fades smoothly off-policy, a little faster for negative advantages
(tau_neg 1.05 > tau_pos 1.0). Per-answer aggregation (seq-mean-token-mean, the mode SAPO
is defined with), no KL.

Regime: each rollout batch split into 4 minibatches (4 updates, off-policy after the
first) in the paper's math experiments, as GSPO, its baseline; the batch, G and budget
follow GSPO's recipe here: 512 prompts x 16 answers, 8,192 new tokens, learning rate 1e-6.
``runlocal``: 16 prompts x 4 answers, 4 updates, 48 tokens (configs/base.py set_regime).

Paper: Gao et al., Soft Adaptive Policy Optimization (arXiv:2511.20347), eq. 5-8, sec. 5.1.
Load: `config_lib.load_config("configs/sapo.py:runlocal=True")`.
"""

from grpo_jax import config_lib
from grpo_jax.objectives import presets


def get_config(arg=None):
    arg = config_lib.parse_arg(arg, runlocal=False)
    base = config_lib.load_sibling(__file__, "base")
    config = base.get_config(f"runlocal={arg.runlocal}")
    base.set_regime(config, prompts=512, group_size=16, updates=4, max_new_tokens=8192,
                    learning_rate=1e-6, warmup_steps=0, runlocal=arg.runlocal)
    config_lib.set_objective(config, presets.sapo(group_size=config.objective.group_size))
    return config
