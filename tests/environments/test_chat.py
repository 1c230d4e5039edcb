"""A chat model's tool replies: `chat_reply` reads the turn layout from the tokenizer's template."""

import pytest
import tokenizers
import transformers

from grpo_jax import environments

# SmolLM2-135M-Instruct's template, as its GGUF's tokenizer.chat_template holds it (ChatML).
SMOLLM2_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
    "Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}")
# A template that knows two roles only, as Llama 2's did.
TWO_ROLES = ("{% for m in messages %}{% if m['role'] not in ['user', 'assistant'] %}"
             "{{ raise_exception('roles must be user or assistant') }}{% endif %}"
             "[{{ m['role'] }}]{{ m['content'] }}{% endfor %}"
             "{% if add_generation_prompt %}[assistant]{% endif %}")
# One that leaves tool messages out of the text.
DROPS_TOOLS = ("{% for m in messages %}{% if m['role'] != 'tool' %}[{{ m['role'] }}]"
               "{{ m['content'] }}{% endif %}{% endfor %}"
               "{% if add_generation_prompt %}[assistant]{% endif %}")


def chat_tokenizer(template=SMOLLM2_TEMPLATE):
    """One id per printable character, ChatML's markers as special tokens (<|im_end|> the
    end of a turn and the stop token, as in SmolLM2)."""
    chars = [chr(c) for c in range(32, 127)] + ["\n"]
    vocab = {"<pad>": 0, **{c: i + 1 for i, c in enumerate(chars)}}
    model = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="<pad>"))
    model.pre_tokenizer = tokenizers.pre_tokenizers.Split(tokenizers.Regex("[\\s\\S]"),
                                                          behavior="isolated")
    model.decoder = tokenizers.decoders.Fuse()
    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_object=model, pad_token="<pad>", eos_token="<|im_end|>",
        additional_special_tokens=["<|im_start|>"])
    tokenizer.chat_template = template
    return tokenizer


def test_chatml_reply_closes_the_turn_holds_the_output_and_opens_the_next():
    tokenizer = chat_tokenizer()
    reply = environments.chat_reply(tokenizer)
    assert reply == "<|im_end|>\n<|im_start|>tool\n{}<|im_end|>\n<|im_start|>assistant\n"
    assert environments.chat_reply(tokenizer, "user") == (
        "<|im_end|>\n<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n")
    # the markers are read as the template's special tokens, not as their characters
    ids = tokenizer.encode(reply.format("56"), add_special_tokens=False)
    end, start = tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("<|im_start|>")
    char = lambda text: [tokenizer.convert_tokens_to_ids(c) for c in text]
    assert ids == [end, *char("\n"), start, *char("tool\n56"), end, *char("\n"), start,
                   *char("assistant\n")]
    assert {end, start} <= set(tokenizer.all_special_ids)
    # braces in a template's text stay text: the reply has exactly one field
    braces = chat_tokenizer(SMOLLM2_TEMPLATE.replace("'<|im_end|>'", "'<|im_end|>{x}'"))
    assert environments.chat_reply(braces).format("56") == (
        "<|im_end|>{x}\n<|im_start|>tool\n56<|im_end|>{x}\n<|im_start|>assistant\n")


def test_a_template_without_the_role_is_refused_with_the_fix():
    with pytest.raises(ValueError, match=r"does not render a 'tool' turn .* e.g. 'user'"):
        environments.chat_reply(chat_tokenizer(TWO_ROLES))
    assert environments.chat_reply(chat_tokenizer(TWO_ROLES), "user") == "[user]{}[assistant]"
    with pytest.raises(ValueError, match=r"does not show a 'tool' turn's content"):
        environments.chat_reply(chat_tokenizer(DROPS_TOOLS))
    plain = chat_tokenizer()
    plain.chat_template = None
    with pytest.raises(ValueError, match=r"needs a tokenizer with a chat_template"):
        environments.chat_reply(plain)


def test_make_sets_the_reply_of_a_tool_environment():
    environment = environments.make("calculator", max_calls=2, reply="[tool]{}[assistant]")
    step = environment.step({}, ["<calculator>7*8</calculator>"])
    assert step.observation == "[tool]56[assistant]" and step.tool_call


def test_make_refuses_a_reply_for_an_environment_that_writes_its_own(monkeypatch):
    from tests.environments.envs import AnswerEveryA
    monkeypatch.setitem(environments.ENVIRONMENTS, "scripted", lambda max_calls: AnswerEveryA())
    assert isinstance(environments.make("scripted", max_calls=1), AnswerEveryA)
    with pytest.raises(ValueError, match=r"'scripted' writes its own observations .* "
                                         r"environment.chat_role=''"):
        environments.make("scripted", max_calls=1, reply="[tool]{}")
