"""The decoder's building blocks: RMSNorm, RoPE, grouped-query attention, SwiGLU, routed experts.

Every weight is an `nnx.Param` whose `logical_axes` metadata names its dimensions
("embed", "heads", "mlp", ...); `sharding.py` maps those names to mesh axes with one rule
table. Weights are stored in `param_dtype` (a QLoRA base's projections as integers,
`lora.quantize_base`) and cast to the compute `dtype` where used.
The math follows transformers' PyTorch modules line by line, so checkpoints agree to
float32 rounding (see tests/models/test_transformers_parity.py).
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx, struct

from grpo_jax.models import lora, paged_kernel, sharding, splash


def initial_value(init, shape, dtype, normal):
    """A weight's initial value: "ones" (norms), "zeros" (biases) or
    `lora.INIT_STD * normal(shape)`."""
    if init == "ones":
        return np.ones(shape, dtype)
    if init == "zeros":
        return np.zeros(shape, dtype)
    return (lora.INIT_STD * normal(shape)).astype(dtype)


def param(rngs, shape, logical_axes, dtype, *, init="normal"):
    """A weight of `shape` tagged with one logical axis name per dimension (and its init kind)."""
    if len(shape) != len(logical_axes):
        raise ValueError(f"shape {shape} needs {len(shape)} logical axes, got {logical_axes}")
    value = initial_value(init, shape, dtype, lambda s: jax.random.normal(rngs.params(), s))
    return nnx.Param(value, logical_axes=tuple(logical_axes), init=init)


def weight_array(variable):
    """A weight's array: a QLoRA base's integer weight (`qwix.QArray`) dequantised here,
    inside the jitted forward (`lora.quantize_base`); any other weight as it is stored."""
    return lora.dequantized(variable.get_value())


def rms_norm(x, weight, eps):
    """RMSNorm (Zhang & Sennrich 2019): x / rms(x) * w, normalised in float32.

    Args:
      x: `[..., D]` activations in the compute dtype.
      weight: `[D]` scale.
      eps: added to the mean square.

    Returns:
      `[..., D]` in x's dtype.
    """
    x32 = x.astype(jnp.float32)
    normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    return weight.astype(x.dtype) * normed.astype(x.dtype)


def rope_inv_freq(head_dim, theta, scaling=None):
    """RoPE inverse frequencies theta^(-2i/H) (Su et al. 2021), `[H/2]` float32.

    With `scaling` (a `Llama3RopeScaling`), low frequencies are divided by `factor` and
    the band between `low_freq_factor` and `high_freq_factor` is interpolated, as in
    Llama 3.1 and transformers' `_compute_llama3_parameters`.
    """
    inv_freq = 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float32) / head_dim)
    if scaling is None:
        return inv_freq
    old_len = scaling.original_max_position_embeddings
    wavelen = 2 * math.pi / inv_freq
    scaled = np.where(
        wavelen > old_len / scaling.low_freq_factor, inv_freq / scaling.factor, inv_freq
    )
    smooth = (old_len / wavelen - scaling.low_freq_factor) / (
        scaling.high_freq_factor - scaling.low_freq_factor
    )
    smoothed = (1 - smooth) * scaled / scaling.factor + smooth * scaled
    medium = (wavelen >= old_len / scaling.high_freq_factor) & (
        wavelen <= old_len / scaling.low_freq_factor
    )
    return np.where(medium, smoothed, scaled).astype(np.float32)


def apply_rope(x, positions, inv_freq):
    """Rotates each head's halves by position * frequency (transformers' rotate_half layout).

    Args:
      x: `[B, S, heads, H]` queries or keys.
      positions: `[B, S]` integer positions (per row, so left padding is handled).
      inv_freq: `[H/2]` from `rope_inv_freq`.

    Returns:
      `[B, S, heads, H]` in x's dtype; the rotation itself runs in float32.
    """
    angles = positions[..., None].astype(jnp.float32) * inv_freq  # [B, S, H/2]
    cos = jnp.cos(angles)[:, :, None, :]
    sin = jnp.sin(angles)[:, :, None, :]
    x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1).astype(x.dtype)


def grouped_attention(q, k_t, v, mask, *, scale, prefix=None):
    """Grouped-query attention over keys stored transposed and values stored heads-first.

    Query head i reads key/value head i // (N / K), as transformers' repeat_kv does.
    Both products are plain `[rows, inner] x [inner, cols]` matmuls over the big
    operand's natural layout (`q k_t` then `p v`), which XLA:CPU runs at memory speed;
    keys as `[B, K, L, H]` made a decode step's attention 2.6-3.1x slower on CPU
    (experiments/results/bench_sampler_cpu_keys_transposed.txt, table 3).

    With `prefix`, every group of B/P consecutive rows also attends one shared prefix
    row (the prompt of G completions) placed before its own slots, in one softmax. The
    group's queries are stacked as rows of one matmul against the prefix, so its keys
    and values are read once per group instead of once per row (cascade attention).

    Args:
      q: `[B, S, N, H]` queries.
      k_t: `[B, K, H, L]` keys, head_dim before slots (K divides N).
      v: `[B, K, L, H]` values.
      mask: `[B, S, L]` bool, True where query s may attend slot l.
      scale: multiplies the scores (1 / sqrt(H)).
      prefix: optional `(k_t, v, valid)` of P shared rows (P divides B): `[P, K, H, Lp]`,
        `[P, K, Lp, H]` and `[P, Lp]` bool, True on the prefix slots every query of the
        group may attend.

    Returns:
      `[B, S, N, H]` in q's dtype; scores and softmax in float32.
    """
    b, s, n, h = q.shape
    kv, g = k_t.shape[1], n // k_t.shape[1]
    # [rows, inner] x [inner, cols], batched over (row, kv head) on both sides.
    matmul = (((3,), (2,)), ((0, 1), (0, 1)))
    low = jnp.finfo(jnp.float32).min
    rows = q.reshape(b, s, kv, g, h).transpose(0, 2, 3, 1, 4).reshape(b, kv, g * s, h)
    scores = jax.lax.dot_general(rows, k_t, matmul, preferred_element_type=jnp.float32)
    scores = jnp.where(mask[:, None, None], scores.reshape(b, kv, g, s, -1) * scale, low)
    scores = scores.reshape(b, kv, g * s, -1)  # [B, K, G*S, L]
    if prefix is not None:
        k_p, v_p, valid_p = prefix
        groups, per_group, prefix_len = k_p.shape[0], b // k_p.shape[0], k_p.shape[-1]

        def to_groups(x):   # [B, K, G*S, X] -> [P, K, B/P*G*S, X]
            return x.reshape(groups, per_group, kv, g * s, -1).transpose(0, 2, 1, 3, 4).reshape(
                groups, kv, per_group * g * s, -1)

        def to_rows(x):   # the inverse
            return x.reshape(groups, kv, per_group, g * s, -1).transpose(0, 2, 1, 3, 4).reshape(
                b, kv, g * s, -1)

        scores_p = jax.lax.dot_general(
            to_groups(rows), k_p, matmul, preferred_element_type=jnp.float32
        )
        scores_p = jnp.where(valid_p[:, None, None, :], scores_p * scale, low)
        scores = jnp.concatenate([to_rows(scores_p), scores], axis=-1)
    probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
    if prefix is not None:
        probs_p, probs = probs[..., :prefix_len], probs[..., prefix_len:]
    out = jax.lax.dot_general(probs, v, matmul)  # [B, K, G*S, H]
    if prefix is not None:
        out = out + to_rows(jax.lax.dot_general(to_groups(probs_p), v_p, matmul))
    return out.reshape(b, kv, g, s, h).transpose(0, 3, 1, 2, 4).reshape(b, s, n, h)


@struct.dataclass
class PageIndex:
    """Where a paged decode step writes and reads (`KVCache.pages`).

    Attributes:
      table: `[B, T]` int32, the pool pages row b reads, in order: its columns are
        `T * page` wide, column l in page `table[b, l // page]` at offset `l % page`.
      write_page: `[B]` int32, the page the row's new token goes to.
      write_offset: `[B]` int32, its offset in that page.
      kernel: the pools are in `paged_kernel`'s layout (`[K, M, page, H]` keys and values)
        and attention runs through the Pallas kernel (`paged_kernel.paged_attention`);
        else `paged_write_and_gather`'s layout and its XLA gather.
      shared_pages: with `kernel`, the leading pages of `table` that are the prompt's
        (attended through XLA); the rest are the row's own, valid on a prefix.
    """

    table: jax.Array
    write_page: jax.Array
    write_offset: jax.Array
    kernel: bool = struct.field(pytree_node=False, default=False)
    shared_pages: int = struct.field(pytree_node=False, default=0)


def paged_write_and_gather(pools, k, v, index, cache_layer=None):
    """Writes one new token per row into the page pools, then gathers each row's pages.

    Args:
      pools: `(k pool [M, K, H, page], v pool [M, K, page, H])`, or with `cache_layer`
        stacked `[n, M, ...]`.
      k, v: the new keys `[B, K, H, 1]` and values `[B, K, 1, H]`.
      index: the `PageIndex`.
      cache_layer: the layer's index in a stacked pool, or None.

    Returns:
      `(new pools, keys [B, K, H, T*page], values [B, K, T*page, H])`: the XLA gather of
      every row's pages (the path for CPU and GPU).
    """
    lead = () if cache_layer is None else (cache_layer,)
    page, offset = index.write_page, index.write_offset
    pool_k = pools[0].at[(*lead, page, slice(None), slice(None), offset)].set(
        k[..., 0].astype(pools[0].dtype))
    pool_v = pools[1].at[(*lead, page, slice(None), offset, slice(None))].set(
        v[:, :, 0, :].astype(pools[1].dtype))
    layer_k, layer_v = (pool_k, pool_v) if cache_layer is None else (
        jax.lax.dynamic_index_in_dim(c, cache_layer, keepdims=False) for c in (pool_k, pool_v))
    b, t = index.table.shape
    heads, head_dim, size = layer_k.shape[1:]
    keys = layer_k[index.table].transpose(0, 2, 3, 1, 4).reshape(b, heads, head_dim, t * size)
    values = layer_v[index.table].transpose(0, 2, 1, 3, 4).reshape(b, heads, t * size, head_dim)
    return (pool_k, pool_v), keys, values


class Attention(nnx.Module):
    """Grouped-query self-attention with RoPE, optional qkv/o biases and q/k RMSNorm."""

    def __init__(self, cfg, *, rngs):
        d, n, k, h, pdt = cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.param_dtype
        self.cfg = cfg
        self.q = param(rngs, (d, n, h), ("embed", "heads", "head_dim"), pdt)
        self.k = param(rngs, (d, k, h), ("embed", "kv_heads", "head_dim"), pdt)
        self.v = param(rngs, (d, k, h), ("embed", "kv_heads", "head_dim"), pdt)
        self.o = param(rngs, (n, h, d), ("heads", "head_dim", "embed"), pdt)
        if cfg.qkv_bias:
            self.q_bias = param(rngs, (n, h), ("heads", "head_dim"), pdt, init="zeros")
            self.k_bias = param(rngs, (k, h), ("kv_heads", "head_dim"), pdt, init="zeros")
            self.v_bias = param(rngs, (k, h), ("kv_heads", "head_dim"), pdt, init="zeros")
        if cfg.o_bias:
            self.o_bias = param(rngs, (d,), ("norm",), pdt, init="zeros")
        if cfg.qk_norm:
            self.q_norm = param(rngs, (h,), ("head_dim",), pdt, init="ones")
            self.k_norm = param(rngs, (h,), ("head_dim",), pdt, init="ones")
        self.q_lora = lora.adapter(cfg, "attn.q", d, n * h, "embed", "heads", rngs)
        self.k_lora = lora.adapter(cfg, "attn.k", d, k * h, "embed", "kv_heads", rngs)
        self.v_lora = lora.adapter(cfg, "attn.v", d, k * h, "embed", "kv_heads", rngs)
        self.o_lora = lora.adapter(cfg, "attn.o", n * h, d, "heads", "embed", rngs)

    def _project(self, x, name, dropout_key=None):
        dt = x.dtype
        weight = getattr(self, name)
        y = jnp.einsum("bsd,dnh->bsnh", x, weight_array(weight).astype(dt))
        y = y + lora.apply(getattr(self, f"{name}_lora"), x, weight.shape[1:], self.cfg.lora,
                           dropout_key, f"attn.{name}")
        if self.cfg.qkv_bias:
            y = y + getattr(self, f"{name}_bias")[...].astype(dt)
        if self.cfg.qk_norm and name != "v":
            y = rms_norm(y, getattr(self, f"{name}_norm")[...], self.cfg.norm_eps)
        return y

    def __call__(self, x, positions, mask, segments, kv_cache=None, cache_index=None, prefix=None,
                 cache_layer=None, dropout_key=None):
        """Attends each query to the keys `mask` allows.

        Args:
          x: `[B, S, D]` normed activations.
          positions: `[B, S]` rope positions.
          mask: `[B, S, L]` bool, True where query s may attend key slot l; L = S without
            a cache, the cache length with one.
          segments: `[B, S]` int, the new tokens' segment ids, 0 on padding (the splash
            kernel's segments; `mask` already says the same for the XLA path).
          kv_cache: optional `(k_t, v)`, keys `[B, K, H, L]` and values `[B, K, L, H]`;
            the new keys and values are written at slots `[cache_index, cache_index + S)`
            before attending. These are the layouts a decode step reads in place (see
            `grouped_attention`): with `[B, L, K, H]` XLA:CPU transposed the whole cache
            every step.
          cache_index: scalar int32 slot of the first new token; or a `PageIndex`: then
            `kv_cache` holds page pools shared by all rows and the new token (S = 1) is
            written per row (`paged_write_and_gather`; with `PageIndex.kernel`,
            `paged_kernel`, which also attends).
          prefix: optional shared prefix rows attended before the cache (see
            `grouped_attention`); always the XLA path, whatever `attention_impl`.
          cache_layer: with a stacked cache (`[n, B, K, H, L]`, a scanned model's), this
            layer's index in it: only the new slots are written into the stack, in place,
            so a decode step does not copy the cache.
          dropout_key: the layer's adapter-dropout key in a training forward
            (`lora.layer_key`), or None.

        Returns:
          `([B, S, D], new kv_cache or None)`.
        """
        cfg = self.cfg
        inv_freq = rope_inv_freq(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling)
        q = sharding.constrain(apply_rope(self._project(x, "q", dropout_key), positions, inv_freq),
                               ("batch", None, "heads"))
        # [B, K, H, S]
        k = apply_rope(self._project(x, "k", dropout_key), positions, inv_freq).transpose(
            0, 2, 3, 1
        )
        v = self._project(x, "v", dropout_key).transpose(0, 2, 1, 3)  # [B, K, S, H]
        k, v = (sharding.constrain(a, ("batch", "kv_heads")) for a in (k, v))
        if isinstance(cache_index, PageIndex) and cache_index.kernel:   # pages read in place
            kv_cache, pools = paged_kernel.write_token(kv_cache, k, v, cache_index.write_page,
                                                       cache_index.write_offset, cache_layer)
            out = paged_kernel.paged_attention(q, pools, cache_index.table, mask[:, 0],
                                               shared_pages=cache_index.shared_pages,
                                               scale=cfg.head_dim**-0.5)
            return self._output(out, x, dropout_key), kv_cache
        if isinstance(cache_index, PageIndex):   # a paged cache: pools shared by all rows
            kv_cache, k, v = paged_write_and_gather(kv_cache, k, v, cache_index, cache_layer)
        elif kv_cache is not None:
            lead = () if cache_layer is None else (cache_layer,)

            def write(buffer, new, start):
                new = new.astype(buffer.dtype).reshape((1,) * len(lead) + new.shape)
                return jax.lax.dynamic_update_slice(buffer, new, (*lead, *start))

            kv_cache = (write(kv_cache[0], k, (0, 0, 0, cache_index)),
                        write(kv_cache[1], v, (0, 0, cache_index, 0)))
            k, v = kv_cache if cache_layer is None else (
                jax.lax.dynamic_index_in_dim(c, cache_layer, keepdims=False) for c in kv_cache)
        k, v = k.astype(q.dtype), v.astype(q.dtype)
        s, slots = q.shape[1], k.shape[-1]
        # The kernels attend the new tokens to themselves: no cache, or a fresh cache they
        # fill (S = L: a prompt's prefill); decoding and shared prefixes stay XLA.
        self_attention = prefix is None and s == slots
        if cfg.attention_impl == "splash" and self_attention:
            out = splash.splash_attention(q, k.transpose(0, 1, 3, 2), v, segments,
                                          scale=cfg.head_dim**-0.5)
        elif cfg.attention_impl == "cudnn" and prefix is None:
            out = jax.nn.dot_product_attention(
                q, k.transpose(0, 3, 1, 2), v.transpose(0, 2, 1, 3), mask=mask[:, None],
                scale=cfg.head_dim**-0.5, implementation="cudnn")
        else:
            out = grouped_attention(q, k, v, mask, scale=cfg.head_dim**-0.5, prefix=prefix)
        return self._output(out, x, dropout_key), kv_cache

    def _output(self, out, x, dropout_key):
        """The output projection of the heads' results `out` `[B, S, N, H]`: `[B, S, D]`."""
        cfg = self.cfg
        out = sharding.constrain(out, ("batch", None, "heads"))
        y = jnp.einsum("bsnh,nhd->bsd", out, weight_array(self.o).astype(x.dtype))
        y = y + lora.apply(self.o_lora, out.reshape(*out.shape[:2], -1), (cfg.d_model,), cfg.lora,
                           dropout_key, "attn.o")
        if cfg.o_bias:
            y = y + self.o_bias[...].astype(x.dtype)
        return y


class Mlp(nnx.Module):
    """The dense SwiGLU feed-forward block (Shazeer 2020): down(silu(x gate) * (x up))."""

    def __init__(self, cfg, *, rngs):
        d, f, pdt = cfg.d_model, cfg.d_ff, cfg.param_dtype
        self.gate = param(rngs, (d, f), ("embed", "mlp"), pdt)
        self.up = param(rngs, (d, f), ("embed", "mlp"), pdt)
        self.down = param(rngs, (f, d), ("mlp", "embed"), pdt)
        self.cfg = cfg
        self.gate_lora = lora.adapter(cfg, "mlp.gate", d, f, "embed", "mlp", rngs)
        self.up_lora = lora.adapter(cfg, "mlp.up", d, f, "embed", "mlp", rngs)
        self.down_lora = lora.adapter(cfg, "mlp.down", f, d, "mlp", "embed", rngs)

    def _project(self, x, name, dropout_key):
        weight = getattr(self, name)
        return (x @ weight_array(weight).astype(x.dtype)
                + lora.apply(getattr(self, f"{name}_lora"), x, weight.shape[1:], self.cfg.lora,
                             dropout_key, f"mlp.{name}"))

    def __call__(self, x, token_mask, routing=None, dropout_key=None):
        """`[B, S, D]` -> (`[B, S, D]`, None, None): no routing in a dense block;
        `dropout_key` as `Attention`'s."""
        del token_mask, routing
        gate, up = (self._project(x, name, dropout_key) for name in ("gate", "up"))
        hidden = sharding.constrain(jax.nn.silu(gate) * up, ("batch", None, "mlp"))
        return self._project(hidden, "down", dropout_key), None, None


class MoeMlp(nnx.Module):
    """Top-k routed SwiGLU experts (Qwen3-MoE; Shazeer et al. 2017, Fedus et al. 2021).

    Every token goes to its k highest-probability experts, no capacity limit and no token
    dropped, so the result equals transformers' loop over experts. With `cfg.moe_impl`
    "ragged" the (token, expert) rows are sorted by expert and each expert's rows are
    multiplied by its weights with `jax.lax.ragged_dot` (k/E of the compute of running
    every expert on every token); "dense" runs every expert on every token and keeps
    each token's k (faster on CPU).

    Keep routing (DeepSeek-V3.2, arXiv:2512.02556, sec. 3.1; GSPO's routing replay,
    arXiv:2507.18071, sec. 5.3): given the experts the sampler chose (`routing`), a
    training forward sends every token to those experts instead of its own top k, so the
    trainer's pi_theta and the sampler's pi_old use the same expert parameters. Neither
    paper says how the gate weights over the replayed experts are formed; here they are
    the current router's probabilities at those experts (renormalised when
    `norm_topk_prob`), so the router keeps its gradient and, with unchanged parameters,
    the weights equal the sampler's.
    """

    def __init__(self, cfg, *, rngs):
        d, e, f, pdt = cfg.d_model, cfg.n_experts, cfg.moe_d_ff, cfg.param_dtype
        self.cfg = cfg
        self.router = param(rngs, (d, e), ("embed", "router"), pdt)
        self.gate = param(rngs, (e, d, f), ("expert", "embed", "mlp"), pdt)
        self.up = param(rngs, (e, d, f), ("expert", "embed", "mlp"), pdt)
        self.down = param(rngs, (e, f, d), ("expert", "mlp", "embed"), pdt)
        self.gate_lora = lora.expert_adapter(cfg, "mlp.gate", d, f, "embed", "mlp", rngs)
        self.up_lora = lora.expert_adapter(cfg, "mlp.up", d, f, "embed", "mlp", rngs)
        self.down_lora = lora.expert_adapter(cfg, "mlp.down", f, d, "mlp", "embed", rngs)

    def __call__(self, x, token_mask, routing=None, dropout_key=None):
        """Routes and mixes the experts.

        Args:
          x: `[B, S, D]` normed activations.
          token_mask: `[B, S]` 1 on real tokens; padding is routed (as in transformers)
            but left out of the routing statistics.
          routing: None, or `[B, S, k]` int expert ids to replay instead of the top k.
          dropout_key: unused: the experts' adapters are folded into their weights and
            refuse dropout (`lora.expert_adapter`).

        Returns:
          `([B, S, D], stats, experts)`: stats `[2, E]` float32, the number of top-k
          assignments per expert and the summed router probability per expert over real
          tokens, the two factors of the load-balancing loss (`load_balancing_loss`);
          experts `[B, S, k]` int32, the router's own top k of each token (the experts it
          went to; with `routing`, those it would have gone to: what the replay changed).
        """
        b, s, d = x.shape
        dt, k, e = x.dtype, self.cfg.n_experts_per_tok, self.cfg.n_experts
        x_td = x.reshape(b * s, d)
        router_logits = x_td @ self.router[...].astype(dt)
        probs = jax.nn.softmax(router_logits.astype(jnp.float32), axis=-1)  # [T, E]
        top_p, top_e = own = jax.lax.top_k(probs, k)  # [T, k]
        if routing is not None:
            top_e = routing.reshape(b * s, k).astype(jnp.int32)
            top_p = jnp.take_along_axis(probs, top_e, axis=-1)
        if self.cfg.norm_topk_prob:
            top_p = top_p / jnp.sum(top_p, axis=-1, keepdims=True)
        weights = tuple(
            lora.adapted_weight(weight_array(getattr(self, name)), getattr(self, f"{name}_lora"),
                                self.cfg.lora).astype(dt)
            for name in ("gate", "up", "down"))
        experts = _every_expert if self.cfg.moe_impl == "dense" else _chosen_experts_ragged
        y = experts(x_td, top_e, *weights)  # [T, k, D]
        out = jnp.einsum("tkd,tk->td", y, top_p.astype(dt)).reshape(b, s, d)
        m = token_mask.reshape(-1, 1).astype(jnp.float32)
        counts = jnp.sum(jax.nn.one_hot(top_e, e, dtype=jnp.float32).sum(1) * m, axis=0)
        prob_sums = jnp.sum(probs * m, axis=0)
        return out, jnp.stack([counts, prob_sums]), own[1].reshape(b, s, k)


def _chosen_experts_ragged(x, top_e, gate, up, down):
    """Each token's k experts' SwiGLU outputs, `[T, k, D]`: the T*k (token, expert) rows
    sorted by expert and multiplied group by group with `jax.lax.ragged_dot` (k/E of the
    FLOPs of running every expert; native on TPU and GPU).

    Args: x `[T, D]`; top_e `[T, k]` int expert ids; gate, up `[E, D, F]`; down `[E, F, D]`.
    """
    k, e = top_e.shape[1], gate.shape[0]
    flat_e = top_e.reshape(-1)  # [T*k]
    order = jnp.argsort(flat_e, stable=True)
    group_sizes = jnp.bincount(flat_e, length=e).astype(jnp.int32)
    rows = x[order // k]  # [T*k, D], grouped by expert
    g = jax.lax.ragged_dot(rows, gate, group_sizes)
    u = jax.lax.ragged_dot(rows, up, group_sizes)
    y_sorted = jax.lax.ragged_dot(jax.nn.silu(g) * u, down, group_sizes)
    return jnp.zeros_like(y_sorted).at[order].set(y_sorted).reshape(x.shape[0], k, -1)


def _every_expert(x, top_e, gate, up, down):
    """`_chosen_experts_ragged`'s result by running every expert on every token and keeping
    each token's k: E/k times the FLOPs and a `[T, E, F]` activation, but plain einsums,
    which CPU backends run many times faster than their emulation of `ragged_dot` (7.6x
    for tiny_moe's fwd+bwd on an 8-device CPU mesh: experiments/bench_models.py
    --moe_impl). The same products and sums per (token, expert)."""
    h = (jax.nn.silu(jnp.einsum("td,edf->tef", x, gate))
         * jnp.einsum("td,edf->tef", x, up))
    y = jnp.einsum("tef,efd->ted", h, down)  # [T, E, D]
    return jnp.take_along_axis(y, top_e[:, :, None], axis=1)


def load_balancing_loss(stats, n_moe_layers, n_tokens):
    r"""Switch Transformer load-balancing loss (Fedus et al. 2021, eqs. 4-6), transformers' form.

    .. math:: \mathcal{L}_{aux} = E \sum_e f_e P_e,\quad
       f_e = \frac{\#\text{assignments to } e}{L n},\ P_e = \frac{\sum p_e}{L n}

    summed over the L MoE layers and n real tokens, as transformers'
    `load_balancing_loss_func` (so f sums to k, not 1).

    Args:
      stats: `[2, E]` routing statistics summed over layers (see `MoeMlp`).
      n_moe_layers: L.
      n_tokens: n, the number of unmasked tokens (scalar).

    Returns:
      scalar float32.
    """
    rows = n_moe_layers * jnp.maximum(n_tokens, 1).astype(jnp.float32)
    return stats.shape[-1] * jnp.sum((stats[0] / rows) * (stats[1] / rows))
