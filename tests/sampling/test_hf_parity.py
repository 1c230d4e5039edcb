"""Greedy decoding equals transformers' PyTorch `generate(do_sample=False)` token for token."""

import jax
import numpy as np
import pytest
from tests.models import checkpoints
from flax import nnx

from grpo_jax import models, sampling

NEW = 16
PAD = 0


def prompts(vocab_size):
    """Three prompts of 12, 9 and 5 tokens (none starts with the pad id)."""
    rng = np.random.default_rng(7)
    return [rng.integers(1, vocab_size, size=n).tolist() for n in (12, 9, 5)]


def ours(model, token_lists, stop):
    tokens, mask = sampling.pad_prompts(token_lists, pad_id=PAD)  # padded to the 16 bucket
    rollout = sampling.generate(
        *nnx.split(model), tokens, mask, rng=jax.random.key(0), method=sampling.Greedy(),
        group_size=1, max_new_tokens=NEW, stop_tokens=[stop], pad_id=PAD,
    )
    return sampling.to_host(rollout)


def transformers_generate(torch_model, token_lists, eos):
    import torch

    width = max(map(len, token_lists))  # left-padded to the longest prompt only
    ids = np.full((len(token_lists), width), PAD)
    mask = np.zeros_like(ids)
    for row, p in enumerate(token_lists):
        ids[row, width - len(p):], mask[row, width - len(p):] = p, 1
    with torch.no_grad():
        out = torch_model.generate(
            input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask), do_sample=False,
            max_new_tokens=NEW, eos_token_id=eos, pad_token_id=PAD,
        )
    return out[:, width:].numpy()


@pytest.mark.slow
@pytest.mark.parametrize("family", checkpoints.FAMILIES)
def test_greedy_matches_transformers_generate(family, tmp_path):
    pytest.importorskip("torch", reason="the parity test runs transformers' PyTorch generate")
    torch_model = checkpoints.make_hf_checkpoint(family, tmp_path)
    model, _ = models.from_pretrained(str(tmp_path))
    token_lists = prompts(model.cfg.vocab_size)
    # An eos that the second row reaches mid-way (found with a stop id that never matches),
    # so both an early stop with padding after it and unfinished rows are compared.
    free = ours(model, token_lists, stop=-1)
    eos = int(free.tokens[1, 5])
    expected = transformers_generate(torch_model, token_lists, eos)
    got = ours(model, token_lists, stop=eos)
    n = expected.shape[1]
    np.testing.assert_array_equal(got.tokens[:, :n], expected)
    assert (got.tokens[:, n:] == PAD).all()
    hf_lengths = [list(row).index(eos) + 1 if eos in row else NEW for row in expected]
    np.testing.assert_array_equal(got.lengths, hf_lengths)
    assert got.lengths[1] <= 6 and not got.truncated[1]
