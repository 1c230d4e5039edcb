"""Scoring a batch: several rewards per row, summed with weights or kept apart for GDPO.

A run names its rewards in the config as a list of `(name, weight)` pairs, optionally
with options for the reward function:

    config.rewards = [("math", 1.0), ("format", 0.1, {"tags": ("think", "answer")})]

`score_batch` returns `[B]` weighted sums (`combine="sum"`) or the `[B, K]` unweighted
columns (`combine="separate"`, for `objectives.gdpo_advantages(..., weights=spec_weights(specs))`),
and a metrics dict. It never raises because of a grader: an exception, a non-finite value
or (for pool rewards) a call past the time budget gives that row 0 for that reward and is
counted in `reward_errors` / `reward_timeouts`.
"""

import dataclasses
import logging
from typing import Any, Literal, Mapping, Sequence

import numpy as np

from grpo_jax.rewards import _pool
from grpo_jax.rewards._registry import Reward
from grpo_jax.rewards._registry import get_reward

_logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class RewardSpec:
    """One reward of a run: the registered name, its weight, and keyword options for it."""

    name: str
    weight: float = 1.0
    options: Mapping[str, Any] = dataclasses.field(default_factory=dict)


def as_specs(config: Sequence) -> list[RewardSpec]:
    """Reads `[(name, weight), (name, weight, options), RewardSpec, ...]` into RewardSpecs.

    Checks that every name is registered and appears once, so a typo fails at start-up.
    """
    specs = [entry if isinstance(entry, RewardSpec) else RewardSpec(*entry) for entry in config]
    if not specs:
        raise ValueError("rewards must name at least one reward, e.g. [('math', 1.0)]")
    names = [spec.name for spec in specs]
    for name in names:
        get_reward(name)
        if names.count(name) > 1:
            raise ValueError(
                f"reward {name!r} appears {names.count(name)} times in rewards; list it once"
            )
    return specs


def spec_weights(specs: Sequence[RewardSpec]) -> np.ndarray:
    """`[K]` float32 weights, in spec order (GDPO weights the normalised columns)."""
    return np.array([spec.weight for spec in specs], np.float32)


def _score_rows(reward: Reward, options, rows, pool) -> list[_pool.Outcome]:
    if reward.where == "pool" and pool is not None:
        return pool.map(reward.fn, rows, options)
    return [_pool.run_contained(reward.fn, row, dict(options)) for row in rows]


def _score_whole_batch(
    reward: Reward, options, prompts, completions, examples
) -> list[_pool.Outcome]:
    try:
        values = np.asarray(reward.fn(prompts, completions, examples, **options), np.float64)
        if values.shape != (len(prompts),):
            raise ValueError(
                f"reward {reward.name!r} returned shape {values.shape}, expected ({len(prompts)},)"
            )
    except (Exception, SystemExit) as error:  # a grader bug (or sys.exit) must not stop training
        return [_pool.error_outcome(error)] * len(prompts)
    return [_pool.to_outcome(value) for value in values]


def _outcomes(spec: RewardSpec, prompts, completions, examples, pool) -> list[_pool.Outcome]:
    reward = get_reward(spec.name)
    if reward.where == "batch":
        return _score_whole_batch(reward, spec.options, prompts, completions, examples)
    return _score_rows(reward, spec.options, list(zip(prompts, completions, examples)), pool)


def _summary(name: str, outcomes: list[_pool.Outcome]) -> dict[str, float]:
    """Per-reward metrics; failures are also logged, with the first one's reason."""
    failed = [outcome for outcome in outcomes if outcome.status != "ok"]
    if failed:
        _logger.warning("reward %r: %d of %d rows failed; first: %s %s",
                        name, len(failed), len(outcomes), failed[0].status, failed[0].detail)
    return {
        f"rewards/{name}": (float(np.mean([outcome.value for outcome in outcomes]))
                            if outcomes else 0.0),
        f"reward_errors/{name}": float(sum(outcome.status == "error" for outcome in failed)),
        f"reward_timeouts/{name}": float(sum(outcome.status == "timeout" for outcome in failed)),
    }


def score_batch(
    specs: Sequence[RewardSpec],
    prompts: Sequence[str],
    completions: Sequence[str],
    examples: Sequence[dict],
    *,
    pool: _pool.GraderPool | None = None,
    completion_lengths: Sequence[int] | np.ndarray | None = None,
    max_new_tokens: int | None = None,
    combine: Literal["sum", "separate"] = "sum",
) -> tuple[np.ndarray, dict[str, float]]:
    """Scores B rows with every reward in `specs`.

    Args:
      specs: the rewards, from `as_specs(config.rewards)`.
      prompts, completions, examples: `[B]` each; row i is (prompts[i], completions[i],
        examples[i]).
      pool: runs the rewards registered `where="pool"` under its time budget. Without a
        pool they run in this process with no time budget (tests, debugging).
      completion_lengths: `[B]` completion lengths in tokens; when given, each row's
        example gets a "completion_length" entry (read by length shaping).
      max_new_tokens: the run's completion budget in tokens; when given, each row's
        example gets a "max_new_tokens" entry (length shaping's default limit, so the
        penalty follows the budget when it is overridden).
      combine: "sum" gives `[B]` = sum_k weight_k * reward_k; "separate" gives the
        unweighted `[B, K]` columns in spec order, for GDPO.

    Returns:
      (rewards float32 `[B]` or `[B, K]`, metrics) where metrics has, per reward name,
      `rewards/<name>` (mean), `reward_errors/<name>`, `reward_timeouts/<name>`, and the
      totals `reward_errors` and `reward_timeouts`.
    """
    num_rows = len(prompts)
    if not len(completions) == len(examples) == num_rows:
        raise ValueError(
            f"prompts, completions and examples must have one entry per row, got "
            f"{num_rows}, {len(completions)} and {len(examples)}"
        )
    if completion_lengths is not None:
        if len(completion_lengths) != num_rows:
            raise ValueError(
                f"completion_lengths must have {num_rows} entries, got {len(completion_lengths)}"
            )
        examples = [
            dict(ex, completion_length=int(n)) for ex, n in zip(examples, completion_lengths)
        ]
    if max_new_tokens is not None:
        examples = [dict(ex, max_new_tokens=int(max_new_tokens)) for ex in examples]
    if combine not in ("sum", "separate"):
        raise ValueError(f"combine must be 'sum' or 'separate', got {combine!r}")
    columns, metrics = [], {}
    for spec in specs:
        outcomes = _outcomes(spec, prompts, completions, examples, pool)
        columns.append(np.array([outcome.value for outcome in outcomes], np.float32))
        metrics.update(_summary(spec.name, outcomes))
    for kind in ("reward_errors", "reward_timeouts"):
        metrics[kind] = float(sum(metrics[f"{kind}/{spec.name}"] for spec in specs))
    rewards_bk = np.stack(columns, axis=1) if columns else np.zeros((num_rows, 0), np.float32)
    if combine == "separate":
        return rewards_bk, metrics
    return (rewards_bk @ spec_weights(specs)).astype(np.float32), metrics
