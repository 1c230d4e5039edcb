"""A chat model's tool replies: each one a turn of the tokenizer's own chat template.

A chat model reads a tool's output as a turn of its conversation, not as text inside its
own turn. `chat_reply` asks the template how it renders the conversation
``[..., assistant: A, tool: R]`` followed by the next assistant turn, and returns what
comes between A and that turn's content: the end of the model's turn, R as a turn of
the given role, and the opening of the model's next turn. Set as a `ToolEnvironment`'s
``reply``, it makes an episode's tokens exactly what the template renders for the
conversation (the model's turns and the tool's, alternating), the turn markers included.
For ChatML (SmolLM2, Qwen2) and ``role="tool"``::

    <|im_end|>\\n<|im_start|>tool\\n{}<|im_end|>\\n<|im_start|>assistant\\n

The reply's text is tokenized like any observation (no BOS/EOS added); a fast tokenizer
reads the markers written in it as the template's special tokens (``<|im_end|>`` is one
id, not eight characters). Every token of a reply is the environment's: out of the loss.
"""

_USER, _MODEL, _TOOL = "\x1euser\x1e", "\x1emodel\x1e", "\x1etool\x1e"   # texts no template makes


def chat_reply(tokenizer, role="tool"):
    """The format string (one ``{}``, the tool's output) of a reply as a `role` turn of
    `tokenizer`'s chat template, between two turns of the model.

    Args:
      tokenizer: a `transformers` tokenizer with a ``chat_template``.
      role: the role of the tool's turn: ``"tool"`` where the template has one (or renders
        any role it is given), else one it has (``"user"``).

    Returns:
      A `str.format` template: the text that closes the model's turn, holds the output as a
      `role` turn, and opens the model's next turn.

    Raises:
      ValueError: the tokenizer has no chat template, the template rejects `role`, or it
        does not render the conversation so far as a prefix of the longer one (then a
        reply cannot be appended to an episode).
    """
    if getattr(tokenizer, "chat_template", None) is None:
        raise ValueError("environment.chat_role needs a tokenizer with a chat_template; this "
                         "tokenizer has none (set environment.chat_role='' for plain replies)")
    user = {"role": "user", "content": _USER}
    model = {"role": "assistant", "content": _MODEL}
    render = lambda messages: tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True)
    prompt = render([user])
    try:
        conversation = render([user, model, {"role": role, "content": _TOOL}])
    except Exception as error:   # jinja's raise_exception: the template refuses the role
        raise ValueError(f"the chat template does not render a {role!r} turn after the "
                         f"assistant's ({error}); set environment.chat_role to a role it has, "
                         "e.g. 'user'") from None
    if not conversation.startswith(prompt + _MODEL):
        raise ValueError(f"the chat template renders the model's turn differently once a {role!r} "
                         "turn follows it (the episode so far is not a prefix of the "
                         "conversation), so no reply appended to an episode renders it; set "
                         "environment.chat_role='' for plain replies")
    between = conversation[len(prompt + _MODEL):]
    if between.count(_TOOL) != 1:
        raise ValueError(f"the chat template does not show a {role!r} turn's content as it is; "
                         "set environment.chat_role to a role it shows, e.g. 'user'")
    before, _, after = between.partition(_TOOL)
    escape = lambda text: text.replace("{", "{{").replace("}", "}}")
    return escape(before) + "{}" + escape(after)
