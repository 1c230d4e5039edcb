"""The optax optimizer from the config: AdamW, global-norm clipping, warmup + schedule."""

import optax

from grpo_jax.objectives import _checks

SCHEDULES = ("constant", "cosine", "linear")


def learning_rate_schedule(cfg, total_steps):
    """Linear warmup over `cfg.warmup_steps`, then constant, cosine or linear decay to 0."""
    _checks.check_choice("optimizer.schedule", cfg.schedule, SCHEDULES)
    _checks.check_greater("optimizer.learning_rate", cfg.learning_rate, 0.0)
    _checks.check_nonnegative("optimizer.warmup_steps", cfg.warmup_steps)
    warmup = optax.linear_schedule(0.0, cfg.learning_rate, max(cfg.warmup_steps, 1))
    decay_steps = max(total_steps - cfg.warmup_steps, 1)
    after = {
        "constant": optax.constant_schedule(cfg.learning_rate),
        "cosine": optax.cosine_decay_schedule(cfg.learning_rate, decay_steps),
        "linear": optax.linear_schedule(cfg.learning_rate, 0.0, decay_steps),
    }[cfg.schedule]
    return optax.join_schedules([warmup, after], [cfg.warmup_steps])


def make_optimizer(cfg, total_steps):
    """``clip_by_global_norm(cfg.grad_clip)`` then AdamW with the schedule above.

    `total_steps` counts optimizer updates (RL: steps x epochs x minibatches).
    """
    _checks.check_greater("optimizer.grad_clip", cfg.grad_clip, 0.0)
    return optax.chain(
        optax.clip_by_global_norm(cfg.grad_clip),
        optax.adamw(learning_rate_schedule(cfg, total_steps), b1=cfg.b1, b2=cfg.b2, eps=cfg.eps,
                    weight_decay=cfg.weight_decay))
