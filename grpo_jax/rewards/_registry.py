"""Rewards registered by name, so a config selects them with a string.

A row reward is `fn(prompt: str, completion: str, example: dict, **options) -> float`.
Its `where` says how the batch scorer runs it:

- `"inline"`: in the calling process; cheap and bounded by construction (format,
  countdown, RPT). An exception still yields 0 and is counted.
- `"pool"`: in a worker of a `GraderPool` under a time budget, because it may hang
  (math-verify can spin in sympy). A hung worker is killed and replaced.
- `"batch"`: one call on the whole batch, `fn(prompts, completions, examples,
  **options) -> [B] array`, for shaping that is an array function of the batch
  (length shaping calls `objectives.overlong_penalty` once per batch).
"""

import dataclasses
from typing import Callable, Literal

Where = Literal["inline", "pool", "batch"]


@dataclasses.dataclass(frozen=True)
class Reward:
    """A registered reward: its name, the function, and where it runs."""

    name: str
    fn: Callable[..., object]
    where: Where


_REWARDS: dict[str, Reward] = {}


def register(name: str, *, where: Where = "inline"):
    """Decorator registering `fn` under `name`; adding a reward is one function plus this line."""
    if where not in ("inline", "pool", "batch"):
        raise ValueError(f"where must be 'inline', 'pool' or 'batch', got {where!r}")

    def decorator(fn):
        if name in _REWARDS:
            raise ValueError(f"reward {name!r} is already registered; pick another name")
        _REWARDS[name] = Reward(name=name, fn=fn, where=where)
        return fn

    return decorator


def unregister(name: str) -> None:
    """Removes a registered reward (tests register throw-away graders)."""
    _REWARDS.pop(name, None)


def get_reward(name: str) -> Reward:
    """The reward registered under `name`; the error lists the known names."""
    try:
        return _REWARDS[name]
    except KeyError:
        raise KeyError(f"unknown reward {name!r}; registered rewards: {sorted(_REWARDS)}") from None


def reward_names() -> list[str]:
    """All registered reward names, sorted."""
    return sorted(_REWARDS)
