"""GSPO vs GRPO on the Qwen3-30B-A3B mixture of experts: stable without routing replay.

Paper: Zheng et al., Group Sequence Policy Optimization (arXiv:2507.18071). Reproduced:
Fig. 1 (training reward and AIME 2024 over training, GSPO above GRPO) and sec. 5.3
(GRPO on an MoE policy converges only with Routing Replay, the sampler's experts replayed
in the training forward; GSPO needs none), as `get_sweep()`: GSPO, and GRPO with routing
replay (``rollout.keep_routing``).

Model: Qwen3-30B-A3B base (``model.name = "qwen3_30b_a3b"``: 48 layers, 128 experts,
top 8; ``path=`` its HF checkpoint).
Data: DAPO-Math-17k (``task.name = "dapo_math_17k"``, ``data=`` its folder), graded by the
``math`` reward, with Qwen3's thinking-mode prompt (``qwen3_thinking``).
Regime: configs/gspo.py: 512 prompts x 16 answers, 4 updates per batch (sec. 5.1),
8,192 new tokens, learning rate 1e-6, sequence ratio clipped to [1 - 3e-4, 1 + 4e-4];
GRPO's row: token ratios clipped to [0.8, 1.2], per-answer means, no KL (the one change
is the ratio's level and the replay it needs).
Steps: 1,000. The paper plots training compute, not steps.
Evaluation: ``eval.suite = "dapo_aime24"``: AIME 2024 avg@32 (temperature 1.0, top-p 0.7).

Departures, and why:
- The paper starts from a cold-start fine-tune of Qwen3-30B-A3B-Base on data it does not
  publish, and trains on data it does not name: here the base model on DAPO-Math-17k.
- Its evaluation settings are not given; DAPO's AIME 2024 avg@32 protocol stands in.
- bf16 weights and AdamW moments.

At ``runlocal=True``: the tiny MoE (``tiny_moe``, 8 experts, top 2) on 3-digit addition
with GSPO's objective, 2 steps; the sweep's rows apply there as they are.

    python -m grpo_jax.sweep --config configs/paper/gspo_qwen3_30b_a3b.py:path=P,data=D \\
        --workdir_root gs://B/runs/gspo --seeds 0
"""

from grpo_jax import config_lib

paper = config_lib.load_sibling(__file__, "_paper")


def get_config(arg=None):
    arg = paper.parse(arg)
    config = paper.recipe("gspo", arg)
    if arg.runlocal:
        config.model.name = "tiny_moe"
        return paper.runlocal(config)
    config = paper.at_scale(config, arg, model="qwen3_30b_a3b", hub_name="Qwen3-30B-A3B-Base",
                          task="dapo_math_17k", template="qwen3_thinking", steps=1000,
                          suite="dapo_aime24", samples=32, eval_split="train")
    # Every 100 steps, 64 training problems x the suite's 32 answers (no test split).
    config.train.eval_every = 100
    config.eval.num_prompts = 64
    return config


def get_sweep():
    """GSPO, then GRPO's token-level clip with the sampler's experts replayed."""
    return [
        {"objective.loss.kind": "gspo", "objective.loss.eps_low": 3e-4,
         "objective.loss.eps_high": 4e-4, "rollout.keep_routing": False},
        {"objective.loss.kind": "ppo_clip", "objective.loss.eps_low": 0.2,
         "objective.loss.eps_high": 0.2, "rollout.keep_routing": True},
    ]
