"""RPT next-token(s) reward: a hand-checked table of predictions against true continuations."""

import pytest

from grpo_jax import rewards

THINK = "<think>The sentence is about a fox; 'quick brown' usually precedes 'fox'.</think> "

# (completion, true continuation, expected)
TABLE = [
    # exact single-token predictions
    (THINK + r"\boxed{fox}", "fox", 1.0),
    (r"\boxed{fox}", "fox", 1.0),
    (r"\boxed{ fox }", "fox", 1.0),
    (r"\boxed{fox}.", "fox", 1.0),
    (r"The next word is \boxed{fox}", "fox", 1.0),
    (r"\boxed{Fox}", "fox", 0.0),  # case matters
    (r"\boxed{FOX}", "fox", 0.0),
    (r"\boxed{foxes}", "fox", 0.0),
    (r"\boxed{fo}", "fox", 0.0),  # not a token boundary
    (r"\boxed{dog}", "fox", 0.0),
    (r"\boxed{.}", ".", 1.0),
    (r"\boxed{,}", ",", 1.0),
    (r"\boxed{,}", ".", 0.0),
    (r"\boxed{1984}", "1984", 1.0),
    (r"\boxed{1,984}", "1984", 0.0),  # no numeric normalisation: text must match
    (r"\boxed{ünïcödé}", "ünïcödé", 1.0),
    (r"\boxed{東京}", "東京", 1.0),
    (r"\boxed{'}", "'", 1.0),
    # multi-token continuations: any prefix on a token boundary
    (r"\boxed{New York}", "New York", 1.0),
    (r"\boxed{New}", "New York", 1.0),
    (r"\boxed{New Yo}", "New York", 0.0),
    (r"\boxed{Ne}", "New York", 0.0),
    (r"\boxed{New York City}", "New York", 0.0),  # longer than what can be checked
    (r"\boxed{New  York}", "New York", 1.0),  # whitespace runs compare as one space
    ("\\boxed{New\nYork}", "New York", 1.0),
    (r"\boxed{New York}", "New\nYork", 1.0),
    (r"\boxed{NewYork}", "New York", 0.0),  # a missing space is a different text
    (r"\boxed{York}", "New York", 0.0),  # not a prefix
    (r"\boxed{jumps over}", "jumps over the", 1.0),
    (r"\boxed{jumps over the}", "jumps over the", 1.0),
    (r"\boxed{jumps}", "jumps over the", 1.0),
    (r"\boxed{jumps over th}", "jumps over the", 0.0),
    (r"\boxed{end.}", "end. The", 1.0),
    (r"\boxed{end}", "end. The", 1.0),
    (r"\boxed{end. The}", "end. The", 1.0),
    (r"\boxed{end .}", "end. The", 0.0),  # a space the text does not have
    (r"\boxed{don}", "don't", 1.0),  # word/punctuation tokens, as in grpo_jax.data.rpt
    (r"\boxed{don'}", "don't", 1.0),
    (r"\boxed{don't}", "don't", 1.0),
    (r"\boxed{do}", "don't", 0.0),
    (r"\boxed{3.}", "3.14", 1.0),
    (r"\boxed{3.1}", "3.14", 0.0),
    # the last box decides; empty or unclosed never falls back
    (r"\boxed{dog} no wait, \boxed{fox}", "fox", 1.0),
    (r"\boxed{fox} no wait, \boxed{dog}", "fox", 0.0),
    (r"\boxed{fox} and \boxed{}", "fox", 0.0),
    (r"\boxed{fox} and \boxed{  }", "fox", 0.0),
    (r"\boxed{fox} and \boxed{do", "fox", 0.0),  # truncated
    (r"\boxed{fox", "fox", 0.0),
    (r"\boxed{\boxed{fox}}", "fox", 1.0),
    # no box
    ("fox", "fox", 0.0),
    ("The next word is fox.", "fox", 0.0),
    ("<answer>fox</answer>", "fox", 0.0),
    ("", "fox", 0.0),
    (r"\boxed fox", "fox", 0.0),
    # adversarial
    (r"\boxed{__import__('os').system('ls')}", "fox", 0.0),
    (r"\boxed{.*}", "fox", 0.0),  # no regex semantics
    (r"\boxed{fox|dog}", "fox", 0.0),
    (r"\boxed{fox dog cat bird}", "fox", 0.0),  # listing guesses does not help
    (r"\boxed{" + "fox " * 5000 + "}", "fox", 0.0),
    (r"\boxed{\text{fox}}", "fox", 0.0),  # no LaTeX stripping: the text itself
    (r"\boxed{fox}" + "\u200b", "fox", 1.0),  # text after the box does not matter
    ("\\boxed{fox\u200b}", "fox", 0.0),
    (r"\boxed{" + "\u200bfox" + "}", "fox", 0.0),
]


def test_table_is_big_enough():
    assert len(TABLE) >= 60


@pytest.mark.parametrize("completion, continuation, expected", TABLE)
def test_rpt_reward(completion, continuation, expected):
    example = {
        "task": "rpt", "question": "ctx", "answer": continuation, "context": "ctx",
        "continuation": continuation,
    }
    assert rewards.rpt_reward("prompt", completion, example) == expected


@pytest.mark.slow
def test_tokens_are_the_data_modules_tokens():
    """The reward's token boundaries are the ones grpo_jax.data.rpt cuts continuations at."""
    from grpo_jax.data import rpt as data_rpt
    from grpo_jax.rewards import _rpt

    assert _rpt.TOKEN.pattern == data_rpt.TOKEN.pattern
