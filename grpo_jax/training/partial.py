"""Partial rollouts: a per-step token budget; rows not done by it carry over to the next step.

Kimi k1.5 (Kimi Team, arXiv:2501.12599, sec. 2.6.2, "partial rollouts") gives every
trajectory a fixed token budget per rollout iteration: a longer one is saved and goes on
in the next iteration, so a few long answers do not hold up a step. APRIL (Zhou et al.,
arXiv:2509.18521) draws more than a batch needs, trains on what finishes first and
recycles the unfinished rows into the next step. With ``rollout.partial.enabled``
(D = ``tokens_per_step``, m = ``max_carries``, P = ``rollout.prompts_per_batch``), step t:

1. **Resumes** every row carried over, under the parameters that sample step t: its
   tokens so far are fed into its cache (`sampling.Engine`'s queued tokens, one per decode
   step, not counted in D) and it samples at most D more, or runs to its end when its
   group was drawn m steps ago (a row is carried over at most m times).
2. **Draws** P new prompts while fewer than P groups are ready, each row sampling at
   most D tokens: at most ``filtering.max_gen_batches`` times, and only while the pool
   stays within (m + 1) P groups (the pipeline's depth, APRIL's over-provisioning). A
   group is ready once all its G rows are done (stop token or
   ``rollout.max_new_tokens``) and scored; with dynamic sampling also its rewards must
   differ (a done group without signal is dropped, as DAPO drops it).
3. **Forces**: still short, the oldest groups not done run to their end until P are ready.
4. **Trains** on the P oldest ready groups (carried ones before new ones, in draw order):
   a batch of P whole groups, always. Rows not done and ready groups beyond P wait in the
   pool for step t + 1 (the pool carries over; `partial_pool.run_step` is the host's part).

Every token keeps the behaviour log-prob and the version of the parameters that sampled
it; the new tokens of a resumed row get the new parameters'. With
``train.old_logp="recompute"`` the trainer's pi_old is the proximal policy of decoupled
PPO (Hilton et al., arXiv:2110.00641): the parameters that sample step t, for every
token, and `objective.importance` / M2PO weigh each token against its own sampler. A
row draws token t with ``fold_in(its key, t)`` whatever step samples it, its key being
its draw's (rng, prompt index, completion index) as in `sampling.row_keys`. With
``rollout.keep_sampling_mask`` a token also keeps the support its sampler's cut kept and
its behaviour log-prob is the cut distribution's (`rollout.draw`'s), so a row finished
over several steps has the records of the row sampled in one go under the same parameters.
With ``rollout.keep_routing`` a row keeps the experts of its prompt and tokens as the step
that last ran it routed them: a resumption feeds the prompt and the earlier tokens through
the model again, so one routing per token holds for the tokens it sampled (and, under the
same parameters, for every token).

On several processes each process carries the groups of its own prompts (the rows it
holds of each draw) and `partial_pool.run_step` takes every decision (draw, force, which
groups form the batch and which carry over) on every process's groups in the run's draw
order, gathered (`parallel.allgather_rows`); a resumption gathers the rows that go on into
one `sampling.Engine`, in that order, and the batch is put together on the mesh from
each process's groups of it. A checkpoint saves every process's pool as one.
"""

import functools
import math
import time
from collections.abc import Iterator
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from grpo_jax import parallel, sampling
from grpo_jax.training import partial_pool, rollout, task as task_lib
from grpo_jax.training import policy as policy_lib
from grpo_jax.training.partial_pool import Pool


def check_config(config: Any, process_count: int) -> None:
    """Raises ValueError naming the field for partial-rollout settings the loop cannot run."""
    cfg = config.rollout.partial   # enabled is a bool: the config's types hold it
    if not cfg.enabled:
        return
    if not isinstance(cfg.tokens_per_step, int) or cfg.tokens_per_step < 1:
        raise ValueError(f"rollout.partial.tokens_per_step must be an int >= 1 (the tokens a row "
                         f"samples per step), got {cfg.tokens_per_step!r}")
    if not isinstance(cfg.max_carries, int) or cfg.max_carries < 1:
        raise ValueError(f"rollout.partial.max_carries must be an int >= 1 (0 carries nothing: "
                         f"set rollout.partial.enabled=False), got {cfg.max_carries!r}")
    if config.filtering.max_gen_batches < 2:
        raise ValueError(f"rollout.partial.enabled needs filtering.max_gen_batches >= 2, got "
                         f"{config.filtering.max_gen_batches}: with one draw a step runs every "
                         "group it drew to its end to fill the batch, and nothing carries over")
    if config.environment.name:
        raise ValueError(f"rollout.partial.enabled with environment.name="
                         f"{config.environment.name!r}: multi-turn episodes run their own engine "
                         "loop, which does not carry rows over; set one of them off")
    if process_count > 1 and config.rollout.mesh:
        raise ValueError(f"rollout.partial.enabled with rollout.mesh={config.rollout.mesh!r} on "
                         f"{process_count} processes: process roles do not carry a pool across "
                         "processes; set rollout.mesh='' or rollout.partial.enabled=False")
    if process_count > 1 and config.train.sft_weight:
        raise ValueError(f"rollout.partial.enabled with train.sft_weight={config.train.sft_weight}"
                         f" on {process_count} processes: each process's share of the batch's "
                         "prompts varies from step to step; set train.sft_weight=0")


def empty_pool(config: ml_collections.ConfigDict, scorer: task_lib.Scorer,
               model_cfg: Any) -> Pool | None:
    """The pool of a run's start: no groups (a run that carries nothing keeps None), with
    the records the run keeps (`support_k`, `routing_shape`)."""
    if not config.rollout.partial.enabled:
        return None
    columns = (len(scorer.weights),) if scorer.separate else ()
    return Pool.empty(config.objective.group_size, config.rollout.max_new_tokens, columns,
                      support_k(config, model_cfg), routing_shape(config, model_cfg))


def support_k(config: Any, model_cfg: Any) -> int:
    """K, the support ids the run's sampler records per position (`rollout.record_layout`);
    0 without ``rollout.keep_sampling_mask``."""
    layout = rollout.record_layout(config, model_cfg, 1, 1, 1)
    return layout["support_ids"][0][-1] if "support_ids" in layout else 0


def routing_shape(config: Any, model_cfg: Any) -> tuple[int, ...]:
    """`(L_moe, k)` of the experts the run's sampler records per token with
    ``rollout.keep_routing`` (`rollout.record_layout`); () without."""
    if not config.rollout.keep_routing:
        return ()
    return tuple(rollout.record_layout(config, model_cfg, 1, 1, 1)["routing"][0][2:])


def restored_pool(arrays: Any, info: Any, config: Any, model_cfg: Any) -> Pool:
    """This process's groups of the pool a checkpoint holds (`to_checkpoint`), with the
    records the run keeps (`Pool.with_support`, `Pool.with_routing`)."""
    pool = Pool.from_checkpoint(arrays, info).with_support(support_k(config, model_cfg))
    pool = pool.with_routing(routing_shape(config, model_cfg))
    return own_groups(pool, config.rollout.prompts_per_batch)


def gather(value: np.ndarray) -> list[np.ndarray]:
    """`partial_pool.Gather` over the processes acting together."""
    return parallel.allgather_rows(value)


def to_checkpoint(pool: Pool) -> tuple[dict[str, np.ndarray] | None, dict[str, Any]]:
    """`Pool.to_checkpoint` of every process's pool as one (in draw order): the same on
    every process (each calls it at once)."""
    return whole_pool(pool).to_checkpoint()


def whole_pool(pool: Pool) -> Pool:
    """Every process's groups in one pool, in the run's draw order (`Pool.order`)."""
    if parallel.process_count() == 1:
        return pool
    arrays = {k: np.concatenate(gather(getattr(pool, k))) for k in pool.fields
              if k not in partial_pool.PROMPT_AXIS}
    width = parallel.agree_max(pool.prompt_tokens.shape[1])
    for k, axis in partial_pool.PROMPT_AXIS.items():
        if k in pool.fields:
            arrays[k] = np.concatenate(gather(partial_pool.left_pad(getattr(pool, k), width,
                                                                    axis)))
    examples, texts = (sum(parallel.allgather_json(list(getattr(pool, k))), [])
                       for k in ("examples", "texts"))
    whole = Pool(**arrays, examples=tuple(examples), texts=tuple(texts))
    return whole.take(np.argsort(whole.order, kind="stable"))


def own_groups(pool: Pool, num_groups: int) -> Pool:
    """The groups of `pool` (every process's, `whole_pool`) this process holds: those of
    its share of each draw's `num_groups` prompts (`Pool.order`)."""
    share = num_groups // parallel.process_count()
    return pool.take(np.flatnonzero(pool.order % num_groups // share == parallel.process_index()))


def budget(config: Any) -> partial_pool.Budget:
    """The run's `partial_pool.Budget`."""
    cfg = config.rollout.partial
    return partial_pool.Budget(
        tokens_per_step=cfg.tokens_per_step, max_carries=cfg.max_carries,
        num_groups=config.rollout.prompts_per_batch, max_draws=config.filtering.max_gen_batches,
        dynamic=config.filtering.dynamic_sampling, signal=config.filtering.signal)


# The sampler's outputs a pool keeps (`_Sampler`), besides its records (`Pool.RECORDS`).
_OUT = ("tokens", "logp", "sample_logp", "lengths", "truncated")


def _row_bucket(rows, ways):
    """Rows of a resumption, padded: `ways` times a power of two (few compiled shapes)."""
    return ways * 2 ** math.ceil(math.log2(max(1, math.ceil(rows / ways))))


class _Sampler:
    """One step's sampling for `partial_pool.run_step`: new prompt batches (`draw`) and
    carried rows going on (`resume`), by `policy` (parameters of version `version`) on
    `mesh`; rows in and out as host numpy."""

    def __init__(self, policy, mesh, train_iter, *, config, method, rng, step, version,
                 reward_columns):
        self.policy, self.mesh, self.train_iter, self.config = policy, mesh, train_iter, config
        self.method, self.rng, self.step, self.version = method, rng, step, version
        self.group_size = config.objective.group_size
        self.buffer_len = config.rollout.max_new_tokens
        self.reward_columns = reward_columns
        self.keep_support = config.rollout.keep_sampling_mask
        self.keep_routing = config.rollout.keep_routing
        self.records = (Pool.RECORDS[:2] if self.keep_support else ()) + (
            Pool.RECORDS[2:] if self.keep_routing else ())
        # The behaviour log-prob (`rollout.draw`): of the cut distribution with keep mask.
        self.logp_key = "sample_logp" if self.keep_support else "logp"

    def draw(self, index: int, cap: int) -> Pool:
        """The step's `index`-th prompt batch, sampled with ``fold_in(rng, index)`` (as
        `rollout.collect`'s draws), each row up to `cap` tokens."""
        config, g, n = self.config, self.group_size, self.buffer_len
        examples = next(self.train_iter)
        rng = jax.random.fold_in(self.rng, index)
        texts, tokens, mask = task_lib.prompt_rows(config.task, examples, self.policy.tokenizer)
        task_lib.check_positions(int(np.max(np.sum(mask, axis=1))), n,
                                 self.policy.model_config().max_position_embeddings,
                                 "a train batch")
        prompts = parallel.global_rows(self.mesh, {"tokens": tokens, "mask": mask})
        out, _ = rollout.sample_on_mesh(
            self.policy, self.mesh, prompts, rng=rng, method=self.method, group_size=g,
            max_new_tokens=cap, buffer_len=n, rules=config.rollout.rules,
            slots=config.rollout.slots, record_support=self.keep_support,
            record_routing=self.keep_routing)
        out = {k: parallel.local_rows(getattr(out, k))   # this process's prompts' rows
               for k in _OUT + self.records}
        p = len(examples)
        first = parallel.process_index() * p   # the draw's index of this process's first prompt
        ids = jnp.arange(first, first + p, dtype=jnp.int32)
        keys = jax.random.key_data(sampling.row_keys(rng, ids, g))
        draws = self.step * config.filtering.max_gen_batches + index   # the run's draws before
        order = draws * p * parallel.process_count()
        grouped = lambda x: np.asarray(x).reshape(p, g, *np.shape(x)[1:])
        return Pool(
            prompt_tokens=np.asarray(tokens, np.int32), prompt_mask=np.asarray(mask, np.int32),
            prompt_width=np.full(p, tokens.shape[1], np.int32),
            drawn=np.full(p, self.step, np.int32), order=order + np.arange(first, first + p),
            scored=np.zeros(p, bool), keys=grouped(keys).astype(np.uint32),
            tokens=grouped(out["tokens"]), logp=grouped(out[self.logp_key]),
            version=np.full((p, g, n), self.version, np.int32), lengths=grouped(out["lengths"]),
            stopped=~grouped(out["truncated"]), start=np.zeros((p, g), np.int32),
            rewards=np.zeros((p, g, *self.reward_columns), np.float32),
            correct=np.zeros((p, g), bool), examples=tuple(examples), texts=tuple(texts),
            **{k: grouped(out[k]) for k in Pool.RECORDS if k in out})

    def resume(self, pool: Pool, cap: np.ndarray) -> Pool:
        """`pool` with every row whose cap (`[n, G]`) is above its length gone on to it:
        the row's tokens so far fed, then sampled on under this step's parameters; the
        tokens it had keep their log-probs, versions and supports; with keep routing the
        row takes this step's experts (of its prompt and of every token: all routed again)."""
        group, row = np.nonzero(cap > pool.lengths)
        lengths = pool.lengths[group, row]
        out = self._continue(pool, group, row, cap[group, row])
        new = np.arange(pool.buffer_len)[None] >= lengths[:, None]   # this step's tokens
        fields = {k: getattr(pool, k).copy() for k in ("tokens", "logp", "version", "lengths",
                                                       "stopped") + self.records}
        fields["tokens"][group, row] = np.where(new, out["tokens"], pool.tokens[group, row])
        fields["logp"][group, row] = np.where(new, out[self.logp_key], pool.logp[group, row])
        for k in Pool.RECORDS[:2] if self.keep_support else ():   # fed tokens record none
            fresh = new.reshape(*new.shape, *[1] * (out[k].ndim - 2))
            fields[k][group, row] = np.where(fresh, out[k], getattr(pool, k)[group, row])
        if self.keep_routing:   # this step routed the prompt and every token again
            fields["routing"][group, row] = out["routing"]
            fields["prompt_routing"][group, row] = partial_pool.left_pad(
                out["prompt_routing"], pool.prompt_tokens.shape[1])
        fields["version"][group, row] = np.where(new, self.version, pool.version[group, row])
        fields["lengths"][group, row] = out["lengths"]
        fields["stopped"][group, row] = ~out["truncated"]
        return pool.replace(**fields)

    def _continue(self, pool, group, row, cap):
        """This process's rows (`group`, `row`) of `pool` continued to `cap` tokens (host
        arrays `_OUT`, and the records the run keeps): every process's rows that
        go on in one `sampling.Engine` (each row its own prompt, key and queued tokens), in
        the run's draw order, padded to `_row_bucket` rows with one-token rows."""
        config, policy, n = self.config, self.policy, self.buffer_len
        width = parallel.agree_max(int(pool.prompt_width[group].max()) if group.size else 1)
        prompt = lambda x: partial_pool.left_pad(x[group], width)
        own = {"place": np.stack([pool.order[group], row], axis=1), "cap": cap,
               "prompt_tokens": prompt(pool.prompt_tokens), "prompt_mask": prompt(pool.prompt_mask),
               "keys": pool.keys[group, row], "tokens": pool.tokens[group, row],
               "lengths": pool.lengths[group, row]}
        parts = {k: gather(v) for k, v in own.items()}
        every = {k: np.concatenate(v) for k, v in parts.items()}
        owner = np.concatenate([np.full(len(x), i) for i, x in enumerate(parts["cap"])])
        index = np.concatenate([np.arange(len(x)) for x in parts["cap"]])
        order = np.lexsort((every["place"][:, 1], every["place"][:, 0]))   # draw order
        every = {k: v[order] for k, v in every.items()}
        count = order.size
        total = _row_bucket(count, parallel.row_ways(self.mesh))
        pad = lambda x: np.concatenate([x, np.repeat(x[:1], total - count, axis=0)])
        queued = [t[:length].tolist() for t, length in zip(every["tokens"], every["lengths"])]
        slots = config.rollout.slots if 0 < config.rollout.slots < total else total
        with jax.set_mesh(self.mesh):
            engine = sampling.Engine(
                policy.graphdef, policy.params, pad(every["prompt_tokens"]),
                pad(every["prompt_mask"]),
                keys=jax.random.wrap_key_data(jnp.asarray(pad(every["keys"]))),
                method=self.method, group_size=1,
                max_new_tokens=np.concatenate([every["cap"], np.ones(total - count, np.int32)]),
                stop_tokens=[policy.tokenizer.eos_token_id], pad_id=policy.tokenizer.pad_token_id,
                slots=slots, max_append=n, queued=queued + [[]] * (total - count),
                max_len_bucket=n, rules=config.rollout.rules,
                record_support=self.keep_support, record_routing=self.keep_routing)
            while not engine.finished:
                engine.run()
            out = sampling.to_host(engine.rollout())
        mine = owner[order] == parallel.process_index()
        back = np.empty(group.size, np.int64)   # this process's rows, in the order they came
        back[index[order][mine]] = np.flatnonzero(mine)
        return {k: getattr(out, k)[back] for k in _OUT + self.records}


def _scorer_of(scorer, tokenizer):
    """`run_step`'s `score`: the done groups' rows decoded and scored (`rollout.draw`'s
    call), rewards and correctness per group."""
    def score(groups):
        rows = partial_pool.batch_rows(groups)
        completions = task_lib.decode_completions(tokenizer, rows["tokens"], rows["mask"])
        repeat = lambda items: [item for item in items for _ in range(groups.group_size)]
        rewards, correct, metrics = scorer(repeat(groups.texts), completions,
                                           repeat(groups.examples), rows["lengths"])
        grouped = lambda x: x.reshape(groups.size, groups.group_size, *x.shape[1:])
        return grouped(rewards), grouped(correct), metrics
    return score


def collect(
    policy: policy_lib.Policy, mesh: jax.sharding.Mesh,
    train_iter: Iterator[list[dict[str, Any]]], carry: Pool, *, config: ml_collections.ConfigDict,
    scorer: task_lib.Scorer, rng: jax.Array, method: Any, step: int, version: int,
) -> tuple[dict[str, jax.Array], dict[str, float], list[dict[str, Any]], Pool]:
    """`rollout.collect` with partial rollouts: one train batch of P x G rows on the mesh
    from the groups carried over (`carry`, a `Pool`) and new prompts, with version
    `version` of the parameters (`policy`) sampling at step `step`.

    Returns `(batch, metrics, examples, carry)`: the batch (`rollout.select_groups`'
    layout), the step's rollout metrics, the batch's examples and the pool for step + 1.
    The rollout statistics (`rollout.rollout_statistics`: reward, accuracy, lengths) are
    over the groups completed this step (absent from a step that completed none);
    ``generated_tokens`` counts the tokens sampled this step.
    """
    begin = time.time()
    group_size, num_groups = config.objective.group_size, config.rollout.prompts_per_batch
    sampler = _Sampler(policy, mesh, train_iter, config=config, method=method, rng=rng, step=step,
                       version=version, reward_columns=carry.rewards.shape[2:])
    spend = budget(config)
    result = partial_pool.run_step(
        carry, step=step, budget=spend, draw=sampler.draw, resume=sampler.resume,
        score=_scorer_of(scorer, policy.tokenizer), short_batch=config.filtering.short_batch,
        gather=gather, me=parallel.process_index())
    pad_id = int(policy.tokenizer.pad_token_id)
    batch = rollout.select_groups((_batch_on_mesh(mesh, result),), mesh=mesh,
                                  group_size=group_size, num_groups=num_groups,
                                  dynamic=spend.dynamic, pad_id=pad_id, signal=spend.signal)
    metrics = {}
    if result.completed:
        stats = rollout.rollout_statistics(_completed_rows(mesh, result.completed),
                                           jnp.asarray(scorer.weights), group_size=group_size,
                                           signal=spend.signal)
        metrics = rollout.host_statistics(stats)
        pieces = [(m, r) for call in parallel.allgather_json(
            list(zip(result.reward_metrics, result.rows_scored))) for m, r in call if r]
        metrics.update(rollout.combine_reward_metrics([m for m, _ in pieces],
                                                      rows=[r for _, r in pieces]))
    seconds = time.time() - begin
    generated = partial_pool.total(result.generated, gather)
    metrics.update(partial_pool.token_metrics(result.batch, result.valid, step, gather))
    valid = partial_pool.total(result.valid.sum(), gather)
    metrics.update(
        gen_batches=float(result.draws), time_rollout=seconds, generated_tokens=generated,
        rollout_tokens_per_s=generated / max(seconds, 1e-9),
        batch_filled=valid / num_groups if spend.dynamic else 1.0,
        carried_groups=partial_pool.total(result.pool.size, gather),
        forced_groups=float(result.forced))
    return batch, metrics, list(result.batch.examples), result.pool


def _completed_rows(mesh, completed):
    """`rollout.rollout_statistics`' draws: the rows of the groups each sampling call
    completed, on the mesh; on several processes every process's, whole on each."""
    if parallel.process_count() == 1:
        return tuple(parallel.global_rows(mesh, partial_pool.batch_rows(groups))
                     for groups in completed)
    groups = Pool.concatenate(completed)
    rows = {"rewards": groups.rewards.reshape(-1, *groups.rewards.shape[2:]),
            "correct": groups.correct.reshape(-1), "lengths": groups.lengths.reshape(-1),
            "truncated": ~groups.stopped.reshape(-1)}
    return ({k: np.concatenate(gather(v)) for k, v in rows.items()},)


def _batch_on_mesh(mesh, result):
    """The batch's rows (`partial_pool.batch_rows` of every process's groups of it, in batch
    order) as global arrays on the mesh. On several processes each puts its groups,
    padded to as many as any holds, and one gather on the mesh orders them."""
    rows = partial_pool.batch_rows(result.batch)
    if parallel.process_count() == 1:
        return parallel.global_rows(mesh, rows)
    g, ways = result.batch.group_size, parallel.row_ways(mesh)
    count, processes = parallel.agree_max(result.batch.size), parallel.process_count()
    while not parallel.rows_divide(processes * count * g, ways):
        count += 1
    width = parallel.agree_max(int(result.batch.prompt_width.max()) if result.batch.size else 1)
    padded = {}
    for k, x in rows.items():
        if k in partial_pool.PROMPT_AXIS:   # rows: the prompt is axis 1
            x = partial_pool.left_pad(x, width)
        padded[k] = np.concatenate([x, np.zeros((count * g - len(x), *x.shape[1:]), x.dtype)])
    place = np.zeros(len(result.owners), np.int64)   # each group's place in its process's part
    for o in range(processes):
        place[result.owners == o] = np.arange(np.sum(result.owners == o))
    groups = result.owners * count + place
    index = (groups[:, None] * g + np.arange(g)).reshape(-1)
    return _take_rows(parallel.global_rows(mesh, padded), index, mesh=mesh)


@functools.partial(jax.jit, static_argnames=("mesh",))
def _take_rows(rows, index, *, mesh):
    """Rows `index` of every array of `rows`, split over the mesh's row axes."""
    taken = jax.tree.map(lambda x: jnp.take(x, index, axis=0), rows)
    return jax.lax.with_sharding_constraint(taken, parallel.rows_sharding(mesh, index.shape[0]))
