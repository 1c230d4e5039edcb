"""Host rollout rows -> device minibatches, and completion log-probs under a model.

Row layout (the sampler's): prompts left-padded to S columns, completions right-padded
to N columns, so column S is every row's first completion token. The model reads the
concatenation `[B, S + N]`; the logits at column c score the token at column c + 1.
"""

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from grpo_jax.models import chunked_token_logprobs

from grpo_jax.training.steps import micro_batch_shardings, split_micro_batches

TOKEN_KEYS = ("prompt_tokens", "prompt_mask", "tokens", "mask")
LOSS_KEYS = ("old_logp", "mask", "advantages", "ref_logp", "behaviour_logp", "truncated",
             "num_tokens", "num_seqs")


def completion_logprobs(model, batch, *, with_stats=False):
    """`[B, N]` float32 log-probs of the completion tokens at temperature 1.

    Goes through the model's chunked log-prob path, so the `[B, S+N, V]` logits are
    never materialised whole. Values past a row's last token are meaningless; the
    losses mask them. With `with_stats`, returns `(logp, entropy [B, N], aux_loss [])`,
    aux_loss being the MoE load-balancing loss (0 for dense models).
    """
    tokens = jnp.concatenate([batch["prompt_tokens"], batch["tokens"]], axis=1)
    attention = jnp.concatenate([batch["prompt_mask"], batch["mask"]], axis=1)
    hidden, aux_loss = model.hidden_states(tokens[:, :-1], attention_mask=attention[:, :-1])
    start = batch["prompt_tokens"].shape[1] - 1
    out = chunked_token_logprobs(hidden[:, start:], model.unembedding(), tokens[:, start + 1:],
                                 with_entropy=with_stats)
    return (*out, aux_loss) if with_stats else out


def make_logprob_fn(graphdef):
    """`(params, pieces [M, b, ...]) -> [M, b, N]`: log-probs one piece at a time."""

    def fn(params, pieces):
        model = nnx.merge(graphdef, params)
        return jax.lax.map(lambda piece: completion_logprobs(model, piece), pieces)

    return fn


def logprobs_in_pieces(logp_fn, params, batch, pieces, mesh):
    """`[B, N]` completion log-probs, computed `B / pieces` rows at a time."""
    tokens = split_micro_batches({k: np.asarray(batch[k]) for k in TOKEN_KEYS}, pieces)
    tokens = jax.device_put(tokens, micro_batch_shardings(tokens, mesh))
    logp = logp_fn(params, tokens)
    return np.asarray(logp).reshape(batch["mask"].shape)


def minibatch(batch, rows, micro_batches, mesh):
    """The rows `rows` of `batch` as `[M, b, ...]` device arrays, with GLOBAL counts.

    ``num_tokens`` (valid tokens) and ``num_seqs`` (real rows) count the whole
    minibatch, so each micro-batch's loss is its share of the minibatch's loss.
    """
    keys = [k for k in TOKEN_KEYS + LOSS_KEYS if k in batch]
    picked = {k: np.asarray(batch[k])[rows] for k in keys}
    split = split_micro_batches(picked, micro_batches)
    split["num_tokens"] = np.full(micro_batches, picked["mask"].sum(), np.float32)
    split["num_seqs"] = np.full(micro_batches, np.asarray(batch["row_valid"])[rows].sum(), np.float32)
    return jax.device_put(split, micro_batch_shardings(split, mesh))
