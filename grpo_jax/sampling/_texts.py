"""Strings in, strings out: sample completions of text prompts from a model and tokenizer."""

import math

import jax
from flax import nnx

from grpo_jax.sampling._buckets import pad_prompts
from grpo_jax.sampling._api import generate
from grpo_jax.sampling._generate import row_multiple, to_host
from grpo_jax.sampling._methods import Greedy


def _ids(value):
    if value is None:
        return []
    return list(value) if isinstance(value, (list, tuple)) else [value]


def sample_texts(model, tokenizer, prompts, *, num_samples=1, max_new_tokens=256, method=Greedy(),
                 seed=0, stop_tokens=None, chat=False):
    """`num_samples` completions of every prompt, decoded.

    Under a mesh (`jax.set_mesh`) the rows are split over its batch axes, the model's
    weights laid out by the "sampling" rules; prompts are repeated up to a count whose
    P*G rows split evenly, and the extra rows dropped.

    Args:
      model: a `models.Decoder` (e.g. from `models.from_pretrained`).
      tokenizer: its transformers tokenizer.
      prompts: P strings.
      num_samples: G completions per prompt.
      max_new_tokens: the most tokens per completion.
      method: a sampling method (`make_method` builds one from temperature/top-p/...).
      seed: the PRNG seed.
      stop_tokens: ids that end a completion; default the tokenizer's and the model
        config's eos ids.
      chat: wrap each prompt as a user turn with the tokenizer's chat template.

    Returns:
      P lists of G strings (special tokens removed).
    """
    if chat:
        prompts = [
            tokenizer.apply_chat_template(
                [{"role": "user", "content": p}], add_generation_prompt=True, tokenize=False
            )
            for p in prompts
        ]
    if stop_tokens is None:
        stop_tokens = sorted(set(_ids(tokenizer.eos_token_id) + _ids(model.cfg.eos_token_id)))
    pad_id = next((i for i in (tokenizer.pad_token_id, tokenizer.eos_token_id) if i is not None), 0)
    token_lists = tokenizer(list(prompts), add_special_tokens=not chat)["input_ids"]
    ways = row_multiple()
    prompts_multiple = ways // math.gcd(ways, num_samples)
    token_lists += token_lists[-1:] * (-len(token_lists) % prompts_multiple)
    tokens, mask = pad_prompts(token_lists, pad_id=pad_id)
    rollout = to_host(
        generate(
            *nnx.split(model), tokens, mask, rng=jax.random.key(seed), method=method,
            group_size=num_samples, max_new_tokens=max_new_tokens, stop_tokens=stop_tokens,
            pad_id=pad_id,
        )
    )
    rows = len(prompts) * num_samples
    texts = [
        tokenizer.decode(row[:n], skip_special_tokens=True)
        for row, n in zip(rollout.tokens[:rows], rollout.lengths[:rows])
    ]
    return [texts[i : i + num_samples] for i in range(0, len(texts), num_samples)]
