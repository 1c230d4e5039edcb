"""The groups a partial-rollout run holds between steps (`Pool`) and how one step moves them
(`run_step`): host numpy, no model; `partial` samples for it.

A group is one prompt's G rows. A row is *done* when it sampled a stop token or has
``rollout.max_new_tokens`` tokens; a group is *ready* when all its rows are done and
scored (with dynamic sampling, also when its rewards differ: a done group without signal
is dropped). Every row keeps, per token, the behaviour log-prob and the parameters'
version it was sampled with, however many steps it took, and the sampler's records where
the run keeps them (`Pool.RECORDS`): with ``rollout.keep_sampling_mask`` the support its
cut kept, with ``rollout.keep_routing`` the experts of the step that last ran the row.

On several processes each process holds the groups of its own prompts (those whose rows
it holds of each draw) and `run_step` takes every decision on all processes' groups in
the run's draw order (`Pool.order`), gathered at each decision, so every process decides
the same as one process holding every group would.
"""

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from grpo_jax import objectives


def key_words() -> int:
    """How many uint32 words a PRNG key of the default implementation holds (2: threefry)."""
    return jax.random.key_data(jax.random.key(0)).shape[-1]


@dataclasses.dataclass(frozen=True)
class Pool:
    """Groups in flight between steps, oldest first (n groups of G rows, N = the buffer).

    Attributes:
      prompt_tokens, prompt_mask: `[n, S]` int32, left-padded to the widest group's.
      prompt_width: `[n]` int32, the prompt bucket each group was drawn with.
      drawn: `[n]` int32, the step that drew the group.
      order: `[n]` int64, the group's place in the run's draw order: (step x the draws a
        step may make + the draw's index in its step) x P + the prompt's index in its draw.
      scored: `[n]` bool, every row is done and the rewards are in.
      keys: `[n, G, W]` uint32, each row's random stream (`jax.random.key_data`).
      tokens: `[n, G, N]` int32 (pad after the row's length).
      logp: `[n, G, N]` float32, each token's behaviour log-prob (0 past the length).
      version: `[n, G, N]` int32, v of the theta_v that sampled each token.
      lengths: `[n, G]` int32; stopped: `[n, G]` bool, the row sampled a stop token.
      start: `[n, G]` int32, the row's length when the current step began.
      rewards: `[n, G]` (or `[n, G, K]` for several reward columns) float32, once scored.
      correct: `[n, G]` bool, once scored.
      examples, texts: n dataset examples and prompt texts.
      support_ids: `[n, G, N, K]` int32, the ids the sampler's cut kept at each sampled
        position (-1 past them); support_size: `[n, G, N]` int32, how many it kept (0
        past the length): with ``rollout.keep_sampling_mask`` (`rollout.draw`'s records),
        else None. K + 1 marks a token whose support was not recorded (the trainer then
        takes the whole tempered softmax, `batch.scored_logprobs`).
      prompt_routing: `[n, G, S, L_moe, k]` int32, the experts of each row's prompt
        tokens; routing: `[n, G, N, L_moe, k]` int32, of its tokens: with
        ``rollout.keep_routing``, else None; both those of the step that last ran the
        row (a resumption routes the prompt and the earlier tokens again).
    """

    prompt_tokens: np.ndarray
    prompt_mask: np.ndarray
    prompt_width: np.ndarray
    drawn: np.ndarray
    order: np.ndarray
    scored: np.ndarray
    keys: np.ndarray
    tokens: np.ndarray
    logp: np.ndarray
    version: np.ndarray
    lengths: np.ndarray
    stopped: np.ndarray
    start: np.ndarray
    rewards: np.ndarray
    correct: np.ndarray
    examples: tuple = ()
    texts: tuple = ()
    support_ids: np.ndarray | None = None
    support_size: np.ndarray | None = None
    prompt_routing: np.ndarray | None = None
    routing: np.ndarray | None = None

    ARRAYS = ("prompt_tokens", "prompt_mask", "prompt_width", "drawn", "order", "scored", "keys",
              "tokens", "logp", "version", "lengths", "stopped", "start", "rewards", "correct")
    # The sampler's, where the run keeps them.
    RECORDS = ("support_ids", "support_size", "prompt_routing", "routing")

    @classmethod
    def empty(cls, group_size: int, buffer_len: int, reward_columns: tuple[int, ...] = (),
              support_k: int = 0, routing_shape: tuple[int, ...] = ()) -> "Pool":
        """No groups; rows of `buffer_len` tokens, rewards of shape `reward_columns` each,
        supports of `support_k` ids (0: no support records), experts of shape
        `routing_shape` (`(L_moe, k)`; (): no routing records)."""
        g, n = group_size, buffer_len
        zeros = lambda *shape, dtype=np.int32: np.zeros((0, *shape), dtype)
        records = {}
        if support_k:
            records.update(support_ids=zeros(g, n, support_k), support_size=zeros(g, n))
        if routing_shape:
            records.update(prompt_routing=zeros(g, 1, *routing_shape),
                           routing=zeros(g, n, *routing_shape))
        return cls(prompt_tokens=zeros(1), prompt_mask=zeros(1), prompt_width=zeros(),
                   drawn=zeros(), order=zeros(dtype=np.int64), scored=zeros(dtype=bool),
                   keys=zeros(g, key_words(), dtype=np.uint32),
                   tokens=zeros(g, n), logp=zeros(g, n, dtype=np.float32), version=zeros(g, n),
                   lengths=zeros(g), stopped=zeros(g, dtype=bool), start=zeros(g),
                   rewards=zeros(g, *reward_columns, dtype=np.float32),
                   correct=zeros(g, dtype=bool), **records)

    @property
    def fields(self) -> tuple[str, ...]:
        """The names of the pool's per-group arrays: `ARRAYS` and the `RECORDS` it keeps."""
        return self.ARRAYS + tuple(k for k in self.RECORDS if getattr(self, k) is not None)

    @property
    def support_k(self) -> int:
        """K, the support ids recorded per position; 0 without support records."""
        return 0 if self.support_ids is None else self.support_ids.shape[-1]

    @property
    def routing_shape(self) -> tuple[int, ...]:
        """`(L_moe, k)` of the routing records; () without them."""
        return () if self.routing is None else self.routing.shape[3:]

    @property
    def size(self) -> int:
        return self.drawn.shape[0]

    @property
    def group_size(self) -> int:
        return self.tokens.shape[1]

    @property
    def buffer_len(self) -> int:
        return self.tokens.shape[2]

    @property
    def done(self) -> np.ndarray:
        """`[n, G]` bool: the row sampled a stop token or has the whole buffer."""
        return self.stopped | (self.lengths >= self.buffer_len)

    def replace(self, **fields: Any) -> "Pool":
        return dataclasses.replace(self, **fields)

    def take(self, index: Sequence[int] | np.ndarray) -> "Pool":
        """The groups at `index` (ints), in that order."""
        index = np.asarray(index, np.int64)
        return self.replace(**{k: getattr(self, k)[index] for k in self.fields},
                            examples=tuple(self.examples[i] for i in index),
                            texts=tuple(self.texts[i] for i in index))

    @classmethod
    def concatenate(cls, pools: Sequence["Pool"]) -> "Pool":
        """The groups of `pools` in order (all with the same records); prompts
        left-padded to the widest."""
        width = max(p.prompt_tokens.shape[1] for p in pools)
        fields = {k: np.concatenate([getattr(p, k) for p in pools]) for k in pools[0].fields
                  if k not in PROMPT_AXIS}
        for k in PROMPT_AXIS:   # pad id 0, mask 0, experts 0
            if k in pools[0].fields:
                fields[k] = np.concatenate([left_pad(getattr(p, k), width, PROMPT_AXIS[k])
                                            for p in pools])
        return cls(**fields, examples=sum((p.examples for p in pools), ()),
                   texts=sum((p.texts for p in pools), ()))

    def to_checkpoint(self) -> tuple[dict[str, np.ndarray] | None, dict[str, Any]]:
        """`(arrays, info)`: the arrays (None for an empty pool: nothing to write) and the
        JSON-able rest, for `Checkpointer.save_run(extra=...)`."""
        arrays = {k: getattr(self, k) for k in self.fields} if self.size else None
        info = {"groups": self.size, "group_size": self.group_size, "buffer_len": self.buffer_len,
                "reward_columns": list(self.rewards.shape[2:]), "support_k": self.support_k,
                "routing_shape": list(self.routing_shape),
                "examples": list(self.examples), "texts": list(self.texts)}
        return arrays, info

    @classmethod
    def from_checkpoint(cls, arrays: Mapping[str, np.ndarray] | None,
                        info: Mapping[str, Any]) -> "Pool":
        """The pool `to_checkpoint` wrote (one written before pools kept the sampler's
        records has none: `with_support` and `with_routing` fit it to the run)."""
        support_k = info.get("support_k", 0)   # absent: written before pools kept records
        routing_shape = tuple(info.get("routing_shape", ()))
        if not info["groups"]:
            return cls.empty(info["group_size"], info["buffer_len"], tuple(info["reward_columns"]),
                             support_k, routing_shape)
        arrays = dict(arrays)
        if "order" not in arrays:
            # Written by one process before groups recorded their draw order: that pool kept
            # its groups in draw order, so their places are their indices.
            arrays["order"] = np.arange(info["groups"], dtype=np.int64)
        records = cls.RECORDS[:2] if support_k else ()
        records += cls.RECORDS[2:] if routing_shape else ()
        return cls(**{k: np.asarray(arrays[k]) for k in cls.ARRAYS + records},
                   examples=tuple(info["examples"]), texts=tuple(info["texts"]))

    def with_support(self, support_k: int) -> "Pool":
        """The pool with support records of `support_k` ids (0: none), for a run that
        keeps them (``rollout.keep_sampling_mask``) restoring a pool written without them:
        its tokens' supports are marked not recorded (size K + 1), so the trainer scores
        them over the whole tempered softmax, the distribution their behaviour log-probs
        (`logp`) were taken over.

        Raises:
          ValueError: the pool's records cannot serve the run: it has records of another
            K, or records (log-probs of the cut distribution) and the run keeps none.
        """
        if support_k == self.support_k:
            return self
        if self.support_k:
            raise ValueError(
                f"the checkpoint's pool of partial rollouts records supports of "
                f"{self.support_k} ids and their behaviour log-probs are of the cut "
                f"distribution; this run keeps {support_k} (0: rollout.keep_sampling_mask="
                "False). Resume with the rollout.keep_sampling_mask, top_k, top_p and min_p "
                "it was written with")
        taken = np.arange(self.buffer_len) < self.lengths[..., None]
        ids = np.full((*self.tokens.shape, support_k), -1, np.int32)
        size = np.where(taken, support_k + 1, 0).astype(np.int32)
        return self.replace(support_ids=ids, support_size=size)

    def with_routing(self, routing_shape: tuple[int, ...]) -> "Pool":
        """The pool with routing records of `routing_shape` (`(L_moe, k)`; (): none), for
        the run restoring it: records a run without ``rollout.keep_routing`` does not
        replay are dropped.

        Raises:
          ValueError: a run that keeps routing restores groups without routing records
            (no experts to replay), or records of another shape.
        """
        routing_shape = tuple(routing_shape)
        if routing_shape == self.routing_shape:
            return self
        if not routing_shape:
            return self.replace(prompt_routing=None, routing=None)
        if not self.size:
            empty = Pool.empty(self.group_size, self.buffer_len, routing_shape=routing_shape)
            return self.replace(prompt_routing=empty.prompt_routing, routing=empty.routing)
        raise ValueError(
            f"the checkpoint's pool of partial rollouts holds {self.size} groups with routing "
            f"records of shape {self.routing_shape} ((): none), and this run replays experts of "
            f"shape {routing_shape} (rollout.keep_routing): resume with the "
            "rollout.keep_routing and model it was written with")


# The prompt arrays (left-padded to the widest prompt) and their prompt axis.
PROMPT_AXIS = {"prompt_tokens": 1, "prompt_mask": 1, "prompt_routing": 2}


def left_pad(x: np.ndarray, width: int, axis: int = 1) -> np.ndarray:
    """`x` with zeros on the left of `axis` up to `width`, or its last `width` there
    (`Pool.concatenate`'s padding; cut columns are padding the prompts left of their
    width)."""
    widths = [(0, 0)] * x.ndim
    widths[axis] = (max(0, width - x.shape[axis]), 0)
    x = np.pad(x, widths)
    return np.take(x, np.arange(x.shape[axis] - width, x.shape[axis]), axis=axis)


def signal(pool: Pool, judged_on: str) -> np.ndarray:
    """`[n]` bool: the pool's groups DAPO's dynamic sampling keeps, judged on `judged_on`
    (``filtering.signal``: `objectives.dynamic_sampling_signal`)."""
    if not pool.size:
        return np.zeros((0,), bool)
    rows = pool.size * pool.group_size
    rewards = pool.rewards.reshape(rows, *pool.rewards.shape[2:])
    return np.asarray(objectives.dynamic_sampling_signal(
        jnp.asarray(rewards), jnp.asarray(pool.correct.reshape(rows)), pool.group_size,
        judged_on))


@dataclasses.dataclass(frozen=True)
class Budget:
    """How a step spends tokens: `tokens_per_step` (D) new tokens per row and step, to its
    end at the step after its group's `max_carries`-th carry; `num_groups` (P) groups per
    batch; at most `max_draws` new prompt batches per step; `dynamic`: DAPO's test, on
    `signal` (``filtering.signal``)."""

    tokens_per_step: int
    max_carries: int
    num_groups: int
    max_draws: int
    dynamic: bool
    signal: str

    @property
    def capacity(self) -> int:
        """The most groups the pool holds after a draw, (m + 1) P: the pipeline's depth
        (APRIL's over-provisioning). A group is then done m steps after its draw and in
        a batch at most m steps after that."""
        return (self.max_carries + 1) * self.num_groups


def caps(pool: Pool, step: int, budget: Budget) -> np.ndarray:
    """`[n, G]` token caps of this step's resumption: D more than the row's length, or the
    whole buffer once its group was drawn `max_carries` steps ago or earlier; 0 for done rows."""
    n = pool.buffer_len
    last = (step - pool.drawn) >= budget.max_carries
    cap = np.where(last[:, None], n, np.minimum(n, pool.lengths + budget.tokens_per_step))
    return np.where(pool.done, 0, cap).astype(np.int32)


# `gather(x)`: every process's `x` (`[k_i, ...]` numpy, of its own groups), in process
# order; one process's is itself (`alone`). Every process calls it at once.
Gather = Callable[[np.ndarray], list[np.ndarray]]


def alone(value: np.ndarray) -> list[np.ndarray]:
    """The `Gather` of one process."""
    return [value]


@dataclasses.dataclass(frozen=True)
class View:
    """Every process's groups in the run's draw order (`Pool.order`): what `run_step`
    decides on, the same on every process.

    Attributes:
      owner: `[t]` the process holding each group; local: `[t]` its index in that
        process's pool (each pool is in draw order).
      done, ready, dropped: `[t]` bool: every row done; ready for a batch; done without
        signal (dynamic sampling: never in a batch).
    """

    owner: np.ndarray
    local: np.ndarray
    done: np.ndarray
    ready: np.ndarray
    dropped: np.ndarray

    @classmethod
    def of(cls, pool: Pool, budget: "Budget", gather: Gather) -> "View":
        ready = pool.scored & (signal(pool, budget.signal) if budget.dynamic else True)
        flags = np.stack([pool.done.all(axis=1), ready, pool.scored & ~ready], axis=1)
        parts = gather(np.concatenate([pool.order[:, None], flags.astype(np.int64)], axis=1))
        rows = np.concatenate(parts)
        owner = np.concatenate([np.full(len(x), i) for i, x in enumerate(parts)])
        local = np.concatenate([np.arange(len(x)) for x in parts])
        order = np.argsort(rows[:, 0], kind="stable")
        rows, owner, local = rows[order], owner[order], local[order]
        return cls(owner=owner, local=local, done=rows[:, 1] > 0, ready=rows[:, 2] > 0,
                   dropped=rows[:, 3] > 0)

    @property
    def size(self) -> int:
        return self.owner.size

    def mine(self, index: np.ndarray, me: int) -> np.ndarray:
        """The local pool indices of the groups at `index` (view positions) held by `me`."""
        index = np.asarray(index, np.int64)
        return self.local[index[self.owner[index] == me]]


def total(value: float, gather: Gather) -> float:
    """The sum of every process's `value`."""
    return float(np.concatenate(gather(np.asarray([value], np.float64))).sum())


@dataclasses.dataclass
class StepResult:
    """One step's rollouts (`run_step`); with several processes, this process's part.

    Attributes:
      batch: this process's groups of the batch in batch order: the P oldest ready ones,
        then (dynamic sampling short of groups, ``filtering.short_batch="pad"``) done
        groups without signal to fill it; `valid`: `[len(batch)]` bool, False on those.
      owners: `[P']` the process holding each group of the whole batch, in batch order
        (all 0 on one process): process o's groups are its `batch` in that order.
      pool: what carries over to the next step (rows not done, ready groups beyond P).
      completed: per sampling call that completed groups on any process, the groups it
        completed here (scored in that call; possibly none).
      reward_metrics, rows_scored: each such call's reward metrics here (None where it
        completed none here) and rows.
      draws: new prompt batches drawn; forced: groups run to their end to fill the batch
        (both of the whole run, the same on every process).
      generated: tokens sampled this step by this process's rows (fed ones not counted).
    """

    batch: Pool
    valid: np.ndarray
    owners: np.ndarray
    pool: Pool
    completed: list
    reward_metrics: list
    rows_scored: list
    draws: int
    forced: int
    generated: int


def run_step(pool: Pool, *, step: int, budget: Budget, draw: Callable[[int, int], Pool],
             resume: Callable[[Pool, np.ndarray], Pool],
             score: Callable[[Pool], tuple[np.ndarray, np.ndarray, dict[str, Any]]],
             short_batch: str = "error", gather: Gather = alone, me: int = 0) -> StepResult:
    """One step of partial rollouts over `pool` (module docstring of `partial`).

    The rows carried over go on first (`caps`); then, while fewer than P groups are ready,
    the step draws a new prompt batch when it may (`budget.max_draws`, the pool within
    `budget.capacity`), else runs the oldest groups not done to their end. On several
    processes each decision is taken on the `View` of every process's groups.

    Args:
      pool: the groups carried over from the last step (this process's).
      step: this step (the caps count carries from `Pool.drawn`).
      budget: the step's `Budget`.
      draw: `draw(index, cap) -> Pool` samples the step's `index`-th new prompt batch,
        each row up to `cap` tokens (this process's groups of it; every process at once).
      resume: `resume(pool, caps) -> Pool` goes on with every row whose cap (`[n, G]`)
        is above its length, to that cap (every process at once, some with no such row).
      score: `score(groups) -> (rewards, correct, metrics)` for done groups
        (`[k, G(, K)]`, `[k, G]`), this process's only.
      short_batch: dynamic sampling short of groups with signal: "error" or "pad".
      gather, me: the processes' `Gather` and this process's place in it.

    Returns:
      A `StepResult`.
    """
    p = budget.num_groups
    pool = pool.replace(start=pool.lengths.copy())
    calls = dict(completed=[], reward_metrics=[], rows_scored=[])
    generated = 0

    def settle(pool, before):   # scores the groups this call completed
        nonlocal generated
        generated += int(pool.lengths.sum() - before)
        new = np.flatnonzero(pool.done.all(axis=1) & ~pool.scored)
        if not total(new.size, gather):
            return pool
        metrics = None
        if new.size:
            rewards, correct, metrics = score(pool.take(new))
            fields = {k: getattr(pool, k).copy() for k in ("rewards", "correct", "scored")}
            for name, value in (("rewards", rewards), ("correct", correct), ("scored", True)):
                fields[name][new] = value
            pool = pool.replace(**fields)
        calls["completed"].append(pool.take(new))
        calls["reward_metrics"].append(metrics)
        calls["rows_scored"].append(new.size * pool.group_size)
        return pool

    def go_on(pool, cap):
        if not total((cap > pool.lengths).any(), gather):
            return pool
        return settle(resume(pool, cap), pool.lengths.sum())

    pool = go_on(pool, caps(pool, step, budget))
    draws = forced = 0
    view = View.of(pool, budget, gather)
    while view.ready.sum() < p:
        if draws < budget.max_draws and view.size - view.dropped.sum() + p <= budget.capacity:
            fresh = draw(draws, min(budget.tokens_per_step, pool.buffer_len))
            pool = settle(Pool.concatenate([pool, fresh]), pool.lengths.sum())
            draws += 1
        elif not view.done.all():   # the oldest groups not done run to their end
            unready = np.flatnonzero(~view.done)[:p - view.ready.sum()]
            own = view.mine(unready, me)
            cap = np.zeros_like(pool.lengths)
            cap[own] = np.where(pool.done[own], 0, pool.buffer_len)
            pool = go_on(pool, cap)
            forced += unready.size
        else:
            break
        view = View.of(pool, budget, gather)
    chosen = np.flatnonzero(view.ready)[:p]
    dropped = np.flatnonzero(view.dropped)
    filler = np.zeros((0,), np.int64)
    if chosen.size < p:
        if short_batch == "error":
            raise RuntimeError(
                f"dynamic sampling found {chosen.size} groups with signal in {draws} draws of "
                f"{p} prompts and the groups carried over, fewer than the {p} a batch needs. "
                "Raise filtering.max_gen_batches, use harder prompts, or set "
                "filtering.short_batch='pad' to train on the groups found")
        filler = dropped[:p - chosen.size]
    picked = np.concatenate([chosen, filler])
    batch = pool.take(view.mine(picked, me))
    valid = (np.arange(picked.size) < chosen.size)[view.owner[picked] == me]
    leaving = np.zeros(pool.size, bool)
    leaving[view.mine(chosen, me)], leaving[view.mine(dropped, me)] = True, True
    return StepResult(batch=batch, valid=valid, owners=view.owner[picked],
                      pool=pool.take(np.flatnonzero(~leaving)), draws=draws, forced=forced,
                      generated=generated, **calls)


def token_metrics(batch: Pool, valid: np.ndarray, step: int,
                  gather: Gather = alone) -> dict[str, float]:
    """The batch's per-token staleness: over the completion tokens of its real rows (every
    process's), the mean and max of (step - 1) - v, theta_v the parameters that sampled
    the token (``token_staleness_mean``, ``token_staleness_max``), and the share sampled
    at an earlier step than this one (``carried_token_share``)."""
    n = batch.buffer_len
    position = np.arange(n)
    tokens = (position < batch.lengths[..., None]) & valid[:, None, None]
    stale = (step - 1) - batch.version
    carried = position < batch.start[..., None]
    sums = np.asarray([[tokens.sum(), (stale * tokens).sum(), (carried & tokens).sum(),
                        stale[tokens].max() if tokens.any() else 0]], np.int64)
    count, stale_sum, carried_sum, stale_max = np.concatenate(gather(sums)).T
    count_all = max(int(count.sum()), 1)
    return {"token_staleness_mean": float(stale_sum.sum() / count_all),
            "token_staleness_max": float(stale_max.max()),
            "carried_token_share": float(carried_sum.sum() / count_all)}


def batch_rows(batch: Pool) -> dict[str, np.ndarray]:
    """The groups' rows as the sampler's `[B, ...]` row arrays (`rollout.draw`'s keys),
    B = groups x G; prompts cut to the widest group's bucket."""
    g, n = batch.group_size, batch.buffer_len
    width = int(batch.prompt_width.max()) if batch.size else batch.prompt_tokens.shape[1]
    lengths = batch.lengths.reshape(-1)
    repeat = lambda x: np.repeat(x[:, -width:], g, axis=0)
    rows = {"prompt_tokens": repeat(batch.prompt_tokens), "prompt_mask": repeat(batch.prompt_mask),
            "tokens": batch.tokens.reshape(-1, n),
            "mask": (np.arange(n)[None] < lengths[:, None]).astype(np.int32),
            "behaviour_logp": batch.logp.reshape(-1, n), "lengths": lengths,
            "truncated": ~batch.stopped.reshape(-1),
            "rewards": batch.rewards.reshape(-1, *batch.rewards.shape[2:]),
            "correct": batch.correct.reshape(-1),
            **{k: getattr(batch, k).reshape(-1, *getattr(batch, k).shape[2:])
               for k in batch.fields if k in batch.RECORDS}}
    if "prompt_routing" in rows:
        rows["prompt_routing"] = rows["prompt_routing"][:, -width:]
    return rows

