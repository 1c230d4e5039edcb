"""Bad checkpoints fail with an error that names the file or tensor."""

import json
import os

import pytest
import transformers

from grpo_jax import models
from grpo_jax.models.safetensors_io import SafetensorsFile, save_file

TINY = models.get_model_config("tiny")


@pytest.fixture
def checkpoint(tmp_path):
    path = str(tmp_path / "ckpt")
    models.save_pretrained(models.init_model(TINY), path)
    return path


def edit_config(path, **changes):
    config_path = os.path.join(path, "config.json")
    with open(config_path) as f:
        config = json.load(f)
    config.update(changes)
    with open(config_path, "w") as f:
        json.dump(config, f)


def test_missing_directory(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"nowhere/config.json does not exist"):
        models.from_pretrained(str(tmp_path / "nowhere"))


def test_missing_weights(checkpoint):
    os.remove(os.path.join(checkpoint, "model.safetensors"))
    with pytest.raises(
        FileNotFoundError, match=r"has neither model.safetensors nor model.safetensors.index.json"
    ):
        models.from_pretrained(checkpoint)


def test_missing_shard(tmp_path):
    path = str(tmp_path / "sharded")
    models.save_pretrained(models.init_model(TINY), path, max_shard_bytes=100_000)
    with open(os.path.join(path, "model.safetensors.index.json")) as f:
        second = sorted(set(json.load(f)["weight_map"].values()))[1]
    os.remove(os.path.join(path, second))
    with pytest.raises(FileNotFoundError, match=rf"index.json names {second}, which is missing"):
        models.from_pretrained(path)


def test_unsupported_model_type(tmp_path):
    transformers.GPT2Config().save_pretrained(tmp_path)
    with pytest.raises(
        ValueError, match=r"config.json: model_type='gpt2' is not supported; supported: llama"
    ):
        models.from_pretrained(str(tmp_path))


def test_unsupported_option(checkpoint):
    edit_config(checkpoint, use_sliding_window=True)
    with pytest.raises(ValueError, match=r"config.json: use_sliding_window=True is not supported"):
        models.from_pretrained(checkpoint)


def test_weight_shape_disagrees_with_config(checkpoint):
    edit_config(checkpoint, intermediate_size=TINY.d_ff * 2)
    with pytest.raises(ValueError, match=(
        r"model.safetensors: tensor model.layers.0.mlp.gate_proj.weight has shape \(384, 128\), "
        r"but config.json implies \(768, 128\)"
    )):
        models.from_pretrained(checkpoint)


def test_missing_tensor(checkpoint):
    file_path = os.path.join(checkpoint, "model.safetensors")
    weights = SafetensorsFile(file_path)
    kept = {
        name: weights[name].copy()
        for name in weights.keys()
        if name != "model.layers.2.self_attn.k_norm.weight"
    }
    save_file(kept, file_path)
    with pytest.raises(KeyError, match=r"tensor model.layers.2.self_attn.k_norm.weight is missing"):
        models.from_pretrained(checkpoint)
