"""Adaptive entropy control in the RL loop: the entropy bonus's coefficient as run state.

With ``adaptive_entropy.enabled`` the run holds Skywork-OR1's controller state (He et al.,
arXiv:2505.22312; TRL's ``use_adaptive_entropy``): the coefficient c_k, starting at
``objective.entropy_coef``, and the previous RL step's mean token entropy H_{k-1} (+inf
before the first step). RL step k applies the bonus coefficient
``objectives.entropy_bonus_coef(c_k, H_{k-1})`` (c_k while H_{k-1} <= target, else 0) in
every update of the step, carried in the batch as the ``entropy_coef`` column (the same
value in each row, so it splits with the rows); after the step, with H_k the step's
``entropy`` metric (the token mean over the loss tokens, averaged over the step's
updates), c_{k+1} = ``objectives.adaptive_entropy_coef(c_k, H_k)``. With one update per
step that is TRL's controller, which steps once per optimizer step. The state is
checkpointed, so a resumed run continues the same sequence.
"""

import math
import numbers
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections

from grpo_jax import objectives

KEY = "entropy_coef"   # the batch's column: this step's coefficient, one copy per row
# configs/base.py's values of the controller's fields: a disabled section that differs
# from them was set for nothing (tests/training/test_entropy_control.py checks they match).
DEFAULTS = {"target": 0.2, "delta": 0.005, "low": 0.0, "high": 1.0}


def enabled(config: ml_collections.ConfigDict) -> bool:
    """Whether the run adapts the entropy coefficient (``adaptive_entropy.enabled``)."""
    return bool(config.adaptive_entropy.enabled)


def check_config(config: ml_collections.ConfigDict) -> None:
    """Raises ValueError naming the ``adaptive_entropy`` field and the fix: a field that is
    not a finite number, impossible bounds, or, with the section disabled, a field changed
    from its default (`DEFAULTS`), which nothing would read."""
    section = config.adaptive_entropy
    if not isinstance(section.enabled, bool):
        raise ValueError(f"adaptive_entropy.enabled must be a bool, got {section.enabled!r}")
    for field in ("target", "delta", "low", "high"):
        value = section[field]
        if (isinstance(value, bool) or not isinstance(value, numbers.Real)
                or not math.isfinite(value)):
            raise ValueError(f"adaptive_entropy.{field} must be a finite number, got {value!r}")
    if not enabled(config):
        changed = [f"adaptive_entropy.{field}={section[field]!r}"
                   for field, default in DEFAULTS.items() if section[field] != default]
        if changed:
            raise ValueError(f"{', '.join(changed)} has no effect while adaptive_entropy.enabled "
                             "is False: set adaptive_entropy.enabled=True, or leave the field at "
                             f"its configs/base.py default {DEFAULTS}")
        return
    if section.delta < 0 or section.low < 0:
        raise ValueError(f"adaptive_entropy.delta and .low must be >= 0, got {section.delta} "
                         f"and {section.low}")
    if section.low > section.high:
        raise ValueError(f"adaptive_entropy.low must be <= adaptive_entropy.high, got "
                         f"{section.low} and {section.high}")


def initial_state(config: ml_collections.ConfigDict, mesh: jax.sharding.Mesh) -> dict | None:
    """The controller's state before the first RL step, replicated on `mesh` (what a
    checkpoint holds): ``{"coef": c_0 = objective.entropy_coef, "last_entropy": +inf}``
    as float32 scalars; None when the run does not adapt the coefficient."""
    if not enabled(config):
        return None
    replicated = jax.NamedSharding(mesh, jax.P())
    return {"coef": jax.device_put(jnp.float32(config.objective.entropy_coef), replicated),
            "last_entropy": jax.device_put(jnp.float32(jnp.inf), replicated)}


def applied(config: ml_collections.ConfigDict, state: dict) -> float:
    """The coefficient RL step k applies: `objectives.entropy_bonus_coef(c_k, H_{k-1})`."""
    return float(objectives.entropy_bonus_coef(state["coef"], state["last_entropy"],
                                               target=config.adaptive_entropy.target))


def add_coef(batch: dict, coef: float) -> None:
    """Adds the step's coefficient to `batch` as the `[B]` float32 column ``entropy_coef``."""
    rows = batch["mask"]
    batch[KEY] = jnp.full(rows.shape[:1], coef, jnp.float32, device=rows.sharding)


def step_coef(micro: dict) -> dict:
    """`micro` with its ``entropy_coef`` column (`add_coef`) made the scalar the objective
    reads (every row holds the same value); unchanged without it."""
    if KEY not in micro:
        return micro
    return {**micro, KEY: micro[KEY][0]}


def advance(config: ml_collections.ConfigDict, state: dict, entropy: float,
            mesh: jax.sharding.Mesh) -> tuple[dict, dict]:
    """After RL step k with mean token entropy `entropy` (H_k): the next state
    ``{"coef": c_{k+1}, "last_entropy": H_k}`` and the step's metrics ``entropy_coef``
    (the coefficient the step applied) and ``entropy_coef_next`` (c_{k+1})."""
    section = config.adaptive_entropy
    used = applied(config, state)
    entropy = jnp.float32(entropy)
    coef = objectives.adaptive_entropy_coef(state["coef"], entropy, target=section.target,
                                            delta=section.delta, low=section.low,
                                            high=section.high)
    replicated = jax.NamedSharding(mesh, jax.P())
    new = {"coef": jax.device_put(coef, replicated),
           "last_entropy": jax.device_put(entropy, replicated)}
    return new, {"entropy_coef": used, "entropy_coef_next": float(coef)}


def layout(config: ml_collections.ConfigDict, rows: int) -> dict[str, Any]:
    """The RL batch's column ``{"entropy_coef": ([B], float32)}`` when the run adapts the
    coefficient, else {} (`programs.batch_layout`)."""
    return {KEY: ((rows,), jnp.float32)} if enabled(config) else {}
