"""Hugging Face checkpoints in and out: `from_pretrained` and `save_pretrained`.

One table (`weight_map`) pairs each of our parameters with its transformers tensor
name(s) and layout; loading and saving both read it, so they cannot drift apart.
Layouts: transformers' `nn.Linear` stores `[out, in]`, we store `[in..., out...]` with
heads split out (`q` is `[D, N, H]`); Qwen3-MoE checkpoints hold one tensor per expert,
we stack them into `[E, ...]`; a scanned decoder (`scan_layers`) stacks each run of layers
likewise, `[n, ...]` or `[n, E, ...]`.
"""

import dataclasses
import json
import logging
import math
import os

import jax
import numpy as np
import transformers
from flax import nnx

from grpo_jax import parallel, paths
from grpo_jax.models import config as config_lib
from grpo_jax.models import decoder
from grpo_jax.models import lora
from grpo_jax.models.safetensors_io import SafetensorsFile, save_file

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"


@dataclasses.dataclass(frozen=True)
class WeightMap:
    """Where one parameter lives in a transformers checkpoint.

    Attributes:
      path: our parameter's path in the `nnx.State`, e.g. `("layers", 0, "attn", "q")`.
      hf_names: its tensor names, row-major over our `n_stacked` leading axes (one name
        when there are none; per expert; per stacked layer, then per expert).
      layout: "same" (identical array), "flat" (HF flattens it: biases `[N, H]` -> `[N*H]`)
        or "linear" (HF `[out, in]`; ours `[in..., out...]`, `n_in` leading input dims).
      n_in: number of our dims, after the stacked ones, that are the linear map's input.
      n_stacked: our leading axes that enumerate HF tensors (0, 1 for experts or scanned
        layers, 2 for a scanned stack of experts).
    """

    path: tuple
    hf_names: tuple
    layout: str = "same"
    n_in: int = 1
    n_stacked: int = 0


def weight_map(cfg):
    """The list of `WeightMap`s of a model with config `cfg` (scanned or not)."""
    entries = _per_layer_weight_map(cfg)
    if not cfg.scan_layers:
        return entries
    stacked = {}
    for entry in entries:
        path, position = decoder.scanned_path(cfg, entry.path)
        if position is None:
            stacked[path] = entry
        elif position == 0:
            stacked[path] = dataclasses.replace(entry, path=path, n_stacked=entry.n_stacked + 1)
        else:
            stacked[path] = dataclasses.replace(
                stacked[path], hf_names=stacked[path].hf_names + entry.hf_names)
    return list(stacked.values())


def _per_layer_weight_map(cfg):
    entries = [WeightMap(("embed",), ("model.embed_tokens.weight",))]
    for i in range(cfg.n_layers):
        pre = f"model.layers.{i}"
        attn = [("q", "q_proj", 1), ("k", "k_proj", 1), ("v", "v_proj", 1), ("o", "o_proj", 2)]
        entries += [
            WeightMap(("layers", i, "attn_norm"), (f"{pre}.input_layernorm.weight",)),
            WeightMap(("layers", i, "mlp_norm"), (f"{pre}.post_attention_layernorm.weight",)),
        ]
        entries += [
            WeightMap(
                ("layers", i, "attn", ours), (f"{pre}.self_attn.{hf}.weight",), "linear", n_in
            )
            for ours, hf, n_in in attn
        ]
        if cfg.qkv_bias:
            entries += [
                WeightMap(
                    ("layers", i, "attn", f"{x}_bias"), (f"{pre}.self_attn.{x}_proj.bias",), "flat"
                )
                for x in "qkv"
            ]
        if cfg.o_bias:
            entries.append(
                WeightMap(("layers", i, "attn", "o_bias"), (f"{pre}.self_attn.o_proj.bias",))
            )
        if cfg.qk_norm:
            entries += [
                WeightMap(("layers", i, "attn", f"{x}_norm"), (f"{pre}.self_attn.{x}_norm.weight",))
                for x in "qk"
            ]
        mlp = ("gate", "up", "down")
        if cfg.is_moe_layer(i):
            entries.append(
                WeightMap(("layers", i, "mlp", "router"), (f"{pre}.mlp.gate.weight",), "linear")
            )
            entries += [
                WeightMap(
                    ("layers", i, "mlp", x),
                    tuple(f"{pre}.mlp.experts.{e}.{x}_proj.weight" for e in range(cfg.n_experts)),
                    "linear",
                    n_stacked=1,
                )
                for x in mlp
            ]
        else:
            entries += [
                WeightMap(("layers", i, "mlp", x), (f"{pre}.mlp.{x}_proj.weight",), "linear")
                for x in mlp
            ]
    entries.append(WeightMap(("final_norm",), ("model.norm.weight",)))
    if not cfg.tie_embeddings:
        entries.append(WeightMap(("lm_head",), ("lm_head.weight",), "linear"))
    return entries


def _hf_shape(entry, shape):
    """The shape transformers stores for one tensor of our (per-tensor) `shape`."""
    if entry.layout == "flat":
        return (math.prod(shape),)
    if entry.layout == "linear":
        return (math.prod(shape[entry.n_in :]), math.prod(shape[: entry.n_in]))
    return tuple(shape)


def _from_hf(entry, array, shape):
    return (array.T if entry.layout == "linear" else array).reshape(shape)


def _to_hf(entry, array):
    if entry.layout == "linear":
        n_in = math.prod(array.shape[: entry.n_in])
        return array.reshape(n_in, -1).T
    return array.reshape(_hf_shape(entry, array.shape))


def _open_checkpoint(path):
    """{tensor name: SafetensorsFile} for a single-file or index-sharded checkpoint."""
    index_path = os.path.join(path, INDEX_FILE)
    if os.path.exists(index_path):
        with open(index_path) as f:
            files = json.load(f)["weight_map"]
    elif os.path.exists(os.path.join(path, SINGLE_FILE)):
        files = None
    else:
        raise FileNotFoundError(
            f"{path} has neither {SINGLE_FILE} nor {INDEX_FILE}; point from_pretrained at a "
            "Hugging Face model directory with safetensors weights"
        )
    if files is None:
        single = SafetensorsFile(os.path.join(path, SINGLE_FILE))
        return {name: single for name in single.keys()}
    opened = {}
    for file_name in sorted(set(files.values())):
        file_path = os.path.join(path, file_name)
        if not os.path.exists(file_path):
            raise FileNotFoundError(f"{index_path} names {file_name}, which is missing from {path}")
        opened[file_name] = SafetensorsFile(file_path)
    return {name: opened[file_name] for name, file_name in files.items()}


def _reader(entry, tensors, shape, dtype):
    """`read(index)`: the slice `index` of our array for `entry`, read from the memory-mapped
    HF tensors it covers; every tensor is checked against the shape the config implies."""
    lead, per_tensor = shape[:entry.n_stacked], shape[entry.n_stacked:]
    want = _hf_shape(entry, per_tensor)
    for name in entry.hf_names:
        if name not in tensors:
            raise KeyError(
                f"tensor {name} is missing from the checkpoint (needed for {entry.path})"
            )
        found = tuple(tensors[name].header[name]["shape"])
        if found != want:
            raise ValueError(
                f"{tensors[name].path}: tensor {name} has shape {found}, but config.json "
                f"implies {want}; the weights and config.json come from different models"
            )
    names = np.empty(len(entry.hf_names), object)
    names[:] = entry.hf_names
    names = names.reshape(lead)

    def read(index):
        picked = np.asarray(names[index[:entry.n_stacked]], dtype=object)
        rest = index[entry.n_stacked:]
        parts = [_from_hf(entry, tensors[name][name], per_tensor)[rest].astype(dtype)
                 for name in picked.reshape(-1)]
        return np.stack(parts).reshape(picked.shape + parts[0].shape)

    return read


def load_config(path, **overrides):
    """The `ModelConfig` of the HF directory `path`, with fields replaced by `overrides`."""
    config_path = os.path.join(path, "config.json")
    if not os.path.exists(config_path):
        raise FileNotFoundError(
            f"{config_path} does not exist; is {path} a Hugging Face model directory?"
        )
    hf = transformers.AutoConfig.from_pretrained(path)
    return dataclasses.replace(config_lib.from_hf_config(hf, source=config_path), **overrides)


def from_pretrained(
    path, *, mesh=None, rules="fsdp", dtype="float32", param_dtype="float32", seed=0, **overrides
):
    """Loads a local Hugging Face checkpoint into a `Decoder`, each tensor into its sharding.

    Each tensor is read from the memory-mapped safetensors file and every device receives
    only its own slice (`jax.make_array_from_callback`), so no device ever holds a full
    copy of a sharded weight and the host holds one tensor at a time.

    Args:
      path: a directory with config.json and model.safetensors (or an index and shards).
      mesh: a `jax.sharding.Mesh`; None puts everything on the default device.
      rules: a sharding rule-set name or table (`sharding.RULE_SETS`), used with `mesh`.
      dtype: compute dtype; param_dtype: storage dtype of the weights.
      seed: the adapters' init seed, with a `lora` override (as `decoder.init_model`);
        a `lora` with ``quantize`` stores the base's projections as integers once read
        (QLoRA: `lora.quantize_base`, whose program is donated the float weights).
      **overrides: other `ModelConfig` fields, e.g. `remat=True`, `attention_impl="cudnn"`.

    Returns:
      `(model, tokenizer)`; tokenizer is `transformers.AutoTokenizer`'s, or None when
      the directory has none.
    """
    cfg = load_config(path, dtype=dtype, param_dtype=param_dtype, **overrides)
    graphdef, state = decoder.abstract_model(cfg)
    loaded = read_weights(path, state, weight_map(cfg), mesh=mesh, rules=rules,
                          param_dtype=param_dtype)
    loaded.update(decoder.initial_variables(cfg, state, seed, mesh, rules, only=nnx.LoRAParam))
    # QLoRA: integers after loading
    state = lora.quantize_base(nnx.from_flat_state(loaded), cfg.lora)
    return nnx.merge(graphdef, state), load_tokenizer(path)


def read_weights(path, state, entries, *, mesh, rules, param_dtype, expected_unused=()):
    """``{parameter path: variable}`` of each of `entries`, read from the checkpoint at `path`
    into its sharding (one tensor at a time on the host).

    Args:
      state: the abstract `nnx.State` the entries' paths point into.
      entries: `WeightMap`s (`weight_map`, or a model's own table built on it).
      expected_unused: checkpoint tensors known to be unused (not warned about).
    """
    flat = dict(nnx.to_flat_state(state))
    tensors = _open_checkpoint(path)
    loaded = {}
    for entry in entries:
        variable = flat[entry.path]
        read = _reader(entry, tensors, variable.get_value().shape, np.dtype(param_dtype))
        loaded[entry.path] = decoder.place(read, variable, entry.path, mesh, rules)
    used = {n for e in entries for n in e.hf_names} | set(expected_unused)
    unused = sorted(set(tensors) - used)
    if unused:
        logging.warning(
            "%s: ignoring %d tensors the model does not use: %s", path, len(unused), unused[:5]
        )
    return loaded


def load_tokenizer(path):
    """`transformers.AutoTokenizer` for `path`, or None when it has no tokenizer files."""
    if not any(
        os.path.exists(os.path.join(path, f)) for f in ("tokenizer.json", "tokenizer_config.json")
    ):
        return None
    return transformers.AutoTokenizer.from_pretrained(path)


def _shard_plan(entries, flat, itemsize, max_shard_bytes):
    """{tensor name: shard number}, filling each shard up to `max_shard_bytes` in table order."""
    plan, shard, size = {}, 0, 0
    for entry in entries:
        shape = flat[entry.path].get_value().shape
        nbytes = math.prod(shape) * itemsize // len(entry.hf_names)
        for name in entry.hf_names:
            if size and size + nbytes > max_shard_bytes:
                shard, size = shard + 1, 0
            plan[name] = shard
            size += nbytes
    return plan


def _host_tensors(value, entry):
    """`(hf name, host array)` of each tensor `entry` covers, in hf_names order. Every
    process joins the gathers (one per stacked layer for a scanned stack, so the host
    holds one layer's experts at most, not the stack)."""
    scanned = "stacks" in entry.path   # a scanned stack (of a decoder, or a critic's trunk)
    per_layer = value if scanned else [value]
    names = iter(entry.hf_names)
    for chunk in per_layer:
        array = parallel.whole_on_host(chunk)
        n_lead = entry.n_stacked - scanned
        for part in array.reshape(-1, *array.shape[n_lead:]):
            yield next(names), part


def save_pretrained(model, path, *, tokenizer=None, dtype=None, max_shard_bytes=5 * 2**30):
    """Writes config.json and safetensors that transformers (and vLLM) load as-is.

    Weights are gathered to the host one at a time and written shard by shard, so the
    host holds at most one shard.

    Args:
      model: a `Decoder`, sharded or not; LoRA adapters are merged into the weights
        (`lora.merged_state`).
      path: output directory (created).
      tokenizer: optionally a transformers tokenizer to save alongside.
      dtype: storage dtype of the written weights (default: the model's param_dtype).
      max_shard_bytes: above this the weights are split into numbered files plus
        model.safetensors.index.json, as transformers does.
    """
    cfg, state = model.cfg, nnx.state(model)
    if cfg.lora is not None:   # the adapters folded into the weights: a plain checkpoint
        cfg, state = dataclasses.replace(cfg, lora=None), lora.merged_state(state, cfg.lora)
    dtype = np.dtype(dtype or cfg.param_dtype)
    hf_config = config_lib.to_hf_config(dataclasses.replace(cfg, param_dtype=dtype.name))
    write_weights(state, weight_map(cfg), hf_config, path, tokenizer=tokenizer,
                  dtype=dtype, max_shard_bytes=max_shard_bytes)


def write_weights(state, entries, hf_config, path, *, tokenizer=None, dtype,
                  max_shard_bytes=5 * 2**30):
    """Writes `hf_config` and the tensors of `entries` (read from the `nnx.State` `state`)
    as safetensors shards in `path`, and the tokenizer if given; see `save_pretrained`."""
    dtype = np.dtype(dtype)
    writer = jax.process_index() == 0
    flat = dict(nnx.to_flat_state(state))
    plan = _shard_plan(entries, flat, dtype.itemsize, max_shard_bytes)
    n_shards = max(plan.values()) + 1
    file_names = [
        SINGLE_FILE if n_shards == 1 else f"model-{i + 1:05d}-of-{n_shards:05d}.safetensors"
        for i in range(n_shards)
    ]
    if writer:
        with paths.staged(path) as local:   # transformers writes local files only
            hf_config.save_pretrained(local)
    current, shard = {}, 0
    for entry in entries:
        for name, part in _host_tensors(flat[entry.path].get_value(), entry):
            if plan[name] != shard:
                if writer:
                    save_file(
                        current, paths.join(path, file_names[shard]), metadata={"format": "pt"}
                    )
                current, shard = {}, plan[name]
            current[name] = np.ascontiguousarray(_to_hf(entry, part).astype(dtype))
    if not writer:
        return
    save_file(current, paths.join(path, file_names[shard]), metadata={"format": "pt"})
    if n_shards == 1:   # a stale index would shadow the single file on load
        (paths.path(path) / INDEX_FILE).unlink(missing_ok=True)
    if n_shards > 1:
        index = {
            "metadata": {"total_size": sum(
                math.prod(flat[e.path].get_value().shape) * dtype.itemsize for e in entries
            )},
            "weight_map": {name: file_names[i] for name, i in plan.items()},
        }
        paths.write_whole(paths.join(path, INDEX_FILE), json.dumps(index, indent=2))
    if tokenizer is not None:
        with paths.staged(path) as local:
            tokenizer.save_pretrained(local)
