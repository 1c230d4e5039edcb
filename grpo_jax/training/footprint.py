"""What a run keeps in memory, counted from shapes before anything is allocated.

The mesh "auto" (`parallel.choose_mesh`) asks how many bytes the run's state would take
on one device replicated; the fit report (`grpo_jax.aot`) and the trainer ask the same
question here, so they choose the same mesh.
"""

import math
from typing import Any

import jax
from flax import nnx

from grpo_jax import models
from grpo_jax.training import async_rl, distill, optimizer as optimizer_lib, policy as policy_lib

PHASES = ("rl", "sft", "eval")


def model_config(config: Any, mesh: jax.sharding.Mesh | None = None) -> models.ModelConfig:
    """The `ModelConfig` of ``config.model``: a named shape, or an HF directory's config.json
    (no weights read), with the run's dtype, remat, attention, MoE and scan settings (MoE's
    "auto" resolved for `mesh`'s platform; see `models.run_overrides`)."""
    overrides = models.run_overrides(config.model, mesh)
    if config.model.path:
        return models.load_config(config.model.path, **overrides)
    if not config.model.name:
        raise ValueError("set model.path (an HF directory) or model.name (a named config)")
    return models.get_model_config(config.model.name, **overrides)


def tree_bytes(tree: Any) -> int:
    """Bytes of every leaf of a tree of arrays or `ShapeDtypeStruct`s, unsharded (int4:
    half a byte)."""
    return sum(math.prod(x.shape) * jax.dtypes.itemsize_bits(x.dtype) // 8
               for x in jax.tree.leaves(tree))


def _trained_bytes(params, optimizer_cfg):
    """Weights, their gradient and the optimizer's state for them (AdamW: two moments)."""
    tx = optimizer_lib.make_optimizer(optimizer_cfg, 1)
    return 2 * tree_bytes(params) + tree_bytes(jax.eval_shape(tx.init, params))


def replicated_state_bytes(config: Any, phase: str = "rl") -> int:
    """Bytes of the run's state on one device if every device held all of it.

    Args:
      config: a run config.
      phase: "rl" (the policy's weights, gradient and optimizer state, pi_ref with
        ``objective.kl.beta > 0``, the lagged copies (`async_rl.lagged_copies`), and the critic's
        weights, gradient and optimizer state with ``critic.enabled``, and the frozen
        distillation teacher's weights with ``distill.teacher_path``: its own shapes from
        its config.json, in the policy's dtypes), "sft" (the policy
        under ``sft.optimizer``) or "eval" (the weights alone). With LoRA
        (``model.lora.rank`` > 0) only the adapters have a gradient, optimizer state and
        lagged copies, the frozen base (integers with ``model.lora.quantize``) is held
        once, and pi_ref is that base: no copy.

    Returns:
      The bytes, an int. Activations, the KV cache and the batch are not counted: they
      split over the rows whatever the weights' layout.
    """
    if phase not in PHASES:
        raise ValueError(f"phase must be one of {PHASES}, got {phase!r}")
    cfg = model_config(config)
    params = models.quantize_base(models.abstract_model(cfg)[1], cfg.lora)
    if phase == "eval":
        return tree_bytes(params)
    trained, frozen = nnx.split_state(params, nnx.LoRAParam if cfg.lora else nnx.Param, ...)
    if phase == "sft":
        return tree_bytes(frozen) + _trained_bytes(trained, config.sft.optimizer)
    lagged = async_rl.lagged_copies(config) * tree_bytes(trained)
    total = (tree_bytes(frozen) + _trained_bytes(trained, config.optimizer)
             + policy_lib.owns_reference(config) * tree_bytes(params) + lagged)
    if config.critic.enabled:
        total += _trained_bytes(models.abstract_value_model(cfg)[1], config.critic.optimizer)
    teacher = distill.teacher_model_config(config)
    if teacher is not None:   # frozen like pi_ref: weights only
        total += tree_bytes(models.abstract_model(teacher)[1])
    return total
