"""Prompt formatting and the answer format of every task.

A prompt is built from an example (see ``_records``) in one of two ways:

* plain: ``TaskFormat.plain_template`` filled with the question and the task's
  answer instruction, optionally preceded by a system prompt; for base models and the
  tiny CPU models (arithmetic's plain prompt is just ``"478+256="``, the small countdown's
  ``"3 7 9 -> 30:"``);
* chat: the tokenizer's own chat template (``tokenizer.apply_chat_template``) over an
  optional system message and one user message, ending with the generation prompt.

Answer formats (the final answer a completion must give; every ``solution`` gives it):

  arithmetic, chain_sum                     ``#### <integer>`` (at the end)
  basic_arithmetic, gsm8k, gsm_symbolic     ``#### <number>`` (at the end)
  math500, math, dapo_math_17k, deepscaler   ``\\boxed{<answer>}`` (the last one counts)
  aime24, aime25, amc23, minerva_math       ``\\boxed{<answer>}``
  olympiadbench                             ``\\boxed{<answer>}``
  countdown, countdown_compact              ``<answer><expression></answer>``
  rpt                                       ``\\boxed{<the next token(s)>}``
  humaneval, code_tasks, mbpp               a ```` ```python ```` block (the last one counts)
  mbpp_sanitized, apps                      a ```` ```python ```` block

e.g. arithmetic ``8+6+0=14 7+5+1=13 4+2+1=7 #### 734``, countdown
``<answer>(6 - 2) * 6</answer>``, rpt ``\\boxed{fox}``.
"""

import dataclasses
from typing import Any


@dataclasses.dataclass(frozen=True)
class AnswerFormat:
    """How a final answer is written: a template and the instruction that asks for it."""

    template: str
    instruction: str

    def render(self, answer: str) -> str:
        """The answer written in this format, e.g. ``"#### 72"``."""
        return self.template.format(answer=answer)


HASHES = AnswerFormat(
    "#### {answer}",
    "Think step by step, then write the final answer on the last line as "
    "'#### <answer>'.")
BOXED = AnswerFormat(
    "\\boxed{{{answer}}}",
    "Think step by step, then put the final answer in \\boxed{}.")
ANSWER_TAGS = AnswerFormat(
    "<answer>{answer}</answer>",
    "Think step by step, then write only the expression inside <answer> </answer> "
    "tags, for example <answer>(1 + 2) * 3</answer>.")
PYTHON_BLOCK = AnswerFormat(
    "```python\n{answer}```",
    "Write the complete solution, with its imports, as one Python program in a "
    "```python code block.")
NEXT_TOKENS = AnswerFormat(
    "\\boxed{{{answer}}}",
    "Reason about how the text above continues, then put the word(s) that come "
    "next, exactly as they would appear, in \\boxed{}.")


@dataclasses.dataclass(frozen=True)
class TaskFormat:
    """The answer format of a task and its plain prompt template.

    ``plain_template`` may use ``{question}`` and ``{instruction}``.
    """

    answer: AnswerFormat
    plain_template: str = "{question}\n\n{instruction}\n"


TASK_FORMATS = {
    "arithmetic": TaskFormat(HASHES, plain_template="{question}="),
    "basic_arithmetic": TaskFormat(HASHES),
    "chain_sum": TaskFormat(HASHES),
    "gsm_symbolic": TaskFormat(HASHES),
    "gsm8k": TaskFormat(HASHES),
    "math500": TaskFormat(BOXED),
    **{name: TaskFormat(BOXED) for name in (
        "math", "dapo_math_17k", "deepscaler", "aime24", "aime25", "amc23", "minerva_math",
        "olympiadbench")},
    "countdown": TaskFormat(ANSWER_TAGS),
    "countdown_compact": TaskFormat(ANSWER_TAGS, plain_template="{question}:"),
    "rpt": TaskFormat(NEXT_TOKENS),
    **{name: TaskFormat(PYTHON_BLOCK) for name in ("humaneval", "mbpp", "mbpp_sanitized",
                                                    "apps")},
    "code_tasks": TaskFormat(PYTHON_BLOCK, plain_template="{question}\n"),
}


def task_format(task: str) -> TaskFormat:
    """The ``TaskFormat`` registered for ``task``."""
    if task not in TASK_FORMATS:
        raise ValueError(
            f"example['task'] = {task!r} has no answer format; add it to "
            f"grpo_jax.data.prompts.TASK_FORMATS (known: {sorted(TASK_FORMATS)})")
    return TASK_FORMATS[task]


def render_answer(task: str, answer: str) -> str:
    """``answer`` written in ``task``'s answer format (the end of an SFT target)."""
    return task_format(task).answer.render(answer)


def user_message(example: dict[str, Any]) -> str:
    """The question followed by the task's answer instruction (the chat user turn)."""
    instruction = task_format(example["task"]).answer.instruction
    return f"{example['question']}\n\n{instruction}"


def plain_prompt(example: dict[str, Any], *, system_prompt: str | None = None,
                 shots: tuple = ()) -> str:
    """The task's plain template filled from ``example``, after ``system_prompt`` if any
    and the worked ``shots`` (``(question, answer text)`` pairs, each its own prompt
    followed by its answer and a blank line).

    >>> plain_prompt({"task": "arithmetic", "question": "478+256"})
    '478+256='
    """
    fmt = task_format(example["task"])
    fill = lambda question: fmt.plain_template.format(
        question=question, instruction=fmt.answer.instruction)
    parts = [fill(question) + answer for question, answer in _checked_shots(shots)]
    body = "\n\n".join(parts + [fill(example["question"])])
    return body if system_prompt is None else f"{system_prompt}\n\n{body}"


def _checked_shots(shots) -> list[tuple[str, str]]:
    """``shots`` as a list of ``(question, answer text)`` string pairs, or a clear error."""
    pairs = [shot if isinstance(shot, str) else tuple(shot) for shot in shots]
    for shot in pairs:
        if isinstance(shot, str) or len(shot) != 2 or not all(
                isinstance(part, str) for part in shot):
            raise ValueError(
                f"task.shots: each shot is a (question, answer text) pair of strings, got "
                f"{shot!r}; e.g. (('23+45', '23+45=68\\n#### 68'),)")
    return pairs


def chat_prompt(example: dict[str, Any], tokenizer, *,
                system_prompt: str | None = None, shots: tuple = ()) -> str:
    """The example as a chat prompt rendered by ``tokenizer``'s chat template.

    Args:
      example: an example dict (``task`` and ``question`` are read).
      tokenizer: a ``transformers`` tokenizer whose ``chat_template`` is set.
      system_prompt: an optional system message placed before the user turn.
      shots: worked examples, ``(question, answer text)`` pairs, each rendered as an
        earlier user turn (the question with the task's instruction) and the assistant's
        answer (a few-shot prompt, as Brown et al., arXiv:2005.14165).

    Returns:
      The prompt text, ending with the template's generation prompt (the start of the
      assistant turn), ready to tokenize.
    """
    if getattr(tokenizer, "chat_template", None) is None:
        raise ValueError(
            "tokenizer has no chat_template; pass tokenizer=None for a plain prompt or "
            "set tokenizer.chat_template")
    messages = []
    for question, answer in _checked_shots(shots):
        messages += [{"role": "user", "content": user_message({**example, "question": question})},
                     {"role": "assistant", "content": answer}]
    messages.append({"role": "user", "content": user_message(example)})
    if system_prompt is not None:
        messages.insert(0, {"role": "system", "content": system_prompt})
    return tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True)


def format_prompt(example: dict[str, Any], *, tokenizer=None,
                  system_prompt: str | None = None, shots: tuple = ()) -> str:
    """``chat_prompt`` when a tokenizer is given, else ``plain_prompt``."""
    if tokenizer is None:
        return plain_prompt(example, system_prompt=system_prompt, shots=shots)
    return chat_prompt(example, tokenizer, system_prompt=system_prompt, shots=shots)
