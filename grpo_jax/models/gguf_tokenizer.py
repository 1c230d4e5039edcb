"""The tokenizer a GGUF file describes, rebuilt as a Hugging Face fast tokenizer.

A GGUF carries no `tokenizer.json`: its metadata holds the vocabulary
(`tokenizer.ggml.tokens`), each token's type, the BPE merges, the special token ids,
the chat template, and a name for the pre-tokenizer (`tokenizer.ggml.pre`) that llama.cpp
resolves to a split regex in `llama-vocab.cpp`. This module maps those fields back onto the
`tokenizers` library with the split each model family's own `tokenizer.json` uses.
Only byte-level BPE (`tokenizer.ggml.model = "gpt2"`: GPT-2, Llama 3, Qwen2/3, SmolLM)
is rebuilt; a file that embeds its `tokenizer.json` (`tokenizer.huggingface.json`) is
taken as is.
"""

import dataclasses

import transformers
from gguf import Keys
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

# llama.cpp's token types (gguf.TokenType): 3 marks control tokens such as <|im_end|>,
# 4 user-defined ones that are matched whole but are not special.
CONTROL, USER_DEFINED = 3, 4

_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


@dataclasses.dataclass(frozen=True)
class PreTokenizer:
    """How one `tokenizer.ggml.pre` value splits text before BPE.

    Attributes:
      split: a regex whose matches are the pieces, or None for GPT-2's own regex.
      individual_digits: split every digit off first (SmolLM, StarCoder).
      nfc: NFC-normalise the text first (Qwen2's tokenizer.json does).
      ignore_merges: a piece already in the vocabulary is one token (Llama 3's BPE).
      add_bos: whether to prepend BOS when the file has no `tokenizer.ggml.add_bos_token`.
    """

    split: str | None = None
    individual_digits: bool = False
    nfc: bool = False
    ignore_merges: bool = False
    add_bos: bool = False

    def build(self):
        """`(normalizer or None, pre_tokenizer)` for a `tokenizers.Tokenizer`."""
        if self.split is None:
            steps = [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)]
        else:
            steps = [
                pre_tokenizers.Split(Regex(self.split), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        if self.individual_digits:
            steps.insert(0, pre_tokenizers.Digits(individual_digits=True))
        return (normalizers.NFC() if self.nfc else None), pre_tokenizers.Sequence(steps)


# `tokenizer.ggml.pre` -> split; the groups and their defaults follow llama.cpp's
# `llama_vocab::impl::load`. Its "default" (for a file that names none) stacks four
# regexes that no tokenizer.json spells, so it is not rebuilt.
PRE_TOKENIZERS = {
    "gpt-2": PreTokenizer(),
    "smollm": PreTokenizer(individual_digits=True),
    "starcoder": PreTokenizer(individual_digits=True),
    "llama-bpe": PreTokenizer(_LLAMA3_SPLIT, ignore_merges=True, add_bos=True),
    "llama3": PreTokenizer(_LLAMA3_SPLIT, ignore_merges=True, add_bos=True),
    "llama-v3": PreTokenizer(_LLAMA3_SPLIT, ignore_merges=True, add_bos=True),
    "qwen2": PreTokenizer(_QWEN2_SPLIT, nfc=True),
    "deepseek-r1-qwen": PreTokenizer(_QWEN2_SPLIT, nfc=True),
}


def _byte_level_bpe(metadata, source):
    """The `tokenizers.Tokenizer` of a byte-level BPE vocabulary, special tokens included."""
    pre_name = metadata.get(Keys.Tokenizer.PRE)
    if pre_name not in PRE_TOKENIZERS:
        raise ValueError(
            f"{source}: {Keys.Tokenizer.PRE}={pre_name!r} is not supported; "
            f"known pre-tokenizers: {', '.join(sorted(PRE_TOKENIZERS))}"
        )
    pre = PRE_TOKENIZERS[pre_name]
    tokens = metadata[Keys.Tokenizer.LIST]
    # "a b": split at the first space after the first character, as llama.cpp does.
    merges = [
        (m[: m.index(" ", 1)], m[m.index(" ", 1) + 1 :])
        for m in metadata.get(Keys.Tokenizer.MERGES, [])
    ]
    tokenizer = Tokenizer(models.BPE(
        vocab={t: i for i, t in enumerate(tokens)}, merges=merges, ignore_merges=pre.ignore_merges
    ))
    normalizer, tokenizer.pre_tokenizer = pre.build()
    if normalizer is not None:
        tokenizer.normalizer = normalizer
    tokenizer.decoder = decoders.ByteLevel()
    types = metadata.get(Keys.Tokenizer.TOKEN_TYPE, [])
    tokenizer.add_special_tokens([
        AddedToken(t, special=True, normalized=False) for t, k in zip(tokens, types) if k == CONTROL
    ])
    tokenizer.add_tokens(
        [
            AddedToken(t, special=False, normalized=False)
            for t, k in zip(tokens, types)
            if k == USER_DEFINED
        ]
    )
    return tokenizer


def backend_tokenizer(metadata, source="the GGUF file"):
    """The `tokenizers.Tokenizer` the GGUF `metadata` ({key: value}) describes.

    Raises:
      ValueError naming `source` and the field, for a tokenizer type or pre-tokenizer
      that is not rebuilt here.
    """
    if Keys.Tokenizer.HF_JSON in metadata:
        return Tokenizer.from_str(metadata[Keys.Tokenizer.HF_JSON])
    kind = metadata.get(Keys.Tokenizer.MODEL)
    if kind != "gpt2":
        raise ValueError(
            f"{source}: {Keys.Tokenizer.MODEL}={kind!r} is not supported; only byte-level BPE "
            "('gpt2': GPT-2, Llama 3, Qwen2/3, SmolLM vocabularies) is rebuilt"
        )
    return _byte_level_bpe(metadata, source)


def hf_tokenizer(metadata, *, model_max_length=None, source="the GGUF file"):
    """A `transformers.PreTrainedTokenizerFast` with the file's special tokens and chat template.

    `save_pretrained` on it writes tokenizer.json, tokenizer_config.json and the chat
    template, which `transformers.AutoTokenizer.from_pretrained` reads back.
    """
    tokens = metadata[Keys.Tokenizer.LIST]
    pre = PRE_TOKENIZERS.get(metadata.get(Keys.Tokenizer.PRE), PreTokenizer())

    def token(key):
        index = metadata.get(key)
        return None if index is None else tokens[index]

    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_object=backend_tokenizer(metadata, source),
        bos_token=token(Keys.Tokenizer.BOS_ID),
        eos_token=token(Keys.Tokenizer.EOS_ID),
        unk_token=token(Keys.Tokenizer.UNK_ID),
        pad_token=token(Keys.Tokenizer.PAD_ID),
        add_bos_token=bool(metadata.get(Keys.Tokenizer.ADD_BOS, pre.add_bos)),
        add_eos_token=bool(metadata.get(Keys.Tokenizer.ADD_EOS, False)),
        clean_up_tokenization_spaces=False,
        **({} if model_max_length is None else {"model_max_length": model_max_length}),
    )
    if Keys.Tokenizer.CHAT_TEMPLATE in metadata:
        tokenizer.chat_template = metadata[Keys.Tokenizer.CHAT_TEMPLATE]
    return tokenizer
