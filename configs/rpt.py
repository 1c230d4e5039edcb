"""RPT: reinforcement pre-training, next-token prediction as a verifiable reasoning task.

A context from a text corpus is the prompt; the policy reasons, then puts the text it
predicts comes next in \\boxed{}; the reward is 1 when that is a prefix of the true
continuation ending on a token boundary (grpo_jax.rewards' "rpt"). Only hard positions are
kept: the paper selects them by a small proxy model's next-token entropy over its top 16
tokens (task.knobs.proxy_model, min_entropy; grpo_jax.data.rpt). GRPO advantages, no KL,
dynamic sampling.

Regime (Table 5): 256 contexts x 8 answers per batch, one update per batch (mini-batch 256:
on-policy), 8,192 new tokens, temperature 0.8, learning rate 1e-6. Argument
``sft_weight=W`` adds W x the next-token loss of the reference continuation (in the task's
answer format) to the RL loss: the hybrid of next-token prediction and RL (the paper
itself trains with RL alone, W = 0).
Full scale needs ``--config.task.knobs.corpus_dir`` (a directory of .txt files) and, for
hard tokens, ``--config.task.knobs.proxy_model`` (the paper: DeepSeek-R1-Distill-Qwen-1.5B)
with ``min_entropy`` (the paper's evaluation splits use 0.5 / 1.0 / 1.5 nats).
``runlocal``: the builtin arithmetic corpus (written-out additions, whose next tokens take
computing), every position (no proxy), the tiny model warm-started on the reference
continuations; 16 contexts x 4 answers, 1 update, 48 tokens (configs/base.py set_regime).

Paper: Dong et al., Reinforcement Pre-Training (arXiv:2506.08007), sec. 3 and Table 5.
Load: `config_lib.load_config("configs/rpt.py:runlocal=True,sft_weight=0.1")`.
"""

from ml_collections import config_dict

from grpo_jax import config_lib
from grpo_jax.objectives import presets


def get_config(arg=None):
    arg = config_lib.parse_arg(arg, runlocal=False, sft_weight=0.0)
    base = config_lib.load_sibling(__file__, "base")
    config = base.get_config(f"runlocal={arg.runlocal}")
    base.set_regime(config, prompts=256, group_size=8, updates=1, max_new_tokens=8192,
                    learning_rate=1e-6, warmup_steps=0, runlocal=arg.runlocal)
    config.task.name = "rpt"
    config.task.knobs = config_dict.ConfigDict(dict(
        corpus_dir="", context_tokens=512, min_context_tokens=32, continuation_tokens=1,
        stride=16, proxy_model="", entropy_top_k=16, min_entropy=1.0))
    config.reward.specs = (("rpt", 1.0),)
    config.reward.correct = "rpt"
    config.rollout.temperature = 0.8
    config.train.sft_weight = float(arg.sft_weight)
    config_lib.set_objective(
        config, presets.dapo(group_size=config.objective.group_size, eps_high=0.2)
    )
    config.filtering.dynamic_sampling = True
    config.filtering.max_gen_batches = 10
    if arg.runlocal:
        config.task.knobs.update(corpus_dir="builtin:arithmetic", context_tokens=24,
                                 min_context_tokens=6, stride=3, min_entropy=0.0)
        config.task.data_dir = "~/tensorflow_datasets/grpo_jax_runlocal"
    return config
