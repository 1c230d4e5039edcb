"""Tiny random checkpoints of each family, created and saved by transformers' PyTorch classes.

They go through the same `from_pretrained` a real checkpoint does. Each config is small
but exercises the family's particulars: llama with llama3 rope scaling and untied
embeddings, qwen2 with qkv bias and tied embeddings, qwen3 with q/k norm and an explicit
head_dim != d_model / n_heads, qwen3_moe with normalised top-k routing and one dense layer.
"""

import pytest

_COMMON = dict(
    vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
)
HF_CONFIGS = {
    "llama": dict(
        _COMMON, tie_word_embeddings=False, rope_parameters={
            "rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 64,
        },
    ),
    "qwen2": dict(_COMMON, tie_word_embeddings=True,
                  rope_parameters={"rope_theta": 1e6, "rope_type": "default"}),
    "qwen3": dict(_COMMON, head_dim=32, tie_word_embeddings=False),
    "qwen3_moe": dict(
        _COMMON, head_dim=16, num_hidden_layers=3, num_experts=8, num_experts_per_tok=2,
        moe_intermediate_size=32, norm_topk_prob=True, mlp_only_layers=[1],
    ),
}
FAMILIES = tuple(HF_CONFIGS)


def make_hf_checkpoint(family, path, seed=0):
    """Random-inits `family`'s tiny config in torch, saves it to `path`; returns the torch model."""
    torch = pytest.importorskip("torch", reason="parity tests need torch (CPU) and transformers")
    import transformers

    torch.manual_seed(seed)
    hf_cfg = transformers.AutoConfig.for_model(family, **HF_CONFIGS[family])
    model = transformers.AutoModelForCausalLM.from_config(hf_cfg, attn_implementation="eager")
    with torch.no_grad():  # norms start at 1 and biases at 0: perturb them so they are tested
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith("bias"):
                p.add_(0.1 * torch.randn_like(p))
    model.eval()
    model.save_pretrained(path)
    return model
