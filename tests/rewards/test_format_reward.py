"""Format reward: a hand-checked table of completions for the default and custom tags."""

import pytest

from grpo_jax import rewards

TV = ("think", "answer", "verify")

# (prompt, completion, tags, expected)
TABLE = [
    # well formed
    ("Q:", "<think>2 + 2 = 4</think><answer>4</answer>", None, 1.0),
    ("Q:", "<think>2 + 2 = 4</think>\n<answer>4</answer>", None, 1.0),
    ("Q:", "  <think>a</think>  \n\n  <answer>4</answer>\n", None, 1.0),
    ("Q:", "<think>\nline one\nline two\n</think>\n<answer>\n4\n</answer>", None, 1.0),
    ("Q:", "<think></think><answer>4</answer>", None, 1.0),  # empty thinking, as Qwen3 no-think
    # structure only; correctness scores content
    ("Q:", "<think>x</think><answer></answer>", None, 1.0),
    ("Q:", "<think>5 < 6 and 7 > 3</think><answer>4</answer>", None, 1.0),
    # other tags inside are text
    ("Q:", "<think>we use <b>bold</b></think><answer>4</answer>", None, 1.0),
    ("Q:", "<think>ﾃｽﾄ ٤ 🙂</think><answer>٤</answer>", None, 1.0),
    ("Q:", "<think>" + "x" * 20000 + "</think><answer>4</answer>", None, 1.0),
    # pre-filled opener in the prompt
    ("Assistant: <think>", "2 + 2 = 4</think><answer>4</answer>", None, 1.0),
    ("Assistant: <think>\n", "2 + 2 = 4</think>\n<answer>4</answer>", None, 1.0),
    ("Assistant: <think>", "<think>2 + 2 = 4</think><answer>4</answer>", None, 0.0),  # opened twice
    ("Assistant:", "2 + 2 = 4</think><answer>4</answer>", None, 0.0),  # opener not in the prompt
    ("Assistant: <think> ok", "2 + 2 = 4</think><answer>4</answer>", None, 0.0),
    # missing pieces
    ("Q:", "", None, 0.0),
    ("Q:", "   ", None, 0.0),
    ("Q:", "The answer is 4.", None, 0.0),
    ("Q:", "<answer>4</answer>", None, 0.0),
    ("Q:", "<think>2 + 2 = 4</think>", None, 0.0),
    ("Q:", "<think>2 + 2 = 4<answer>4</answer>", None, 0.0),
    ("Q:", "2 + 2 = 4</think><answer>4</answer>", None, 0.0),
    ("Q:", "<think>2 + 2 = 4</think><answer>4", None, 0.0),  # truncated
    ("Q:", "<think>2 + 2 = 4</think><answer>4</answ", None, 0.0),
    ("Q:", "<think>2 + 2 = 4</think><answer>", None, 0.0),
    ("Q:", "<think>2 + 2 = 4", None, 0.0),
    ("Q:", "<think>", None, 0.0),
    # wrong order or nesting
    ("Q:", "<answer>4</answer><think>2 + 2 = 4</think>", None, 0.0),
    ("Q:", "<think>2 + 2 = 4<answer>4</answer></think>", None, 0.0),
    ("Q:", "<think><answer>4</answer></think>", None, 0.0),
    ("Q:", "<think>a</answer><answer>4</think>", None, 0.0),
    ("Q:", "</think>a<think><answer>4</answer>", None, 0.0),
    # repeated tags
    ("Q:", "<think>a</think><think>b</think><answer>4</answer>", None, 0.0),
    ("Q:", "<think>a</think><answer>3</answer><answer>4</answer>", None, 0.0),
    ("Q:", "<think>a <think> b</think><answer>4</answer>", None, 0.0),
    ("Q:", "<think>a</think> b </think><answer>4</answer>", None, 0.0),
    ("Q:", "<think>I will write <answer> at the end</think><answer>4</answer>", None, 0.0),
    # text outside the blocks
    ("Q:", "Sure! <think>a</think><answer>4</answer>", None, 0.0),
    ("Q:", "<think>a</think> so <answer>4</answer>", None, 0.0),
    ("Q:", "<think>a</think><answer>4</answer> Hope this helps!", None, 0.0),
    ("Q:", "<think>a</think><answer>4</answer><|im_end|>", None, 0.0),  # strip special tokens first
    ("Q:", "<think>a</think><answer>4</answer>.", None, 0.0),
    # spelling of the tags
    ("Q:", "<Think>a</Think><Answer>4</Answer>", None, 0.0),
    ("Q:", "<think >a</think ><answer >4</answer >", None, 0.0),
    ("Q:", "<thinking>a</thinking><answer>4</answer>", None, 0.0),
    ("Q:", "<think>a</think><answer>4<answer/>", None, 0.0),
    ("Q:", "&lt;think&gt;a&lt;/think&gt;<answer>4</answer>", None, 0.0),
    ("Q:", "＜think＞a＜/think＞<answer>4</answer>", None, 0.0),  # full-width brackets
    # adversarial
    # text only
    ("Q:", "<think>__import__('os').system('ls')</think><answer>4</answer>", None, 1.0),
    ("Q:", "<think>" + "<think>" * 1000 + "</think><answer>4</answer>", None, 0.0),
    ("Q:", "<think>a</think><answer>" + "(" * 5000 + "</answer>", None, 1.0),
    # three tags for self-verification
    ("Q:", "<think>a</think><answer>4</answer><verify>correct</verify>", TV, 1.0),
    ("Q:", "<think>a</think>\n<answer>4</answer>\n<verify>\nincorrect\n</verify>\n", TV, 1.0),
    ("Q:", "<think>a</think><answer>4</answer>", TV, 0.0),
    ("Q:", "<think>a</think><verify>correct</verify><answer>4</answer>", TV, 0.0),
    ("Q:", "<think>a</think><answer>4</answer><verify>correct", TV, 0.0),
    ("Assistant: <think>", "a</think><answer>4</answer><verify>correct</verify>", TV, 1.0),
    # custom tags
    ("Q:", "<answer>4</answer>", ("answer",), 1.0),
    ("Q:", "<think>a</think><answer>4</answer>", ("answer",), 0.0),
    ("Q:", "<reasoning>a</reasoning><solution>4</solution>", ("reasoning", "solution"), 1.0),
    ("Q:", "<reasoning>a</reasoning><solution>4</solution>", ("solution", "reasoning"), 0.0),
    ("Q:", "<my-tag>a</my-tag>", ("my-tag",), 1.0),
]


def test_table_is_big_enough():
    assert len(TABLE) >= 60


@pytest.mark.parametrize("prompt, completion, tags, expected", TABLE)
def test_format_reward(prompt, completion, tags, expected):
    options = {} if tags is None else {"tags": tags}
    assert rewards.format_reward(prompt, completion, {}, **options) == expected


@pytest.mark.parametrize("tags", [(), ("think", "think"), ("a b",), ("<think>",), (".*",), (3,)])
def test_bad_tags_name_the_option(tags):
    with pytest.raises(ValueError, match="option tags"):
        rewards.format_reward("Q:", "<think>a</think>", {}, tags=tags)


def test_options_through_score_batch():
    specs = rewards.as_specs([("format", 1.0, {"tags": ["answer"]})])
    values, _ = rewards.score_batch(specs, ["Q:"] * 2, ["<answer>4</answer>", "4"], [{}] * 2)
    assert values.tolist() == [1.0, 0.0]
