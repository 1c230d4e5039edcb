"""Causal self-attention over padded or packed rows with the Pallas TPU splash kernel.

Splash attention (the flash-attention algorithm of Dao et al. 2022, arXiv:2205.14135, as
a block-sparse Pallas kernel for TPUs; jax.experimental.pallas.ops.tpu.splash_attention)
never materialises the `[B, N, S, S]` scores: memory grows with S, not S^2, and blocks
above the diagonal are skipped. Padding and packing are expressed with segment ids (one id
per sequence, 0 on padding), and-ed with the causal mask, so a real query attends exactly
the keys of its own sequence at or before it, as `layers.grouped_attention` with the mask
`causal & same segment & real key` does. The rows of padding queries differ (they attend
padding keys); nothing reads them.

The kernel is interpreted on CPU (`jax.lax.platform_dependent`), so tests run it without a
TPU, and wrapped in `shard_map` under a mesh (Mosaic kernels are not partitioned
automatically): each device runs it on its rows and heads.
"""

import jax
import jax.numpy as jnp
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as kernel_lib
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as mask_lib

from grpo_jax.models import sharding

MAX_BLOCK = 512   # query and key block of the kernel (sequences are padded to a multiple)
LANES = 128       # the smallest block the kernel accepts


def block_size(seq_len):
    """The kernel's block for `seq_len` tokens: 512, or less for short sequences."""
    return min(MAX_BLOCK, -(-seq_len // LANES) * LANES)


def _kernel(heads, seq_len, block, interpret):
    """A causal splash kernel for `[heads, seq_len, H]` queries.

    Built inside the trace that uses it (its block masks become that trace's constants):
    a kernel cached across traces would carry one trace's values into another.
    """
    mask = mask_lib.MultiHeadMask([mask_lib.CausalMask((seq_len, seq_len))] * heads)
    sizes = kernel_lib.BlockSizes(
        block_q=block, block_kv=block, block_kv_compute=block, block_q_dkv=block,
        block_kv_dkv=block, block_kv_dkv_compute=block, block_q_dq=block, block_kv_dq=block)
    return kernel_lib.make_splash_mha(mask, block_sizes=sizes, head_shards=1, q_seq_shards=1,
                                      interpret=interpret)


def _local_attention(q, k, v, segments):
    """One device's rows: `[b, N, S, H]`, `[b, K, S, H]` x2, `[b, S]` -> `[b, N, S, H]`."""
    heads, seq_len = q.shape[1], q.shape[2]

    def run(interpret):
        kernel = _kernel(heads, seq_len, block_size(seq_len), interpret)
        one_row = lambda q, k, v, s: kernel(q, k, v, segment_ids=kernel_lib.SegmentIds(s, s))
        return jax.vmap(one_row)(q, k, v, segments)

    return jax.lax.platform_dependent(cpu=lambda: run(True), default=lambda: run(False))


def splash_attention(q, k, v, segments, *, scale):
    """Causal grouped-query attention of every real token to its sequence's tokens up to it.

    Args:
      q: `[B, S, N, H]` queries (rope applied).
      k: `[B, K, S, H]` keys, v: `[B, K, S, H]` values (K divides N).
      segments: `[B, S]` int segment ids: 1 on real tokens and 0 on padding, or one id
        per sequence of a packed row.
      scale: multiplies the scores (1 / sqrt(H)).

    Returns:
      `[B, S, N, H]` in q's dtype; rows of padding queries are meaningless.
    """
    b, s, n, h = q.shape
    pad = -s % block_size(s)
    q = jnp.pad(
        (q * scale).astype(q.dtype).transpose(0, 2, 1, 3), ((0, 0), (0, 0), (0, pad), (0, 0))
    )
    k, v = (jnp.pad(x, ((0, 0), (0, 0), (0, pad), (0, 0))) for x in (k, v))
    segments = jnp.pad(segments.astype(jnp.int32), ((0, 0), (0, pad)))
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty:
        out = _local_attention(q, k, v, segments)
    else:
        heads_spec = sharding.activation_spec((b, n, s, h), ("batch", "heads"), mesh)
        kv_spec = sharding.activation_spec((b, k.shape[1], s, h), ("batch", "kv_heads"), mesh)
        if heads_spec[1] != kv_spec[1]:   # heads and kv heads must split alike
            heads_spec = kv_spec = jax.P(heads_spec[0], None)
        rows = jax.P(heads_spec[0])
        out = jax.shard_map(_local_attention, in_specs=(heads_spec, kv_spec, kv_spec, rows),
                            out_specs=heads_spec, check_vma=False)(q, k, v, segments)
    return out[:, :, :s].transpose(0, 2, 1, 3)
