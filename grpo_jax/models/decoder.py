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

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx, struct

from grpo_jax.models import layers, logprobs, lora, sharding


@struct.dataclass
class KVCache:
    """Keys and values of all tokens seen so far, in fixed-size buffers.

    Attributes:
      k: one `[B, K, H, L]` array per layer (keys transposed: see layers.grouped_attention);
        with `scan_layers`, one `[n, B, K, H, L]` array per run of n scanned layers
        (`ModelConfig.layer_runs`).
      v: likewise, `[B, K, L, H]` per layer or `[n, B, K, L, H]` per run.
      valid: `[B, L]` bool, True on slots that hold a real (non-padding) token.
      index: `[]` int32, the slot the next token is written to (shared by all rows).
      prefix: None, or a filled `KVCache` of P rows (P divides B) that every group of
        B/P consecutive rows continues: the prompt of G sampled completions, kept once
        per prompt and read once per group (see `Decoder.init_cache`).
      pages: None, or a `layers.PageIndex`: then `k` and `v` are page pools (one
        `[M, K, H, page]` / `[M, K, page, H]` array per layer, `[n, M, ...]` per scanned
        run; `[K, M, page, H]` both with `pages.kernel`) shared by all rows, each row
        reading the pages its table lists and writing its new token where `pages` says
        (`Decoder.paged_decode_step`); `valid` is `[B, L]` over the table's columns and
        `index` is unused.
    """

    k: tuple
    v: tuple
    valid: jax.Array
    index: jax.Array
    prefix: "KVCache | None" = None
    pages: "layers.PageIndex | None" = None

    def prefix_lengths(self):
        """`[B]` real tokens each row has in the shared prefix (0 without one)."""
        if self.prefix is None:
            return jnp.zeros(self.valid.shape[:1], jnp.int32)
        per_group = self.valid.shape[0] // self.prefix.valid.shape[0]
        return jnp.repeat(jnp.sum(self.prefix.valid, axis=1, dtype=jnp.int32), per_group)

    def grow(self, slots):
        """The cache with empty slots appended up to `slots` (the shared prefix unchanged)."""
        def pad(x, axis):
            widths = [(0, 0)] * x.ndim
            widths[axis] = (0, slots - x.shape[axis])
            return jnp.pad(x, widths)

        return self.replace(k=tuple(pad(k, k.ndim - 1) for k in self.k),
                            v=tuple(pad(v, v.ndim - 2) for v in self.v),
                            valid=pad(self.valid, 1))


def kv_row_axis(x):
    """The row axis of a cache's keys or values, `[..., B, K, H, L]` / `[..., B, K, L, H]`:
    0 per layer, 1 in a scanned model's stack (`[n, B, ...]`)."""
    return x.ndim - 4


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

    def __call__(self, x, positions, mask, segments, kv_cache=None, cache_index=None, prefix=None,
                 routing=None, cache_layer=None, dropout_key=None):
        """`[B, S, D]` -> (`[B, S, D]`, new kv_cache, routing stats `[2, E]` or None,
        experts `[B, S, k]` or None); `segments` `[B, S]` are the tokens' segment ids (0 on
        padding); `routing` replays an MoE block's experts; `cache_layer` is the layer's
        index in a stacked cache (`Attention`); `dropout_key` the layer's adapter-dropout
        key in a training forward (`lora.layer_key`)."""
        eps = self.cfg.norm_eps
        x = sharding.constrain(x, ("batch",))
        h, kv_cache = self.attn(layers.rms_norm(x, self.attn_norm[...], eps), positions, mask,
                                segments, kv_cache, cache_index, prefix, cache_layer, dropout_key)
        x = x + h
        h, stats, experts = self.mlp(layers.rms_norm(x, self.mlp_norm[...], eps), segments > 0,
                                     routing, dropout_key)
        return sharding.constrain(x + h, ("batch",)), kv_cache, stats, experts


def layer_units(cfg):
    """`[(first layer, number of layers, is_moe), ...]`, one entry per unit the forward
    walks: a run of stacked layers with `scan_layers`, otherwise each layer alone."""
    if cfg.scan_layers:
        return cfg.layer_runs()
    return [(i, 1, cfg.is_moe_layer(i)) for i in range(cfg.n_layers)]


def _stacked_layers(cfg, moe, count, rngs):
    """One `DecoderLayer` holding `count` layers' weights stacked on a leading axis."""
    per_layer = [DecoderLayer(cfg, moe, rngs=rngs) for _ in range(count)]
    graphdef = nnx.graphdef(per_layer[0])
    return nnx.merge(graphdef, stack_states([nnx.state(layer) for layer in per_layer]))


def remat_policy(name):
    """`jax.checkpoint` policy of `ModelConfig.remat`, or None for "off" (no remat).

    "full" saves nothing inside a layer (its input is kept by the caller: one `[B, S, D]`
    per layer), "dots_saveable" every matmul result, "dots_with_no_batch_dims_saveable"
    the matmuls without batch dimensions (the projections, not attention's q k^T and p v).
    """
    policies = jax.checkpoint_policies
    return {
        "off": None,
        "full": policies.nothing_saveable,
        "dots_saveable": policies.dots_saveable,
        "dots_with_no_batch_dims_saveable": policies.dots_with_no_batch_dims_saveable,
    }[name]


def _layer_fn(graphdef, cfg, *, in_scan):
    """`(layer state, x, ...) -> DecoderLayer(...)` as a pure function, under the remat policy.

    Inside `lax.scan` common subexpressions cannot leak across iterations, so
    `prevent_cse` is off there (the setting JAX recommends for a scanned body).
    """
    def apply(state, *args):
        return nnx.merge(graphdef, state)(*args)

    policy = remat_policy(cfg.remat)
    if policy is None:
        return apply
    return jax.checkpoint(apply, policy=policy, prevent_cse=not in_scan)


def stack_states(states):
    """Per-layer `nnx.State`s of one kind -> one state whose leaves gain a leading layer
    axis, logical axis "layers" (numpy, jax arrays or `ShapeDtypeStruct`s)."""
    def stack(*variables):
        values = [v.get_value() for v in variables]
        if isinstance(values[0], jax.ShapeDtypeStruct):
            value = jax.ShapeDtypeStruct((len(values),) + values[0].shape, values[0].dtype)
        else:
            value = jnp.stack(values)
        axes = variables[0].get_metadata()["logical_axes"]
        return variables[0].replace(value, logical_axes=("layers",) + tuple(axes))

    return jax.tree.map(stack, *states, is_leaf=lambda x: isinstance(x, nnx.Variable))


class Decoder(nnx.Module):
    """A causal language model; `model(tokens)` gives next-token logits.

    Attributes:
      cfg: the `ModelConfig`.
      embed: `[V, D]` input embedding ("vocab", "embed").
      layers: the decoder layers, or with `cfg.scan_layers`
      stacks: one `DecoderLayer` per run of layers of one kind (`cfg.layer_runs()`)
        whose weights have a leading layer axis, walked by `jax.lax.scan`.
      final_norm: `[D]`.
      lm_head: `[D, V]` output projection ("embed", "vocab"), absent when tied.
    """

    def __init__(self, cfg, *, rngs):
        self.cfg = cfg
        self.embed = layers.param(
            rngs, (cfg.vocab_size, cfg.d_model), ("vocab", "embed"), cfg.param_dtype
        )
        if cfg.scan_layers:
            self.stacks = nnx.List(
                [_stacked_layers(cfg, moe, n, rngs) for _, n, moe in cfg.layer_runs()]
            )
        else:
            self.layers = nnx.List(
                [DecoderLayer(cfg, cfg.is_moe_layer(i), rngs=rngs) for i in range(cfg.n_layers)]
            )
        self.final_norm = layers.param(
            rngs, (cfg.d_model,), ("norm",), cfg.param_dtype, init="ones"
        )
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

    def _run(self, tokens, segments, positions, mask, cache=None, routing=None, dropout_key=None):
        """Embeds, runs every layer and the final norm. `segments` `[B, S]`: each token's
        segment id, 0 on padding (an attention mask is the one-segment case); with
        `dropout_key`, layer i's adapters drop with `lora.layer_key(dropout_key, i)`.

        The layers are walked unit by unit: one layer, or with `scan_layers` one run of
        stacked layers under `jax.lax.scan` (the cache's k/v tuples hold one entry per unit).

        Returns (hidden, (keys, values), aux loss, experts): experts `[L_moe, B, S, k]`
        int32, the experts of each MoE layer, or None for a dense model; `routing` (the
        same shape) replays them.
        """
        cfg = self.cfg
        x = sharding.constrain(
            jnp.take(self.embed[...], tokens, axis=0).astype(cfg.dtype), ("batch",)
        )
        index = None if cache is None else cache.index if cache.pages is None else cache.pages
        prefix_valid = None if cache is None or cache.prefix is None else cache.prefix.valid
        new_k, new_v, stats, chosen = [], [], [], []
        modules = self.stacks if cfg.scan_layers else self.layers
        for i, (module, (first, count, moe)) in enumerate(zip(modules, layer_units(cfg))):
            graphdef, state = nnx.split(module)
            apply = _layer_fn(graphdef, cfg, in_scan=cfg.scan_layers)
            kv = None if cache is None else (cache.k[i], cache.v[i])
            prefix = None if prefix_valid is None else (cache.prefix.k[i], cache.prefix.v[i])
            replay = None
            if routing is not None and moe:
                start = sum(cfg.is_moe_layer(j) for j in range(first))
                replay = routing[start:start + count]

            def layer(state, x, kv, prefix, replay, position=None, first=first):
                full_prefix = None if prefix is None else (*prefix, prefix_valid)
                key = lora.layer_key(dropout_key, first if position is None else first + position)
                return apply(state, x, positions, mask, segments, kv, index, full_prefix, replay,
                             position, key)

            if cfg.scan_layers:
                # The stacked cache rides in the carry, each layer writing its new slots
                # in place; as a scanned input/output it would be copied whole every call.
                def body(carry, xs):
                    x, kv = carry
                    state, prefix, replay, position = xs
                    x, kv, layer_stats, experts = layer(state, x, kv, prefix, replay, position)
                    return (x, kv), (layer_stats, experts)

                xs = (state, prefix, replay, jnp.arange(count))
                (x, kv), (layer_stats, experts) = jax.lax.scan(body, (x, kv), xs)
            else:
                replay = None if replay is None else replay[0]
                x, kv, layer_stats, experts = layer(state, x, kv, prefix, replay)
                layer_stats, experts = jax.tree.map(lambda a: a[None], (layer_stats, experts))
            if cache is not None:
                new_k.append(kv[0])
                new_v.append(kv[1])
            if moe:
                stats.append(jnp.sum(layer_stats, axis=0))
                chosen.append(experts)
        hidden = layers.rms_norm(x, self.final_norm[...], cfg.norm_eps)
        aux = jnp.zeros((), jnp.float32)
        if stats:
            experts = jnp.concatenate(chosen)
            aux = layers.load_balancing_loss(sum(stats), experts.shape[0], jnp.sum(segments > 0))
            return hidden, (new_k, new_v), aux, experts
        return hidden, (new_k, new_v), aux, None

    def hidden_states(self, tokens, *, attention_mask=None, positions=None, routing=None,
                      segment_ids=None, dropout_key=None, with_routing=False):
        """Final (normed) hidden states and the MoE load-balancing loss.

        Args:
          tokens: `[B, S]` int32 token ids.
          attention_mask: `[B, S]` 1 on real tokens, 0 on padding (default: all real).
          positions: `[B, S]` rope positions (default: `default_positions(attention_mask)`).
          routing: MoE only: `[L_moe, B, S, k]` expert ids to replay (keep routing), as
            `prefill(..., with_routing=True)` and the sampler record them.
          segment_ids: packed rows: `[B, S]` int32, the sequence each token belongs to (0
            on padding); a token attends the tokens of its own segment up to it, nothing
            else. Replaces `attention_mask`; `positions` (each segment's own, from 0) are
            then required.
          dropout_key: a training forward's key for the adapters' dropout
            (``model.lora.dropout``; a LoRA model only); None: no dropout.
          with_routing: also return the router's own top-k experts of every token,
            `[L_moe, B, S, k]` int32 (None if dense); with `routing`, the experts it would
            have chosen.

        Returns:
          `(hidden [B, S, D] in the compute dtype, aux_loss [])`; aux_loss is the
          load-balancing loss over real tokens (0 for dense models); a trainer adds
          `cfg.router_aux_loss_coef * aux_loss`. With `with_routing`, the experts third.
        """
        b, s = tokens.shape
        causal = jnp.tril(jnp.ones((s, s), bool))
        if segment_ids is not None:
            if attention_mask is not None or positions is None:
                raise ValueError("segment_ids replaces attention_mask and needs each segment's "
                                 "positions; pass segment_ids and positions")
            same = segment_ids[:, :, None] == segment_ids[:, None, :]
            mask = causal[None] & same & (segment_ids > 0)[:, None, :]
            segments = segment_ids
        else:
            if attention_mask is None:
                attention_mask = jnp.ones((b, s), jnp.int32)
            if positions is None:
                positions = default_positions(attention_mask)
            mask = causal[None] & attention_mask.astype(bool)[:, None, :]
            segments = attention_mask
        hidden, _, aux, experts = self._run(tokens, segments, positions, mask, routing=routing,
                                            dropout_key=dropout_key)
        return (hidden, aux, experts) if with_routing else (hidden, aux)

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
            raise ValueError(
                "the prefix cache has a prefix of its own; only one level is supported"
            )
        k_shape = (batch_size, cfg.n_kv_heads, cfg.head_dim, max_len)
        v_shape = (batch_size, cfg.n_kv_heads, max_len, cfg.head_dim)
        def zeros(shape):
            stacked = lambda count: (count,) if cfg.scan_layers else ()
            return tuple(
                jnp.zeros(stacked(count) + shape, cfg.dtype) for _, count, _ in layer_units(cfg)
            )

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
            raise ValueError(
                f"cannot prefill {s} tokens into a cache of {max_len} slots; raise max_len"
            )
        if attention_mask is None:
            attention_mask = jnp.ones((b, s), jnp.int32)
        seen = jnp.sum(cache.valid, axis=1, dtype=jnp.int32) + cache.prefix_lengths()
        positions = default_positions(attention_mask, offset=seen)
        valid = jax.lax.dynamic_update_slice(
            cache.valid, attention_mask.astype(bool), (0, cache.index)
        )
        if s == 1:
            # One new token attends every valid slot: all were written before it (or are
            # it), wherever they sit; a continuous-batching sampler writes completions
            # into a ring of columns, so some may lie after `index`.
            mask = valid[:, None, :]
        else:
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

    def paged_decode_step(self, tokens, positions, cache):
        """One token per row into a paged cache (`KVCache.pages` set): each row writes its
        token's keys and values at its own (page, offset) and attends the columns of its
        page table that `cache.valid` marks (the caller marks the new token's column).

        Args:
          tokens: `[B]` int32.
          positions: `[B]` int32 rope positions of the tokens.
          cache: a paged `KVCache` (`sampling._paged`).

        Returns:
          `(logits [B, V] float32, the cache with the pools written, experts
          [L_moe, B, 1, k] int32 or None)`.
        """
        ones = jnp.ones((tokens.shape[0], 1), jnp.int32)
        hidden, (k, v), _, experts = self._run(tokens[:, None], ones, positions[:, None],
                                               cache.valid[:, None, :], cache)
        return self.logits(hidden[:, -1]), cache.replace(k=tuple(k), v=tuple(v)), experts


def abstract_model(cfg):
    """`(graphdef, state)` of a `Decoder` whose parameters are `ShapeDtypeStruct`s (no memory)."""
    return nnx.split(nnx.eval_shape(lambda: Decoder(cfg, rngs=nnx.Rngs(0))))


def scanned_path(cfg, path):
    """A per-layer parameter path `("layers", i, ...)` -> `(("stacks", j, ...), k)`: the
    stack that holds layer i in a scanned decoder and i's position in it. Other paths
    are the same in both layouts (k is None)."""
    if path[0] != "layers":
        return path, None
    for j, (first, count, _) in enumerate(cfg.layer_runs()):
        if first <= path[1] < first + count:
            return ("stacks", j, *path[2:]), path[1] - first
    raise ValueError(f"{path}: layer {path[1]} is past the model's {cfg.n_layers} layers")


def place(read, variable, path, mesh, rules):
    """`variable` holding the host values `read(index)` returns, each device reading only
    its own slice (`index`: a tuple of slices of the variable's shape)."""
    if mesh is None:
        target = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    else:
        target = sharding.variable_sharding(path, variable, mesh, rules)
    return variable.replace(jax.make_array_from_callback(variable.get_value().shape, target, read))


def init_model(cfg, *, seed=0, mesh=None, rules="fsdp"):
    """A randomly initialised `Decoder`, created directly in its sharding on `mesh`.

    Weights are drawn on the host with numpy and copied slice by slice to the devices
    (as `from_pretrained` does): an XLA program drawing dozens of differently shaped
    random tensors takes seconds to compile on CPU, this takes none. A scanned decoder
    gets the same values as the unscanned one (drawn per layer, then stacked on the host:
    for large models load weights with `from_pretrained`, which reads slice by slice).

    Args:
      cfg: a `ModelConfig`.
      seed: the init RNG seed (the same values on any mesh and with or without scan).
      mesh: a `jax.sharding.Mesh`; None keeps the parameters on the default device.
      rules: a rule-set name or a rule table (see `sharding.RULE_SETS`), used with `mesh`.

    With ``cfg.lora.quantize`` the base's projections are then quantised (QLoRA).
    """
    graphdef, state = abstract_model(cfg)
    state = nnx.from_flat_state(initial_variables(cfg, state, seed, mesh, rules))
    return nnx.merge(graphdef, lora.quantize_base(state, cfg.lora))   # QLoRA: the base as integers


def initial_variables(cfg, state, seed, mesh, rules, *, only=nnx.Param):
    """`{path: variable}` of `init_model`'s values for the variables of the abstract
    `state` that are instances of `only` (`nnx.LoRAParam`: the adapters of a loaded base)."""
    targets = dict(nnx.to_flat_state(state))
    _, per_layer_state = abstract_model(dataclasses.replace(cfg, scan_layers=False))
    # Adapters draw from their own stream, so the base weights do not depend on them.
    base_rng, adapter_rng = np.random.default_rng(seed), np.random.default_rng([seed, 1])
    stacks, placed = {}, {}
    for path, variable in nnx.to_flat_state(per_layer_state):
        if not isinstance(variable, only):
            continue
        value, init = variable.get_value(), variable.get_metadata()["init"]
        rng = adapter_rng if isinstance(variable, nnx.LoRAParam) else base_rng
        host = layers.initial_value(
            init, value.shape, value.dtype, lambda s: rng.standard_normal(s, dtype=np.float32)
        )
        path, position = scanned_path(cfg, path) if cfg.scan_layers else (path, None)
        if position is not None:
            stacks.setdefault(path, []).append(host)
            if len(stacks[path]) < targets[path].get_value().shape[0]:
                continue
            host = np.stack(stacks.pop(path))
        placed[path] = place(lambda index, host=host: host[index], targets[path], path, mesh, rules)
    return placed
