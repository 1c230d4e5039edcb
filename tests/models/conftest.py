"""Tiny random checkpoints of each family, created and saved by transformers' PyTorch classes.

They go through the same `from_pretrained` a real checkpoint does. Each config is small
but exercises the family's particulars: llama with llama3 rope scaling and untied
embeddings, qwen2 with qkv bias and tied embeddings, qwen3 with q/k norm and an explicit
head_dim != d_model / n_heads, qwen3_moe with normalised top-k routing and one dense layer.
"""

import numpy as np
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
    "qwen2": dict(_COMMON, tie_word_embeddings=True, rope_parameters={"rope_theta": 1e6, "rope_type": "default"}),
    "qwen3": dict(_COMMON, head_dim=32, tie_word_embeddings=False),
    "qwen3_moe": dict(
        _COMMON, head_dim=16, num_hidden_layers=3, num_experts=8, num_experts_per_tok=2,
        moe_intermediate_size=32, norm_topk_prob=True, mlp_only_layers=[1],
    ),
}
FAMILIES = tuple(HF_CONFIGS)


def make_hf_checkpoint(family, path, seed=0):
    """Random-inits `family`'s tiny config with torch and saves it to `path`; returns the torch model."""
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


@pytest.fixture(scope="session")
def hf_checkpoint(tmp_path_factory):
    """`hf_checkpoint(family)` -> (directory, torch model); built once per session."""
    cache = {}

    def get(family):
        if family not in cache:
            path = tmp_path_factory.mktemp(family)
            cache[family] = (str(path), make_hf_checkpoint(family, path))
        return cache[family]

    return get


def padded_batch(vocab_size, seed=0):
    """tokens [3, 12] and a left-padding mask (0, 3 and 7 pads), as int32 numpy arrays."""
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, vocab_size, size=(3, 12)).astype(np.int32)
    mask = np.ones((3, 12), np.int32)
    mask[1, :3] = 0
    mask[2, :7] = 0
    return tokens, mask


def hf_forward(torch_model, tokens, mask):
    """transformers' outputs on a left-padded batch, with positions counting real tokens only."""
    import torch

    positions = np.maximum(np.cumsum(mask, axis=1) - 1, 0)
    with torch.no_grad():
        return torch_model(
            input_ids=torch.tensor(tokens).long(),
            attention_mask=torch.tensor(mask).long(),
            position_ids=torch.tensor(positions).long(),
            output_router_logits=torch_model.config.model_type == "qwen3_moe",
        )


def max_rel_error(ours, ref, mask):
    """max |ours - ref| / max |ref| over the real (unmasked) positions."""
    m = np.asarray(mask).astype(bool)
    ours, ref = np.asarray(ours)[m], np.asarray(ref)[m]
    return float(np.abs(ours - ref).max() / np.abs(ref).max())
