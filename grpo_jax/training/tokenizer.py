"""A character-level tokenizer trained with `tokenizers` for the tiny procedural tasks.

Arithmetic is learned column by column, so every digit should be one token; a BPE
would merge "73" into one symbol and hide the columns from a tiny model. The vocabulary
is learned from the task's own texts (WordLevel over single characters) and wrapped as
a `transformers.PreTrainedTokenizerFast`, so it saves and loads like any HF tokenizer
and travels with the exported checkpoint.
"""

from collections.abc import Iterable

import tokenizers
import transformers

PAD, EOS, UNK = "<pad>", "<eos>", "<unk>"


def train_char_tokenizer(texts: Iterable[str]) -> transformers.PreTrainedTokenizerFast:
    """A tokenizer with one token per character of `texts`, plus <pad>, <eos>, <unk>.

    Args:
      texts: an iterable of strings covering every character the task uses.

    Returns:
      `transformers.PreTrainedTokenizerFast` with ids 0, 1, 2 = pad, eos, unk.
    """
    model = tokenizers.Tokenizer(tokenizers.models.WordLevel(unk_token=UNK))
    model.pre_tokenizer = tokenizers.pre_tokenizers.Split(
        tokenizers.Regex("."), behavior="isolated")
    trainer = tokenizers.trainers.WordLevelTrainer(special_tokens=[PAD, EOS, UNK], min_frequency=1)
    model.train_from_iterator(texts, trainer=trainer)
    model.decoder = tokenizers.decoders.Fuse()
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=model, pad_token=PAD, eos_token=EOS, unk_token=UNK,
        padding_side="left", clean_up_tokenization_spaces=False)
