"""convert_gguf against GGUF files written here the way llama.cpp's converter writes them.

Each file holds a tiny random model of one family and a tiny BPE tokenizer trained here.
The writer side is independent of the module under test: tensor names come from the
`gguf` package's own HF -> GGUF name map, q/k rows of llama files are permuted with
llama.cpp's `LlamaModel.permute`, Llama 3 rope scaling is written as llama.cpp's
`rope_freqs` divisors, and quantisation is `gguf.quants.quantize`. Quantisation runs
within each row, so it commutes with the row permutation: the converted weights must
equal `dequantize(quantize(W))` of the original weights bit for bit.
"""

import dataclasses
import json
import math
import os
import subprocess
import sys

import gguf
import jax
import numpy as np
import pytest
import transformers
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize, quantize
from tokenizers import (
    AddedToken, Regex, Tokenizer, decoders, models as tk_models, pre_tokenizers, trainers,
)

from grpo_jax import models
from grpo_jax.models import convert_gguf, gguf_tokenizer
from grpo_jax.models.safetensors_io import SafetensorsFile, save_file

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
USER_DEFINED = "<think>"
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] "
    "+ '<|im_end|>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
CORPUS = [
    "The quick brown fox jumps over the lazy dog. What is 17 + 25? It is 42.",
    "Don't panic: we'll compute 1234 * 5678 and they've checked the answer twice.",
    "Natural language models read tokens; the tokens come from byte-level merges.\n\n"
    "New lines too.",
    "Café, naïve, 東京 and emoji 🙂 are bytes as well.  Two spaces, tabs\tand 3.14159.",
]
SAMPLES = [
    "What is 17 + 25? Answer with the number.",
    "Hello world!  12345 6789",
    "naïve café — 東京 🙂\n\n\tTabs",
    "don't I'll WE'VE",
    "  leading spaces and trailing   ",
    "x=1234567890;y=3.14159",
    "<|im_start|>user\nhi<|im_end|>\n<think>ok</think>",
]
# The split regex of Llama 3's tokenizer.json.
LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
    r"|\s+(?!\S)|\s+"
)


@pytest.fixture(scope="module")
def trained_bpe():
    """(tokens in id order, merges): byte-level BPE with 3 special and 1 user-defined token."""
    tokenizer = Tokenizer(tk_models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=400, special_tokens=SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(CORPUS * 4, trainer)
    tokenizer.add_tokens([AddedToken(USER_DEFINED, normalized=False)])
    vocab = tokenizer.get_vocab()
    tokens = sorted(vocab, key=vocab.get)
    assert [vocab[t] for t in tokens] == list(range(len(tokens)))
    merges = [" ".join(pair) for pair in json.loads(tokenizer.to_str())["model"]["merges"]]
    return tokens, merges


def reference_tokenizer(pre, tokens, merges):
    """The tokenizer the original model ships for `tokenizer.ggml.pre` = `pre`."""
    vocab = {t: i for i, t in enumerate(tokens)}
    pairs = [tuple(m.split(" ")) for m in merges]
    if pre == "qwen2":  # transformers' own Qwen2 tokenizer: NFC, its split regex, byte-level
        tokenizer = transformers.Qwen2Tokenizer(vocab=vocab, merges=pairs)._tokenizer
    else:
        tokenizer = Tokenizer(
            tk_models.BPE(vocab=vocab, merges=pairs, ignore_merges=pre == "llama-bpe")
        )
        tokenizer.decoder = decoders.ByteLevel()
        if pre == "smollm":  # SmolLM's tokenizer.json: every digit alone, then GPT-2's split
            tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
                [
                    pre_tokenizers.Digits(individual_digits=True),
                    pre_tokenizers.ByteLevel(add_prefix_space=False),
                ]
            )
        else:
            tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
                pre_tokenizers.Split(Regex(LLAMA3_SPLIT), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ])
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL])
    tokenizer.add_tokens([AddedToken(USER_DEFINED, normalized=False)])
    return tokenizer


@dataclasses.dataclass(frozen=True)
class Family:
    cfg_fields: dict
    pre: str
    add_bos: bool = False


_COMMON = dict(
    d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16, d_ff=96,
    max_position_embeddings=256, bos_token_id=1, eos_token_id=2, pad_token_id=2,
)
FAMILIES = {
    # SmolLM2's shape: plain llama, tied embeddings.
    "llama": Family(dict(model_type="llama", norm_eps=1e-5, rope_theta=100000.0,
                         tie_embeddings=True), "smollm"),
    # Llama 3.1 rope scaling, attention biases (q/k biases are permuted too), untied, BOS added.
    "llama_scaled": Family(dict(
        model_type="llama", norm_eps=1e-5, rope_theta=500000.0, qkv_bias=True, o_bias=True,
        rope_scaling=models.Llama3RopeScaling(factor=8.0),
    ), "llama-bpe", add_bos=True),
    "qwen2": Family(dict(model_type="qwen2", norm_eps=1e-6, rope_theta=1e6, qkv_bias=True,
                         tie_embeddings=True), "qwen2"),
    # head_dim 32 != d_model / n_heads: the file must say it (attention.key_length).
    "qwen3": Family(dict(model_type="qwen3", norm_eps=1e-6, rope_theta=1e6, qk_norm=True,
                         head_dim=32), "qwen2"),
}
# GGUF tensor type per llama.cpp tensor kind ("f32": every tensor float32).
MIXED_TYPES = {
    "token_embd": T.Q8_0, "attn_q": T.Q4_1, "attn_k": T.Q4_1, "attn_v": T.Q8_0,
    "attn_output": T.Q4_1, "ffn_gate": T.Q8_0, "ffn_up": T.F16, "ffn_down": T.BF16, "output": T.F16,
}


def llama_cpp_permute(array, n_heads):
    """llama.cpp's `LlamaModel.permute`: rotate-half rows -> interleaved pairs, per head."""
    return (array.reshape(n_heads, 2, array.shape[0] // n_heads // 2, *array.shape[1:])
            .swapaxes(1, 2).reshape(array.shape))


def llama_cpp_rope_freqs(scaling, head_dim, theta):
    """llama.cpp's `rope_freqs` tensor for Llama 3 scaling (`LlamaModel.generate_extra_tensors`)."""
    freqs = 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float32) / head_dim)
    low_wavelen = scaling.original_max_position_embeddings / scaling.low_freq_factor
    high_wavelen = scaling.original_max_position_embeddings / scaling.high_freq_factor
    factors = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < high_wavelen:
            factors.append(1.0)
        elif wavelen > low_wavelen:
            factors.append(scaling.factor)
        else:
            smooth = (
                scaling.original_max_position_embeddings / wavelen - scaling.low_freq_factor
            ) / (scaling.high_freq_factor - scaling.low_freq_factor)
            factors.append(1 / ((1 - smooth) / scaling.factor + smooth))
    return np.array(factors, np.float32)


def random_checkpoint(cfg, path, seed=0):
    """{HF name: float32 array} of a random `cfg` model saved at `path`, norms and biases moved."""
    models.save_pretrained(models.init_model(cfg, seed=seed), path)
    file = SafetensorsFile(os.path.join(path, "model.safetensors"))
    rng = np.random.default_rng(seed)
    tensors = {n: np.array(file[n], np.float32) for n in file.keys()}
    for name, array in tensors.items():
        if "norm" in name or name.endswith("bias"):
            tensors[name] = (array + 0.1 * rng.standard_normal(array.shape)).astype(np.float32)
    save_file(tensors, os.path.join(path, "model.safetensors"), metadata={"format": "pt"})
    return tensors


def write_gguf(path, cfg, tensors, tokenizer_fields, *, types=None, arch=None, extra_tensors=()):
    """Writes `cfg` and HF `tensors` as a llama.cpp GGUF; returns {HF name: what a reader must get}.

    `types` maps a llama.cpp tensor kind to its GGUF type (default F32); every tensor is
    written through `quantize` and expected back as `dequantize(quantize(W))`.
    """
    arch = arch or cfg.model_type
    writer = gguf.GGUFWriter(path, arch)
    writer.add_block_count(cfg.n_layers)
    writer.add_context_length(cfg.max_position_embeddings)
    writer.add_embedding_length(cfg.d_model)
    writer.add_feed_forward_length(cfg.d_ff)
    writer.add_head_count(cfg.n_heads)
    writer.add_head_count_kv(cfg.n_kv_heads)
    writer.add_layer_norm_rms_eps(cfg.norm_eps)
    writer.add_rope_freq_base(cfg.rope_theta)
    if cfg.head_dim != cfg.d_model // cfg.n_heads:
        writer.add_key_length(cfg.head_dim)
        writer.add_value_length(cfg.head_dim)
    if cfg.model_type == "llama":
        writer.add_vocab_size(cfg.vocab_size)
        writer.add_rope_dimension_count(cfg.head_dim)
    for key, value in tokenizer_fields.items():
        getattr(writer, f"add_{key}")(value)
    name_map = gguf.get_tensor_name_map(
        {v: k for k, v in gguf.MODEL_ARCH_NAMES.items()}[cfg.model_type], cfg.n_layers
    )
    expected = {}
    for hf_name, array in tensors.items():
        base, suffix = hf_name.rsplit(".", 1)
        name = name_map.get_name(base)
        qtype = (types or {}).get(name.split(".")[-1], T.F32) if suffix == "weight" else T.F32
        data = quantize(array, qtype)
        expected[hf_name] = np.asarray(dequantize(data, qtype), np.float32).reshape(array.shape)
        if cfg.model_type == "llama" and name.endswith(("attn_q", "attn_k")):
            data = llama_cpp_permute(
                data, cfg.n_heads if name.endswith("attn_q") else cfg.n_kv_heads
            )
        writer.add_tensor(
            f"{name}.{suffix}", data, raw_dtype=None if qtype in (T.F32, T.F16) else qtype
        )
    for name, data, raw_dtype in extra_tensors:
        writer.add_tensor(name, data, raw_dtype=raw_dtype)
    if cfg.rope_scaling is not None:
        writer.add_tensor(
            "rope_freqs.weight",
            llama_cpp_rope_freqs(cfg.rope_scaling, cfg.head_dim, cfg.rope_theta),
        )
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return expected


def tokenizer_fields(trained_bpe, pre, add_bos=False):
    tokens, merges = trained_bpe
    types = [3 if t in SPECIAL else 4 if t == USER_DEFINED else 1 for t in tokens]
    return dict(
        tokenizer_model="gpt2", tokenizer_pre=pre, token_list=tokens, token_types=types,
        token_merges=merges, unk_token_id=0, bos_token_id=1, eos_token_id=2, pad_token_id=2,
        add_bos_token=add_bos,
        chat_template=CHAT_TEMPLATE,
    )


def family_config(name, vocab_size):
    return models.ModelConfig(**{**_COMMON, **FAMILIES[name].cfg_fields, "vocab_size": vocab_size})


@pytest.fixture(scope="module")
def converted(tmp_path_factory, trained_bpe):
    """`converted(family, scheme)` -> dict of paths, config, original and expected tensors."""
    cache = {}

    def get(family, scheme):
        if (family, scheme) not in cache:
            root = tmp_path_factory.mktemp(f"{family}_{scheme}")
            cfg = family_config(family, len(trained_bpe[0]))
            original = random_checkpoint(cfg, str(root / "original"))
            fields = tokenizer_fields(trained_bpe, FAMILIES[family].pre, FAMILIES[family].add_bos)
            gguf_path = str(root / "model.gguf")
            expected = write_gguf(
                gguf_path, cfg, original, fields, types=MIXED_TYPES if scheme == "mixed" else None
            )
            convert_gguf.convert(gguf_path, str(root / "hf"))
            cache[family, scheme] = dict(
                cfg=cfg, gguf=gguf_path, out=str(root / "hf"), original_dir=str(root / "original"),
                original=original, expected=expected, root=root,
            )
        return cache[family, scheme]

    return get


def our_logits(path, tokens):
    model, _ = models.from_pretrained(path)
    return np.asarray(jax.jit(lambda t: model(t))(tokens))


def max_rel_error(ours, ref):
    return float(np.abs(ours - ref).max() / np.abs(ref).max())


def sample_tokens(vocab_size, seed=0):
    return np.random.default_rng(seed).integers(0, vocab_size, size=(2, 12)).astype(np.int32)


@pytest.mark.parametrize("scheme", ["f32", "mixed"])
@pytest.mark.parametrize("family", tuple(FAMILIES))
class TestWeights:
    def test_weights_equal_dequantised_tensors(self, converted, family, scheme):
        c = converted(family, scheme)
        file = SafetensorsFile(os.path.join(c["out"], "model.safetensors"))
        assert set(file.keys()) == set(c["original"])
        for name, want in c["expected"].items():
            np.testing.assert_array_equal(file[name], want, err_msg=name)
        if scheme == "mixed":  # the quantised tensors really are not the originals
            name = "model.layers.0.self_attn.q_proj.weight"
            assert not np.array_equal(c["expected"][name], c["original"][name])

    def test_config_round_trips(self, converted, family, scheme):
        c = converted(family, scheme)
        assert models.load_config(c["out"]) == c["cfg"]


@pytest.mark.slow
@pytest.mark.parametrize("family", tuple(FAMILIES))
class TestLogits:
    def test_float32_file_gives_the_original_logits(self, converted, family):
        c = converted(family, "f32")
        tokens = sample_tokens(c["cfg"].vocab_size)
        assert (
            max_rel_error(our_logits(c["out"], tokens), our_logits(c["original_dir"], tokens))
            < 1e-5
        )

    def test_quantised_file_gives_the_dequantised_models_logits(self, converted, family):
        c = converted(family, "mixed")
        dequantised_dir = str(c["root"] / "dequantised")
        models.save_pretrained(models.init_model(c["cfg"]), dequantised_dir)
        save_file(
            c["expected"], os.path.join(dequantised_dir, "model.safetensors"),
            metadata={"format": "pt"},
        )
        tokens = sample_tokens(c["cfg"].vocab_size)
        assert (
            max_rel_error(our_logits(c["out"], tokens), our_logits(dequantised_dir, tokens)) < 1e-5
        )


@pytest.mark.parametrize("family", tuple(FAMILIES))
class TestTokenizer:
    @pytest.fixture
    def tokenizers_pair(self, converted, trained_bpe, family):
        """(ours from the converted directory via AutoTokenizer, the original model's)."""
        ours = transformers.AutoTokenizer.from_pretrained(converted(family, "f32")["out"])
        return ours, reference_tokenizer(FAMILIES[family].pre, *trained_bpe)

    def test_ids_equal_the_original_tokenizers(self, tokenizers_pair):
        ours, reference = tokenizers_pair
        for text in SAMPLES:
            assert (
                ours(text, add_special_tokens=False)["input_ids"]
                == reference.encode(text, add_special_tokens=False).ids
            ), text

    def test_text_round_trips(self, tokenizers_pair):
        ours, _ = tokenizers_pair
        for text in SAMPLES:
            assert ours.decode(ours(text, add_special_tokens=False)["input_ids"]) == text

    def test_special_tokens(self, tokenizers_pair, family):
        ours, _ = tokenizers_pair
        assert (ours.unk_token, ours.bos_token, ours.eos_token, ours.pad_token) == tuple(
            SPECIAL
        ) + ("<|im_end|>",)
        ids = ours("a<|im_end|>b<think>", add_special_tokens=False)["input_ids"]
        assert ids[1] == 2 and ours.convert_ids_to_tokens(ids[-1]) == USER_DEFINED
        assert ours.decode(ids, skip_special_tokens=True) == "ab" + USER_DEFINED
        with_bos = ours("hi")["input_ids"]
        assert (with_bos[0] == 1) == FAMILIES[family].add_bos
        assert (
            len(with_bos)
            == len(ours("hi", add_special_tokens=False)["input_ids"]) + FAMILIES[family].add_bos
        )

    def test_chat_template_is_preserved(self, tokenizers_pair):
        ours, _ = tokenizers_pair
        assert ours.chat_template == CHAT_TEMPLATE
        pytest.importorskip("jinja2", reason="rendering a chat template needs jinja2")
        text = ours.apply_chat_template(
            [{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False
        )
        assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_embedded_tokenizer_json_is_taken_as_is(trained_bpe):
    reference = reference_tokenizer("llama-bpe", *trained_bpe)
    ours = gguf_tokenizer.backend_tokenizer({gguf.Keys.Tokenizer.HF_JSON: reference.to_str()})
    assert [ours.encode(t).ids for t in SAMPLES] == [reference.encode(t).ids for t in SAMPLES]


@pytest.mark.parametrize("pre, added", [("llama-bpe", True), ("smollm", False), ("qwen2", False)])
def test_bos_default_follows_llama_cpp(trained_bpe, pre, added):
    """A file without tokenizer.ggml.add_bos_token gets llama.cpp's default for its pre."""
    tokens, merges = trained_bpe
    keys = gguf.Keys.Tokenizer
    metadata = {
        keys.MODEL: "gpt2", keys.PRE: pre, keys.LIST: tokens, keys.MERGES: merges, keys.BOS_ID: 1,
    }
    ids = gguf_tokenizer.hf_tokenizer(metadata)("hi")["input_ids"]
    assert (ids[0] == 1) == added


class TestRopePermutation:
    @pytest.mark.parametrize("shape", [(4 * 16, 24), (4 * 16,)])
    def test_inverts_llama_cpp(self, shape):
        x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
        np.testing.assert_array_equal(convert_gguf.unpermute_rope(llama_cpp_permute(x, 4), 4), x)
        assert not np.array_equal(llama_cpp_permute(x, 4), x)

    def test_matches_transformers_gguf_loader(self):
        from transformers.modeling_gguf_pytorch_utils import LlamaTensorProcessor

        x = np.random.default_rng(0).standard_normal((2 * 16, 8)).astype(np.float32)
        theirs = LlamaTensorProcessor()._reverse_permute_weights(x, 4, 2)
        np.testing.assert_array_equal(convert_gguf.unpermute_rope(x, 2), theirs)


@pytest.mark.parametrize("qtype", [T.Q4_0, T.Q5_0, T.Q5_1, T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K])
def test_block_types_read_in_numpy_order(tmp_path, qtype):
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    # 3 rows of 2 blocks
    raw = np.random.default_rng(0).integers(0, 256, size=(3, 2 * size), dtype=np.uint8)
    writer = gguf.GGUFWriter(str(tmp_path / "t.gguf"), "llama")
    writer.add_tensor("w", raw, raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    (tensor,) = gguf.GGUFReader(str(tmp_path / "t.gguf")).tensors
    got = convert_gguf.dequantized(tensor)
    assert got.shape == (3, 2 * block) and got.dtype == np.float32
    np.testing.assert_array_equal(got, dequantize(raw, qtype))


class TestErrors:
    def write(
        self, tmp_path, trained_bpe, family="llama", *, drop=(), arch=None, extra_tensors=(),
        **fields,
    ):
        cfg = family_config(family, len(trained_bpe[0]))
        tensors = random_checkpoint(cfg, str(tmp_path / "original"))
        tensors = {k: v for k, v in tensors.items() if k not in drop}
        path = str(tmp_path / "bad.gguf")
        write_gguf(
            path, cfg, tensors, {**tokenizer_fields(trained_bpe, "smollm"), **fields}, arch=arch,
            extra_tensors=extra_tensors,
        )
        return path

    def test_unsupported_tensor_type_is_named(self, tmp_path, trained_bpe):
        _, size = gguf.GGML_QUANT_SIZES[T.Q8_1]
        raw = np.zeros((96, 64 // 32 * size), np.uint8)
        path = self.write(tmp_path, trained_bpe, drop=["model.layers.0.mlp.up_proj.weight"],
                          extra_tensors=[("blk.0.ffn_up.weight", raw, T.Q8_1)])
        with pytest.raises(
            ValueError, match=r"tensor blk.0.ffn_up.weight has type Q8_1.*supported: F32, F16"
        ):
            convert_gguf.convert(path, str(tmp_path / "out"))

    def test_unsupported_architecture_is_named(self, tmp_path, trained_bpe):
        path = self.write(tmp_path, trained_bpe, arch="gemma2")
        with pytest.raises(
            ValueError, match=r"general.architecture='gemma2' is not supported; supported: llama"
        ):
            convert_gguf.convert(path, str(tmp_path / "out"))

    def test_unknown_tensor_is_named(self, tmp_path, trained_bpe):
        path = self.write(
            tmp_path, trained_bpe,
            extra_tensors=[("blk.0.ffn_gate_exps.weight", np.zeros(4, np.float32), None)],
        )
        with pytest.raises(
            ValueError,
            match=r"tensor blk.0.ffn_gate_exps.weight has no counterpart in a llama model",
        ):
            convert_gguf.convert(path, str(tmp_path / "out"))

    def test_missing_tensor_is_named(self, tmp_path, trained_bpe):
        path = self.write(tmp_path, trained_bpe, drop=["model.layers.1.mlp.down_proj.weight"])
        with pytest.raises(KeyError, match=r"model.layers.1.mlp.down_proj.weight"):
            convert_gguf.convert(path, str(tmp_path / "out"))

    def test_rope_scaling_type_is_named(self, tmp_path, trained_bpe):
        path = self.write(tmp_path, trained_bpe, rope_scaling_type=gguf.RopeScalingType.LINEAR)
        with pytest.raises(ValueError, match=r"llama.rope.scaling.type='linear' is not supported"):
            convert_gguf.convert(path, str(tmp_path / "out"))

    @pytest.mark.parametrize(
        "field, value, message",
        [
            (
                "tokenizer_pre", "bogus",
                r"tokenizer.ggml.pre='bogus' is not supported; known pre-tokenizers: .*smollm",
            ),
            (
                "tokenizer_model", "llama",
                r"tokenizer.ggml.model='llama' is not supported; only byte-level BPE",
            ),
        ],
    )
    def test_unsupported_tokenizer_is_named(self, tmp_path, trained_bpe, field, value, message):
        path = self.write(tmp_path, trained_bpe, **{field: value})
        with pytest.raises(ValueError, match=message):
            convert_gguf.convert(path, str(tmp_path / "out"))

    def test_bad_output_dtype(self, tmp_path):
        with pytest.raises(
            ValueError, match=r"dtype must be one of \('float32', 'bfloat16'\), got 'float16'"
        ):
            convert_gguf.convert("unused.gguf", str(tmp_path / "out"), dtype="float16")


@pytest.mark.slow
def test_command_line_runs_without_torch(converted, tmp_path):
    """`python -m grpo_jax.models.convert_gguf IN OUT` with torch made unimportable."""
    c = converted("llama", "mixed")
    script = (
        "import runpy, sys; sys.modules['torch'] = None; "
        f"sys.argv = ['convert_gguf', {c['gguf']!r}, {str(tmp_path / 'out')!r}, "
        "'--dtype', 'bfloat16']; "
        "runpy.run_module('grpo_jax.models.convert_gguf', run_name='__main__'); "
        "assert sys.modules['torch'] is None"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
    assert result.returncode == 0, result.stderr[-2000:]
    assert "wrote" in result.stdout and "bfloat16" in result.stdout
    file = SafetensorsFile(str(tmp_path / "out" / "model.safetensors"))
    name = "model.layers.0.mlp.gate_proj.weight"
    np.testing.assert_array_equal(file[name], c["expected"][name].astype(file[name].dtype))
    assert str(file[name].dtype) == "bfloat16"
    with open(tmp_path / "out" / "config.json") as f:
        assert json.load(f)["dtype"] == "bfloat16"


@pytest.mark.slow
class TestTransformers:
    """The converted directory and transformers' own GGUF loader, where torch is installed."""

    @pytest.fixture(autouse=True)
    def torch(self):
        return pytest.importorskip(
            "torch", reason="parity with transformers' PyTorch models needs torch"
        )

    def torch_logits(self, torch_model, tokens):
        import torch

        with torch.no_grad():
            return torch_model(torch.tensor(tokens).long()).logits.float().numpy()

    @pytest.mark.parametrize("family", tuple(FAMILIES))
    def test_converted_directory_loads_in_transformers(self, converted, family):
        c = converted(family, "mixed")
        torch_model = transformers.AutoModelForCausalLM.from_pretrained(c["out"])
        tokens = sample_tokens(c["cfg"].vocab_size)
        assert (
            max_rel_error(our_logits(c["out"], tokens), self.torch_logits(torch_model, tokens))
            < 1e-4
        )

    # transformers' GGUF loader reads neither llama_scaled's rope_freqs and attention biases nor
    # qwen3's attention.key_length, so only the other two families are compared with it.
    @pytest.mark.parametrize("family", ["llama", "qwen2"])
    def test_agrees_with_transformers_gguf_loader(self, converted, family):
        pytest.importorskip(
            "accelerate", reason="transformers loads GGUF weights only with accelerate"
        )
        c = converted(family, "mixed")
        torch_model = transformers.AutoModelForCausalLM.from_pretrained(
            str(c["root"]), gguf_file="model.gguf"
        )
        tokens = sample_tokens(c["cfg"].vocab_size)
        assert (
            max_rel_error(our_logits(c["out"], tokens), self.torch_logits(torch_model, tokens))
            < 1e-4
        )

    # Its GGUF tokenizer has no digit split for "smollm" (llama.cpp and SmolLM's tokenizer.json
    # split every digit), so only the other pre-tokenizers are compared with it.
    @pytest.mark.parametrize("family", ["llama_scaled", "qwen2"])
    def test_tokenizer_agrees_with_transformers_gguf_tokenizer(self, converted, family):
        c = converted(family, "f32")
        theirs = transformers.AutoTokenizer.from_pretrained(str(c["root"]), gguf_file="model.gguf")
        ours = transformers.AutoTokenizer.from_pretrained(c["out"])
        for text in SAMPLES:
            assert ours(text)["input_ids"] == theirs(text)["input_ids"], text
