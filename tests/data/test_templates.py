"""Model families' prompt templates, chosen by task.prompt_template."""

import jinja2
import pytest

from configs import base
from grpo_jax import data
from grpo_jax.training import task as task_lib
from tests.data.test_prompts import CHATML

QUESTION = "Let $f(x) = \\{x\\}$. What is $f(2.5)$?"   # braces stay as written
EXAMPLE = {"task": "math", "question": QUESTION, "answer": "0.5"}
BOXED = "Please reason step by step, and put your final answer within \\boxed{}."


def chatml(messages):
    """ChatML rendered by its own jinja template (as Qwen tokenizers do)."""
    return jinja2.Template(CHATML).render(messages=messages, add_generation_prompt=True)


class TestTemplates:

    def test_qwen25_math_is_the_system_turn_of_chatml(self):
        expected = chatml([{"role": "system", "content": BOXED},
                           {"role": "user", "content": QUESTION}])
        assert data.template_prompt(EXAMPLE, "qwen25_math") == expected
        assert expected == ("<|im_start|>system\n" + BOXED + "<|im_end|>\n<|im_start|>user\n"
                            + QUESTION + "<|im_end|>\n<|im_start|>assistant\n")

    def test_qwen3_thinking_puts_the_instruction_in_the_user_turn(self):
        expected = chatml([{"role": "user", "content": f"{QUESTION}\n{BOXED}"}])
        assert data.template_prompt(EXAMPLE, "qwen3_thinking") == expected

    def test_r1_zero_opens_think(self):
        prompt = data.template_prompt(EXAMPLE, "r1_zero")
        assert prompt.startswith("A conversation between User and Assistant. The User asks a "
                                 "question, and the Assistant solves it.")
        assert ("<think> reasoning process here </think> <answer> answer here </answer>."
                in prompt)
        assert prompt.endswith(f"</answer>.\nUser: {QUESTION}\nAssistant: <think>")

    def test_r1_distill(self):
        assert data.template_prompt(EXAMPLE, "r1_distill") == (
            f"<｜begin▁of▁sentence｜><｜User｜>{QUESTION}\n{BOXED}<｜Assistant｜><think>\n")

    def test_unknown_name(self):
        with pytest.raises(ValueError, match=r"task.prompt_template must be '' or one of "
                                             r"\['qwen25_math', 'qwen3_thinking', 'r1_distill'"):
            data.template_prompt(EXAMPLE, "llama")


class TestSelectedByConfig:

    def test_the_default_is_the_task_prompt(self):
        task_cfg = base.get_config().task
        assert task_cfg.prompt_template == ""
        assert task_lib.prompt_text(task_cfg, EXAMPLE, None) == data.format_prompt(EXAMPLE)

    @pytest.mark.parametrize("name", sorted(data.TEMPLATES))
    def test_a_named_template(self, name):
        task_cfg = base.get_config().task
        task_cfg.prompt_template = name
        assert task_lib.prompt_text(task_cfg, EXAMPLE, None) == data.template_prompt(EXAMPLE,
                                                                                      name)

    @pytest.mark.parametrize("field, value", [("chat_template", True),
                                              ("system_prompt", "Be brief."),
                                              ("shots", (("1+1", "2"),))])
    def test_conflicts_with_the_task_prompt_fields(self, field, value):
        task_cfg = base.get_config().task
        task_cfg.prompt_template = "qwen25_math"
        task_cfg[field] = value
        with pytest.raises(ValueError, match=r"task.prompt_template='qwen25_math' writes the "
                                             r"whole prompt"):
            task_lib.prompt_text(task_cfg, EXAMPLE, None)
