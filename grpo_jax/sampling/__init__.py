"""Grouped rollouts in JAX: G completions per prompt with per-token log-probs.

    graphdef, state = nnx.split(model)
    tokens, mask = pad_prompts(prompt_ids, pad_id=tokenizer.pad_token_id)
    method = make_method(temperature=1.0, top_p=0.95)   # plain Temperature when top_p = 1
    rollout = generate(graphdef, state, tokens, mask, rng=jax.random.key(0), method=method,
                       group_size=8, max_new_tokens=512, stop_tokens=[tokenizer.eos_token_id],
                       pad_id=tokenizer.pad_token_id)
    rollout.tokens, rollout.logp, rollout.mask        # [P*8, 512]

`generate(..., record_support=True)` also records each position's kept tokens
(`rollout.support_ids [P*8, 512, 64]`, `support_size`) for keep-sampling-mask training
(`models.support_token_logprobs`).
`python -m grpo_jax.sampling --checkpoint DIR --prompt "..."` samples from a checkpoint.
"""

from grpo_jax import _extras

_extras.require("grpo_jax.sampling")   # before the imports it guards

from grpo_jax.sampling._api import generate
from grpo_jax.sampling._buckets import bucket_length
from grpo_jax.sampling._buckets import pad_prompts
from grpo_jax.sampling._driver import Engine
from grpo_jax.sampling._engine import engine_step
from grpo_jax.sampling._engine import init_slots
from grpo_jax.sampling._engine import prefill_prompts
from grpo_jax.sampling._engine import tail_widths
from grpo_jax.sampling._generate import MAX_NEW_TOKENS
from grpo_jax.sampling._generate import STOP_TOKEN
from grpo_jax.sampling._generate import Rollout
from grpo_jax.sampling._generate import row_keys
from grpo_jax.sampling._generate import row_multiple
from grpo_jax.sampling._generate import to_host
from grpo_jax.sampling._methods import Greedy
from grpo_jax.sampling._methods import MinP
from grpo_jax.sampling._methods import Temperature
from grpo_jax.sampling._methods import TopK
from grpo_jax.sampling._methods import TopP
from grpo_jax.sampling._methods import make_method
from grpo_jax.sampling._sample import Support
from grpo_jax.sampling._sample import sample
from grpo_jax.sampling._texts import sample_texts
