"""The decoder-only transformer (Llama 3, Qwen2/2.5, Qwen3, Qwen3-MoE) and its KV cache.

Shapes: B batch rows, S new tokens, L cache slots, D model width, V vocabulary.

Prompts are left-padded, so every row's last prompt token sits at the same column and a
single scalar `index` says where the next token goes in every row's cache. Positions are
per row: the number of real tokens before it, so a padded row gets the same rope angles
as the unpadded prompt would.

For a sampler, split once and merge inside the jitted loop, passing the weights in:

    graphdef, state = nnx.split(model)
    def step(state, cache, tokens_b):
        return nnx.merge(graphdef, state).decode_step(tokens_b, cache)

Every argument is an array of fixed shape, so new values never recompile.
"""

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx, struct

from grpo_jax.models import layers, logprobs, sharding


@struct.dataclass
class KVCache:
    """Keys and values of all tokens seen so far, in fixed-size buffers.

    Attributes:
      k: one `[B, K, H, L]` array per layer (keys transposed: see layers.grouped_attention).
      v: one `[B, K, L, H]` array per layer.
      valid: `[B, L]` bool, True on slots that hold a real (non-padding) token.
      index: `[]` int32, the slot the next token is written to (shared by all rows).
      prefix: None, or a filled `KVCache` of P rows (P divides B) that every group of
        B/P consecutive rows continues: the prompt of G sampled completions, kept once
        per prompt and read once per group (see `Decoder.init_cache`).
    """

    k: tuple
    v: tuple
    valid: jax.Array
    index: jax.Array
    prefix: "KVCache | None" = None

    def prefix_layer(self, i):
        """Layer i's `(k_t, v, valid)` of the shared prefix, or None without one."""
        if self.prefix is None:
            return None
        return self.prefix.k[i], self.prefix.v[i], self.prefix.valid

    def prefix_lengths(self):
        """`[B]` real tokens each row has in the shared prefix (0 without one)."""
        if self.prefix is None:
            return jnp.zeros(self.valid.shape[:1], jnp.int32)
        per_group = self.valid.shape[0] // self.prefix.valid.shape[0]
        return jnp.repeat(jnp.sum(self.prefix.valid, axis=1, dtype=jnp.int32), per_group)


def default_positions(attention_mask, offset=0):
    """Positions that count only real tokens: `offset + cumsum(mask) - 1`, at least 0.

    Args:
      attention_mask: `[B, S]` 1 on real tokens, 0 on (left) padding.
      offset: `[B]` or scalar, real tokens already in the cache.

    Returns:
      `[B, S]` int32.
    """
    pos = jnp.cumsum(attention_mask.astype(jnp.int32), axis=1) - 1
    return jnp.maximum(pos + jnp.asarray(offset, jnp.int32)[..., None], 0)


class DecoderLayer(nnx.Module):
    """Pre-norm block: x + attn(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, cfg, moe, *, rngs):
        self.cfg = cfg
        self.attn_norm = layers.param(rngs, (cfg.d_model,), ("norm",), cfg.param_dtype, init="ones")
        self.attn = layers.Attention(cfg, rngs=rngs)
        self.mlp_norm = layers.param(rngs, (cfg.d_model,), ("norm",), cfg.param_dtype, init="ones")
        self.mlp = layers.MoeMlp(cfg, rngs=rngs) if moe else layers.Mlp(cfg, rngs=rngs)

    def __call__(self, x, positions, mask, token_mask, kv_cache=None, cache_index=None, prefix=None,
                 routing=None):
        """`[B, S, D]` -> (`[B, S, D]`, new kv_cache, routing stats `[2, E]` or None,
        experts `[B, S, k]` or None); `routing` replays an MoE block's experts."""
        eps = self.cfg.norm_eps
        h, kv_cache = self.attn(
            layers.rms_norm(x, self.attn_norm[...], eps), positions, mask, kv_cache, cache_index, prefix
        )
        x = x + h
        h, stats, experts = self.mlp(layers.rms_norm(x, self.mlp_norm[...], eps), token_mask, routing)
        return x + h, kv_cache, stats, experts


def _call_layer(layer, *args):
    return layer(*args)


class Decoder(nnx.Module):
    """A causal language model; `model(tokens)` gives next-token logits.

    Attributes:
      cfg: the `ModelConfig`.
      embed: `[V, D]` input embedding ("vocab", "embed").
      layers: the decoder layers.
      final_norm: `[D]`.
      lm_head: `[D, V]` output projection ("embed", "vocab"), absent when tied.
    """

    def __init__(self, cfg, *, rngs):
        self.cfg = cfg
        self.embed = layers.param(rngs, (cfg.vocab_size, cfg.d_model), ("vocab", "embed"), cfg.param_dtype)
        self.layers = nnx.List(
            [DecoderLayer(cfg, cfg.is_moe_layer(i), rngs=rngs) for i in range(cfg.n_layers)]
        )
        self.final_norm = layers.param(rngs, (cfg.d_model,), ("norm",), cfg.param_dtype, init="ones")
        if not cfg.tie_embeddings:
            self.lm_head = layers.param(
                rngs, (cfg.d_model, cfg.vocab_size), ("embed", "vocab"), cfg.param_dtype
            )

    def unembedding(self):
        """The `[D, V]` output projection (the embedding table, transposed, when tied)."""
        return self.embed[...].T if self.cfg.tie_embeddings else self.lm_head[...]

    def logits(self, hidden):
        """`[..., D]` final hidden states -> `[..., V]` float32 logits (float32 accumulation)."""
        return logprobs.unembed(hidden, self.unembedding())

    def token_logprobs(self, tokens, targets, *, attention_mask=None, positions=None,
                       temperature=1.0, chunk_size=1024, with_entropy=False):
        """`[B, T]` float32 log-probs of `targets` after each prefix of `tokens`, chunked.

        Equals `objectives.token_logprobs(model(tokens, ...), targets)` without building the
        `[B, T, V]` logits (see `logprobs.chunked_token_logprobs`). Typically `targets` is
        `tokens` shifted left by one. With `with_entropy`, returns `(logp, entropy)`. An
        MoE trainer that also needs the load-balancing loss calls `hidden_states` and
        `chunked_token_logprobs` itself.
        """
        hidden, _ = self.hidden_states(tokens, attention_mask=attention_mask, positions=positions)
        return logprobs.chunked_token_logprobs(
            hidden, self.unembedding(), targets, temperature=temperature, chunk_size=chunk_size,
            with_entropy=with_entropy,
        )

    def _run(self, tokens, token_mask, positions, mask, cache=None, routing=None):
        """Embeds, runs every layer and the final norm.

        Returns (hidden, (keys, values), aux loss, experts): experts `[L_moe, B, S, k]`
        int32, the experts of each MoE layer, or None for a dense model; `routing` (the
        same shape) replays them.
        """
        cfg = self.cfg
        x = jnp.take(self.embed[...], tokens, axis=0).astype(cfg.dtype)
        call = nnx.remat(_call_layer) if cfg.remat else _call_layer
        new_k, new_v, stats, chosen = [], [], [], []
        for i, layer in enumerate(self.layers):
            kv = None if cache is None else (cache.k[i], cache.v[i])
            index = None if cache is None else cache.index
            prefix = None if cache is None else cache.prefix_layer(i)
            replay = None if routing is None or not cfg.is_moe_layer(i) else routing[len(chosen)]
            x, kv, layer_stats, experts = call(layer, x, positions, mask, token_mask, kv, index,
                                               prefix, replay)
            if cache is not None:
                new_k.append(kv[0])
                new_v.append(kv[1])
            if layer_stats is not None:
                stats.append(layer_stats)
                chosen.append(experts)
        hidden = layers.rms_norm(x, self.final_norm[...], cfg.norm_eps)
        aux = jnp.zeros((), jnp.float32)
        if stats:
            aux = layers.load_balancing_loss(sum(stats), len(stats), jnp.sum(token_mask))
        return hidden, (new_k, new_v), aux, jnp.stack(chosen) if chosen else None

    def hidden_states(self, tokens, *, attention_mask=None, positions=None, routing=None):
        """Final (normed) hidden states and the MoE load-balancing loss.

        Args:
          tokens: `[B, S]` int32 token ids.
          attention_mask: `[B, S]` 1 on real tokens, 0 on padding (default: all real).
          positions: `[B, S]` rope positions (default: `default_positions(attention_mask)`).
          routing: MoE only: `[L_moe, B, S, k]` expert ids to replay (keep routing), as
            `prefill(..., with_routing=True)` and the sampler record them.

        Returns:
          `(hidden [B, S, D] in the compute dtype, aux_loss [])`; aux_loss is the
          load-balancing loss over real tokens (0 for dense models); a trainer adds
          `cfg.router_aux_loss_coef * aux_loss`.
        """
        b, s = tokens.shape
        if attention_mask is None:
            attention_mask = jnp.ones((b, s), jnp.int32)
        if positions is None:
            positions = default_positions(attention_mask)
        causal = jnp.tril(jnp.ones((s, s), bool))
        mask = causal[None] & attention_mask.astype(bool)[:, None, :]
        hidden, _, aux, _ = self._run(tokens, attention_mask, positions, mask, routing=routing)
        return hidden, aux

    def __call__(self, tokens, *, attention_mask=None, positions=None):
        """`[B, S]` token ids -> `[B, S, V]` float32 logits (see `hidden_states` for the args)."""
        hidden, _ = self.hidden_states(tokens, attention_mask=attention_mask, positions=positions)
        return self.logits(hidden)

    def init_cache(self, batch_size, max_len, *, prefix=None):
        """An empty `KVCache` of `max_len` slots per row, in the compute dtype.

        With `prefix` (a `KVCache` of P rows filled by `prefill`; P divides batch_size),
        rows `[j*G, (j+1)*G)`, G = batch_size/P, continue prefix row j: their tokens
        attend its slots first, then their own. The prefix is stored and read once per
        group rather than copied into every row (for G completions of a prompt: G times
        less cache memory and attention reads for the prompt's part).
        """
        cfg = self.cfg
        if prefix is not None and batch_size % prefix.valid.shape[0]:
            raise ValueError(f"batch_size {batch_size} is not a multiple of the prefix's "
                             f"{prefix.valid.shape[0]} rows")
        if prefix is not None and prefix.prefix is not None:
            raise ValueError("the prefix cache has a prefix of its own; only one level is supported")
        k_shape = (batch_size, cfg.n_kv_heads, cfg.head_dim, max_len)
        v_shape = (batch_size, cfg.n_kv_heads, max_len, cfg.head_dim)
        def zeros(shape):
            return tuple(jnp.zeros(shape, cfg.dtype) for _ in range(cfg.n_layers))

        return KVCache(
            k=zeros(k_shape), v=zeros(v_shape), valid=jnp.zeros((batch_size, max_len), bool),
            index=jnp.zeros((), jnp.int32), prefix=prefix,
        )

    def prefill(self, tokens, cache, *, attention_mask=None, with_routing=False):
        """Appends `S` tokens to the cache and returns the next-token logits after them.

        Used once with the (left-padded) prompts; `decode_step` is the same with S = 1.
        The caller keeps `cache.index + S <= L`.

        Args:
          tokens: `[B, S]` int32.
          cache: a `KVCache` from `init_cache` or a previous call.
          attention_mask: `[B, S]` 1 on real tokens (default: all real).
          with_routing: also return the experts each token went to (MoE).

        Returns:
          `(logits [B, V] float32 at the last column, updated cache)`, and with
          `with_routing` a third item, `[L_moe, B, S, k]` int32 experts (None if dense).
        """
        b, s = tokens.shape
        max_len = cache.valid.shape[1]
        if s > max_len:
            raise ValueError(f"cannot prefill {s} tokens into a cache of {max_len} slots; raise max_len")
        if attention_mask is None:
            attention_mask = jnp.ones((b, s), jnp.int32)
        seen = jnp.sum(cache.valid, axis=1, dtype=jnp.int32) + cache.prefix_lengths()
        positions = default_positions(attention_mask, offset=seen)
        valid = jax.lax.dynamic_update_slice(cache.valid, attention_mask.astype(bool), (0, cache.index))
        slots = jnp.arange(max_len)
        causal = slots[None, :] <= cache.index + jnp.arange(s)[:, None]  # [S, L]
        mask = causal[None] & valid[:, None, :]
        hidden, (k, v), _, experts = self._run(tokens, attention_mask, positions, mask, cache)
        cache = cache.replace(k=tuple(k), v=tuple(v), valid=valid, index=cache.index + s)
        if with_routing:
            return self.logits(hidden[:, -1]), cache, experts
        return self.logits(hidden[:, -1]), cache

    def decode_step(self, tokens, cache, *, with_routing=False):
        """One token per row: `[B]` int32 -> (`[B, V]` float32 logits, updated cache), and
        with `with_routing` the experts the token went to, `[L_moe, B, 1, k]`."""
        return self.prefill(tokens[:, None], cache, with_routing=with_routing)


def abstract_model(cfg):
    """`(graphdef, state)` of a `Decoder` whose parameters are `ShapeDtypeStruct`s (no memory)."""
    return nnx.split(nnx.eval_shape(lambda: Decoder(cfg, rngs=nnx.Rngs(0))))


def place(host, variable, path, mesh, rules):
    """`variable` holding the host array `host`, each device receiving only its own slice."""
    if mesh is None:
        target = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    else:
        target = sharding.variable_sharding(path, variable, mesh, rules)
    return variable.replace(jax.make_array_from_callback(host.shape, target, lambda index: host[index]))


def init_model(cfg, *, seed=0, mesh=None, rules="fsdp"):
    """A randomly initialised `Decoder`, created directly in its sharding on `mesh`.

    Weights are drawn on the host with numpy and copied slice by slice to the devices
    (as `from_pretrained` does): an XLA program drawing dozens of differently shaped
    random tensors takes seconds to compile on CPU, this takes none.

    Args:
      cfg: a `ModelConfig`.
      seed: the init RNG seed (the same values on any mesh).
      mesh: a `jax.sharding.Mesh`; None keeps the parameters on the default device.
      rules: a rule-set name or a rule table (see `sharding.RULE_SETS`), used with `mesh`.
    """
    graphdef, state = abstract_model(cfg)
    rng = np.random.default_rng(seed)
    placed = {}
    for path, variable in nnx.to_flat_state(state):
        shape, init = variable.get_value().shape, variable.get_metadata()["init"]
        host = layers.initial_value(
            init, shape, cfg.param_dtype, lambda s: rng.standard_normal(s, dtype=np.float32)
        )
        placed[path] = place(host, variable, path, mesh, rules)
    return nnx.merge(graphdef, nnx.from_flat_state(placed))
