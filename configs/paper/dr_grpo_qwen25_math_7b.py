"""Dr. GRPO on Qwen2.5-Math-7B (Oat-Zero-7B): the five math benchmarks after R1-Zero-like RL.

Paper: Liu et al., Understanding R1-Zero-Like Training: A Critical Perspective
(arXiv:2503.20783). Reproduced: the Oat-Zero-7B results (Qwen2.5-Math-7B trained with
Dr. GRPO from the base model; its five-benchmark table: AIME 2024, AMC, MATH-500, Minerva
Math, OlympiadBench, greedy pass@1) and the length claim (sec. 3.1: without GRPO's
length normalisation, wrong answers stop growing longer; ``response_length_mean`` in the
metrics).

Model: Qwen2.5-Math-7B (``model.name = "qwen2_5_math_7b"``; ``path=`` its HF checkpoint).
Data: MATH's 7,500 training problems (``task.name = "math"``, ``data=`` the folder of
``MATH.tar``), graded by the ``math`` reward; the Qwen2.5-Math template (sec. 3: the
"Qwen-Math template", the one the paper trains Oat-Zero with).
Regime: configs/dr_grpo.py (Table 6 and the authors' Oat-Zero script): 128 prompts x 8
answers, 8 updates of 128 answers, 3,000 new tokens, learning rate 1e-6, AdamW beta2
0.95, no std division, token sums over the constant 3,000, no KL.
Evaluation: ``eval.suite = "oat_zero"``: the five benchmarks, greedy (temperature 0),
one answer per problem.

Departures, and why:
- Oat-Zero-7B trains on MATH levels 3-5 only; the ``math`` builder keeps every level
  (it has no level filter), so the set is easier on average.
- Steps: 500. The paper states Oat-Zero-7B's budget as wall time (27 hours on 8 A100s),
  not steps; 500 steps of 128 prompts pass over the 7,500 problems about 8.5 times.
- bf16 weights and AdamW moments (``--config.model.param_dtype=float32`` restores fp32).

At ``runlocal=True``: the tiny model on 3-digit addition with Dr. GRPO's objective, 2 steps.

    python -m grpo_jax.main --config configs/paper/dr_grpo_qwen25_math_7b.py:path=P,data=D \\
        --workdir gs://B/runs/dr_grpo
"""

from grpo_jax import config_lib

paper = config_lib.load_sibling(__file__, "_paper")


def get_config(arg=None):
    arg = paper.parse(arg)
    config = paper.recipe("dr_grpo", arg)
    if arg.runlocal:
        return paper.runlocal(config)
    return paper.at_scale(config, arg, model="qwen2_5_math_7b", hub_name="Qwen2.5-Math-7B",
                          task="math", template="qwen25_math", steps=500, suite="oat_zero",
                          samples=1)
