"""Paged decode attention through the Pallas TPU paged-attention kernel.

JAX ships the kernel (`jax.experimental.pallas.ops.tpu.paged_attention`, the TPU form of
vLLM's PagedAttention, Kwon et al. 2023, arXiv:2309.06180): one query token per row reads
its pages from HBM in place (no gathered copy), in blocks of pages with an online softmax
(Dao et al. 2022, arXiv:2205.14135). It attends columns `[0, length)` of the pages a row
lists. A row of the paged engine (`sampling._paged`) has two parts: its prompt's pages,
shared by the prompt's completions and padded on the left (holes the kernel cannot skip),
then its own completion pages, whose valid columns are a prefix. So the prompt part is
attended with XLA and the completion part with the kernel, and the two softmaxes are
merged by their maxima and sums (the kernel's running statistics, which the shipped
`paged_attention` drops: `kernel_attention` launches the same kernel body keeping them).

The pools are in the kernel's layout, keys and values alike `[K, M, page, H]` (K kv heads,
M pages); `layers.paged_write_and_gather` keeps its own layout for the XLA path. On CPU the
kernel runs in Pallas's interpreter (`jax.lax.platform_dependent`), which the tests use.
Interpreted, it agrees with float32 attention to float32 rounding on values bfloat16
represents (the pools' dtype on TPU), and to ~1e-2 on other float32 values (seen at head
dim 16): its matmuls behave as at the TPU's default one-pass bfloat16 precision.
"""

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.experimental.pallas.ops.tpu.paged_attention import (
    paged_attention_kernel as kernel_lib,
)

MAX_PAGES_PER_BLOCK = 16   # pages the kernel reads per block (a divisor of the row's pages)
LANES = 128   # on TPU the kernel's head dim must be a multiple (its blocks' last dimension)


def pages_per_block(pages):
    """The largest divisor of `pages` up to `MAX_PAGES_PER_BLOCK` (the kernel's block must
    divide a row's page count)."""
    return max(d for d in range(1, min(pages, MAX_PAGES_PER_BLOCK) + 1) if pages % d == 0)


def _launch(q, k_pages, v_pages, lengths, page_indices, interpret):
    """The shipped kernel body (`paged_flash_attention_kernel_inline_seq_dim`) launched as
    `paged_attention` launches it without quantization or megacore, returning its
    statistics too: `(out [B, N, H] float32, max [B, N], sum [B, N])`."""
    b, n, h = q.shape
    kv, _, page, _ = k_pages.shape
    per_row = page_indices.shape[1]
    block = pages_per_block(per_row)
    groups = n // kv
    # As `paged_attention`: [B, N, 1, H] queries when groups % 8 != 0 (a <1x128> layout).
    if groups % 8:
        q = q.reshape(b, n, 1, h)
        q_spec = pl.BlockSpec((None, groups, None, h), lambda core, i, j, *_: (i, j, 0, 0))
    else:
        q_spec = pl.BlockSpec((None, groups, h), lambda core, i, j, *_: (i, j, 0))
    buffer = pltpu.VMEM((2, block, page, h), k_pages.dtype)
    body = functools.partial(
        kernel_lib.paged_flash_attention_kernel_inline_seq_dim, pages_per_sequence=per_row,
        batch_size=b, pages_per_compute_block=block, mask_value=kernel_lib.DEFAULT_MASK_VALUE,
        attn_logits_soft_cap=None, megacore_mode=None)
    any_space = pl.BlockSpec(memory_space=pl.ANY)
    out, m, l = pl.pallas_call(
        body,
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=4, in_specs=[q_spec, any_space, None, any_space, None],
            out_specs=[q_spec, q_spec, q_spec], grid=(1, b, kv),
            scratch_shapes=(buffer, None, buffer, None, pltpu.SemaphoreType.DMA((2,)),
                            pltpu.SemaphoreType.DMA((2,)))),
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "arbitrary", "arbitrary")),
        out_shape=[jax.ShapeDtypeStruct(q.shape, jnp.float32),
                   jax.ShapeDtypeStruct((*q.shape[:-1], 1), jnp.float32),
                   jax.ShapeDtypeStruct((*q.shape[:-1], 1), jnp.float32)],
        interpret=interpret,
    )(lengths, page_indices.reshape(-1), jnp.zeros((1,), jnp.int32), jnp.ones((1,), jnp.int32),
      q.astype(jnp.float32), k_pages, None, v_pages, None)
    return out.reshape(b, n, h), m.reshape(b, n), l.reshape(b, n)


def kernel_attention(q, k_pages, v_pages, lengths, page_indices):
    """Each row's query attends columns `[0, length)` of its pages, through the kernel.

    Args:
      q: `[B, N, H]` queries, already scaled (the kernel has no softmax scale).
      k_pages, v_pages: `[K, M, page, H]` pools (K divides N).
      lengths: `[B]` int32 >= 1, valid columns of each row.
      page_indices: `[B, T]` int32 pages of each row, in order.

    Returns:
      `(out [B, N, H], max [B, N], sum [B, N])` float32: the softmax-weighted values and
      the softmax's running max and sum of `exp(score - max)`.
    """
    def local(*args):
        run = functools.partial(_launch, *args)
        return jax.lax.platform_dependent(cpu=lambda: run(True), default=lambda: run(False))

    args = (q, k_pages, v_pages, lengths, page_indices)
    if jax.sharding.get_abstract_mesh().empty:
        return local(*args)
    # Mosaic kernels are not partitioned automatically; any row may read any page, so
    # every device runs the kernel on the whole (replicated) pools and rows.
    return jax.shard_map(local, in_specs=(jax.P(),) * 5, out_specs=(jax.P(),) * 3,
                         check_vma=False)(*args)


def target_platform() -> str:
    """The platform a program traced now is for: that of the devices of the mesh set by
    `jax.set_mesh` (a fit report compiles for a TPU topology's devices on a CPU host),
    else JAX's default backend."""
    mesh = jax.sharding.get_abstract_mesh()
    device = None if mesh.empty else mesh.abstract_device
    return jax.default_backend() if device is None else device.platform


def selected(cfg):
    """Whether paged decoding attends through the kernel: for TPU (`target_platform`) when
    the head dim is a multiple of `LANES` (the kernel's blocks need it there), or anywhere
    with `model.attention="splash"` (the Pallas kernels; interpreted on CPU).

    Raises:
      ValueError: with "splash" for TPU and a head dim the kernel cannot take.
    """
    on_tpu, fits = target_platform() == "tpu", cfg.head_dim % LANES == 0
    if cfg.attention_impl == "splash" and on_tpu and not fits:
        raise ValueError(f"model.attention='splash' decodes the paged cache through the Pallas "
                         f"kernel, which needs head_dim % {LANES} == 0 on TPU, got "
                         f"{cfg.head_dim}; set model.attention='xla' (the XLA gather) or "
                         "rollout.kv_page_size=0")
    return cfg.attention_impl == "splash" or (on_tpu and fits)


def to_kernel_layout(k_pool, v_pool):
    """Pools in `layers.paged_write_and_gather`'s layout (`[.., M, K, H, page]` keys,
    `[.., M, K, page, H]` values) -> this module's (`[.., K, M, page, H]` both)."""
    return (jnp.swapaxes(jnp.swapaxes(k_pool, -1, -2), -4, -3), jnp.swapaxes(v_pool, -4, -3))


def write_token(pools, k, v, page, offset, cache_layer=None):
    """Writes one new token per row into kernel-layout pools.

    Args:
      pools: `(k, v)`, each `[K, M, page, H]`, or with `cache_layer` stacked `[n, K, M, ...]`.
      k, v: the new keys `[B, K, H, 1]` and values `[B, K, 1, H]`.
      page, offset: `[B]` int32, where each row's token goes.
      cache_layer: the layer's index in a stacked pool, or None.

    Returns:
      `(new pools, this layer's pools)`.
    """
    lead = () if cache_layer is None else (cache_layer,)
    index = (*lead, jnp.arange(k.shape[1])[:, None], page[None], offset[None])   # [K, B]
    pool_k = pools[0].at[index].set(k[..., 0].transpose(1, 0, 2).astype(pools[0].dtype))
    pool_v = pools[1].at[index].set(v[:, :, 0].transpose(1, 0, 2).astype(pools[1].dtype))
    layer = (pool_k, pool_v) if cache_layer is None else tuple(
        jax.lax.dynamic_index_in_dim(x, cache_layer, keepdims=False) for x in (pool_k, pool_v))
    return (pool_k, pool_v), layer


def _gathered_attention(q, k_pages, v_pages, table, valid):
    """XLA attention over the gathered pages `table` `[B, T]` where `valid` `[B, T*page]`:
    `(out [B, N, H], max [B, N], sum [B, N])` as `kernel_attention`."""
    b, n, h = q.shape
    kv = k_pages.shape[0]
    keys, values = (x[:, table].reshape(kv, b, -1, h) for x in (k_pages, v_pages))
    q = q.astype(jnp.float32).reshape(b, kv, n // kv, h)
    scores = jnp.einsum("bkgh,kbth->bkgt", q, keys.astype(jnp.float32))
    scores = jnp.where(valid[:, None, None], scores, jnp.finfo(jnp.float32).min)
    high = jnp.max(scores, axis=-1)
    weights = jnp.exp(scores - high[..., None])
    total = jnp.sum(weights, axis=-1)
    out = jnp.einsum("bkgt,kbth->bkgh", weights, values.astype(jnp.float32)) / total[..., None]
    return out.reshape(b, n, h), high.reshape(b, n), total.reshape(b, n)


def paged_attention(q, pools, table, valid, *, shared_pages, scale):
    """A paged decode step's attention: the shared pages through XLA, the row's own pages
    through the kernel, one softmax over both.

    Args:
      q: `[B, 1, N, H]` queries.
      pools: `(k [K, M, page, H], v [K, M, page, H])`.
      table: `[B, T]` int32 pages of each row: the first `shared_pages` its prompt's,
        the rest its own.
      valid: `[B, T * page]` bool, the columns the row attends; over its own pages a
        prefix (one column at least where the result is read).
      shared_pages: how many leading pages of `table` are the prompt's (static).
      scale: multiplies the scores (1 / sqrt(H)).

    Returns:
      `[B, 1, N, H]` in q's dtype.
    """
    k_pages, v_pages = pools
    page = k_pages.shape[2]
    cut = shared_pages * page
    q3 = q[:, 0].astype(jnp.float32) * scale
    own = jnp.maximum(jnp.sum(valid[:, cut:], axis=1, dtype=jnp.int32), 1)
    out, high, total = kernel_attention(q3, k_pages, v_pages, own, table[:, shared_pages:])
    if shared_pages:
        out_s, high_s, total_s = _gathered_attention(q3, k_pages, v_pages,
                                                     table[:, :shared_pages], valid[:, :cut])
        top = jnp.maximum(high, high_s)
        w, w_s = total * jnp.exp(high - top), total_s * jnp.exp(high_s - top)
        out = (w[..., None] * out + w_s[..., None] * out_s) / (w + w_s)[..., None]
    return out[:, None].astype(q.dtype)
