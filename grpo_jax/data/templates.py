"""The prompt templates of the model families the RL papers train, by name.

``task.prompt_template`` picks one; the prompt is then the template around the example's
question, as the papers write it out (special tokens as text: prompts are tokenized
without adding any), instead of the task's own instruction:

* ``qwen25_math``: Qwen2.5-Math's chain-of-thought prompt (Yang et al., arXiv:2409.12122;
  its evaluation's ``qwen25-math-cot``), the "Qwen-Math template" of Dr. GRPO (Liu et
  al., arXiv:2503.20783, sec. 3): a system turn asking for the answer in ``\\boxed{}``;
* ``qwen3_thinking``: Qwen3 in thinking mode (Qwen3 technical report, arXiv:2505.09388):
  its chat template with ``enable_thinking=True`` around a user turn ending in the math
  instruction Qwen3's model card recommends; the model opens its own ``<think>``;
* ``r1_zero``: DeepSeek-R1-Zero's template for a base model (Guo et al.,
  arXiv:2501.12948, table 1; Dr. GRPO's "R1 template"), the prompt ending in an opened
  ``<think>``. It asks for the answer in ``<answer>`` tags: the ``math`` reward reads the
  last ``\\boxed{}``, so score it with a reward that reads the tags, or expect 0 for an
  answer not also boxed;
* ``r1_distill``: the DeepSeek-R1-Distill models' chat format with DeepSeek's recommended
  math instruction, the assistant turn opened with ``<think>\\n`` (as their chat template
  renders it).
"""

import dataclasses
from typing import Any

BOXED_INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."
R1_ZERO_SYSTEM = (
    "A conversation between User and Assistant. The User asks a question, and the Assistant "
    "solves it. The Assistant first thinks about the reasoning process in the mind and then "
    "provides the User with the answer. The reasoning process is enclosed within <think> "
    "</think> and answer is enclosed within <answer> </answer> tags, respectively, i.e., "
    "<think> reasoning process here </think> <answer> answer here </answer>.")


@dataclasses.dataclass(frozen=True)
class PromptTemplate:
    """A model family's prompt: ``text`` with ``{question}`` in it."""

    text: str

    def render(self, question: str) -> str:
        """The prompt for `question` (braces in the question are kept as written)."""
        before, after = self.text.split("{question}")
        return before + question + after


TEMPLATES = {
    "qwen25_math": PromptTemplate(
        f"<|im_start|>system\n{BOXED_INSTRUCTION}<|im_end|>\n"
        "<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n"),
    "qwen3_thinking": PromptTemplate(
        "<|im_start|>user\n{question}\n" f"{BOXED_INSTRUCTION}<|im_end|>\n"
        "<|im_start|>assistant\n"),
    "r1_zero": PromptTemplate(f"{R1_ZERO_SYSTEM}\nUser: {{question}}\nAssistant: <think>"),
    "r1_distill": PromptTemplate(
        "<｜begin▁of▁sentence｜><｜User｜>{question}\n" f"{BOXED_INSTRUCTION}"
        "<｜Assistant｜><think>\n"),
}


def template_prompt(example: dict[str, Any], name: str) -> str:
    """The example's question in the prompt template `name` (one of ``TEMPLATES``).

    >>> template_prompt({"question": "What is $1+1$?"}, "r1_zero")[-39:]
    'User: What is $1+1$?\\nAssistant: <think>'
    """
    if name not in TEMPLATES:
        raise ValueError(f"task.prompt_template must be '' or one of {sorted(TEMPLATES)}, "
                         f"got {name!r}")
    return TEMPLATES[name].render(example["question"])
