"""Toy decoders whose logits the sampler tests set, and a compile counter."""

import contextlib
import dataclasses

import jax
import numpy as np
from flax import nnx

from grpo_jax import models

COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"


def lookup_model(next_logits):
    """A 1-layer decoder whose logits after token i are `next_logits[i]`, whatever came before.

    Attention and MLP weights are zero, so the final hidden state is the normed embedding
    of the last token; with embedding = identity (D = V) the output projection row i is
    the logits after token i.

    Args:
      next_logits: `[V, V]` float32.

    Returns:
      `(graphdef, state)` of the model.
    """
    v = next_logits.shape[0]
    cfg = dataclasses.replace(
        models.get_model_config("tiny"), model_type="llama", vocab_size=v, d_model=v, n_layers=1,
        n_heads=1, n_kv_heads=1, head_dim=8, d_ff=8, qk_norm=False, tie_embeddings=False,
    )
    graphdef, state = nnx.split(models.init_model(cfg))
    norm_scale = 1.0 / np.sqrt(1.0 / v + cfg.norm_eps)  # rms_norm of a one-hot row
    values = {
        ("embed",): np.eye(v), ("lm_head",): next_logits / norm_scale, ("final_norm",): np.ones(v),
    }
    flat = {
        path: var.replace(
            jax.numpy.asarray(values.get(path, np.zeros(var.get_value().shape)), np.float32)
        )
        for path, var in nnx.to_flat_state(state)
    }
    return graphdef, nnx.from_flat_state(flat)


@contextlib.contextmanager
def counting_compiles():
    """Yields a list that collects one entry per XLA compilation inside the block."""
    compiles = []

    def listen(event, *_, **__):
        if event == COMPILE_EVENT:
            compiles.append(event)

    jax.monitoring.register_event_duration_secs_listener(listen)
    try:
        yield compiles
    finally:
        jax.monitoring.unregister_event_duration_listener(listen)
