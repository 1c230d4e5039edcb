"""save_pretrained / from_pretrained details that need no torch: tokenizer, dtypes."""

import jax
import ml_dtypes
import numpy as np
import pytest
import tokenizers
import transformers
from flax import nnx

from grpo_jax import models
from grpo_jax.models.safetensors_io import SafetensorsFile

TINY = models.get_model_config("tiny")


def word_tokenizer():
    words = ["<pad>", "<eos>", "what", "is", "2", "+", "3", "?", "5"]
    tok = tokenizers.Tokenizer(
        tokenizers.models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<pad>")
    )
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>"
    )


def params(model):
    return {path: np.asarray(v.get_value()) for path, v in nnx.to_flat_state(nnx.state(model))}


def test_tokenizer_is_saved_and_loaded(tmp_path):
    tok = word_tokenizer()
    models.save_pretrained(models.init_model(TINY), str(tmp_path), tokenizer=tok)
    _, loaded = models.from_pretrained(str(tmp_path))
    assert (
        loaded("what is 2 + 3 ?")["input_ids"]
        == tok("what is 2 + 3 ?")["input_ids"]
        == [2, 3, 4, 5, 6, 7]
    )
    assert loaded.eos_token == "<eos>"


def test_no_tokenizer_gives_none(tmp_path):
    models.save_pretrained(models.init_model(TINY), str(tmp_path))
    assert models.from_pretrained(str(tmp_path))[1] is None


def test_bfloat16_save_and_load(tmp_path):
    model = models.init_model(TINY, seed=7)
    models.save_pretrained(model, str(tmp_path), dtype="bfloat16")
    assert {
        e["dtype"] for e in SafetensorsFile(str(tmp_path / "model.safetensors")).header.values()
    } == {"BF16"}
    loaded, _ = models.from_pretrained(str(tmp_path), param_dtype="bfloat16")
    want, got = params(model), params(loaded)
    for path in want:
        assert got[path].dtype == ml_dtypes.bfloat16, path
        np.testing.assert_array_equal(
            got[path], want[path].astype(ml_dtypes.bfloat16), err_msg=str(path)
        )


@pytest.mark.parametrize("max_shard_bytes", [5 * 2**30, 100_000])
def test_float32_round_trip_is_exact(tmp_path, max_shard_bytes):
    model = models.init_model(TINY, seed=8)
    models.save_pretrained(model, str(tmp_path), max_shard_bytes=max_shard_bytes)
    loaded, _ = models.from_pretrained(str(tmp_path))
    want, got = params(model), params(loaded)
    assert want.keys() == got.keys()
    for path in want:
        np.testing.assert_array_equal(got[path], want[path], err_msg=str(path))
    assert loaded.cfg == model.cfg
    assert jax.tree.structure(nnx.state(loaded)) == jax.tree.structure(nnx.state(model))


def test_config_overrides_reach_the_model(tmp_path):
    models.save_pretrained(models.init_model(TINY), str(tmp_path))
    model, _ = models.from_pretrained(
        str(tmp_path), dtype="bfloat16", remat=True, attention_impl="xla"
    )
    assert (model.cfg.dtype, model.cfg.remat, model.cfg.attention_impl) == (
        "bfloat16", "full", "xla",
    )
    assert model.embed[...].dtype == np.float32
