"""Our decoder against transformers' PyTorch models, on checkpoints transformers wrote."""

import os

import jax
import numpy as np
import pytest
from flax import nnx

from grpo_jax import models

torch = pytest.importorskip("torch", reason="parity tests need torch (CPU) and transformers")
transformers = pytest.importorskip("transformers")


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


@pytest.fixture(scope="module")
def loaded(family, hf_checkpoint):
    """(model, torch model, mask, our outputs, transformers' outputs) for one family."""
    path, torch_model = hf_checkpoint(family)
    model, _ = models.from_pretrained(path)
    tokens, mask = padded_batch(model.cfg.vocab_size)
    hidden, aux = jax.jit(lambda t, m: model.hidden_states(t, attention_mask=m))(tokens, mask)
    ours = {"logits": np.asarray(jax.jit(model.logits)(hidden)), "aux_loss": float(aux)}
    return model, torch_model, mask, ours, hf_forward(torch_model, tokens, mask)


class TestFromPretrained:
    def test_logits_match_transformers(self, loaded):
        _, _, mask, ours, ref = loaded
        assert max_rel_error(ours["logits"], ref.logits.numpy(), mask) < 1e-4

    def test_greedy_tokens_match_transformers(self, loaded):
        _, _, mask, ours, ref = loaded
        m = mask.astype(bool)
        np.testing.assert_array_equal(
            ours["logits"].argmax(-1)[m], ref.logits.numpy().argmax(-1)[m]
        )

    def test_load_balancing_loss_matches_transformers(self, loaded):
        model, _, _, ours, ref = loaded
        if model.cfg.n_experts == 0:
            assert ours["aux_loss"] == 0.0
        else:
            np.testing.assert_allclose(ours["aux_loss"], float(ref.aux_loss), rtol=1e-5)

    def test_config_round_trips(self, loaded):
        model, torch_model, *_ = loaded
        again = models.from_hf_config(models.to_hf_config(model.cfg))
        assert again == model.cfg
        ignore = ("architectures", "transformers_version", "output_router_logits")

        def fields(hf):
            return {k: v for k, v in hf.to_diff_dict().items() if k not in ignore}

        assert fields(models.to_hf_config(model.cfg)) == fields(torch_model.config)


def test_dense_experts_match_transformers(hf_checkpoint):
    """Qwen3-MoE with every expert run on every token (moe_impl="dense", the CPU default of
    a run config) gives transformers' logits and load-balancing loss too."""
    path, torch_model = hf_checkpoint("qwen3_moe")
    model, _ = models.from_pretrained(path, moe_impl="dense")
    assert model.cfg.moe_impl == "dense"
    tokens, mask = padded_batch(model.cfg.vocab_size)
    hidden, aux = jax.jit(lambda t, m: model.hidden_states(t, attention_mask=m))(tokens, mask)
    ref = hf_forward(torch_model, tokens, mask)
    assert max_rel_error(jax.jit(model.logits)(hidden), ref.logits.numpy(), mask) < 1e-4
    np.testing.assert_allclose(float(aux), float(ref.aux_loss), rtol=1e-5)


@pytest.mark.slow
def test_save_pretrained_loads_in_transformers(family, hf_checkpoint, tmp_path):
    """save_pretrained -> transformers.from_pretrained gives our logits; index-sharded files too."""
    path, _ = hf_checkpoint(family)
    model, _ = models.from_pretrained(path)
    tokens, mask = padded_batch(model.cfg.vocab_size)
    forward = nnx.jit(lambda m, t, a: m(t, attention_mask=a))
    ours = forward(model, tokens, mask)
    out = str(tmp_path / "saved")
    models.save_pretrained(model, out, max_shard_bytes=20_000)  # forces several shards + index
    assert os.path.exists(os.path.join(out, "model.safetensors.index.json"))
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(out, attn_implementation="eager")
    assert max_rel_error(ours, hf_forward(reloaded, tokens, mask).logits.numpy(), mask) < 1e-5
    ours_again, _ = models.from_pretrained(out)
    assert max_rel_error(ours, forward(ours_again, tokens, mask), mask) == 0
