"""A grouped batch with every key any preset reads, shared by the preset tests."""

import jax.numpy as jnp
import numpy as np

P, G, T = 2, 4, 6


def batch(seed=0, rows=P * G):
    """A grouped batch with every key any preset reads."""
    rng = np.random.default_rng(seed)
    lengths = np.array([6, 4, 1, 5, 2, 6, 3, 2, 5, 4, 6, 1, 3, 2, 6, 4])[:rows]
    mask = (np.arange(T)[None] < lengths[:, None]).astype(np.float32)
    old = np.log(rng.uniform(0.05, 0.95, (rows, T))).astype(np.float32)
    logp = old + rng.normal(0, 0.3, (rows, T)).astype(np.float32)
    arrays = {
        "old_logp": old, "mask": mask,
        "rewards": rng.integers(0, 2, rows).astype(np.float32),
        "ref_logp": old + rng.normal(0, 0.2, (rows, T)).astype(np.float32),
        "values": rng.normal(0, 0.5, (rows, T)).astype(np.float32),
        "correct": rng.integers(0, 2, rows).astype(np.float32),
        "truncated": np.zeros(rows, bool),
        "loss_seed": np.arange(rows, dtype=np.int32) + 100 * seed,
    }
    return jnp.asarray(logp), {k: jnp.asarray(v) for k, v in arrays.items()}
