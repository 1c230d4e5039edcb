"""Prompt formatting: plain templates, the tokenizer's chat template, answer formats."""

import pytest
import tokenizers
import transformers

from grpo_jax import data
from grpo_jax.data import prompts

CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
          "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
          "{% endif %}")

GSM8K = {"task": "gsm8k", "question": "Lena has 4 times as many stickers as Omar.",
         "answer": "68"}
ARITHMETIC = {"task": "arithmetic", "question": "478+256", "answer": "734"}


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    """A tiny word-level tokenizer with a ChatML template, built locally and saved."""
    vocab = {"[UNK]": 0, "<|im_start|>": 1, "<|im_end|>": 2, "user": 3, "assistant": 4}
    model = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="[UNK]"))
    model.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=model, unk_token="[UNK]", eos_token="<|im_end|>")
    fast.chat_template = CHATML
    path = tmp_path_factory.mktemp("tokenizer")
    fast.save_pretrained(path)  # round-trip through disk, as a real checkpoint would be
    return transformers.PreTrainedTokenizerFast.from_pretrained(path)


class TestPlain:

    def test_arithmetic_is_the_bare_expression(self):
        assert data.plain_prompt(ARITHMETIC) == "478+256="

    def test_default_template_adds_the_instruction(self):
        assert data.plain_prompt(GSM8K) == (
            "Lena has 4 times as many stickers as Omar.\n\n"
            "Think step by step, then write the final answer on the last line as "
            "'#### <answer>'.\n")

    def test_system_prompt_comes_first(self):
        assert data.plain_prompt(ARITHMETIC, system_prompt="Add.") == "Add.\n\n478+256="

    def test_shots_come_before_the_question_after_the_system_prompt(self):
        shots = (("1+2", "#### 3"), ("40+2", "40+2=42\n#### 42"))
        assert data.plain_prompt(ARITHMETIC, system_prompt="Add.", shots=shots) == (
            "Add.\n\n1+2=#### 3\n\n40+2=40+2=42\n#### 42\n\n478+256=")

    @pytest.mark.parametrize("shots", [("1+2", "#### 3"), (("1+2",),), ((1, "#### 1"),)])
    def test_a_malformed_shot_is_a_clear_error(self, shots):
        with pytest.raises(ValueError, match=r"task.shots: each shot is a \(question, answer"):
            data.plain_prompt(ARITHMETIC, shots=shots)

    def test_format_prompt_without_tokenizer_is_plain(self):
        assert data.format_prompt(GSM8K) == data.plain_prompt(GSM8K)


class TestChat:

    def test_chat_template_with_system_prompt(self, tokenizer):
        prompt = data.format_prompt(ARITHMETIC, tokenizer=tokenizer, system_prompt="Be exact.")
        assert prompt == (
            "<|im_start|>system\nBe exact.<|im_end|>\n"
            "<|im_start|>user\n478+256\n\nThink step by step, then write the final answer "
            "on the last line as '#### <answer>'.<|im_end|>\n"
            "<|im_start|>assistant\n")

    def test_chat_template_without_system_prompt(self, tokenizer):
        prompt = data.chat_prompt({"task": "countdown", "question": "Make 24."}, tokenizer)
        assert prompt.startswith("<|im_start|>user\nMake 24.\n\n")
        assert "<answer> </answer>" in prompt
        assert prompt.endswith("<|im_end|>\n<|im_start|>assistant\n")
        assert "system" not in prompt

    def test_one_shot_is_an_earlier_user_and_assistant_turn(self, tokenizer):
        prompt = data.chat_prompt(ARITHMETIC, tokenizer, system_prompt="Be exact.",
                                  shots=(("12+30", "12+30=42\n#### 42"),))
        instruction = ("Think step by step, then write the final answer on the last line as "
                       "'#### <answer>'.")
        assert prompt == (
            "<|im_start|>system\nBe exact.<|im_end|>\n"
            f"<|im_start|>user\n12+30\n\n{instruction}<|im_end|>\n"
            "<|im_start|>assistant\n12+30=42\n#### 42<|im_end|>\n"
            f"<|im_start|>user\n478+256\n\n{instruction}<|im_end|>\n"
            "<|im_start|>assistant\n")

    def test_tokenizer_without_template_is_a_clear_error(self, tokenizer):
        bare = transformers.PreTrainedTokenizerFast(
            tokenizer_object=tokenizer.backend_tokenizer, unk_token="[UNK]")
        bare.chat_template = None
        with pytest.raises(ValueError, match="tokenizer has no chat_template"):
            data.chat_prompt(GSM8K, bare)


class TestAnswerFormats:

    @pytest.mark.parametrize("task, rendered", [
        ("arithmetic", "#### 734"), ("gsm8k", "#### 734"), ("gsm_symbolic", "#### 734"),
        ("basic_arithmetic", "#### 734"), ("chain_sum", "#### 734"),
        ("math500", "\\boxed{734}"), ("rpt", "\\boxed{734}"),
        ("countdown", "<answer>734</answer>"), ("humaneval", "```python\n734```"),
    ])
    def test_render_answer(self, task, rendered):
        assert data.render_answer(task, "734") == rendered

    def test_every_task_has_an_instruction_naming_its_marker(self):
        markers = {"#### ": "'#### <answer>'", "\\boxed": "\\boxed{}", "<answer>": "<answer>",
                   "```python": "```python"}
        for task, fmt in prompts.TASK_FORMATS.items():
            marker = next(m for m in markers if fmt.answer.template.startswith(m))
            assert markers[marker] in fmt.answer.instruction, task

    def test_unknown_task(self):
        with pytest.raises(ValueError, match=r"example\['task'\] = 'sudoku' has no answer format"):
            data.plain_prompt({"task": "sudoku", "question": "?"})
