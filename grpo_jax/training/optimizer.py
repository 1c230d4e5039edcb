"""The optax optimizer from the config: AdamW, global-norm clipping, warmup + schedule."""

import numbers
from typing import Any

import optax

SCHEDULES = ("constant", "cosine", "linear")


def _check_greater(name, value, bound):
    """Raises ValueError unless the Python number `value` is > `bound`."""
    if isinstance(value, numbers.Real) and not value > bound:
        raise ValueError(f"{name} must be > {bound}, got {value}")


def learning_rate_schedule(cfg: Any, total_steps: int) -> optax.Schedule:
    """Linear warmup over `cfg.warmup_steps`, then constant, cosine or linear decay to 0."""
    if cfg.schedule not in SCHEDULES:
        raise ValueError(f"optimizer.schedule must be one of {SCHEDULES}, got {cfg.schedule!r}")
    _check_greater("optimizer.learning_rate", cfg.learning_rate, 0.0)
    if isinstance(cfg.warmup_steps, numbers.Real) and cfg.warmup_steps < 0:
        raise ValueError(f"optimizer.warmup_steps must be >= 0, got {cfg.warmup_steps}")
    warmup = optax.linear_schedule(0.0, cfg.learning_rate, max(cfg.warmup_steps, 1))
    decay_steps = max(total_steps - cfg.warmup_steps, 1)
    after = {
        "constant": optax.constant_schedule(cfg.learning_rate),
        "cosine": optax.cosine_decay_schedule(cfg.learning_rate, decay_steps),
        "linear": optax.linear_schedule(cfg.learning_rate, 0.0, decay_steps),
    }[cfg.schedule]
    return optax.join_schedules([warmup, after], [cfg.warmup_steps])


def make_optimizer(cfg: Any, total_steps: int) -> optax.GradientTransformation:
    """``clip_by_global_norm(cfg.grad_clip)`` then AdamW with the schedule above.

    `total_steps` counts optimizer updates (RL: steps x epochs x minibatches).
    """
    _check_greater("optimizer.grad_clip", cfg.grad_clip, 0.0)
    return optax.chain(
        optax.clip_by_global_norm(cfg.grad_clip),
        optax.adamw(learning_rate_schedule(cfg, total_steps), b1=cfg.b1, b2=cfg.b2, eps=cfg.eps,
                    weight_decay=cfg.weight_decay))
