"""Multi-turn RL with a tool on CPU: the tiny model learns to search countdown with a check.

    python -m grpo_jax.main --config configs/tool_countdown.py --workdir /tmp/tool_countdown

The task is countdown with three numbers from 1-9 (``3 7 9 -> 30:``, data/countdown.py):
write an expression that reaches the target using each number at most once. The tool is
``check`` (``environment.name = "countdown"``, docs/environments.md): the model writes
``<check>3*(7+9)</check>`` and reads ``<result>48 (not the target)</result>``, the
expression's exact value and whether it is a valid answer (an expression that breaks the
rules gets ``error: 7 is used more often than given``). Reward: 1 for a valid answer in
the last ``<answer>...</answer>`` (the ``countdown`` reward).

Why the tool helps. Countdown is a search: the 0.6M-parameter model cannot evaluate its
own candidates reliably (its direct answers are right about a fifth of the time while
one of four samples is right for twice as many prompts), so it guesses. The check makes
each guess cheap to test and says how far off it is, so an episode can propose, check,
revise toward the reported value and answer what the check confirmed: several guesses,
one verified answer. Without the tool the model writes the ``<result>`` itself, and its
verdicts are no better than its arithmetic. The warm start's targets show that search
on a share of the problems (``check_fraction = 0.75``: 0-2 wrong tries, the nearest
misses of random expressions over the numbers, each one nearer the target, then the
solution checked and answered) and a bare ``<answer>`` on the rest, so RL has a choice
between the two.

Regime: DAPO's objective (clip 0.2/0.28, token-mean; Yu et al., arXiv:2503.14476) with
dynamic sampling padded with masked groups when short (``short_batch="pad"``); 16
prompts x 4 answers, 2 updates per rollout, 208 new tokens per episode (three checks,
their replies and the answer are at most 205 with the stop token), at most 3 calls (a
4th ends the episode), learning rate 2e-4 with 5 warmup steps, 40 steps, from a
400-step warm start on 1,200 problems (300 held out; 3 numbers up to 9 give ~1,900
problems in all). The recipe is itself the tiny CPU setting (``runlocal`` is accepted
and changes nothing); the scaling is in the task: the game show's numbers round has 6
numbers (1-10, 25, 50, 75, 100) and a target from 100 to 999.

Hardware and time: 2 CPU cores (shared), about 15 minutes (the warm start ~11, the 40
steps 4-13 with other jobs on the cores).
Expected result (3 seeds, docs/environments.md "Measured"): with the tool the warm start
answers 0.42 of the held-out problems greedily, twice its 0.21 without; 40 RL steps raise
the share of sampled episodes that call the check from 0.69 to 0.97 but not the accuracy
(0.40 greedy, mean@4 0.26 against 0.25): on this task the recipe teaches the tool's use,
not a better search.
Load: `config_lib.load_config("configs/tool_countdown.py")`.
"""

from ml_collections import config_dict

from grpo_jax import config_lib
from grpo_jax.objectives import presets


def get_config(arg=None):
    config_lib.parse_arg(arg, runlocal=True)   # accepted; the recipe is the CPU setting
    base = config_lib.load_sibling(__file__, "base")
    config = base.get_config("runlocal=True")
    base.set_regime(config, prompts=16, group_size=4, updates=2, max_new_tokens=208,
                    learning_rate=2e-4, warmup_steps=5, runlocal=False)
    config_lib.set_objective(config, presets.dapo(group_size=config.objective.group_size))
    config.task.name = "countdown"
    config.task.knobs = config_dict.ConfigDict(dict(
        count=3, max_number=9, max_target=99, ops=("+", "-", "*"), check_fraction=0.75,
        max_misses=2, num_train=1200, num_test=300))
    config.task.data_dir = "~/tensorflow_datasets/grpo_jax_tool_countdown"
    config.reward.specs = (("countdown", 1.0),)
    config.reward.correct = "countdown"
    config.environment.name = "countdown"
    config.environment.max_calls = 3
    config.filtering.dynamic_sampling = True
    config.filtering.max_gen_batches = 3
    config.filtering.short_batch = "pad"
    config.train.steps = 40
    config.train.eval_every = 20
    config.train.checkpoint_every = 20
    config.sft.steps = 400
    config.eval.num_prompts = 200
    return config
