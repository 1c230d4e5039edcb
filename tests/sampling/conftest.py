"""Models for the sampler tests: toy decoders whose logits we set, and the models tests'
tiny Hugging Face checkpoints (imported from tests/models/conftest.py, not copied)."""

import contextlib
import dataclasses
import importlib.util
import pathlib

import jax
import numpy as np
import pytest
import tokenizers
import transformers
from flax import nnx

from grpo_jax import models

_spec = importlib.util.spec_from_file_location(
    "models_conftest", pathlib.Path(__file__).parents[1] / "models" / "conftest.py"
)
models_conftest = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(models_conftest)

COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"


def lookup_model(next_logits):
    """A 1-layer decoder whose logits after token i are `next_logits[i]`, whatever came before.

    Attention and MLP weights are zero, so the final hidden state is the normed embedding
    of the last token; with embedding = identity (D = V) the output projection row i is
    the logits after token i.

    Args:
      next_logits: `[V, V]` float32.

    Returns:
      `(graphdef, state)` of the model.
    """
    v = next_logits.shape[0]
    cfg = dataclasses.replace(
        models.get_model_config("tiny"), model_type="llama", vocab_size=v, d_model=v, n_layers=1,
        n_heads=1, n_kv_heads=1, head_dim=8, d_ff=8, qk_norm=False, tie_embeddings=False,
    )
    graphdef, state = nnx.split(models.init_model(cfg))
    norm_scale = 1.0 / np.sqrt(1.0 / v + cfg.norm_eps)  # rms_norm of a one-hot row
    values = {("embed",): np.eye(v), ("lm_head",): next_logits / norm_scale, ("final_norm",): np.ones(v)}
    flat = {
        path: var.replace(jax.numpy.asarray(values.get(path, np.zeros(var.get_value().shape)), np.float32))
        for path, var in nnx.to_flat_state(state)
    }
    return graphdef, nnx.from_flat_state(flat)


@contextlib.contextmanager
def counting_compiles():
    """Yields a list that collects one entry per XLA compilation inside the block."""
    compiles = []

    def listen(event, *_, **__):
        if event == COMPILE_EVENT:
            compiles.append(event)

    jax.monitoring.register_event_duration_secs_listener(listen)
    try:
        yield compiles
    finally:
        jax.monitoring.unregister_event_duration_listener(listen)


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
    model.pre_tokenizer = tokenizers.pre_tokenizers.Split(tokenizers.Regex("."), behavior="isolated")
    model.decoder = tokenizers.decoders.Fuse()
    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_object=model, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>"
    )
    tokenizer.chat_template = "{% for m in messages %}{{ m['content'] | lower }} {% endfor %}"
    cfg = dataclasses.replace(
        models.get_model_config("tiny"), vocab_size=len(vocab), d_model=64, n_layers=2, eos_token_id=1
    )
    path = str(tmp_path_factory.mktemp("ckpt"))
    models.save_pretrained(models.init_model(cfg, seed=1), path, tokenizer=tokenizer)
    return path
