"""Fixtures of the sampler tests: the tiny model and a character-tokenizer checkpoint.

Toy decoders with set logits live in tests/sampling/toy_models.py; the tiny Hugging Face
checkpoints of each family in tests/models/checkpoints.py.
"""

import dataclasses

import pytest
import tokenizers
import transformers
from flax import nnx

from grpo_jax import models


@pytest.fixture(scope="session")
def tiny_model():
    """`(graphdef, state)` of the named "tiny" config (qwen3, V = 512), float32."""
    return nnx.split(models.init_model(models.get_model_config("tiny"), seed=0))


@pytest.fixture(scope="session")
def char_checkpoint(tmp_path_factory):
    """A tiny random qwen3 with a character tokenizer (id 1 = <eos>) and a plain chat
    template (the turns' contents, concatenated), saved as HF files."""
    chars = "abcdefghijklmnopqrstuvwxyz "
    vocab = {"<pad>": 0, "<eos>": 1, "<unk>": 2, **{c: i + 3 for i, c in enumerate(chars)}}
    model = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="<unk>"))
    model.pre_tokenizer = tokenizers.pre_tokenizers.Split(
        tokenizers.Regex("."), behavior="isolated"
    )
    model.decoder = tokenizers.decoders.Fuse()
    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_object=model, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>"
    )
    tokenizer.chat_template = "{% for m in messages %}{{ m['content'] | lower }} {% endfor %}"
    cfg = dataclasses.replace(
        models.get_model_config("tiny"), vocab_size=len(vocab), d_model=64, n_layers=2,
        eos_token_id=1,
    )
    path = str(tmp_path_factory.mktemp("ckpt"))
    models.save_pretrained(models.init_model(cfg, seed=1), path, tokenizer=tokenizer)
    return path
