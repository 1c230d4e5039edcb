"""DAPO on Qwen2.5-32B base: AIME 2024 avg@32 of 50, and Table 1's ablation of its four techniques.

Paper: Yu et al., DAPO: An Open-Source LLM Reinforcement Learning System at Scale
(arXiv:2503.14476). Reproduced: Fig. 1 (AIME 2024 avg@32 over training, 50 for DAPO)
and Table 1 (AIME 2024 avg@32 as each technique is added: naive GRPO 30, + overlong
filtering 36, + clip-higher 38, + soft overlong punishment 41, + token-level loss 42,
+ dynamic sampling 50), as `get_sweep()`.

Model: Qwen2.5-32B base (``model.name = "qwen2_5_32b"``; ``path=`` its HF checkpoint).
Data: DAPO-Math-17k (``task.name = "dapo_math_17k"``, ``data=`` the folder of
``dapo-math-17k.parquet``), graded by the ``math`` reward, plus the soft overlong penalty.
Regime: configs/dapo.py (sec. 4.1): 512 prompts x 16 answers per step, 16 updates of 512
answers, 20,480 new tokens, learning rate 1e-6 with 20 warmup steps, clip 0.2/0.28,
token-mean, dynamic sampling (at most 10 draws), the penalty over the last 4,096 tokens.
Steps: 5,000. The paper gives no number: Fig. 1 shows DAPO at 50 after half the steps of
DeepSeek-R1-Zero-Qwen-32B on an axis to 10,000; 5,000 is read off that figure.
Evaluation: ``eval.suite = "dapo_aime24"``: AIME 2024, 32 answers per problem at
temperature 1.0 and top-p 0.7, avg@32 (also pass@k, maj@32).

Departures, and why:
- Prompt: Qwen2.5-Math's template (system turn asking for ``\\boxed{}``), not DAPO's
  "Answer: $Answer" instruction (the builder removes it from the data): the ``math``
  reward reads the last ``\\boxed{}``.
- Reward: 1 right / 0 wrong, where DAPO pays +1 / -1; group-normalised advantages are
  the same under the affine change, but the penalty (0 to -1) weighs twice as much
  against a reward range of 1 as against DAPO's 2.
- Table 1's row "+ soft overlong punishment" replaces overlong filtering by the penalty
  (the final DAPO has the penalty and no filtering); the paper does not say whether
  both were on in that row. Naive GRPO is taken without KL, as every row after it.
- bf16 weights, gradients and AdamW moments (verl keeps fp32 master weights), so it fits
  fewer chips; ``--config.model.param_dtype=float32`` restores them.

`get_sweep()` rows set ``reward.specs`` with the ``math`` grader: they are the paper-scale
table; at ``runlocal=True`` (the tiny model on 3-digit addition, 2 steps, the
``integer_answer`` grader) only their dry run is meaningful.

    python -m grpo_jax.main --config configs/paper/dapo_qwen25_32b.py:path=P,data=D \\
        --workdir gs://B/runs/dapo
    python -m grpo_jax.aot --config configs/paper/dapo_qwen25_32b.py --topology v5p:4x4x4 \\
        --plan_cost
"""

from grpo_jax import config_lib

paper = config_lib.load_sibling(__file__, "_paper")

MATH = ("math", 1.0)
SOFT_PENALTY = ("overlong", 1.0, {"cache_fraction": 0.2})


def get_config(arg=None):
    arg = paper.parse(arg)
    config = paper.recipe("dapo", arg)
    if arg.runlocal:
        return paper.runlocal(config)
    config = paper.at_scale(config, arg, model="qwen2_5_32b", hub_name="Qwen2.5-32B",
                          task="dapo_math_17k", template="qwen25_math", steps=5000,
                          suite="dapo_aime24", samples=32, eval_split="train")
    # Every 100 steps, 64 training problems x the suite's 32 answers (no test split).
    config.train.eval_every = 100
    config.eval.num_prompts = 64
    return config


def _row(*, overlong, eps_high, aggregation, dynamic_sampling, soft_penalty):
    return {"objective.overlong.mode": overlong, "objective.loss.eps_high": eps_high,
            "objective.aggregation.mode": aggregation,
            "filtering.dynamic_sampling": dynamic_sampling,
            "reward.specs": (MATH, SOFT_PENALTY) if soft_penalty else (MATH,)}


def get_sweep():
    """Table 1's rows, each adding one technique to the row before."""
    grpo = dict(overlong="none", eps_high=0.2, aggregation="seq-mean-token-mean",
                dynamic_sampling=False, soft_penalty=False)
    filtering = {**grpo, "overlong": "mask"}
    clip_higher = {**filtering, "eps_high": 0.28}
    soft = {**clip_higher, "overlong": "none", "soft_penalty": True}
    token_level = {**soft, "aggregation": "token-mean"}
    dapo = {**token_level, "dynamic_sampling": True}
    return [_row(**row) for row in (grpo, filtering, clip_higher, soft, token_level, dapo)]
