"""Multi-turn RL with a tool on CPU: the tiny model learns to call a calculator.

    python -m grpo_jax.main --config configs/tool_calculator.py --workdir /tmp/tool_calculator

The task is 3-digit multiplication (``478*256=``), beyond the 0.6M-parameter model's
reach when it works the product itself. The warm start's targets call the calculator on
a share of the problems (``<calculator>478*256</calculator><result>122368</result>
#### 122368``, data/arithmetic.py ``calculator_fraction``) and write the long
multiplication scratchpad on the rest, so the warm start calls the tool on some prompts
only. In the rollouts the environment answers each call (``environment.name =
"calculator"``, docs/environments.md): the model's tokens are in the loss, the
``<result>`` reply is read and skipped. Reward: 1 for the exact product after the last
``####``.

Regime: DAPO's objective (clip 0.2/0.28, token-mean; Yu et al., arXiv:2503.14476) with
dynamic sampling topped up with masked groups (``short_batch="pad"``) once most groups
are solved; 16 prompts x 4 answers, 2 updates per rollout, 80 new tokens per episode
(a call, its reply, the answer and the stop token are at most 68), learning rate 1e-4 with 5
warmup steps, 40 steps, from a 400-step warm start. The recipe is itself the tiny CPU
setting: ``runlocal`` is accepted (every recipe takes it) and changes nothing.

Hardware and time: 2 CPU cores (shared), 11-16 minutes: the dataset and the warm start
6-10, the 40 RL steps 2.4-6.4.
Expected result (3 seeds, docs/environments.md "Measured"): greedy held-out accuracy with
the tool 0.155 ± 0.119 from the warm start (which calls it on 2-31% of the prompts) and
0.985 ± 0.015 after RL, every greedy episode calling it; the same models without the
tool (``--config.environment.name=``) 0.012 and 0.000. In the rollouts the share of
episodes that call the tool rises from 0.21-0.45 to 0.92-0.96.
Load: `config_lib.load_config("configs/tool_calculator.py")`.
"""

from ml_collections import config_dict

from grpo_jax import config_lib
from grpo_jax.objectives import presets


def get_config(arg=None):
    config_lib.parse_arg(arg, runlocal=True)   # accepted; the recipe is the CPU setting
    base = config_lib.load_sibling(__file__, "base")
    config = base.get_config("runlocal=True")
    base.set_regime(config, prompts=16, group_size=4, updates=2, max_new_tokens=80,
                    learning_rate=1e-4, warmup_steps=5, runlocal=False)
    config_lib.set_objective(config, presets.dapo(group_size=config.objective.group_size))
    config.task.knobs = config_dict.ConfigDict(dict(
        digits=3, ops=("*",), scratchpad=True, calculator_fraction=0.3, num_train=20_000,
        num_test=500))
    config.task.data_dir = "~/tensorflow_datasets/grpo_jax_tool_calculator"
    config.environment.name = "calculator"
    config.environment.max_calls = 2
    config.filtering.dynamic_sampling = True
    config.filtering.max_gen_batches = 3
    config.filtering.short_batch = "pad"
    config.train.steps = 40
    config.train.eval_every = 20
    config.train.checkpoint_every = 20
    config.sft.steps = 400
    config.eval.num_prompts = 200
    return config
