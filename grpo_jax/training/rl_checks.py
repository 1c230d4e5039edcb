"""The RL trainer's config checks: each raises ValueError naming the field and the fix
for a setting the loop cannot run (or would run to no purpose), before anything compiles.
docs/faults.md lists the refusals.
"""

from typing import Any

import jax

from grpo_jax import objectives, parallel
from grpo_jax.training import async_rl, checkpoint, distill, entropy_control, evaluation
from grpo_jax.training import partial, programs
from grpo_jax.training import rollout
from grpo_jax.training import policy as policy_lib

OLD_LOGP = ("recompute", "sampler")


def check_settings(config: Any) -> None:
    """Raises ValueError naming the field and the fix for a setting the loop cannot run (or
    would run to no purpose), whatever the mesh: called once, before anything compiles.
    The refusals are listed in docs/faults.md."""
    objectives.validate_objective_config(config.objective)
    if not isinstance(config.train.steps, int) or config.train.steps < 0:
        raise ValueError(f"train.steps must be an int >= 0 (RL steps after "
                         f"critic.pretrain_steps), got {config.train.steps!r}")
    for field, meaning in (("epochs", "passes over each rollout batch"),
                           ("minibatches", "optimizer updates per pass"),
                           ("micro_batches", "gradient accumulation pieces per update; 1: none"),
                           ("eval_every", "RL steps between evaluations")):
        value = config.train[field]
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"train.{field} must be an int >= 1 ({meaning}), got {value!r}")
    rollout.check_sampling_config(config)
    checkpoint.check_config(config)
    evaluation.check_config(config)
    distill.check_config(config)   # distillation hook: the distill section's refusals
    entropy_control.check_config(config)


def check_config(config: Any, mesh: jax.sharding.Mesh) -> None:
    """Raises ValueError naming the field for settings the loop cannot run (`check_settings`,
    and how the batch splits over `mesh`)."""
    check_settings(config)
    rows = config.rollout.prompts_per_batch * config.objective.group_size
    minibatches, micro = config.train.minibatches, config.train.micro_batches
    if rows % (minibatches * micro):
        raise ValueError(f"rollout.prompts_per_batch * objective.group_size = {rows} rows must "
                         f"divide into train.minibatches * train.micro_batches = "
                         f"{minibatches * micro} pieces")
    ways = parallel.row_ways(mesh)
    if (rows // (minibatches * micro)) % ways:
        raise ValueError(f"a micro-batch of {rows // (minibatches * micro)} rows does not split "
                         f"over the {ways}-way row axes of mesh {dict(mesh.shape)}; change "
                         "rollout.prompts_per_batch, train.minibatches, train.micro_batches "
                         "or the mesh")
    if config.train.old_logp not in OLD_LOGP:
        raise ValueError(f"train.old_logp must be one of {OLD_LOGP}, got {config.train.old_logp!r}")
    if config.train.old_logp == "sampler" and config.objective.importance.enabled:
        raise ValueError("objective.importance.enabled corrects the trainer's pi_old against the "
                         "sampler's log-probs; with train.old_logp='sampler' they are the same "
                         "numbers and the weight is 1. Use train.old_logp='recompute'")
    if config.rollout.policy_lag < 0:
        raise ValueError(f"rollout.policy_lag must be >= 0, got {config.rollout.policy_lag}")
    if config.train.sft_weight < 0:
        raise ValueError(f"train.sft_weight must be >= 0, got {config.train.sft_weight}")
    if config.train.sft_weight and config.rollout.prompts_per_batch % config.train.minibatches:
        raise ValueError(f"train.sft_weight adds the reference solutions of the "
                         f"{config.rollout.prompts_per_batch} prompts, which must split into "
                         f"train.minibatches = {config.train.minibatches}")
    if config.critic.enabled and config.model.lora.rank > 0:
        raise ValueError("model.lora.rank > 0 with critic.enabled is not supported yet (the "
                         "critic would train and export its trunk's adapters as its own); set "
                         "model.lora.rank=0 for PPO/VAPO")
    if config.train.ref_reset_every and config.model.lora.rank > 0:
        raise ValueError("with model.lora.rank > 0 the KL reference is the frozen base (adapters "
                         "off); train.ref_reset_every cannot move it: set it to 0")
    if config.train.ref_reset_every and config.objective.kl.beta <= 0:
        raise ValueError("train.ref_reset_every replaces the KL reference, but objective.kl.beta "
                         "is 0 (no reference); set kl.beta > 0 or ref_reset_every = 0")
    r = config.rollout
    if r.keep_sampling_mask and r.top_p >= 1.0 and r.top_k <= 0 and r.min_p <= 0.0:
        raise ValueError("rollout.keep_sampling_mask keeps the top-p / top-k / min-p cut of each "
                         "sampled position, but none is configured (top_p=1, top_k=0, min_p=0); "
                         "set one, or keep_sampling_mask=False")
    if not isinstance(r.slots, int) or r.slots < 0:
        raise ValueError("rollout.slots must be an int >= 0 (0: no continuous batching), "
                         f"got {r.slots!r}")
    policy_lib.check_rollout_dtype(config)
    check_paging_config(config)
    if config.filtering.short_batch not in rollout.SHORT_BATCH:
        raise ValueError(f"filtering.short_batch must be one of {rollout.SHORT_BATCH}, got "
                         f"{config.filtering.short_batch!r}")
    programs.packs(config)   # train.packing is one of programs.PACKING
    check_critic_config(config)
    rollout.check_environment_config(config)
    async_rl.check_config(config, jax.process_count())
    partial.check_config(config, jax.process_count())


def check_paging_config(config: Any) -> None:
    """``rollout.kv_page_size`` pages the slots' caches of the one-shot sampler: it needs
    ``rollout.slots`` > 0, and multi-turn episodes and partial rollouts (`sampling.Engine`)
    keep contiguous caches."""
    r = config.rollout
    for field in ("kv_page_size", "kv_pages"):
        if not isinstance(r[field], int) or r[field] < 0:
            raise ValueError(f"rollout.{field} must be an int >= 0 (0: off / the default pool), "
                             f"got {r[field]!r}")
    if not r.kv_page_size:
        if r.kv_pages:
            raise ValueError(f"rollout.kv_pages={r.kv_pages} sizes the page pool of "
                             "rollout.kv_page_size, which is 0; set kv_page_size > 0 or kv_pages=0")
        return
    if r.slots <= 0:
        raise ValueError(f"rollout.kv_page_size={r.kv_page_size} pages the continuous-batching "
                         "slots' caches, but rollout.slots is 0; set rollout.slots > 0 or "
                         "rollout.kv_page_size=0")
    if config.environment.name or r.partial.enabled:
        raise ValueError("rollout.kv_page_size pages the one-shot sampler only; multi-turn "
                         "episodes (environment.name) and partial rollouts (rollout.partial) "
                         "decode contiguously: set rollout.kv_page_size=0")
    if r.keep_routing:
        raise ValueError("rollout.kv_page_size does not record routing; set "
                         "rollout.keep_routing=False or rollout.kv_page_size=0")
    per_row = -(-r.max_new_tokens // r.kv_page_size)
    if r.kv_pages and r.kv_pages < per_row:
        raise ValueError(f"rollout.kv_pages={r.kv_pages} cannot hold one row of "
                         f"rollout.max_new_tokens={r.max_new_tokens} in pages of "
                         f"{r.kv_page_size}; set rollout.kv_pages >= {per_row} (or 0)")


def check_critic_config(config: Any) -> None:
    """The critic and the "gae" estimator need each other; pre-training needs a critic."""
    gae, enabled = config.objective.advantage.estimator == "gae", config.critic.enabled
    if gae and not enabled:
        raise ValueError("objective.advantage.estimator='gae' takes the critic's values; set "
                         "critic.enabled=True (or choose a critic-free estimator)")
    if enabled and not gae:
        raise ValueError(f"critic.enabled trains a value model that objective.advantage.estimator="
                         f"{config.objective.advantage.estimator!r} never reads; set the estimator "
                         "to 'gae' or critic.enabled=False")
    if config.critic.pretrain_steps < 0:
        raise ValueError(f"critic.pretrain_steps must be >= 0, got {config.critic.pretrain_steps}")
    if config.critic.pretrain_steps and not enabled:
        raise ValueError("critic.pretrain_steps pre-trains a critic, but critic.enabled is False")
    if not 0.0 <= config.critic.lam <= 1.0:
        raise ValueError(f"critic.lam must be in [0, 1], got {config.critic.lam}")
    if config.critic.value_clip is not None and config.critic.value_clip <= 0:
        raise ValueError(f"critic.value_clip must be > 0 (None: no clip), got "
                         f"{config.critic.value_clip}")


def check_model(config: Any, model_cfg: Any) -> None:
    """Raises ValueError naming the field for settings the model (a `models.ModelConfig`)
    cannot serve."""
    if config.rollout.keep_routing and not model_cfg.n_experts:
        raise ValueError("rollout.keep_routing replays an MoE's experts, but the model has none; "
                         "set rollout.keep_routing=False for a dense model")
