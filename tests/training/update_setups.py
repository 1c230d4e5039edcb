"""What the update-step tests share: a synthetic rollout batch of the tiny model's
vocabulary, the policy loss and global counts an update step takes, and shardings."""

import jax
import jax.numpy as jnp
import numpy as np

from grpo_jax.training import batch as batch_lib

# B rows of S prompt and N completion tokens over a vocabulary of V.
B, S, N, V = 16, 5, 7, 64


def update_rows(seed=0):
    """`[B, ...]` host arrays: left-padded prompts, completions with a prefix mask, old
    log-probs and advantages, every row valid."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, N + 1, B)
    mask = (np.arange(N)[None] < lengths[:, None]).astype(np.int32)
    prompt_mask = (np.arange(S)[None] >= rng.integers(0, S - 1, B)[:, None]).astype(np.int32)
    return {
        "prompt_tokens": rng.integers(3, V, (B, S)).astype(np.int32), "prompt_mask": prompt_mask,
        "tokens": rng.integers(3, V, (B, N)).astype(np.int32), "mask": mask,
        "old_logp": rng.normal(-3, 0.3, (B, N)).astype(np.float32) * mask,
        "advantages": rng.normal(size=B).astype(np.float32), "row_valid": np.ones(B, bool)}


def loss_of(objective):
    """`(model, micro-batch) -> (loss, metrics)` of a policy objective."""
    def loss_fn(model, micro):
        return objective(batch_lib.completion_logprobs(model, micro), micro)
    return loss_fn


def counts_of(objective):
    """The minibatch's global token and sequence counts the objective divides by."""
    def count_fn(minibatch):
        return {"num_tokens": jnp.sum(objective.loss_mask(minibatch), dtype=jnp.float32),
                "num_seqs": jnp.sum(minibatch["row_valid"], dtype=jnp.float32)}
    return count_fn


def shardings_of(tree):
    return jax.tree.map(lambda x: x.sharding, tree)
