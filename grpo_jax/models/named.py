"""Model shapes selectable by name from a config string (`model=qwen3_0_6b`).

The real shapes copy the config.json of the published checkpoints (the weights
themselves come from `from_pretrained`); the tiny ones are for tests and the CPU demo.
"""

import dataclasses

from grpo_jax.models.config import Llama3RopeScaling, ModelConfig

_QWEN3 = dict(
    model_type="qwen3", vocab_size=151936, head_dim=128, qk_norm=True, rope_theta=1e6,
    max_position_embeddings=40960, bos_token_id=151643, eos_token_id=151645,
)

NAMED_CONFIGS = {
    # ~0.66M parameters: d=128, 3 layers, vocab 512. Runs a full RL step on a laptop CPU.
    "tiny": ModelConfig(
        model_type="qwen3", vocab_size=512, d_model=128, n_layers=3, n_heads=4, n_kv_heads=2,
        head_dim=32, d_ff=384, qk_norm=True, tie_embeddings=True, max_position_embeddings=2048,
    ),
    # The same with 8 routed experts (top 2) in every layer: ~1.4M parameters.
    "tiny_moe": ModelConfig(
        model_type="qwen3_moe", vocab_size=512, d_model=128, n_layers=3, n_heads=4, n_kv_heads=2,
        head_dim=32, d_ff=384, qk_norm=True, n_experts=8, n_experts_per_tok=2, moe_d_ff=128,
        norm_topk_prob=True, max_position_embeddings=2048,
    ),
    "qwen3_0_6b": ModelConfig(
        **_QWEN3, d_model=1024, n_layers=28, n_heads=16, n_kv_heads=8, d_ff=3072,
        tie_embeddings=True,
    ),
    "qwen3_1_7b": ModelConfig(
        **_QWEN3, d_model=2048, n_layers=28, n_heads=16, n_kv_heads=8, d_ff=6144,
        tie_embeddings=True,
    ),
    "qwen3_8b": ModelConfig(
        **_QWEN3, d_model=4096, n_layers=36, n_heads=32, n_kv_heads=8, d_ff=12288
    ),
    "qwen3_30b_a3b": ModelConfig(
        **{**_QWEN3, "model_type": "qwen3_moe"}, d_model=2048, n_layers=48, n_heads=32,
        n_kv_heads=4, d_ff=6144, n_experts=128, n_experts_per_tok=8, moe_d_ff=768,
        norm_topk_prob=True,
    ),
    "qwen2_5_1_5b": ModelConfig(
        model_type="qwen2", vocab_size=151936, d_model=1536, n_layers=28, n_heads=12, n_kv_heads=2,
        head_dim=128, d_ff=8960, qkv_bias=True, rope_theta=1e6, tie_embeddings=True,
        max_position_embeddings=131072, bos_token_id=151643, eos_token_id=151643,
    ),
    # Qwen2.5 base models (the config.json of Qwen/Qwen2.5-0.5B, Qwen/Qwen2.5-32B and
    # Qwen/Qwen2.5-Math-7B on the Hugging Face hub): qkv biases, no qk-norm, bos = eos =
    # <|endoftext|> (151643); the 7B and 32B have untied 152,064-row embeddings.
    "qwen2_5_0_5b": ModelConfig(
        model_type="qwen2", vocab_size=151936, d_model=896, n_layers=24, n_heads=14, n_kv_heads=2,
        head_dim=64, d_ff=4864, qkv_bias=True, rope_theta=1e6, tie_embeddings=True,
        max_position_embeddings=32768, bos_token_id=151643, eos_token_id=151643,
    ),
    "qwen2_5_math_7b": ModelConfig(
        model_type="qwen2", vocab_size=152064, d_model=3584, n_layers=28, n_heads=28, n_kv_heads=4,
        head_dim=128, d_ff=18944, qkv_bias=True, rope_theta=10000.0,
        max_position_embeddings=4096, bos_token_id=151643, eos_token_id=151643,
    ),
    "qwen2_5_32b": ModelConfig(
        model_type="qwen2", vocab_size=152064, d_model=5120, n_layers=64, n_heads=40, n_kv_heads=8,
        head_dim=128, d_ff=27648, qkv_bias=True, norm_eps=1e-5, rope_theta=1e6,
        max_position_embeddings=131072, bos_token_id=151643, eos_token_id=151643,
    ),
    "llama3_2_1b": ModelConfig(
        model_type="llama", vocab_size=128256, d_model=2048, n_layers=16, n_heads=32, n_kv_heads=8,
        head_dim=64, d_ff=8192, norm_eps=1e-5, rope_theta=500000.0,
        rope_scaling=Llama3RopeScaling(factor=32.0), tie_embeddings=True,
        max_position_embeddings=131072, bos_token_id=128000, eos_token_id=128001,
    ),
}


def get_model_config(name, **overrides):
    """The named `ModelConfig`, with fields replaced by `overrides` (e.g. dtype="bfloat16").

    Raises:
      ValueError listing the known names when `name` is not one of them.
    """
    if name not in NAMED_CONFIGS:
        raise ValueError(f"unknown model config {name!r}; choose one of {sorted(NAMED_CONFIGS)}")
    return dataclasses.replace(NAMED_CONFIGS[name], **overrides)
