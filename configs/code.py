"""Code RL: DAPO's objective on programs scored by running them against unit tests.

The policy writes a Python function in a fenced block; `code_tests` runs it in the
sandbox (docs/code.md) against the problem's tests and pays 1 only when every test
passes, the sparse outcome reward of code RL recipes (DeepCoder, verl). DAPO's objective:
clip-higher (eps 0.2 / 0.28), token-mean loss, no KL, dynamic sampling (groups whose
programs all pass or all fail are dropped and more prompts drawn, at most 10 draws) and
the soft overlong penalty over the last fifth of the budget.

Regime: DAPO's rollout shape and learning rate (Yu et al., arXiv:2503.14476, sec. 4.1:
512 prompts x 16 answers, 16 updates per rollout, learning rate 1e-6, 20 warmup steps)
with the 16,384-token budget of DeepCoder's first stage (Luo et al. 2025, "DeepCoder: A
Fully Open-Source 14B Coder at O3-mini Level", Agentica; it then lengthens the context to
32K and masks truncated answers where DAPO penalises them, as here), on HumanEval (the
task to replace with a training set, e.g. TACO or APPS, for real runs).
``runlocal``: 16 prompts x 4 answers, 4 updates (configs/base.py set_regime), on the
procedural code task (one- and two-step functions over integers and lists, the tiny
model warm-started by SFT) with a 160-token budget (the longest reference is 117
characters with its stop token, short of the overlong zone that starts at 128); a warm
start that passes few programs finds few groups with signal, so dynamic sampling draws
at most 4 batches and trains on the groups found (short_batch "pad", as configs/demo.py).
Load: `config_lib.load_config("configs/code.py:runlocal=True")`.
"""

from ml_collections import config_dict

from grpo_jax import config_lib
from grpo_jax.objectives import presets


def get_config(arg=None):
    arg = config_lib.parse_arg(arg, runlocal=False)
    base = config_lib.load_sibling(__file__, "base")
    config = base.get_config(f"runlocal={arg.runlocal}")
    base.set_regime(config, prompts=512, group_size=16, updates=16, max_new_tokens=16384,
                    learning_rate=1e-6, warmup_steps=20, runlocal=arg.runlocal)
    config.task.name = "humaneval"
    config.task.eval_split = "test"
    config.task.chat_template = True
    config.eval.num_prompts = 164    # all of HumanEval
    config.reward.specs = (("code_tests", 1.0, {"all_or_nothing": True}),
                           ("overlong", 1.0, {"cache_fraction": 0.2}))
    config.reward.correct = "code_tests"
    config.reward.timeout_s = 30.0   # above code_tests' 8 s per program: a slow host's margin
    if arg.runlocal:
        config.task.name = "code_tasks"
        config.task.chat_template = False
        config.task.knobs = config_dict.ConfigDict(dict(
            kinds=("int", "list"), min_steps=1, max_steps=2, max_constant=9, num_tests=4,
            num_train=1000, num_test=100))
        config.rollout.max_new_tokens = 160
        config.eval.num_prompts = 100
    config_lib.set_objective(config, presets.dapo(group_size=config.objective.group_size))
    config.filtering.dynamic_sampling = True
    config.filtering.max_gen_batches = 4 if arg.runlocal else 10
    if arg.runlocal:
        config.filtering.short_batch = "pad"
    return config
