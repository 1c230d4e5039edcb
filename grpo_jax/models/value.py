"""A value model (PPO's critic): the decoder's trunk and a scalar head, V(s_t) at every position.

    critic = value_model_from(policy_model, mesh=mesh, rules="fsdp")   # trunk copied, head 0
    values, aux_loss = critic(tokens, attention_mask=mask)             # [B, S] float32
    save_value_model(critic, "/out/critic")       # transformers' *ForTokenClassification
    critic = load_value_model("/out/critic", mesh=mesh)                # or any HF LM checkpoint

The trunk is a `Decoder` (same layers, same logical axes, so the same sharding rules)
built without an output layer: a value model never unembeds. The head is a linear map
`[D] -> 1` with a bias, initialised to zero, so a fresh critic predicts 0 everywhere.

On disk it is the layout transformers (and verl's critics) use for a value model:
`<Family>ForTokenClassification` with `num_labels=1`, the trunk's tensors under
``model.`` and the head as ``score.weight`` `[1, D]` and ``score.bias`` `[1]`.
"""

import dataclasses

import jax.numpy as jnp
import numpy as np
import transformers
from flax import nnx

from grpo_jax.models import config as config_lib
from grpo_jax.models import decoder, hf, layers

TOKEN_CLASSIFICATION = {"llama": "LlamaForTokenClassification",
                        "qwen2": "Qwen2ForTokenClassification",
                        "qwen3": "Qwen3ForTokenClassification",
                        "qwen3_moe": "Qwen3MoeForTokenClassification"}
HEAD = (hf.WeightMap(("head",), ("score.weight",), "linear"),
        hf.WeightMap(("bias",), ("score.bias",)))


class ValueModel(nnx.Module):
    """V(s_t) for every position of a token sequence.

    Attributes:
      cfg: the `ModelConfig` of the trunk's family and shape.
      trunk: a `Decoder` without output layer (its final hidden states are read).
      head: `[D]` ("embed") weights of the scalar head; bias: `[1]`.
    """

    def __init__(self, cfg, *, rngs):
        self.cfg = cfg
        # Built as tied, a decoder has no [D, V] output matrix: the trunk carries none.
        self.trunk = decoder.Decoder(dataclasses.replace(cfg, tie_embeddings=True), rngs=rngs)
        self.head = layers.param(rngs, (cfg.d_model,), ("embed",), cfg.param_dtype, init="zeros")
        self.bias = layers.param(rngs, (1,), ("norm",), cfg.param_dtype, init="zeros")

    def __call__(self, tokens, **inputs):
        """`[B, S]` token ids -> `(values [B, S] float32, aux_loss [])`: the value of the
        state after each prefix (position s reads tokens 0..s), and the MoE
        load-balancing loss (0 for dense trunks). Keyword arguments as
        `Decoder.hidden_states` (attention_mask, positions, routing, segment_ids)."""
        hidden, aux = self.trunk.hidden_states(tokens, **inputs)
        values = jnp.einsum("bsd,d->bs", hidden.astype(jnp.float32),
                            self.head[...].astype(jnp.float32))
        return values + self.bias[...].astype(jnp.float32)[0], aux


def value_weight_map(cfg):
    """The `hf.WeightMap`s of a value model: the trunk's tensors (no lm_head) and the head."""
    trunk = [dataclasses.replace(entry, path=("trunk", *entry.path))
             for entry in hf.weight_map(cfg) if entry.path != ("lm_head",)]
    return trunk + list(HEAD)


def abstract_value_model(cfg):
    """`(graphdef, state)` of a `ValueModel` whose parameters take no memory."""
    return nnx.split(nnx.eval_shape(lambda: ValueModel(cfg, rngs=nnx.Rngs(0))))


def _zeros(variable, path, mesh, rules):
    shape = variable.get_value().shape
    zeros = np.zeros(shape, variable.get_value().dtype)
    return decoder.place(lambda index: zeros[index], variable, path, mesh, rules)


def value_model_from(model, *, mesh=None, rules="fsdp"):
    """A `ValueModel` whose trunk holds copies of a `Decoder`'s weights (its output layer
    left out) in their shardings, and a zero head placed by `rules` on `mesh`."""
    graphdef, state = abstract_value_model(model.cfg)
    source = dict(nnx.to_flat_state(nnx.state(model)))
    placed = {}
    for path, variable in nnx.to_flat_state(state):
        if path[0] == "trunk":
            placed[path] = variable.replace(jnp.copy(source[path[1:]].get_value()))
        else:
            placed[path] = _zeros(variable, path, mesh, rules)
    return nnx.merge(graphdef, nnx.from_flat_state(placed))


def load_value_model(path, *, mesh=None, rules="fsdp", dtype="float32", param_dtype="float32",
                     **overrides):
    """A `ValueModel` from a local Hugging Face directory, each tensor into its sharding.

    A `*ForTokenClassification` checkpoint with one label (what `save_value_model`
    writes) gives the trunk and the head; any other checkpoint of a supported family (a
    causal LM: the policy's, a reward model's trunk) gives the trunk, with a zero head.
    """
    cfg = hf.load_config(path, dtype=dtype, param_dtype=param_dtype, **overrides)
    graphdef, state = abstract_value_model(cfg)
    hf_config = transformers.AutoConfig.from_pretrained(path)
    with_head = any(name.endswith("ForTokenClassification")
                    for name in hf_config.architectures or ())
    if with_head and hf_config.num_labels != 1:
        raise ValueError(f"{path} is a token classifier with {hf_config.num_labels} labels; a "
                         "value model has one (num_labels=1)")
    entries = value_weight_map(cfg) if with_head else value_weight_map(cfg)[:-len(HEAD)]
    loaded = hf.read_weights(path, state, entries, mesh=mesh, rules=rules,
                             param_dtype=param_dtype, expected_unused=("lm_head.weight",))
    for name, variable in nnx.to_flat_state(state):
        if name not in loaded:   # no head in the checkpoint: start from 0
            loaded[name] = _zeros(variable, name, mesh, rules)
    return nnx.merge(graphdef, nnx.from_flat_state(loaded))


def save_value_model(model, path, *, tokenizer=None, dtype=None):
    """Writes a `ValueModel` as transformers'`*ForTokenClassification` (num_labels=1):
    `AutoModelForTokenClassification.from_pretrained(path)` reads it back, its logits
    `[B, S, 1]` the values."""
    cfg = model.cfg
    dtype = np.dtype(dtype or cfg.param_dtype)
    hf_config = config_lib.to_hf_config(dataclasses.replace(cfg, param_dtype=dtype.name))
    hf_config.architectures = [TOKEN_CLASSIFICATION[cfg.model_type]]
    hf_config.num_labels = 1
    hf.write_weights(nnx.state(model), value_weight_map(cfg), hf_config, path,
                     tokenizer=tokenizer, dtype=dtype)
