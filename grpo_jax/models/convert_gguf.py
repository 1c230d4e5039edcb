"""GGUF in: a llama.cpp model file to a Hugging Face model directory, without torch.

    python -m grpo_jax.models.convert_gguf SmolLM2-135M-Instruct.Q4_1.gguf /ckpt/smollm2
    model, tokenizer = models.from_pretrained("/ckpt/smollm2")

GGUF (https://github.com/ggml-org/ggml/blob/master/docs/gguf.md) stores hyper-parameters
as `{arch}.*` metadata, the tokenizer as `tokenizer.*` metadata, and every weight under
llama.cpp's name (`blk.N.attn_q.weight`), each in its own (possibly block-quantised)
type. The `gguf` package reads and dequantises them; this module renames, reshapes and
undoes llama.cpp's layout changes, then writes config.json, model.safetensors and the
tokenizer files (tokenizer.json, tokenizer_config.json, the chat template).

Layout changes undone: GGUF lists dimensions fastest-first (the reader already gives
numpy order, `[out, in]` like transformers); for the "llama" architecture llama.cpp
permutes the rows of q and k (weights and biases) from rotate-half rope to interleaved
rope, which `unpermute_rope` inverts. Qwen2/Qwen3 files keep rotate-half rope and are
not permuted. A file without `output.weight` ties the output layer to the embedding.
"""

import argparse
import os
import re

import ml_dtypes
import numpy as np
from gguf import GGMLQuantizationType, GGUFReader, Keys
from gguf.quants import dequantize

from grpo_jax.models import config as config_lib
from grpo_jax.models import gguf_tokenizer
from grpo_jax.models import hf
from grpo_jax.models import layers
from grpo_jax.models.safetensors_io import save_file

ARCHITECTURES = ("llama", "qwen2", "qwen3")

_T = GGMLQuantizationType
# Tensor types read: float, llama.cpp's legacy block quants and its k-quants.
SUPPORTED_TYPES = (
    _T.F32, _T.F16, _T.BF16, _T.Q4_0, _T.Q4_1, _T.Q5_0, _T.Q5_1, _T.Q8_0,
    _T.Q2_K, _T.Q3_K, _T.Q4_K, _T.Q5_K, _T.Q6_K,
)
_NUMPY_DTYPES = {"float32": np.dtype(np.float32), "bfloat16": np.dtype(ml_dtypes.bfloat16)}
OUTPUT_DTYPES = tuple(_NUMPY_DTYPES)

# llama.cpp tensor name -> transformers name ("{i}" is the layer).
_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_LAYER_TENSOR = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)")
# Llama 3.1 rope scaling is not metadata: llama.cpp writes its per-frequency divisors.
ROPE_FREQS = "rope_freqs.weight"


def read_metadata(reader):
    """{key: value} of a `GGUFReader`'s fields (strings, numbers, bools, lists of them)."""
    return {
        key: field.contents() for key, field in reader.fields.items() if not key.startswith("GGUF.")
    }


def hf_name(gguf_name):
    """transformers' name of a llama.cpp tensor, or None when it has no counterpart."""
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    match = _LAYER_TENSOR.fullmatch(gguf_name)
    if match is None or match[2] not in _LAYER_NAMES:
        return None
    return f"model.layers.{match[1]}.{_LAYER_NAMES[match[2]]}.{match[3]}"


def unpermute_rope(array, n_heads):
    """Undoes llama.cpp's q/k row permutation for one weight `[N*H, D]` or bias `[N*H]`.

    llama.cpp's converter reorders each head's H rows from rotate-half order (the first
    H/2 rows pair with the last H/2) to interleaved pairs, `reshape(N, 2, H/2, ...)
    .swapaxes(1, 2)`; this is its inverse, `reshape(N, H/2, 2, ...).swapaxes(1, 2)`.
    """
    rows = array.shape[0]
    split = array.reshape(n_heads, rows // n_heads // 2, 2, *array.shape[1:])
    return split.swapaxes(1, 2).reshape(array.shape)


def dequantized(tensor):
    """A `ReaderTensor` as float32 numpy in transformers' `[out, in]` order."""
    if tensor.tensor_type not in SUPPORTED_TYPES:
        raise ValueError(
            f"tensor {tensor.name} has type {tensor.tensor_type.name}, which convert_gguf does not "
            f"read; supported: {', '.join(t.name for t in SUPPORTED_TYPES)}. Re-quantise the model "
            "(llama.cpp's llama-quantize) to one of these"
        )
    shape = tuple(int(n) for n in reversed(tensor.shape))
    return np.asarray(dequantize(tensor.data, tensor.tensor_type), np.float32).reshape(shape)


def _float32_decimal(value):
    """The shortest decimal of a float GGUF stored as float32 (9.9999997e-06 -> 1e-05)."""
    return float(str(np.float32(value)))


def _llama3_scaling(rope_freqs, head_dim, theta, source):
    """The `Llama3RopeScaling` whose per-frequency divisors are `rope_freqs` `[H/2]`.

    Only the factor is read off (the lowest frequencies are divided by it); the band
    edges are Llama 3.1's (low 1, high 4, original length 8192), checked against every
    divisor.
    """
    scaling = config_lib.Llama3RopeScaling(factor=float(rope_freqs.max()))
    implied = layers.rope_inv_freq(head_dim, theta) / layers.rope_inv_freq(head_dim, theta, scaling)
    if rope_freqs.shape != implied.shape or not np.allclose(rope_freqs, implied, rtol=1e-5):
        raise ValueError(
            f"{source}: {ROPE_FREQS} does not match Llama 3 rope scaling with factor "
            f"{scaling.factor}, low_freq_factor 1, high_freq_factor 4 and original length 8192; "
            "other rope scalings are not supported"
        )
    return scaling


def model_config(metadata, tensors, *, param_dtype="float32", source="the GGUF file"):
    """The `ModelConfig` of a GGUF file from its `metadata` and {name: `ReaderTensor`}.

    Raises:
      ValueError naming `source` and the key, for an architecture or option the decoder
      does not implement (other architectures, experts, partial rope, rope scaling types).
    """
    arch = metadata.get(Keys.General.ARCHITECTURE)
    if arch not in ARCHITECTURES:
        raise ValueError(
            f"{source}: {Keys.General.ARCHITECTURE}={arch!r} is not supported; "
            f"supported: {', '.join(ARCHITECTURES)}"
        )

    def get(key, default=None):
        key = key.format(arch=arch)
        value = metadata.get(key, default)
        if value is None:
            raise ValueError(f"{source}: metadata key {key} is missing")
        if isinstance(value, list):  # per-layer values: the decoder needs them equal
            if len(set(value)) != 1:
                raise ValueError(f"{source}: {key} varies across layers ({value}); not supported")
            value = value[0]
        return value

    if get(Keys.LLM.EXPERT_COUNT, 0):
        raise ValueError(f"{source}: {Keys.LLM.EXPERT_COUNT.format(arch=arch)} > 0; routed experts "
                         "are not supported for GGUF files")
    scaling_type = get(Keys.Rope.SCALING_TYPE, "none")
    if scaling_type != "none":
        raise ValueError(
            f"{source}: {Keys.Rope.SCALING_TYPE.format(arch=arch)}={scaling_type!r} is not "
            "supported (only Llama 3 scaling, stored as rope_freqs.weight)"
        )
    d_model, n_heads = get(Keys.LLM.EMBEDDING_LENGTH), get(Keys.Attention.HEAD_COUNT)
    head_dim = get(Keys.Attention.KEY_LENGTH, get(Keys.Rope.DIMENSION_COUNT, d_model // n_heads))
    for key in (Keys.Attention.VALUE_LENGTH, Keys.Rope.DIMENSION_COUNT):
        if get(key, head_dim) != head_dim:
            raise ValueError(
                f"{source}: {key.format(arch=arch)}={get(key)} differs from the head "
                f"dimension {head_dim}; only full rope with equal key/value heads is supported"
            )
    theta = _float32_decimal(get(Keys.Rope.FREQ_BASE, 10000.0))
    scaling = None
    if ROPE_FREQS in tensors:
        scaling = _llama3_scaling(dequantized(tensors[ROPE_FREQS]), head_dim, theta, source)
    if "token_embd.weight" not in tensors:
        raise KeyError(f"{source} has no token_embd.weight (the token embedding)")
    vocab_size = get(Keys.LLM.VOCAB_SIZE, int(tensors["token_embd.weight"].shape[1]))
    n_tokens = len(metadata.get(Keys.Tokenizer.LIST, []))
    if n_tokens > vocab_size:
        raise ValueError(
            f"{source}: the tokenizer's {n_tokens} tokens exceed the model's vocabulary "
            f"of {vocab_size}"
        )
    bias = "blk.0.attn_q.bias" in tensors
    return config_lib.ModelConfig(
        model_type=arch,
        vocab_size=vocab_size,
        d_model=d_model,
        n_layers=get(Keys.LLM.BLOCK_COUNT),
        n_heads=n_heads,
        n_kv_heads=get(Keys.Attention.HEAD_COUNT_KV, n_heads),
        head_dim=head_dim,
        d_ff=get(Keys.LLM.FEED_FORWARD_LENGTH),
        norm_eps=_float32_decimal(get(Keys.Attention.LAYERNORM_RMS_EPS)),
        rope_theta=theta,
        rope_scaling=scaling,
        qkv_bias=bias,
        o_bias=bias and arch != "qwen2",  # Qwen2 has biases on q/k/v only
        qk_norm=arch == "qwen3",
        tie_embeddings="output.weight" not in tensors,
        max_position_embeddings=get(Keys.LLM.CONTEXT_LENGTH),
        bos_token_id=metadata.get(Keys.Tokenizer.BOS_ID),
        eos_token_id=metadata.get(Keys.Tokenizer.EOS_ID),
        pad_token_id=metadata.get(Keys.Tokenizer.PAD_ID),
        param_dtype=param_dtype,
    )


def hf_tensors(tensors, cfg, *, dtype="float32", source="the GGUF file"):
    """{transformers name: numpy array in `dtype`} of a GGUF file's {name: `ReaderTensor`}.

    Raises:
      ValueError for a tensor with no transformers counterpart or an unsupported type,
      KeyError when a tensor the model needs is missing.
    """
    out = {}
    for name, tensor in tensors.items():
        if name == ROPE_FREQS:
            continue  # read into the config
        target = hf_name(name)
        if target is None:
            raise ValueError(
                f"{source}: tensor {name} has no counterpart in a {cfg.model_type} model"
            )
        array = dequantized(tensor)
        if cfg.model_type == "llama" and ".attn_q." in name:
            array = unpermute_rope(array, cfg.n_heads)
        elif cfg.model_type == "llama" and ".attn_k." in name:
            array = unpermute_rope(array, cfg.n_kv_heads)
        out[target] = array.astype(_NUMPY_DTYPES[dtype], copy=False)
    missing = [n for entry in hf.weight_map(cfg) for n in entry.hf_names if n not in out]
    if missing:
        raise KeyError(
            f"{source} lacks {len(missing)} tensors a {cfg.model_type} model needs: {missing[:5]}"
        )
    return out


def convert(gguf_path, out_dir, *, dtype="float32"):
    """Writes the Hugging Face directory of `gguf_path` to `out_dir` (created).

    The dequantised weights are held in host memory (4 bytes a parameter in float32).

    Args:
      gguf_path: a llama.cpp GGUF file of a supported architecture (`ARCHITECTURES`).
      out_dir: the output directory.
      dtype: storage dtype of the weights, one of `OUTPUT_DTYPES`; "float32" keeps every
        dequantised value exactly, "bfloat16" rounds them.

    Returns:
      The written model's `ModelConfig`.
    """
    if dtype not in OUTPUT_DTYPES:
        raise ValueError(f"dtype must be one of {OUTPUT_DTYPES}, got {dtype!r}")
    reader = GGUFReader(gguf_path)
    metadata = read_metadata(reader)
    tensors = {t.name: t for t in reader.tensors}
    cfg = model_config(metadata, tensors, param_dtype=dtype, source=gguf_path)
    weights = hf_tensors(tensors, cfg, dtype=dtype, source=gguf_path)
    tokenizer = gguf_tokenizer.hf_tokenizer(
        metadata, model_max_length=cfg.max_position_embeddings, source=gguf_path
    )
    os.makedirs(out_dir, exist_ok=True)
    config_lib.to_hf_config(cfg).save_pretrained(out_dir)
    save_file(weights, os.path.join(out_dir, hf.SINGLE_FILE), metadata={"format": "pt"})
    tokenizer.save_pretrained(out_dir)
    return cfg


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("gguf_path", help="the .gguf file")
    parser.add_argument("out_dir", help="the Hugging Face directory to write")
    parser.add_argument(
        "--dtype", default="float32", choices=OUTPUT_DTYPES, help="storage dtype of the weights"
    )
    args = parser.parse_args(argv)
    cfg = convert(args.gguf_path, args.out_dir, dtype=args.dtype)
    print(f"wrote {args.out_dir}: {cfg.model_type}, {cfg.n_layers} layers, d {cfg.d_model}, "
          f"vocab {cfg.vocab_size}, {args.dtype}")


if __name__ == "__main__":
    main()
