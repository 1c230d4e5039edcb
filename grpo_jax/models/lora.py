"""Low-rank adapters (LoRA, Hu et al. 2021, arXiv:2106.09685) on the decoder's projections.

A targeted projection W keeps its frozen weight and gains `flax.nnx.LoRA`'s two factors,
A `[in, r]` (random) and B `[r, out]` (zeros, so the adapted model starts as the base):

    y = x W + (alpha / r) * (x A) B                      (Hu et al., eq. 3)

With dropout p > 0 (PEFT's `lora_dropout`; QLoRA, Dettmers et al., arXiv:2305.14314,
uses 0.1 up to 13B parameters and 0.05 above), a training forward
that is given a key feeds the adapter dropout(x) instead of x: each input element kept
with probability 1 - p and scaled by 1 / (1 - p), an independent mask per projection,
layer and micro-batch; the frozen path x W and every forward without a key (sampling,
log-probs, evaluation, exports) are unchanged.

QLoRA (Dettmers et al., arXiv:2305.14314): with ``quantize`` "int8" or "int4", every
projection weight of the frozen base (attention q/k/v/o, the MLP's and the routed
experts' gate/up/down; not the embeddings, router or norms) is stored as a `qwix.QArray`
(Google's JAX quantisation library, the one Tunix uses): integer values and one absmax
scale per output channel (every axis but the projection's input axes), int4 also one per
block of 64 inputs. The forward
dequantises it inside the jitted step (`layers.weight_array`), so only the integer weights stay
in memory between steps; the adapters stay float32.

Routed experts get one adapter each (`ExpertLoRA`, folded into the experts' weights
inside the forward). A and B are `nnx.LoRAParam`s, so `nnx.LoRAParam` selects what a trainer
differentiates and what its optimizer and checkpoints hold; zeroing them gives back the base
model (the KL reference) without a second copy of its weights. `merged_state` folds the
adapters into the weights (W + alpha/r A B) for a plain Hugging Face export; `peft_tensors`
names them as `peft` does, to load onto the transformers model.

Targets are the projection paths of `PROJECTIONS`, chosen by fnmatch patterns
("attn.*", "mlp.up") or the projection's own name ("q", "down").
"""

import dataclasses
import fnmatch
import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import qwix
from flax import nnx

from grpo_jax import parallel, paths
from grpo_jax.models.safetensors_io import save_file

INIT_STD = 0.02  # std of the random normal weights (transformers' initializer_range)

PROJECTIONS = ("attn.q", "attn.k", "attn.v", "attn.o", "mlp.gate", "mlp.up", "mlp.down")
# Their module names in transformers (what PEFT's `target_modules` lists).
HF_NAMES = {"attn.q": "q_proj", "attn.k": "k_proj", "attn.v": "v_proj", "attn.o": "o_proj",
            "mlp.gate": "gate_proj", "mlp.up": "up_proj", "mlp.down": "down_proj"}
SUFFIX = "_lora"   # the adapter of projection `q` is the module `q_lora` beside it
# The adapters are trained, so they keep float32 master weights whatever the frozen base
# is stored in (`ModelConfig.param_dtype`, e.g. bfloat16).
ADAPTER_DTYPE = "float32"
# QLoRA's storage types of the frozen base ("" keeps it in param_dtype).
QUANTIZED_TYPES = {"int8": jnp.int8, "int4": jnp.int4}
# int4 keeps a scale per block of this many inputs (QLoRA's NF4 block size, arXiv:2305.14314
# sec. 3): one scale per output channel alone loses too much at 4 bits.
INT4_BLOCK = 64
# The input (contracted) logical axes of each projection's weight; every other axis
# (outputs, experts, a scanned stack's layers) gets its own scale.
INPUT_AXES = {"q": ("embed",), "k": ("embed",), "v": ("embed",), "o": ("heads", "head_dim"),
              "gate": ("embed",), "up": ("embed",), "down": ("mlp",)}


@dataclasses.dataclass(frozen=True)
class LoraSpec:
    """Which projections carry adapters, and their rank and scale.

    Attributes:
      rank: r, the inner width of A and B (> 0).
      alpha: the numerator of the scale alpha / r (Hu et al., sec. 4.1).
      targets: projection paths, a subset of `PROJECTIONS`.
      dropout: p, the probability of zeroing an element of an adapter's input in a
        training forward (0: none).
      quantize: the frozen base's projection weights stored as "int8" or "int4" (QLoRA),
        or "" (in ``param_dtype``).
    """

    rank: int
    alpha: float
    targets: tuple[str, ...]
    dropout: float = 0.0
    quantize: str = ""

    @property
    def scale(self):
        return self.alpha / self.rank


def resolve_targets(patterns):
    """The projections (`PROJECTIONS` order) that fnmatch patterns or bare names select.

    Raises:
      ValueError naming ``model.lora.targets`` for a pattern that selects nothing.
    """
    chosen = set()
    for pattern in patterns:
        hits = [p for p in PROJECTIONS
                if fnmatch.fnmatchcase(p, pattern) or fnmatch.fnmatchcase(p.split(".")[1], pattern)]
        if not hits:
            raise ValueError(f"model.lora.targets: {pattern!r} selects none of {PROJECTIONS}; "
                             "use one of them, a bare name (q, down) or a pattern (attn.*)")
        chosen.update(hits)
    return tuple(p for p in PROJECTIONS if p in chosen)


def spec_from_config(section):
    """The `LoraSpec` of a run config's ``model.lora`` section, or None when rank is 0.

    Raises:
      ValueError naming the field for a negative rank, a non-positive alpha, a dropout
      outside [0, 1) or no targets.
    """
    if section.rank < 0:
        raise ValueError(f"model.lora.rank must be >= 0 (0: no adapters), got {section.rank}")
    if section.rank == 0:
        knobs = [f"model.lora.{name}={section[name]!r}" for name in ("dropout", "quantize")
                 if section[name]]
        if knobs:
            raise ValueError(f"{', '.join(knobs)} acts on LoRA adapters, but model.lora.rank is 0 "
                             "(every weight trained); set model.lora.rank > 0 or leave them off")
        return None
    if section.alpha <= 0:
        raise ValueError(f"model.lora.alpha must be > 0, got {section.alpha}")
    dropout = float(section.dropout)
    if not 0.0 <= dropout < 1.0:
        raise ValueError(f"model.lora.dropout must be in [0, 1) (the probability of dropping an "
                         f"element of an adapter's input; 0: off), got {dropout}")
    quantize = section.quantize
    if quantize not in ("", *QUANTIZED_TYPES):
        raise ValueError(f"model.lora.quantize must be '' (no quantisation) or one of "
                         f"{tuple(QUANTIZED_TYPES)} (QLoRA's frozen base), got {quantize!r}")
    patterns = tuple(section.targets)
    if not patterns:
        raise ValueError(
            "model.lora.targets is empty; name projections such as ('attn.*', 'mlp.*')"
        )
    return LoraSpec(int(section.rank), float(section.alpha), resolve_targets(patterns), dropout,
                    quantize)


def adapter(cfg, path, in_dim, out_dim, in_axis, out_axis, rngs):
    """The `nnx.LoRA` of projection `path` (`[in_dim] -> [out_dim]`, heads flattened,
    float32 factors, computed in `cfg.dtype`), or None when `cfg.lora` does not target
    it. Its factors carry logical axes, so they are sharded like the weight's input and
    output, and "lora" (the rank, never split)."""
    spec = cfg.lora
    if spec is None or path not in spec.targets:
        return None
    return nnx.LoRA(
        in_dim, spec.rank, out_dim, dtype=cfg.dtype, param_dtype=ADAPTER_DTYPE,
        a_initializer=jax.nn.initializers.normal(INIT_STD), rngs=rngs,
        a_metadata={"logical_axes": (in_axis, "lora"), "init": "normal"},
        b_metadata={"logical_axes": ("lora", out_axis), "init": "zeros"})


class ExpertLoRA(nnx.Module):
    """One adapter per routed expert: A `[E, in, r]` (random) and B `[E, r, out]` (zeros),
    `nnx.LoRAParam`s like `nnx.LoRA`'s, which has no expert axis."""

    def __init__(self, n_experts, in_dim, rank, out_dim, in_axis, out_axis, rngs):
        a = jax.nn.initializers.normal(INIT_STD)(
            rngs.params(), (n_experts, in_dim, rank), ADAPTER_DTYPE)
        self.lora_a = nnx.LoRAParam(a, logical_axes=("expert", in_axis, "lora"), init="normal")
        self.lora_b = nnx.LoRAParam(jnp.zeros((n_experts, rank, out_dim), ADAPTER_DTYPE),
                                    logical_axes=("expert", "lora", out_axis), init="zeros")


def expert_adapter(cfg, path, in_dim, out_dim, in_axis, out_axis, rngs):
    """The `ExpertLoRA` of the routed experts' projection `path`, or None when `cfg.lora`
    does not target it."""
    spec = cfg.lora
    if spec is None or path not in spec.targets:
        return None
    if spec.dropout > 0:
        raise ValueError(
            "model.lora.dropout > 0 with MLP targets on routed experts: their adapters are "
            "folded into the experts' weights, so no adapter input exists to drop; target "
            "attention only (model.lora.targets=('attn.*',)) or set model.lora.dropout=0")
    return ExpertLoRA(cfg.n_experts, in_dim, spec.rank, out_dim, in_axis, out_axis, rngs)


def adapted_weight(weight, module, spec):
    """`[E, in, out]` experts' weights with their adapters folded in, W + alpha/r A B
    (per expert, in float32): the experts' matmuls then run as without LoRA, and the
    gradient reaches A and B through the sum. `weight` itself when `module` is None."""
    if module is None:
        return weight
    delta = module.lora_a[...] @ module.lora_b[...]
    return weight.astype(jnp.float32) + spec.scale * delta


def layer_key(key, layer):
    """The dropout key of decoder layer `layer` (an int or a traced index), or None."""
    return None if key is None else jax.random.fold_in(key, layer)


def apply(module, x, out_shape, spec, key=None, path=None):
    """`alpha / r * (x A) B` of an `nnx.LoRA` on `[..., in]` activations, reshaped to
    `[..., *out_shape]`; 0 when `module` is None (an untargeted projection).

    With a layer's dropout `key` (`layer_key`) and ``spec.dropout`` p > 0, the adapter
    reads dropout(x): each element kept with probability 1 - p (the mask drawn from
    fold_in(key, the index of `path` in `PROJECTIONS`)) and scaled by 1 / (1 - p).
    """
    if module is None:
        return 0
    if key is not None and spec.dropout > 0:
        keep_prob = 1.0 - spec.dropout
        keep = jax.random.bernoulli(jax.random.fold_in(key, PROJECTIONS.index(path)),
                                    keep_prob, x.shape)
        x = jnp.where(keep, x / keep_prob, 0).astype(x.dtype)
    return spec.scale * module(x).reshape(*x.shape[:-1], *out_shape)


def is_base_projection(path, variable):
    """Whether the variable at `path` is a projection weight of the frozen base (what
    QLoRA quantises): ``(..., "attn" | "mlp", name)`` with `name` in `INPUT_AXES`."""
    return (isinstance(variable, nnx.Param) and not isinstance(variable, nnx.LoRAParam)
            and len(path) >= 2 and path[-2] in ("attn", "mlp") and path[-1] in INPUT_AXES)


def channel_axes(path, variable):
    """The axes of a base projection weight that keep their own scale: all but its input
    axes (by its `logical_axes`)."""
    axes = variable.get_metadata()["logical_axes"]
    return tuple(i for i, name in enumerate(axes) if name not in INPUT_AXES[path[-1]])


def tiled_axes(path, variable, qtype):
    """``{axis: block}``: int4 also scales each `INT4_BLOCK` weights along the last input
    axis (where it divides that axis into two or more blocks); int8 none."""
    if qtype != "int4":
        return {}
    shape = variable.get_value().shape
    last = max(set(range(len(shape))) - set(channel_axes(path, variable)))
    return {last: INT4_BLOCK} if shape[last] % INT4_BLOCK == 0 and shape[last] > INT4_BLOCK else {}


def _scale_sharding(weight_sharding, shape, channels, tiles):
    """The sharding of a weight's scales: the weight's along its channel axes and along a
    tiled axis whose block count the mesh axes divide; replicated elsewhere."""
    mesh = weight_sharding.mesh
    spec = tuple(weight_sharding.spec) + (None,) * (len(shape) - len(weight_sharding.spec))

    def ways(entry):
        names = entry if isinstance(entry, tuple) else (entry,)
        return math.prod(mesh.shape[name] for name in names if name is not None)

    kept = [entry if i in channels or (i in tiles and shape[i] // tiles[i] % ways(entry) == 0)
            else None for i, entry in enumerate(spec)]
    return jax.NamedSharding(mesh, jax.P(*kept))


def quantize_base(state, spec):
    """`state` with every base projection weight (`is_base_projection`) a `qwix.QArray`
    of ``spec.quantize``: absmax calibration, symmetric, the scale in the weight's dtype,
    one scale per output channel (int4: and per `INT4_BLOCK` inputs, `tiled_axes`); the
    integers keep the weight's sharding (`_scale_sharding` gives the scales'). One jitted
    program quantises them all, consuming the float weights. Works on abstract states
    too (`jax.ShapeDtypeStruct`s carrying shardings, for the fit report). A `spec`
    without ``quantize`` returns `state`."""
    if spec is None or not spec.quantize:
        return state
    flat = dict(nnx.to_flat_state(state))
    chosen = [path for path, variable in flat.items() if is_base_projection(path, variable)]
    layouts = [(channel_axes(path, flat[path]), tiled_axes(path, flat[path], spec.quantize))
               for path in chosen]
    qtype = QUANTIZED_TYPES[spec.quantize]

    def quantize(weights):
        return [qwix.quantize(w, qtype, channelwise_axes=channels, tiled_axes=tiles)
                for w, (channels, tiles) in zip(weights, layouts)]

    weights = [flat[path].get_value() for path in chosen]
    shardings = [getattr(w, "sharding", None) for w in weights]
    out = None
    if all(isinstance(s, jax.NamedSharding) for s in shardings):
        out = [qwix.QArray(s, _scale_sharding(s, w.shape, *layout), None, qtype)
               for s, w, layout in zip(shardings, weights, layouts)]
    if isinstance(weights[0], jax.ShapeDtypeStruct):
        quantized = jax.eval_shape(quantize, weights)
        if out is not None:
            quantized = jax.tree.map(
                lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), quantized, out
            )
    else:
        quantized = jax.jit(quantize, out_shardings=out, donate_argnums=0)(weights)
    for path, value in zip(chosen, quantized):
        flat[path] = flat[path].replace(value)
    return nnx.from_flat_state(flat)


def dequantized(value):
    """A weight's value as an array: a `qwix.QArray` (a QLoRA base's) dequantised to its
    scale's dtype, anything else as it is."""
    return qwix.dequantize(value) if isinstance(value, qwix.QArray) else value


def adapters(state):
    """The `nnx.LoRAParam` part of a model's `nnx.State` (what a LoRA run trains)."""
    return nnx.filter_state(state, nnx.LoRAParam)


def adapters_off(state):
    """`state` with every adapter zeroed: the base model's forward (the KL reference),
    sharing the base weights' arrays instead of copying them."""
    trained, frozen = nnx.split_state(state, nnx.LoRAParam, ...)
    return nnx.merge_state(jax.tree.map(jnp.zeros_like, trained), frozen)


def _adapted(flat):
    """`(weight path, A path, B path)` of every adapter in a flat state dict."""
    for path in flat:
        if path[-1] == "lora_a" and path[-2].endswith(SUFFIX):
            module = path[:-1]
            yield (*module[:-1], module[-1][:-len(SUFFIX)]), path, (*module, "lora_b")


def merged_state(state, spec):
    """`state` with each adapter folded into its weight, W + scale * (A B) reshaped to W's
    shape (stacked layers batch over the leading axis), and the adapters removed: the
    state of the same network without LoRA (a quantised base's weights dequantised)."""
    flat = {path: v.replace(dequantized(v.get_value())) if isinstance(v.get_value(), qwix.QArray)
            else v for path, v in nnx.to_flat_state(state)}
    for weight, a, b in list(_adapted(flat)):
        w = flat[weight]
        delta = (flat.pop(a).get_value().astype(jnp.float32) @ flat.pop(b).get_value())
        value = w.get_value()
        flat[weight] = w.replace(
            (value + spec.scale * delta.reshape(value.shape)).astype(value.dtype)
        )
    return nnx.from_flat_state(flat)


def peft_config(spec, base_path):
    """PEFT's ``adapter_config.json`` of `spec` (a `LoraConfig` of the transformers model
    at `base_path`; PEFT scales by lora_alpha / r, as here)."""
    return {
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": base_path,
        "r": spec.rank, "lora_alpha": spec.alpha, "lora_dropout": spec.dropout, "bias": "none",
        "target_modules": sorted(HF_NAMES[t] for t in spec.targets), "fan_in_fan_out": False,
        "use_rslora": False, "use_dora": False, "inference_mode": True,
    }


def save_peft_adapter(model, path, *, base_path):
    """Writes the adapters of a LoRA `Decoder` in PEFT's format: ``adapter_config.json``
    and ``adapter_model.safetensors`` in `path`, which
    ``peft.PeftModel.from_pretrained(<transformers model of base_path>, path)`` loads."""
    state = nnx.state(model)
    tensors = parallel.whole_on_host(peft_tensors(state, model.cfg))
    if jax.process_index() != 0:
        return
    paths.path(path).mkdir(parents=True, exist_ok=True)
    save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()},
              paths.join(path, "adapter_model.safetensors"), metadata={"format": "pt"})
    paths.write_whole(paths.join(path, "adapter_config.json"),
                      json.dumps(peft_config(model.cfg.lora, base_path), indent=2))


def peft_exportable(cfg):
    """Whether PEFT's format can hold the adapters: not those of routed experts (which
    transformers stores fused, without per-expert modules for a LoRA to wrap)."""
    return not (cfg.n_experts and any(t.startswith("mlp.") for t in cfg.lora.targets))


def peft_tensors(state, cfg):
    """`{PEFT tensor name: [r, in] or [out, r] array}` of the adapters, as `peft` saves a
    LoRA of the transformers model (``base_model.model.<module>.lora_A.weight``, torch's
    `[out, in]` layout); a scanned stack is split into its layers."""
    if not peft_exportable(cfg):
        raise ValueError("the adapters of routed experts have no PEFT form; export the merged "
                         "model (save_pretrained), or target attention only (attn.*)")
    runs = cfg.layer_runs()
    flat = dict(nnx.to_flat_state(state))
    tensors = {}
    for weight, a, b in _adapted(flat):
        a_value, b_value = (flat[p].get_value() for p in (a, b))
        if weight[0] == "stacks":   # ("stacks", j, block, name): layers first .. first + n
            first, count, _ = runs[weight[1]]
            per_layer = [(first + k, a_value[k], b_value[k]) for k in range(count)]
        else:
            per_layer = [(weight[1], a_value, b_value)]
        block, name = weight[-2], weight[-1]
        hf_block = "self_attn" if block == "attn" else "mlp"
        for i, a_i, b_i in per_layer:
            prefix = f"base_model.model.model.layers.{i}.{hf_block}.{HF_NAMES[f'{block}.{name}']}"
            tensors[f"{prefix}.lora_A.weight"] = a_i.T
            tensors[f"{prefix}.lora_B.weight"] = b_i.T
    return tensors
