"""A one-host anchor: zero-RL of Qwen2.5-0.5B on GSM8K, SimpleRL-Zoo's smallest model.

Paper: Zeng et al., SimpleRL-Zoo: Investigating and Taming Zero Reinforcement Learning
for Open Base Models in the Wild (arXiv:2503.18892). Reproduced: its results table's
Qwen-2.5-0.5B rows (base -> after RL): GSM8K 36.7 -> 49.5, MATH-500 15.8 -> 34.4.

Model: Qwen2.5-0.5B base (``model.name = "qwen2_5_0_5b"``; ``path=`` its HF checkpoint).
Data: GSM8K's training split (``task.name = "gsm8k"``, ``data=`` the folder of its
official files), graded by the ``gsm8k`` reward (correctness only, no format reward, as
the paper), prompted with Qwen2.5-Math's ``\\boxed{}`` template.
Regime: the authors' GRPO script (hkust-nlp/simpleRL-reason, train_grpo_math_tune_ray.sh,
with its README's command): 1,024 prompts x 8 answers, mini-batches of 256 prompts (4
updates per batch), 8,192 new tokens, learning rate 5e-7, clip 0.2, KL 1e-4 (k3, "low var
KL", as a loss), temperature 1.0.
Steps: 100 (the README: about 100 steps on their 8K examples).
Evaluation: the held-out GSM8K test split, greedy pass@1 (``eval_accuracy``, the paper's
protocol for the base model); MATH-500 with ``--config.mode=eval
--config.eval.suite=math_reasoning`` (its ``math500`` row).

Departures, and why:
- Data: the paper trains on its own 8K mixes by difficulty (GSM8K + MATH level 1 for
  the easiest); here GSM8K alone, the bundled builder's.
- The entropy bonus (0.001) of the script is left out; the trainer's objective has none
  in GRPO's preset.
- The paper evaluates the trained model at temperature 1.0 and top-p 0.95; the held-out
  evaluation here is greedy, and the suite samples MATH-500 at 0.6 / 0.95.
- No reset of the KL reference (configs/grpo.py's R1 reset every 400 steps is beyond
  100 steps anyway).

At ``runlocal=True``: the tiny model on 3-digit addition with GRPO's objective, 2 steps.

    python -m grpo_jax.main --config configs/paper/simplerl_qwen25_0_5b.py:path=P,data=D \\
        --workdir runs/simplerl_0_5b
"""

from grpo_jax import config_lib
from grpo_jax.objectives import presets

paper = config_lib.load_sibling(__file__, "_paper")


def get_config(arg=None):
    arg = paper.parse(arg)
    config = paper.recipe("grpo", arg)
    base = config_lib.load_module(paper.CONFIGS / "base.py")
    base.set_regime(config, prompts=1024, group_size=8, updates=4, max_new_tokens=8192,
                    learning_rate=5e-7, warmup_steps=0, runlocal=arg.runlocal)
    config_lib.set_objective(config, presets.grpo(group_size=config.objective.group_size,
                                                  kl_beta=1e-4))
    config.train.ref_reset_every = 0
    if arg.runlocal:
        return paper.runlocal(config)
    config = paper.at_scale(config, arg, model="qwen2_5_0_5b", hub_name="Qwen2.5-0.5B",
                            task="gsm8k", template="qwen25_math", steps=100, suite="",
                            samples=1)
    config.reward.specs = (("gsm8k", 1.0),)
    config.reward.correct = "gsm8k"
    config.eval.num_prompts = 1319   # the whole GSM8K test split
    return config
