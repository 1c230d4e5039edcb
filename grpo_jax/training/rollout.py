"""Rollouts on the mesh: sample G completions per prompt, score this process's rows, keep
groups with signal.

One draw, every array global with its rows split over the mesh's row axes:

    this process's examples -> prompt rows [P/n, S] --global_rows--> [P, S] on the mesh
    -> sampling.generate -> completions [B = P G, N], kept on the mesh
    --local_rows--> this process's B/n rows: decoded and scored against its own examples
    --global_rows--> rewards [B] (or [B, K]) back on the mesh

Only the rows a process scores cross to its host. DAPO's dynamic sampling (Yu et al.,
arXiv:2503.14476, sec. 3.2) draws again until the batch holds P groups whose rewards
differ; choosing the groups is one jitted gather on the mesh. With
``filtering.short_batch = "error"`` (the paper's behaviour) running out of draws is an
error; with ``"pad"`` the batch is topped up with groups whose masks are zeroed, which
add nothing to the loss or to any count, and `row_valid` says which rows are real.

With an environment (``environment.name``, `Episodic`) each row is a multi-turn episode
run on `sampling.Engine`: the environment answers the model's tool calls, and the batch's
``mask`` keeps the replies out of the loss while ``context_mask`` lets the forward
passes read them (docs/environments.md). Like the rewards, each process steps the
environment for its own rows only, and the episodes' counts are gathered.
"""

import dataclasses
import functools
import json
import math
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from grpo_jax import environments, models, objectives, parallel, paths, sampling
from grpo_jax import rewards as rewards_lib
from grpo_jax.training import policy as policy_lib
from grpo_jax.training import task as task_lib

SHORT_BATCH = ("error", "pad")
# The batch keys of the sampler's experts (the prompt's, the completion's): replayed by the
# training forward (keep routing), or kept only to measure the routing churn.
REPLAYED_ROUTING = ("prompt_routing", "routing")
SAMPLED_ROUTING = ("sampled_prompt_routing", "sampled_routing")


def check_sampling_config(config: Any) -> None:
    """Raises ValueError naming the field unless the rollouts of an RL run can be drawn:
    prompts and a budget, a temperature > 0 (the ratios and the KL divide log-probs by
    it; greedy rows have no signal), 0 < top_p <= 1, at least one draw per step, a known
    ``filtering.signal``."""
    r = config.rollout
    for field, value, meaning in (
            ("rollout.prompts_per_batch", r.prompts_per_batch, "prompts per step"),
            ("rollout.max_new_tokens", r.max_new_tokens, "the completion budget"),
            ("filtering.max_gen_batches", config.filtering.max_gen_batches,
             "prompt batches a step may draw; 1: no extra draw")):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{field} must be an int >= 1 ({meaning}), got {value!r}")
    if not r.temperature > 0:
        raise ValueError(f"rollout.temperature must be > 0 for RL (the log-probs of the ratios "
                         f"and the KL are taken at it, and a group sampled greedily has no "
                         f"signal); got {r.temperature}. Use 1.0, or a value like 0.6-1.2")
    if not 0.0 < r.top_p <= 1.0:
        raise ValueError(f"rollout.top_p must be in (0, 1] (1: no nucleus cut), got {r.top_p}")
    if config.filtering.signal not in objectives.SIGNALS:
        raise ValueError(f"filtering.signal must be one of {objectives.SIGNALS} (what a group's "
                         f"signal is judged on), got {config.filtering.signal!r}")


def sampling_method(config: Any) -> Any:
    """The rollouts' `sampling` method from the run config's ``rollout`` section."""
    r = config.rollout
    return sampling.make_method(temperature=r.temperature, top_p=r.top_p, top_k=r.top_k,
                                min_p=r.min_p)


def routing_keys(config: Any, model_cfg: models.ModelConfig) -> tuple[str, ...]:
    """Where a batch keeps the sampler's experts of every token: `REPLAYED_ROUTING` with
    ``rollout.keep_routing``; on an MoE without it `SAMPLED_ROUTING` (the routing churn
    is measured against them, nothing replays them), except with partial rollouts, whose
    carried rows keep experts only to replay them, and with a paged KV cache, which
    records none (there the churn goes unmeasured); () for a dense model."""
    if config.rollout.keep_routing:
        return REPLAYED_ROUTING
    r = config.rollout
    if model_cfg.n_experts and not r.partial.enabled and not r.kv_page_size:
        return SAMPLED_ROUTING
    return ()


def record_layout(config: Any, model_cfg: models.ModelConfig, rows: int, prompt_len: int,
                  new_tokens: int) -> dict[str, tuple[tuple[int, ...], jax.typing.DTypeLike]]:
    """``{key: (shape, dtype)}`` of the sampler's records a batch carries when the run
    keeps them (`draw`): the support of every sampled position
    (``rollout.keep_sampling_mask``) and, on an MoE, the experts of every token
    (`routing_keys`)."""
    b, s, n = rows, prompt_len, new_tokens
    layout = {}
    if config.rollout.keep_sampling_mask:
        logits = jax.ShapeDtypeStruct((1, model_cfg.vocab_size), jnp.float32)
        support = jax.eval_shape(lambda z: sampling.sample(
            sampling_method(config), jax.random.key(0), z, with_support=True), logits)[2]
        layout["support_ids"] = ((b, n, support.ids.shape[-1]), jnp.int32)
        layout["support_size"] = ((b, n), jnp.int32)
    routing = routing_keys(config, model_cfg)
    if routing:
        moe_layers = sum(map(model_cfg.is_moe_layer, range(model_cfg.n_layers)))
        layout[routing[0]] = ((b, s, moe_layers, model_cfg.n_experts_per_tok), jnp.int32)
        layout[routing[1]] = ((b, n, moe_layers, model_cfg.n_experts_per_tok), jnp.int32)
    return layout


def check_environment_config(config: Any) -> None:
    """Raises ValueError naming the field unless ``environment.*`` can run: a registered
    name ("" for none), budgets in range, no critic."""
    env = config.environment
    if not env.name:
        return
    if env.max_calls < 0:
        raise ValueError(f"environment.max_calls must be >= 0, got {env.max_calls}")
    environments.make(env.name, max_calls=env.max_calls)   # a registered name
    if env.max_append < 1:
        raise ValueError(f"environment.max_append must be >= 1 (tokens of one reply), got "
                         f"{env.max_append}")
    if env.turn_budget < 0:
        raise ValueError(f"environment.turn_budget must be >= 0 (0: none), got {env.turn_budget}")
    if not env.timeout_s > 0:
        raise ValueError(f"environment.timeout_s must be > 0, got {env.timeout_s}")
    if env.chat_role and not config.task.chat_template:
        raise ValueError(f"environment.chat_role={env.chat_role!r} puts the replies in chat turns, "
                         "but the prompts are plain text (task.chat_template=False); set "
                         "task.chat_template=True or environment.chat_role=''")
    if config.critic.enabled:
        raise ValueError("environment.name with critic.enabled: GAE over a multi-turn row (values "
                         "across the environment's replies) is not built; use a critic-free "
                         "estimator or environment.name=''")


class Episodic:
    """What multi-turn rollouts need besides the sampler (``environment.*``,
    docs/environments.md): the environment, the tokens after which a row pauses for it,
    and the worker processes its steps run in (each under ``environment.timeout_s``)."""

    def __init__(self, env_cfg, tokenizer):
        reply = environments.chat_reply(tokenizer, env_cfg.chat_role) if env_cfg.chat_role else None
        self.environment = environments.make(env_cfg.name, max_calls=env_cfg.max_calls,
                                             reply=reply)
        self.pause_tokens = environments.pause_ids(tokenizer, self.environment)
        self.max_append, self.turn_budget = env_cfg.max_append, env_cfg.turn_budget
        self.pool = rewards_lib.GraderPool(timeout_s=env_cfg.timeout_s)

    @classmethod
    def of(cls, config: Any, tokenizer: Any) -> "Episodic | None":
        """The run's `Episodic`, or None without an environment (single-turn rollouts)."""
        check_environment_config(config)
        return cls(config.environment, tokenizer) if config.environment.name else None

    def close(self) -> None:
        self.pool.close()


def sample_on_mesh(
    policy: policy_lib.Policy, mesh: jax.sharding.Mesh, prompts: Mapping[str, jax.Array], *,
    rng: jax.Array, method: Any, group_size: int, max_new_tokens: int, rules: str,
    record_support: bool = False, record_routing: bool = False, slots: int = 0,
    episodic: Episodic | None = None, examples: Sequence[dict[str, Any]] | None = None,
    prompt_ids: np.ndarray | None = None, buffer_len: int | None = None, kv_page_size: int = 0,
    kv_pages: int = 0,
) -> tuple[sampling.Rollout, environments.Episodes | None]:
    """`sampling.generate` on global prompt rows (in `slots` decode slots when > 0), or
    with `episodic` the rows as episodes: `sampling.Engine` (all rows at once when
    `slots` is 0) with the environment answering the rows' calls (`run_episodes`;
    `examples`: each of this process's prompts' example); `prompt_ids`: the global
    prompts' random streams (default: their row numbers); `buffer_len`: the rows' width
    (default `max_new_tokens`; a partial rollout's rows stop at a smaller budget in the
    run's buffer); `kv_page_size`, `kv_pages`: a paged KV cache for the slots (without
    `episodic`; `sampling.generate`). Returns `(Rollout on the mesh, Episodes of this
    process's rows or None)`."""
    tokenizer = policy.tokenizer
    common = dict(rng=rng, method=method, group_size=group_size, max_new_tokens=max_new_tokens,
                  stop_tokens=[tokenizer.eos_token_id], pad_id=tokenizer.pad_token_id,
                  max_len_bucket=buffer_len or max_new_tokens,   # fixed buffer: one compile
                  rules=rules, record_support=record_support, record_routing=record_routing,
                  prompt_ids=prompt_ids)
    with jax.set_mesh(mesh):
        if episodic is None:
            return sampling.generate(policy.graphdef, policy.params, prompts["tokens"],
                                     prompts["mask"], slots=slots, kv_page_size=kv_page_size,
                                     kv_pages=kv_pages, **common), None
        rows = prompts["tokens"].shape[0] * group_size
        engine = sampling.Engine(policy.graphdef, policy.params, prompts["tokens"], prompts["mask"],
                                 slots=slots or rows, pause_tokens=episodic.pause_tokens,
                                 max_append=episodic.max_append, turn_budget=episodic.turn_budget,
                                 **common)
        examples_b = [example for example in examples for _ in range(group_size)]   # own rows
        episodes = environments.run_episodes(engine, episodic.environment, examples_b, tokenizer,
                                             pool=episodic.pool)
        return engine.rollout(), episodes


def score_own_rows(rollout: sampling.Rollout, texts: Sequence[str],
                   examples: Sequence[dict[str, Any]], scorer: task_lib.Scorer, tokenizer: Any,
                   group_size: int) -> tuple[np.ndarray, np.ndarray, dict[str, float]]:
    """Decodes and scores the rows of `rollout` this process holds: its own prompts'.

    Returns `(rewards [b] or [b, K], correct [b], reward metrics)` as numpy, b = this
    process's rows.
    """
    tokens, mask, lengths = (parallel.local_rows(x) for x in (rollout.tokens, rollout.mask,
                                                              rollout.lengths))
    completions = task_lib.decode_completions(tokenizer, tokens, mask)
    repeat = lambda items: [item for item in items for _ in range(group_size)]
    return scorer(repeat(texts), completions, repeat(examples), lengths)


def all_episodes(episodes: environments.Episodes) -> environments.Episodes:
    """Every process's `Episodes` (each of its own rows) joined in process order: the
    same counts on every process, so their metrics are those of every row."""
    own = {k: v.tolist() for k, v in dataclasses.asdict(episodes).items()}
    parts = parallel.allgather_json(own)
    return environments.Episodes.concatenate([
        environments.Episodes(**{k: np.asarray(v, np.int64) for k, v in part.items()})
        for part in parts])


def combine_reward_metrics(per_process: Sequence[Mapping[str, float]],
                           rows: Sequence[int] | None = None) -> dict[str, float]:
    """Every process's reward metrics -> one dict: counts summed, means averaged (weighted
    by `rows`, each part's row count, where given and unequal)."""
    keys = per_process[0].keys()
    is_count = lambda k: k.startswith(("reward_errors", "reward_timeouts", "environment_failures"))
    equal = rows is None or len(set(rows)) == 1
    weights = None if equal else np.asarray(rows, np.float64) / np.sum(rows)
    mean = lambda values: np.mean(values) if weights is None else np.dot(values, weights)
    return {k: float(np.sum([m[k] for m in per_process]) if is_count(k)
                     else mean([m[k] for m in per_process])) for k in keys}


def draw(policy: policy_lib.Policy, mesh: jax.sharding.Mesh, examples: list[dict[str, Any]], *,
         config: Any, scorer: task_lib.Scorer, rng: jax.Array, method: Any,
         episodic: Episodic | None = None) -> tuple[dict[str, jax.Array], dict[str, float]]:
    """Samples and scores one prompt batch; returns `(rows, metrics)`: the reward
    metrics and, with `episodic` (multi-turn episodes), the episodes' (`Episodes.metrics`).

    `rows` holds global `[B, ...]` arrays: prompt_tokens, prompt_mask, tokens, mask,
    behaviour_logp (the sampler's log-prob: of the tempered distribution, or with
    ``rollout.keep_sampling_mask`` of the cut one it drew from), lengths, truncated,
    rewards, correct; and with the keep options the sampler's records (support_ids,
    support_size; prompt_routing, routing; on an MoE without keep routing its experts as
    sampled_prompt_routing, sampled_routing: `routing_keys`). With `episodic`, `mask` is 1
    on the model's tokens only and ``context_mask`` on every token of the row (the
    environment's replies too); the rewards score the whole row's text.
    """
    group_size = config.objective.group_size
    texts, tokens, mask = task_lib.prompt_rows(config.task, examples, policy.tokenizer)
    task_lib.check_positions(int(np.max(np.sum(mask, axis=1))), config.rollout.max_new_tokens,
                             policy.model_config().max_position_embeddings, "a train batch")
    prompts = parallel.global_rows(mesh, {"tokens": tokens, "mask": mask})
    keep_mask = config.rollout.keep_sampling_mask
    routing = routing_keys(config, policy.model_config())
    rollout, episodes = sample_on_mesh(
        policy, mesh, prompts, rng=rng, method=method, group_size=group_size,
        max_new_tokens=config.rollout.max_new_tokens, rules=config.rollout.rules,
        record_support=keep_mask, record_routing=bool(routing),
        slots=config.rollout.slots, episodic=episodic, examples=examples,
        kv_page_size=config.rollout.kv_page_size, kv_pages=config.rollout.kv_pages)
    rewards, correct, metrics = score_own_rows(rollout, texts, examples, scorer, policy.tokenizer,
                                               group_size)
    scored = parallel.global_rows(mesh, {"rewards": rewards, "correct": correct})
    rows = {"prompt_tokens": rollout.prompt_tokens, "prompt_mask": rollout.prompt_mask,
            "tokens": rollout.tokens, "mask": rollout.mask,
            "behaviour_logp": rollout.sample_logp if keep_mask else rollout.logp,
            "lengths": rollout.lengths, "truncated": rollout.truncated, **scored}
    metrics = combine_reward_metrics(parallel.allgather_json(metrics))
    if episodes is not None:
        rows["mask"] = rollout.mask * ~rollout.appended
        rows["context_mask"] = rollout.mask
        metrics.update(all_episodes(episodes).metrics())
    for key in ("support_ids", "support_size"):
        if getattr(rollout, key) is not None:
            rows[key] = getattr(rollout, key)
    if routing:
        rows.update(zip(routing, (rollout.prompt_routing, rollout.routing)))
    return rows, metrics


@functools.partial(jax.jit, static_argnames=("group_size", "signal"))
def group_signal(rows: Mapping[str, jax.Array], group_size: int, signal: str) -> jax.Array:
    """`[P]` bool: the draw's groups DAPO's dynamic sampling keeps, judged on
    ``filtering.signal`` (`objectives.dynamic_sampling_signal`: the correctness, or the
    rewards entering the advantages)."""
    return objectives.dynamic_sampling_signal(rows["rewards"], rows["correct"], group_size,
                                              signal)


def groups_with_signal(rows: Mapping[str, jax.Array], group_size: int,
                       signal: str) -> jax.Array:
    """`[]` int32: how many of a draw's groups have signal (`group_signal`)."""
    return jnp.sum(group_signal(rows, group_size, signal), dtype=jnp.int32)


def _left_pad(x, width, value):
    """`[B, S, ...]` -> `[B, width, ...]`, padded on the left of axis 1."""
    widths = [(0, 0)] * x.ndim
    widths[1] = (width - x.shape[1], 0)
    return jnp.pad(x, widths, constant_values=value)


@functools.partial(
    jax.jit,
    static_argnames=("mesh", "group_size", "num_groups", "dynamic", "pad_id", "signal"),
)
def select_groups(draws: tuple[Mapping[str, jax.Array], ...], *, mesh: jax.sharding.Mesh,
                  group_size: int, num_groups: int, dynamic: bool, pad_id: int,
                  signal: str) -> dict[str, jax.Array]:
    """The train batch: `num_groups` whole groups from the draws, on the mesh.

    With `dynamic` (DAPO's dynamic sampling), groups with signal come first, in draw
    order, and the rest fill up with their rows marked invalid (`row_valid` False,
    `mask` zeroed); without it, the first draw as it is.

    Args:
      draws: a tuple of row dicts from `draw` (their prompt widths may differ).
      group_size: G.
      num_groups: P, the groups of the train batch.
      dynamic: filter groups by signal.
      pad_id: the tokenizer's pad id (prompts are left-padded to the widest draw).
      mesh: the batch's rows are split over its row axes.
      signal: what a group's signal is judged on (``filtering.signal``).

    Returns:
      The rows of the batch, with ``row_valid`` `[P G]` bool added.
    """
    width = max(d["prompt_tokens"].shape[1] for d in draws)
    fill = {"prompt_tokens": pad_id, "prompt_mask": 0, "prompt_routing": 0,
            "sampled_prompt_routing": 0}
    padded = [{**d, **{k: _left_pad(d[k], width, fill[k]) for k in fill if k in d}}
              for d in draws]
    rows = {k: jnp.concatenate([d[k] for d in padded]) for k in padded[0]}
    has_signal = group_signal(rows, group_size, signal)
    order = jnp.argsort(~has_signal, stable=True) if dynamic else jnp.arange(has_signal.shape[0])
    groups = order[:num_groups]
    index = (groups[:, None] * group_size + jnp.arange(group_size)).reshape(-1)
    batch = jax.tree.map(lambda x: jnp.take(x, index, axis=0), rows)
    valid = has_signal[groups] if dynamic else jnp.ones((num_groups,), bool)
    batch["row_valid"] = jnp.repeat(valid, group_size)
    batch["mask"] = batch["mask"] * batch["row_valid"][:, None]
    return jax.lax.with_sharding_constraint(
        batch, parallel.rows_sharding(mesh, num_groups * group_size))


@functools.partial(jax.jit, static_argnames=("group_size", "signal"))
def rollout_statistics(draws: tuple[Mapping[str, jax.typing.ArrayLike], ...],
                       reward_weights: jax.Array, *, group_size: int,
                       signal: str) -> dict[str, jax.Array]:
    """Metrics of every drawn row (all draws of the step), reduced on the mesh.

    ``reward_mean`` is the mean of the scalar reward that enters the advantages (with
    several reward columns, their weighted sum). A multi-turn row's length counts the
    environment's replies; ``generated_tokens`` counts the model's tokens only.
    """
    cat = lambda k: jnp.concatenate([d[k] for d in draws])
    rewards, correct = cat("rewards"), cat("correct")
    lengths, truncated = cat("lengths").astype(jnp.float32), cat("truncated")
    replies = jnp.sum(cat("context_mask") - cat("mask")) if "context_mask" in draws[0] else 0
    scalar = rewards @ reward_weights if rewards.ndim > 1 else rewards
    has_signal = jnp.concatenate([group_signal(d, group_size, signal) for d in draws])
    mean_where = lambda x, w: jnp.sum(x * w) / jnp.maximum(jnp.sum(w), 1)
    # NaN where no row is in the class: `host_statistics` leaves the key out of the row.
    class_mean = lambda x, w: jnp.where(jnp.any(w), mean_where(x, w), jnp.nan)
    return {
        "reward_mean": jnp.mean(scalar),
        "accuracy": jnp.mean(correct.astype(jnp.float32)),
        "response_length_mean": jnp.mean(lengths),
        "response_length_max": jnp.max(lengths),
        "response_length_correct": class_mean(lengths, correct),
        "response_length_wrong": class_mean(lengths, ~correct),
        "truncation_rate": jnp.mean(truncated.astype(jnp.float32)),
        "groups_without_signal": 1.0 - jnp.mean(has_signal.astype(jnp.float32)),
        "generated_tokens": jnp.sum(lengths) - replies,
    }


def host_statistics(stats: Mapping[str, jax.typing.ArrayLike]) -> dict[str, float]:
    """`rollout_statistics` as the metrics row's floats: a mean over an empty class (the
    lengths of the correct answers in a step that drew none) is left out, not logged as a
    number it is not."""
    values = {k: float(v) for k, v in jax.device_get(stats).items()}
    return {k: v for k, v in values.items() if not math.isnan(v)}


def collect(
    policy: policy_lib.Policy, mesh: jax.sharding.Mesh,
    train_iter: Iterator[list[dict[str, Any]]], *, config: Any, scorer: task_lib.Scorer,
    rng: jax.Array, method: Any, episodic: Episodic | None = None,
) -> tuple[dict[str, jax.Array], dict[str, float], list[dict[str, Any]]]:
    """One train batch of P x G rows on the mesh, the step's rollout metrics, and this
    process's examples of the first draw (for a supervised term on the same prompts).

    Draws `filtering.max_gen_batches` prompt batches at most (one without dynamic
    sampling); the i-th draw samples with `fold_in(rng, i)`; with `episodic`, each row
    is a multi-turn episode (`draw`).
    """
    cfg, group_size = config, config.objective.group_size
    num_groups = cfg.rollout.prompts_per_batch
    dynamic = cfg.filtering.dynamic_sampling
    draws_allowed = cfg.filtering.max_gen_batches if dynamic else 1
    draws, reward_metrics, kept, seconds, first = [], [], 0, 0.0, None
    for index in range(draws_allowed):
        start = time.time()
        examples = next(train_iter)
        first = examples if first is None else first
        rows, metrics = draw(policy, mesh, examples, config=cfg, scorer=scorer,
                             rng=jax.random.fold_in(rng, index), method=method, episodic=episodic)
        kept += int(groups_with_signal(rows, group_size, cfg.filtering.signal))
        seconds += time.time() - start
        draws.append(rows)
        reward_metrics.append(metrics)
        if kept >= num_groups:
            break
    if dynamic and kept < num_groups and cfg.filtering.short_batch == "error":
        raise RuntimeError(
            f"dynamic sampling found {kept} groups with signal in {len(draws)} draws of "
            f"{num_groups} prompts, fewer than the {num_groups} a batch needs: the policy solves "
            "(or fails) almost every prompt. Raise filtering.max_gen_batches, use harder prompts, "
            "or set filtering.short_batch='pad' to train on the groups found")
    batch = select_groups(tuple(draws), mesh=mesh, group_size=group_size, num_groups=num_groups,
                          dynamic=dynamic, pad_id=int(policy.tokenizer.pad_token_id),
                          signal=cfg.filtering.signal)
    metrics = host_statistics(rollout_statistics(tuple(draws), jnp.asarray(scorer.weights),
                                                 group_size=group_size,
                                                 signal=cfg.filtering.signal))
    metrics.update(combine_reward_metrics(reward_metrics))
    metrics.update(gen_batches=float(len(draws)), time_rollout=seconds,
                   batch_filled=min(kept, num_groups) / num_groups if dynamic else 1.0,
                   rollout_tokens_per_s=metrics["generated_tokens"] / max(seconds, 1e-9))
    return batch, metrics, first


def write_samples(batch: Mapping[str, jax.Array], tokenizer: Any, path: str) -> None:
    """Writes every row of a train batch as one JSON line: the prompt, the completion,
    its reward(s), correctness, length and whether the row counts (``row_valid``).

    For reading what the policy writes (``train.log_rollouts_every``): it gathers the
    whole batch to every host, so it is not free on a large run. Process 0 writes.
    """
    keys = ("prompt_tokens", "prompt_mask", "tokens", "rewards", "correct", "row_valid", "lengths")
    rows = parallel.whole_on_host({k: batch[k] for k in keys})
    if not parallel.is_main():
        return
    prompts = task_lib.decode_prompts(tokenizer, rows["prompt_tokens"], rows["prompt_mask"])
    generated = np.arange(rows["tokens"].shape[1])[None] < rows["lengths"][:, None]
    completions = task_lib.decode_completions(tokenizer, rows["tokens"], generated)
    paths.write_whole(path, "".join(
        json.dumps({"prompt": prompt, "completion": completion,
                    "reward": rows["rewards"][i].tolist(), "correct": bool(rows["correct"][i]),
                    "length": int(rows["lengths"][i]),
                    "row_valid": bool(rows["row_valid"][i])}) + "\n"
        for i, (prompt, completion) in enumerate(zip(prompts, completions))))
