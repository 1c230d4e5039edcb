"""The decoder's hyper-parameters, and their translation to and from Hugging Face configs.

One frozen dataclass describes every supported family; the family only switches a few
flags (qkv bias, q/k norm, rope scaling, routed experts). `from_hf_config` and
`to_hf_config` are exact inverses on the fields the model uses, so a checkpoint saved by
`save_pretrained` loads back into transformers with the same architecture.
"""

import dataclasses

import jax
import transformers

from grpo_jax.models import lora as lora_lib

SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "qwen3", "qwen3_moe")
# "xla": plain XLA attention, any backend (the reference); "splash": the Pallas TPU
# splash-attention kernel for training and prefill (interpreted on CPU); "cudnn": fused
# flash attention on NVIDIA GPUs through `jax.nn.dot_product_attention`.
ATTENTION_IMPLS = ("xla", "splash", "cudnn")
# How routed experts are multiplied: "ragged" sorts the (token, expert) rows by expert and
# uses `jax.lax.ragged_dot` (k/E of the dense FLOPs; native on TPU and GPU); "dense" runs
# every expert on every token and keeps each token's k (faster on CPU, whose ragged_dot is
# emulated). The same network either way.
MOE_IMPLS = ("ragged", "dense")
# What a layer keeps for the backward pass (see `decoder.remat_policy`): "off" keeps
# every activation, "full" only the layer's input, the others also the named results.
REMAT_POLICIES = ("off", "full", "dots_saveable", "dots_with_no_batch_dims_saveable")


def as_remat_policy(remat):
    """`remat` as one of `REMAT_POLICIES` when it is the original on/off flag: True or
    False, or either as the command line spells it (`--config.model.remat=True` gives the
    string "True") read as "full" or "off". Anything else is returned as it is."""
    if isinstance(remat, bool):
        return "full" if remat else "off"
    if remat in ("True", "true", "False", "false"):
        return "full" if remat.lower() == "true" else "off"
    return remat


@dataclasses.dataclass(frozen=True)
class Llama3RopeScaling:
    """Llama 3.1's frequency-dependent rope rescaling (transformers' rope_type "llama3")."""

    factor: float = 8.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Shape and numerics of a decoder-only transformer.

    Attributes:
      model_type: transformers' name of the family, one of `SUPPORTED_MODEL_TYPES`.
      vocab_size, d_model, n_layers: V, D and the number of decoder layers.
      n_heads, n_kv_heads, head_dim: N query heads, K key/value heads (grouped-query
        attention, Ainslie et al. 2023, needs N % K == 0) and H per head.
      d_ff: hidden width F of the SwiGLU MLP (Shazeer 2020) in dense layers.
      norm_eps: RMSNorm epsilon (Zhang & Sennrich 2019).
      rope_theta: RoPE base (Su et al. 2021); `rope_scaling` the optional Llama 3 rescaling.
      qkv_bias, o_bias: biases on the q/k/v and the output projections (Qwen2: qkv only).
      qk_norm: RMSNorm over head_dim on queries and keys before rope (Qwen3).
      tie_embeddings: the output layer reuses the input embedding table.
      n_experts, n_experts_per_tok, moe_d_ff: routed experts (Qwen3-MoE); 0 = dense.
      norm_topk_prob: renormalise the top-k router probabilities to sum to one.
      decoder_sparse_step, mlp_only_layers: which layers are MoE (transformers' rule:
        layer i is MoE iff i not in mlp_only_layers and (i + 1) % decoder_sparse_step == 0).
      router_aux_loss_coef: weight of the load-balancing loss a trainer adds.
      max_position_embeddings: written back to config.json; not a limit here.
      bos_token_id, eos_token_id, pad_token_id: carried through for HF tooling.
      dtype: compute dtype of activations and matmuls ("float32", "bfloat16").
      param_dtype: storage dtype of the weights (e.g. float32 master weights).
      remat: what each layer keeps for the backward pass, one of `REMAT_POLICIES`
        ("off": everything; "full": its input only, the rest recomputed; "dots_saveable":
        also every matmul result). True and False (or "True"/"true", "False"/"false")
        mean "full" and "off".
      attention_impl: one of `ATTENTION_IMPLS`: "xla" (any backend), "splash" (the Pallas
        TPU kernels: splash for training and prefill, the paged-attention kernel for the
        paged engine's decoding, which also uses it on any TPU backend; the contiguous
        decode stays XLA) or "cudnn" (NVIDIA GPUs, bf16/fp16, through
        `jax.nn.dot_product_attention`).
      moe_impl: one of `MOE_IMPLS`, how routed experts are computed ("ragged" or "dense").
      scan_layers: run runs of identical layers with `jax.lax.scan` over stacked weights
        (one compiled layer body per run instead of one per layer); the KV cache is
        stacked likewise. Numerically the same network.
      lora: a `lora.LoraSpec` (low-rank adapters on the projections it targets), or None.
    """

    model_type: str
    vocab_size: int
    d_model: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    d_ff: int
    norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: Llama3RopeScaling | None = None
    qkv_bias: bool = False
    o_bias: bool = False
    qk_norm: bool = False
    tie_embeddings: bool = False
    n_experts: int = 0
    n_experts_per_tok: int = 0
    moe_d_ff: int = 0
    norm_topk_prob: bool = False
    decoder_sparse_step: int = 1
    mlp_only_layers: tuple[int, ...] = ()
    router_aux_loss_coef: float = 0.001
    max_position_embeddings: int = 32768
    bos_token_id: int | None = None
    eos_token_id: int | tuple[int, ...] | None = None
    pad_token_id: int | None = None
    dtype: str = "float32"
    param_dtype: str = "float32"
    remat: str = "off"
    attention_impl: str = "xla"
    moe_impl: str = "ragged"
    scan_layers: bool = False
    lora: lora_lib.LoraSpec | None = None

    def __post_init__(self):
        object.__setattr__(self, "remat", as_remat_policy(self.remat))
        if self.remat not in REMAT_POLICIES:
            raise ValueError(
                f"remat must be one of {REMAT_POLICIES} (or a bool), got {self.remat!r}"
            )
        if self.attention_impl not in ATTENTION_IMPLS:
            raise ValueError(
                f"attention_impl must be one of {ATTENTION_IMPLS}, got {self.attention_impl!r}"
            )
        if self.moe_impl not in MOE_IMPLS:
            raise ValueError(f"moe_impl (a run config's model.moe) must be 'auto' in a run "
                             f"config or one of {MOE_IMPLS}, got {self.moe_impl!r}")
        if self.model_type not in SUPPORTED_MODEL_TYPES:
            raise ValueError(
                f"model_type must be one of {SUPPORTED_MODEL_TYPES}, got {self.model_type!r}"
            )
        if self.n_heads % self.n_kv_heads:
            raise ValueError(
                f"n_heads ({self.n_heads}) must be a multiple of n_kv_heads ({self.n_kv_heads})"
            )
        if self.n_experts and not 0 < self.n_experts_per_tok <= self.n_experts:
            raise ValueError(
                f"n_experts_per_tok must be in [1, n_experts={self.n_experts}], "
                f"got {self.n_experts_per_tok}"
            )

    def is_moe_layer(self, i):
        """Whether layer `i` uses routed experts (transformers' Qwen3-MoE rule)."""
        return (
            self.n_experts > 0
            and i not in self.mlp_only_layers
            and (i + 1) % self.decoder_sparse_step == 0
        )

    def layer_runs(self):
        """`[(first layer, number of layers, is_moe), ...]`: maximal runs of consecutive
        layers of one kind (dense or MoE), the stacks a scanned decoder holds."""
        runs = []
        for i in range(self.n_layers):
            moe = self.is_moe_layer(i)
            if runs and runs[-1][2] == moe:
                runs[-1] = (runs[-1][0], runs[-1][1] + 1, moe)
            else:
                runs.append((i, 1, moe))
        return runs


# Fields that keep their name and meaning in transformers' configs: ours -> theirs.
_SAME_MEANING = {
    "vocab_size": "vocab_size",
    "d_model": "hidden_size",
    "n_layers": "num_hidden_layers",
    "n_heads": "num_attention_heads",
    "n_kv_heads": "num_key_value_heads",
    "d_ff": "intermediate_size",
    "norm_eps": "rms_norm_eps",
    "tie_embeddings": "tie_word_embeddings",
    "max_position_embeddings": "max_position_embeddings",
    "bos_token_id": "bos_token_id",
    "eos_token_id": "eos_token_id",
    "pad_token_id": "pad_token_id",
}
_MOE_FIELDS = {
    "n_experts": "num_experts",
    "n_experts_per_tok": "num_experts_per_tok",
    "moe_d_ff": "moe_intermediate_size",
    "norm_topk_prob": "norm_topk_prob",
    "decoder_sparse_step": "decoder_sparse_step",
    "router_aux_loss_coef": "router_aux_loss_coef",
}


def _unsupported(source, field, value, fix):
    return ValueError(f"{source}: {field}={value!r} is not supported; {fix}")


def from_hf_config(hf, *, source="config.json"):
    """Translates a transformers `PretrainedConfig` into a `ModelConfig`.

    Args:
      hf: a config from `transformers.AutoConfig`.
      source: what to name in error messages (the config file's path).

    Raises:
      ValueError naming `source` and the field, for a family or option this decoder
      does not implement (sliding windows, non-SiLU MLPs, other rope types, MLP biases).
    """
    if hf.model_type not in SUPPORTED_MODEL_TYPES:
        raise _unsupported(
            source, "model_type", hf.model_type, f"supported: {', '.join(SUPPORTED_MODEL_TYPES)}"
        )
    if getattr(hf, "hidden_act", "silu") != "silu":
        raise _unsupported(
            source, "hidden_act", hf.hidden_act, "only 'silu' (SwiGLU) is implemented"
        )
    if getattr(hf, "use_sliding_window", False):
        raise _unsupported(source, "use_sliding_window", True, "set it to false")
    if getattr(hf, "mlp_bias", False):
        raise _unsupported(source, "mlp_bias", True, "only bias-free MLPs are implemented")
    rope = dict(hf.rope_parameters)
    rope_type = rope.get("rope_type", "default")
    if rope_type not in ("default", "llama3"):
        raise _unsupported(
            source, "rope_parameters.rope_type", rope_type, "use 'default' or 'llama3'"
        )
    scaling = None
    if rope_type == "llama3":
        scaling = Llama3RopeScaling(
            **{f.name: rope[f.name] for f in dataclasses.fields(Llama3RopeScaling)}
        )
    kwargs = {ours: getattr(hf, theirs) for ours, theirs in _SAME_MEANING.items()}
    if isinstance(kwargs["eos_token_id"], list):
        kwargs["eos_token_id"] = tuple(kwargs["eos_token_id"])
    if hf.model_type == "qwen3_moe":
        kwargs.update({ours: getattr(hf, theirs) for ours, theirs in _MOE_FIELDS.items()})
        kwargs["mlp_only_layers"] = tuple(hf.mlp_only_layers)
    attention_bias = getattr(hf, "attention_bias", False)
    return ModelConfig(
        model_type=hf.model_type,
        head_dim=getattr(hf, "head_dim", None) or hf.hidden_size // hf.num_attention_heads,
        rope_theta=float(rope["rope_theta"]),
        rope_scaling=scaling,
        # Qwen2 hard-codes bias on q/k/v only; the others put `attention_bias` on all four.
        qkv_bias=hf.model_type == "qwen2" or attention_bias,
        o_bias=hf.model_type != "qwen2" and attention_bias,
        qk_norm=hf.model_type in ("qwen3", "qwen3_moe"),
        **kwargs,
    )


def to_hf_config(cfg):
    """The transformers config that describes the same network as `cfg`."""
    if cfg.model_type == "qwen2" and (not cfg.qkv_bias or cfg.o_bias):
        raise ValueError(
            "a qwen2 config needs qkv_bias=True and o_bias=False (Qwen2's fixed layout)"
        )
    if cfg.model_type != "qwen2" and cfg.qkv_bias != cfg.o_bias:
        raise ValueError(
            f"{cfg.model_type} puts attention_bias on q/k/v and o alike; "
            f"got qkv_bias={cfg.qkv_bias}, o_bias={cfg.o_bias}"
        )
    rope = {"rope_type": "default", "rope_theta": cfg.rope_theta}
    if cfg.rope_scaling is not None:
        rope = {**rope, "rope_type": "llama3", **dataclasses.asdict(cfg.rope_scaling)}
    kwargs = {theirs: getattr(cfg, ours) for ours, theirs in _SAME_MEANING.items()}
    if cfg.model_type == "qwen3_moe":
        kwargs.update({theirs: getattr(cfg, ours) for ours, theirs in _MOE_FIELDS.items()})
        kwargs["mlp_only_layers"] = list(cfg.mlp_only_layers)
    if cfg.model_type != "qwen2":
        kwargs["attention_bias"] = cfg.o_bias
    if cfg.model_type != "qwen2" or cfg.head_dim != cfg.d_model // cfg.n_heads:
        kwargs["head_dim"] = cfg.head_dim  # Qwen2's config has no such field unless it differs
    return transformers.AutoConfig.for_model(
        cfg.model_type,
        rope_parameters=rope,
        hidden_act="silu",
        dtype=cfg.param_dtype,
        **kwargs,
    )


# A run config's ``model`` section -> the `ModelConfig` fields it sets.
RUN_FIELDS = {"dtype": "dtype", "param_dtype": "param_dtype", "remat": "remat",
              "attention": "attention_impl", "moe": "moe_impl", "scan_layers": "scan_layers"}


def moe_impl_for(moe, platform):
    """``model.moe`` resolved for devices of `platform` ("cpu", "tpu", "gpu"/"cuda"...):
    "auto" is "dense" on CPU and "ragged" elsewhere; anything else is returned as it is."""
    if moe != "auto":
        return moe
    return "dense" if platform == "cpu" else "ragged"


def run_overrides(model_section, mesh=None):
    """`{ModelConfig field: value}` from a run config's ``model`` section (configs/base.py):
    dtype, param_dtype, remat, attention (-> attention_impl), moe (-> moe_impl, "auto"
    resolved for the platform of `mesh`'s devices, or of JAX's default backend without a
    mesh), scan_layers and lora (``model.lora``: `lora.spec_from_config`).

    Raises:
      ValueError naming the missing ``model.`` field.
    """
    missing = [f"model.{name}" for name in (*RUN_FIELDS, "lora") if name not in model_section]
    if missing:
        raise ValueError(f"the config lacks {', '.join(missing)}; configs/base.py defines them "
                         f"(attention: one of {ATTENTION_IMPLS}, moe: 'auto' or one of "
                         f"{MOE_IMPLS}, remat: one of {REMAT_POLICIES})")
    overrides = {ours: model_section[name] for name, ours in RUN_FIELDS.items()}
    overrides["lora"] = lora_lib.spec_from_config(model_section.lora)
    platform = mesh.devices.flat[0].platform if mesh is not None else jax.default_backend()
    overrides["moe_impl"] = moe_impl_for(overrides["moe_impl"], platform)
    return overrides
