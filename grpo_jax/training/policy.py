"""The policy network and its tokenizer: created or loaded in their sharding, exported."""

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import transformers
from flax import nnx

from grpo_jax import models, parallel, paths
from grpo_jax.training.tokenizer import train_char_tokenizer

VOCAB_MULTIPLE = 64   # pad a trained tokenizer's vocabulary so any tensor axis divides it


@dataclasses.dataclass
class Policy:
    """The weights being trained and what turns text into tokens for them.

    Attributes:
      graphdef: the model's `nnx.GraphDef` (static structure).
      params: its `nnx.State`, sharded on the run's mesh.
      tokenizer: a `transformers` tokenizer (pad, eos set).
    """

    graphdef: object
    params: object
    tokenizer: object

    def model_config(self) -> models.ModelConfig:
        """The `models.ModelConfig` of the network (its shape, MoE or dense, dtypes)."""
        return nnx.merge(self.graphdef, self.params).cfg


def owns_reference(config: Any) -> bool:
    """Whether an RL run of `config` keeps its own copy of pi_ref's weights: with a KL term
    (``objective.kl.beta > 0``) and no LoRA (with ``model.lora.rank > 0`` pi_ref is the
    frozen base with the adapters off: the same arrays, no copy)."""
    return config.objective.kl.beta > 0 and not config.model.lora.rank


def sampling_policy(graphdef: nnx.GraphDef, frozen: nnx.State, trained: nnx.State,
                    tokenizer: Any) -> Policy:
    """The `Policy` a sampler draws with: the network `graphdef` over the state `frozen`
    (the parameters no step updates, or the whole state) with `trained` (one version of the
    trained parameters, an `nnx.State`) merged over it; the arrays are shared, not copied."""
    return Policy(graphdef, nnx.merge_state(frozen, trained), tokenizer)


# What ``rollout.dtype`` may name ("" also: the trainer's ``model.dtype``). The 8- and
# 4-bit names are weight-only formats as inference engines serve them, computing in
# bfloat16 (`quantised_weights`, `WEIGHT_FORMATS`).
ROLLOUT_DTYPES = ("float32", "bfloat16", "float16", "float8_e4m3fn", "float4_e2m1fn")
# Weight-only formats: (the largest finite value, the scaling block: that many consecutive
# elements of a weight's last axis share one scale, the whole last axis where it does not
# divide into blocks). FP8 E4M3 (Micikevicius et al., "FP8 Formats for Deep Learning",
# arXiv:2209.05433) in groups of 128 as DeepSeek-V3's fine-grained FP8 (arXiv:2412.19437,
# sec. 3.3); FP4 E2M1 in blocks of 16 as NVFP4 (the rollout format of QeRL, Huang et al.,
# arXiv:2510.11696), its FP8 block scales kept in float32 here. The blocks run along the
# stored last axis whatever the weight's role, so no layout is assumed.
WEIGHT_FORMATS = {"float8_e4m3fn": (448.0, 128), "float4_e2m1fn": (6.0, 16)}


def check_rollout_dtype(config: Any) -> None:
    """Raises ValueError naming ``rollout.dtype`` unless it is "" or one of `ROLLOUT_DTYPES`."""
    dtype = config.rollout.dtype
    if dtype and dtype not in ROLLOUT_DTYPES:
        raise ValueError(f"rollout.dtype must be '' (model.dtype) or one of {ROLLOUT_DTYPES}, "
                         f"got {dtype!r}")


@functools.partial(jax.jit, static_argnames="dtype")
def cast_floats(params: nnx.State, dtype: str) -> nnx.State:
    """`params` (an `nnx.State`) with every floating-point leaf cast to `dtype`; integer
    leaves (a QLoRA base's quantised projections) as they are. Each leaf keeps its
    sharding."""
    cast = lambda x: x.astype(dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x
    return jax.tree.map(cast, params)


def _quantised(x: jax.Array, dtype: str) -> jax.Array:
    """One floating leaf of `quantised_weights`."""
    largest, block = WEIGHT_FORMATS[dtype]
    if x.ndim < 2:
        return x.astype(jnp.bfloat16)
    last = x.shape[-1]
    block = block if last % block == 0 else last
    blocks = x.astype(jnp.float32).reshape(x.shape[:-1] + (last // block, block))
    amax = jnp.max(jnp.abs(blocks), axis=-1, keepdims=True)
    scale = jnp.where(amax > 0, amax / largest, 1.0)
    values = (blocks / scale).astype(dtype).astype(jnp.float32) * scale
    return values.reshape(x.shape).astype(jnp.bfloat16)


@functools.partial(jax.jit, static_argnames="dtype")
def quantised_weights(params: nnx.State, dtype: str) -> nnx.State:
    """`params` as a weight-only `dtype` engine (a `WEIGHT_FORMATS` key) holds them, in
    bfloat16: every floating leaf of 2 or more dimensions (projections, experts,
    embeddings) rounded to `dtype` with one scale (``amax / largest``) per block of its
    last axis and multiplied back; 1-d leaves (norms) cast to bfloat16; integer leaves as
    they are. Each leaf keeps its sharding."""
    cast = lambda x: _quantised(x, dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x
    return jax.tree.map(cast, params)


def computing_in(graphdef: nnx.GraphDef, params: nnx.State, dtype: str) -> nnx.GraphDef:
    """The `nnx.GraphDef` of the same network with every module's `ModelConfig` computing
    and storing its weights in `dtype` (activations, matmuls and KV cache; the log-probs
    stay float32): `graphdef` is left as it is."""
    model = nnx.merge(graphdef, params)   # the arrays are shared, not copied
    cfg = dataclasses.replace(model.cfg, dtype=dtype, param_dtype=dtype)
    for _, module in nnx.iter_modules(model):
        if hasattr(module, "cfg"):
            module.cfg = cfg
    return nnx.graphdef(model)


@dataclasses.dataclass(frozen=True)
class RolloutPrecision:
    """The sampler's own precision (``rollout.dtype``) when it is not the trainer's: a
    copy of the weights cast to `dtype` and a network that computes in it, as a bf16
    inference engine samples for an fp32 trainer. The sampler's log-probs (the batch's
    ``behaviour_logp``) are then those of the low-precision policy, so the sampler-vs-
    trainer metrics measure the gap and ``objective.importance`` can correct it (Yao et
    al., "Your Efficient RL Framework Secretly Brings You Off-Policy RL Training", 2025;
    MiniMax-M1's CISPO, arXiv:2506.13585, sec. 3).

    Attributes:
      dtype: the sampler's dtype ("bfloat16", ...; a `WEIGHT_FORMATS` key: weight-only).
      graphdef: the policy's network computing in it (`computing_in`; bfloat16 for a
        weight-only format).
    """

    dtype: str
    graphdef: object

    @classmethod
    def of(cls, config: Any, policy: Policy) -> "RolloutPrecision | None":
        """The run's `RolloutPrecision`, or None when ``rollout.dtype`` is "" or equals
        ``model.dtype`` (the sampler uses the trainer's parameters as they are)."""
        check_rollout_dtype(config)
        dtype = config.rollout.dtype
        if not dtype or dtype == config.model.dtype:
            return None
        computes = "bfloat16" if dtype in WEIGHT_FORMATS else dtype
        return cls(dtype, computing_in(policy.graphdef, policy.params, computes))

    def params(self, params: nnx.State) -> nnx.State:
        """`params` (the whole state or a part of it) in the sampler's dtype: one cast, at
        each publish of the parameters to the sampler."""
        if self.dtype in WEIGHT_FORMATS:
            return quantised_weights(params, self.dtype)
        return cast_floats(params, self.dtype)

    def policy(self, policy: Policy) -> Policy:
        """The sampler's `Policy` of `policy`: its weights cast, the network in `dtype`."""
        return Policy(self.graphdef, self.params(policy.params), policy.tokenizer)


def load_policy(model_cfg: Any, mesh: jax.sharding.Mesh, *,
                tokenizer_texts: list[str] | None = None,
                seed: int = 0) -> tuple[nnx.Module, Any]:
    """Returns `(model, tokenizer)` from ``config.model``.

    ``model.path``: a Hugging Face directory (weights, config and tokenizer), read by
    `models.from_pretrained` with every tensor placed straight into its sharding; one in
    a bucket (``gs://...``) is first copied to a temporary local directory.
    ``model.name``: a named shape initialised at random, with a character tokenizer
    trained on `tokenizer_texts` (the tiny CPU models).
    """
    if model_cfg.path:
        path = model_cfg.path
        if not paths.path(path).is_dir():
            raise FileNotFoundError(
                f"model.path {model_cfg.path!r} is not a directory; point it at "
                "a Hugging Face checkpoint (config.json + *.safetensors)"
            )
        with paths.local_copy(path) as local:   # the reader memory-maps local files
            model, tokenizer = models.from_pretrained(
                local, mesh=mesh, rules=model_cfg.rules, seed=seed,
                **models.run_overrides(model_cfg, mesh))
        if tokenizer is None:
            raise FileNotFoundError(f"model.path {path!r} has no tokenizer files; save the "
                                    "tokenizer next to the weights")
        return model, tokenizer
    if not model_cfg.name:
        raise ValueError("set model.path (a local HF checkpoint) or model.name (a named config "
                         f"from {sorted(models.NAMED_CONFIGS)})")
    if tokenizer_texts is None:
        raise ValueError(f"model.name={model_cfg.name!r} trains a tokenizer on the task's texts; "
                         "pass tokenizer_texts")
    tokenizer = train_char_tokenizer(tokenizer_texts)
    vocab = -(-len(tokenizer) // VOCAB_MULTIPLE) * VOCAB_MULTIPLE
    cfg = models.get_model_config(
        model_cfg.name, vocab_size=vocab, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id, bos_token_id=None,
        **models.run_overrides(model_cfg, mesh))
    return models.init_model(cfg, seed=seed, mesh=mesh, rules=model_cfg.rules), tokenizer


def start_policy(config: Any, mesh: jax.sharding.Mesh, workdir: str,
                 tokenizer_texts: list[str] | None) -> Policy:
    """The run's starting `Policy`; the tokenizer is kept in ``workdir/tokenizer``, so a
    resumed run (or another process) uses the one the run started with."""
    model, tokenizer = load_policy(config.model, mesh, tokenizer_texts=tokenizer_texts,
                                   seed=config.seed)
    saved = paths.join(workdir, "tokenizer")
    if parallel.is_main() and not paths.path(saved).is_dir():
        with paths.staged(saved) as local:
            tokenizer.save_pretrained(local)
    parallel.sync("tokenizer saved")
    graphdef, params = nnx.split(model)
    with paths.local_copy(saved) as local:
        tokenizer = transformers.AutoTokenizer.from_pretrained(local)
    return Policy(graphdef, params, tokenizer)


def export(policy: Policy, path: str, *, base_path: str = "") -> None:
    """Writes the policy as a Hugging Face checkpoint (config, safetensors, tokenizer).

    A LoRA policy is written with its adapters merged into the weights, and its adapters
    alone in PEFT's format in ``path/adapter`` (beside, not inside: transformers would read
    an ``adapter_config.json`` in `path` as an adapter to load onto another model),
    pointing at `base_path`, the frozen base's checkpoint; without one (a named shape
    drawn at random) the base is written to ``path/base``. Adapters of routed experts have
    no PEFT form: such a policy is exported merged only.
    """
    model = nnx.merge(policy.graphdef, policy.params)
    models.save_pretrained(model, path, tokenizer=policy.tokenizer)
    adapter = model.cfg.lora is not None and models.peft_exportable(model.cfg)
    if adapter and not base_path:
        base_path = paths.join(path, "base")
        models.save_pretrained(nnx.merge(policy.graphdef, models.adapters_off(policy.params)),
                               base_path, tokenizer=policy.tokenizer)
    if adapter:
        models.save_peft_adapter(model, paths.join(path, "adapter"), base_path=base_path)
    if parallel.is_main():
        print(f"exported the policy to {path}", flush=True)
