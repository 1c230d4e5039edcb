"""Self-verification: reward an answer and an honest verdict on it (DeepSeekMath-V2, V3.2).

Each completion ends with the policy's own verdict on its answer, `<verify>correct</verify>`
or `<verify>incorrect</verify>`. The reward is DeepSeekMath-V2's mix (sec. 2.1, the
generator's reward): 0.76 x the answer's correctness (graded on the text before the
verdict) + 0.24 x the verdict's honesty (`self_verify`: the verdict agrees with the grader).
A right answer called right scores 1; a wrong answer called wrong still earns 0.24, so a
policy gains from saying when it is unsure instead of bluffing. The objective is
DeepSeek-V3.2's GRPO (configs/deepseek_v32.py), which DeepSeek-V3.2-Speciale trains with
this reward; its regime too. The prompt asks for the verdict (task.system_prompt).
``runlocal``: the tiny model on 3-digit addition whose warm-start targets end with the
teacher's honest verdict on its own (sometimes carry-forgetting) answer, so the warm start
writes verdicts and RL can make them honest; 16 prompts x 4, 4 updates, 64 tokens.

Papers: Shao et al., DeepSeekMath-V2 (arXiv:2511.22570), sec. 2.1; DeepSeek-AI,
DeepSeek-V3.2 (arXiv:2512.02556), sec. 3.
Load: `config_lib.load_config("configs/self_verify.py:runlocal=True")`.
"""

from grpo_jax import config_lib

VERDICT_PROMPT = ("After your answer, judge it: end with <verify>correct</verify> if you are "
                  "sure it is right, otherwise <verify>incorrect</verify>.")


def get_config(arg=None):
    arg = config_lib.parse_arg(arg, runlocal=False)
    config = config_lib.load_sibling(__file__, "deepseek_v32").get_config(
        f"runlocal={arg.runlocal}"
    )
    grader = config.reward.correct
    config.reward.specs = (("answer_before_verdict", 0.76, {"grader": grader}),
                           ("self_verify", 0.24, {"grader": grader}))
    config.reward.correct = "answer_before_verdict"
    # A group of all-wrong answers still has signal when its verdicts differ in honesty
    # (0.24 vs 0): the reward, not the correctness, says whether advantages differ.
    config.filtering.signal = "reward"
    if arg.runlocal:
        config.model.name = "tiny"
        config.rollout.keep_routing = False   # a dense model: no experts to replay
        config.task.knobs.verdicts = True
        config.rollout.max_new_tokens = 64  # the scratchpad (<= 36), the verdict tag (25), the stop
    else:
        config.task.system_prompt = VERDICT_PROMPT
    return config
