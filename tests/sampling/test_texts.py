"""sample_texts() and `python -m grpo_jax.sampling` on a saved checkpoint with a tokenizer."""

import os
import subprocess
import sys

import jax
import numpy as np
import pytest
from flax import nnx

from grpo_jax import models, parallel, sampling

PROMPTS = ["the cat", "a dog ran"]


def test_greedy_texts_decode_the_generated_tokens(char_checkpoint):
    model, tokenizer = models.from_pretrained(char_checkpoint)
    texts = sampling.sample_texts(model, tokenizer, PROMPTS, num_samples=2, max_new_tokens=12)
    assert len(texts) == 2 and all(len(group) == 2 for group in texts)
    assert texts[0][0] == texts[0][1]  # greedy: a group's samples agree
    ids = [tokenizer(p)["input_ids"] for p in PROMPTS]
    tokens, mask = sampling.pad_prompts(ids, pad_id=0)
    rollout = sampling.to_host(sampling.generate(
        *nnx.split(model), tokens, mask, rng=jax.random.key(0), method=sampling.Greedy(),
        group_size=1, max_new_tokens=12, stop_tokens=[1], pad_id=0,
    ))
    for (text, _), row, n in zip(texts, rollout.tokens, rollout.lengths):
        assert text == tokenizer.decode(row[:n], skip_special_tokens=True)
    assert np.all(rollout.lengths >= 1)


def test_a_mesh_gives_the_same_texts(char_checkpoint):
    """Under an 8-device mesh, 2 prompts x 3 samples are topped up to rows that split 8
    ways; the texts equal those sampled on one device."""
    model, tokenizer = models.from_pretrained(char_checkpoint)
    method = sampling.make_method(temperature=0.9, top_p=0.8)
    expected = sampling.sample_texts(
        model, tokenizer, PROMPTS, num_samples=3, max_new_tokens=8, method=method, seed=2
    )
    mesh = parallel.make_mesh([("data", -1), ("tensor", 1)])
    spread, _ = models.from_pretrained(char_checkpoint, mesh=mesh, rules="sampling")
    with jax.set_mesh(mesh):
        got = sampling.sample_texts(
            spread, tokenizer, PROMPTS, num_samples=3, max_new_tokens=8, method=method, seed=2
        )
    assert got == expected and len(got) == 2 and all(len(group) == 3 for group in got)


@pytest.mark.slow
def test_command_line_prints_what_sample_texts_returns(char_checkpoint):
    """The command splits the host into one device per core and samples on all of them;
    the texts equal one device's."""
    model, tokenizer = models.from_pretrained(char_checkpoint)
    expected = sampling.sample_texts(
        model, tokenizer, PROMPTS, num_samples=3, max_new_tokens=10,
        method=sampling.make_method(temperature=0.8, top_p=0.9), seed=5,
    )
    env = dict(os.environ, XLA_FLAGS="", JAX_PLATFORMS="cpu")  # the device count a user gets
    run = subprocess.run(
        [sys.executable, "-m", "grpo_jax.sampling", f"--checkpoint={char_checkpoint}",
         f"--prompt={PROMPTS[0]}", f"--prompt={PROMPTS[1]}", "--num_samples=3",
         "--max_new_tokens=10", "--temperature=0.8", "--top_p=0.9", "--seed=5"],
        capture_output=True, text=True, env=env, check=True, timeout=300,
    )
    cores = 2 ** int(np.log2(min(len(os.sched_getaffinity(0)), 8)))  # parallel.use_cpu_cores
    assert f"'data': {cores}, 'tensor': 1}} over {cores} cpu device(s)" in run.stderr
    out = run.stdout
    lines = [f"=== prompt {i}: {p!r}" for i, p in enumerate(PROMPTS)]
    assert all(line in out for line in lines)
    for i, group in enumerate(expected):
        block = out.split(lines[i])[1].split("=== prompt")[0]
        assert (
            block.strip() == "\n".join(f"--- sample {j}\n{t}" for j, t in enumerate(group)).strip()
        )


def test_make_method():
    assert isinstance(sampling.make_method(temperature=0), sampling.Greedy)
    assert isinstance(sampling.make_method(top_k=100), sampling.TopK)
    assert isinstance(sampling.make_method(min_p=0.1), sampling.MinP)
    assert isinstance(sampling.make_method(temperature=0.5), sampling.Temperature)
    with pytest.raises(ValueError, match="at most one of top_k, top_p, min_p"):
        sampling.make_method(top_k=5, top_p=0.9)
