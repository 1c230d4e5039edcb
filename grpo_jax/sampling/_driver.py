"""`Engine`: continuous batching driven from the host, for rows that pause and resume.

`generate(slots=C)` runs the engine's whole loop in one jitted call. A multi-turn rollout
needs the host in the loop: a row that emits a tool call must wait while the host runs
the tool, then take the tool's reply and go on. A partial rollout needs to stop at a
step budget and go on later. `Engine` runs the same loop (`_engine.engine_step`) in
jitted calls that return to the host:

    engine = Engine(graphdef, state, prompts, mask, rng=key, method=method, group_size=8,
                    max_new_tokens=1024, stop_tokens=[eos], pad_id=pad, slots=64,
                    pause_tokens=[tool_call_end])
    while not engine.finished:
        for row in engine.run():                       # the rows that paused
            reply = run_tool(engine.row_tokens(row))      # the host's work
            engine.resume({row: reply}) if reply else engine.end([row])
    rollout = engine.rollout()                         # rollout.appended: the replies

A row pauses right after it samples a pause token (that token is its last so far, fed
into its cache). `run` returns as soon as any row pauses, so a paused row never waits
through a decode step: its ring columns stay its own (`_engine`'s ring holds a row only
while it is written every step). `resume` queues tokens for a paused row; the row feeds
them one per step, each into its cache like a sampled token (nothing before them is
recomputed), while the other slots go on sampling, then samples again. Queued tokens
count against the row's `max_new_tokens` like sampled ones and are marked in
`Rollout.appended`; their `logp` is the model's log-prob of them, their `sample_logp` 0.
`end` finishes a paused row (stop reason: stop token). Rows can also start with queued
tokens (`queued=`): a partial rollout's earlier tokens, fed before the row samples again.

A token's random key is (rng, prompt id, completion index, position in the row), so a
row samples the same tokens whatever the schedule and however long the host took. A row
carried over from another call (a partial rollout) brings its own key (`keys=`) and goes
on drawing from its stream at the position where it stopped.

On a mesh spanning several processes every process runs the same loop at once (`run`
and `answer` are collectives; `finished` and `unfinished` read flags every process holds
alike). The rows' outputs and queues are split over the
mesh's row axes like the prompts' rows (`parallel.global_rows`), so each process holds
the rows of its own prompts (`own_rows`): `run` returns the paused rows it holds, the host
reads and answers only those (`turn_tokens` reads them from its own devices), and `answer`
puts every process's replies into the global queue, each process giving its own rows'.
Which slots are live or paused, and their rows, are agreed once per call inside the
program that changed them (`_start`, `_run`, `_resume` return them whole on every
device, a few flags per slot): the host reads its own copy, so a pause costs no
collective of its own. With one process it holds every row.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from grpo_jax import parallel
from grpo_jax.sampling._api import check_request, check_slots
from grpo_jax.sampling._engine import _admit, engine_step, init_slots, prefill_prompts, rollout_of
from grpo_jax.sampling._generate import _int32, _on_mesh, _shard_rows, row_keys

# What `answer` does to a row (`_resume`'s action_b).
KEEP, RESUME, END_STOPPED, END_TRUNCATED = 0, 1, 2, 3
# The carry's per-row fields (`[B, ...]`), split over the mesh's row axes (`_split_rows`).
_ROW_FIELDS = ("tokens", "logp", "sample_logp", "lengths", "stopped", "support_ids",
               "support_size", "routing")
_TURN_ROW_FIELDS = ("queue", "queued", "fed", "appended", "turn_len")


def _split_rows(slots, batch_axes, ways):
    """`slots` with its per-row fields split over the mesh's row axes as the prompts'
    rows are, so a process holds the rows of its own prompts (left to XLA they came out
    whole on every device); the slots' own fields stay as the decode step leaves them."""
    rows, turn_rows = _shard_rows(({k: getattr(slots, k) for k in _ROW_FIELDS},
                                   {k: getattr(slots.turns, k) for k in _TURN_ROW_FIELDS}),
                                  batch_axes, ways)
    return slots.replace(**rows, turns=slots.turns.replace(**turn_rows))


def _flags(slots):
    """`[3 C + 1]` int32, whole on every device: the slots' live and paused flags, their
    rows, then the next row to admit. Gathered in the program that made the slots (one
    all-gather per call), so every process reads the same flags from its own devices."""
    flags = jnp.concatenate([slots.live.astype(jnp.int32), slots.turns.paused.astype(jnp.int32),
                             slots.row.astype(jnp.int32), slots.next_row.astype(jnp.int32)[None]])
    if jax.sharding.get_abstract_mesh().empty:
        return flags
    return jax.lax.with_sharding_constraint(flags, jax.sharding.PartitionSpec())


@functools.partial(jax.jit, static_argnames=("graphdef", "group_size", "buffer_len", "num_slots",
                                             "rules", "record_support", "record_routing"))
def _start(graphdef, state, prompt_tokens, prompt_mask, rng, prompt_ids, queue, queued, pad_id,
           method, turn_budget, *, group_size, buffer_len, num_slots, rules, record_support,
           record_routing):
    """Prefills the prompts and admits the first rows: `(carry, its `_flags`, (prompt
    cache, prompt logits, row keys), prompt experts or None)`."""
    state, batch_axes, ways = _on_mesh(state, rules)
    p, s = prompt_tokens.shape
    model = nnx.merge(graphdef, state)
    prompt_logits, prompt_cache, experts, records = prefill_prompts(
        model, prompt_tokens, prompt_mask, method=method, record_support=record_support,
        record_routing=record_routing)
    b = p * group_size
    slots = init_slots(model, prompt_logits, rows=b, prompt_len=s, buffer_len=buffer_len,
                       num_slots=num_slots, pad_id=pad_id, queue=queue, queued=queued,
                       turn_budget=turn_budget, **records)
    slots = _split_rows(_admit(slots, prompt_cache, prompt_logits, group_size=group_size,
                               num_rows=b), batch_axes, ways)
    return (slots, _flags(slots), (prompt_cache, prompt_logits,
                                   row_keys(rng, prompt_ids, group_size)), experts)


@functools.partial(jax.jit, static_argnames=("graphdef", "group_size", "rules"),
                   donate_argnames=("slots",))
def _run(graphdef, state, slots, prompt_cache, prompt_logits, keys_b, cap_b, method, stop_tokens,
         pause_tokens, pad_id, max_steps, *, group_size, rules):
    """Decode steps until every row is done, a row pauses, or `max_steps` steps ran:
    `(carry, its `_flags`)`."""
    state, batch_axes, ways = _on_mesh(state, rules)
    b = keys_b.shape[0]
    slots = _admit(slots, prompt_cache, prompt_logits, group_size=group_size, num_rows=b)
    step = functools.partial(engine_step, graphdef, state, prompt_cache=prompt_cache,
                             prompt_logits=prompt_logits, keys_b=keys_b, cap_b=cap_b,
                             method=method, stop_tokens=stop_tokens, pad_id=pad_id,
                             group_size=group_size, batch_axes=batch_axes, ways=ways,
                             pause_tokens=pause_tokens)

    def cond(carry):
        slots, steps = carry
        return jnp.any(slots.live) & ~jnp.any(slots.turns.paused) & (steps < max_steps)

    slots, _ = jax.lax.while_loop(cond, lambda carry: (step(carry[0]), carry[1] + 1),
                                  (slots, jnp.zeros((), jnp.int32)))
    slots = _split_rows(slots, batch_axes, ways)
    return slots, _flags(slots)


@functools.partial(jax.jit, donate_argnames=("slots",))
def _resume(slots, action_b, tokens_bq, lengths_b):
    """Answers paused rows: row b resumes with `tokens_bq[b, :lengths_b[b]]` queued where
    `action_b[b]` is RESUME, ends stopped (END_STOPPED) or truncated (END_TRUNCATED), and
    is left as it is where KEEP. Returns `(carry, its `_flags`)`."""
    turns, b = slots.turns, slots.tokens.shape[0]
    action_c = jnp.where(slots.row < b, action_b[jnp.minimum(slots.row, b - 1)], KEEP)
    resumed_c = turns.paused & (action_c == RESUME)
    ended_c = turns.paused & ((action_c == END_STOPPED) | (action_c == END_TRUNCATED))
    resume_b = action_b == RESUME
    slots = slots.replace(
        live=slots.live | resumed_c,
        stopped=slots.stopped | (action_b == END_STOPPED),
        turns=turns.replace(
            paused=turns.paused & ~(resumed_c | ended_c),
            queue=jnp.where(resume_b[:, None], tokens_bq, turns.queue),
            queued=jnp.where(resume_b, lengths_b, turns.queued),
            fed=jnp.where(resume_b, 0, turns.fed),
        ),
    )
    mesh = jax.sharding.get_abstract_mesh()
    if not mesh.empty:
        slots = _split_rows(slots, parallel.row_axes(mesh), parallel.row_ways(mesh))
    return slots, _flags(slots)


class Engine:
    """Continuous batching in `slots` decode slots, run from the host in steps, with rows
    that pause on `pause_tokens` and resume with appended tokens (module docstring).

    Args:
      graphdef, state, prompt_tokens, prompt_mask, rng, method, group_size,
        max_new_tokens, stop_tokens, pad_id, prompt_ids, max_len_bucket, rules: as
        `generate` (max_new_tokens: the whole row's budget, appended tokens included).
      keys: `[P*G]` PRNG keys, one per row, in place of `rng` (and `prompt_ids`): row b
        draws its token t with ``fold_in(keys[b], t)``, so a row carried over from another
        call (with its tokens so far `queued`) samples on from its own stream.
      slots: C, the rows decoding at once (a multiple of the mesh's row ways).
      pause_tokens: ids after which a sampled row pauses for the host (e.g. the end of a
        tool call); may be empty.
      max_append: Q, the most tokens one `resume` (or `queued`) gives a row.
      turn_budget: a row also pauses each time it has sampled another `turn_budget`
        tokens since it last fed one (a per-turn budget: the host ends the row, or
        resumes it for another budget's worth); 0: no per-turn budget.
      queued: None, or one token list per row (P*G) fed before the row first samples
        (the same lists on every process).
      record_support, record_routing: as `generate` (fed tokens record no support).

    Attributes:
      own_rows: the rows this process holds (ascending ids; every row on one process):
        those `run` returns, `turn_tokens` reads and `answer` takes.
    """

    def __init__(self, graphdef, state, prompt_tokens, prompt_mask, *, method, group_size,
                 max_new_tokens, stop_tokens, pad_id, slots, rng=None, keys=None, pause_tokens=(),
                 max_append=64, turn_budget=0, queued=None, prompt_ids=None, max_len_bucket=None,
                 rules="sampling", record_support=False, record_routing=False):
        if (rng is None) == (keys is None):
            raise ValueError("give the Engine rng (each row's key drawn from it) or keys (one "
                             "per row), not both")
        max_len_bucket, prompt_ids = check_request(
            prompt_tokens, prompt_mask, group_size, max_new_tokens, max_len_bucket, rules,
            prompt_ids,
        )
        rows = np.shape(prompt_tokens)[0] * group_size
        if not 1 <= slots <= rows:
            raise ValueError(f"slots={slots} must be in [1, P*G={rows}]")
        check_slots(slots)
        if max_append < 1:
            raise ValueError(f"max_append={max_append} must be >= 1")
        if turn_budget < 0:
            raise ValueError(f"turn_budget={turn_budget} must be >= 0 (0: none)")
        self.turn_budget = int(turn_budget)
        self.max_append, self.rows, self.slots = int(max_append), rows, int(slots)
        queue, lengths = self._queue(queued or [[]] * rows, rows=range(rows), name="queued")
        self._graphdef, self._state, self._rules, self._group_size = (
            graphdef, state, rules, group_size,
        )
        self._prompts = (_int32(prompt_tokens), _int32(prompt_mask))
        self._method, self._pad_id = method, _int32(pad_id)
        self._stop_tokens = _int32(stop_tokens).reshape(-1)
        self._pause_tokens = _int32(pause_tokens).reshape(-1)
        self._cap_b = jnp.broadcast_to(_int32(max_new_tokens), (rows,))
        if keys is not None and np.shape(keys) != (rows,):
            raise ValueError(f"keys has shape {np.shape(keys)}; give one key per row ({rows},)")
        self._slots, flags, self._prompt_state, self._prompt_experts = _start(
            graphdef, state, *self._prompts, jax.random.key(0) if rng is None else rng,
            _int32(prompt_ids), queue, lengths, self._pad_id,
            method, _int32(turn_budget or int(max_len_bucket) + 1), group_size=group_size,
            buffer_len=int(max_len_bucket), num_slots=self.slots, rules=rules,
            record_support=bool(record_support), record_routing=bool(record_routing))
        if keys is not None:   # `_start` drew keys from a placeholder: the rows' own replace them
            self._prompt_state = (*self._prompt_state[:2], keys)
        self._row_sharding = self._slots.lengths.sharding
        self.own_rows = parallel.held_rows(self._row_sharding, rows)   # every row on one process
        self._paused = np.zeros((0,), np.int64)   # this process's paused rows not yet answered
        self._read_flags(flags)

    def _read_flags(self, flags):
        """Keeps the slots' flags (`_flags`, whole on this process's devices: no collective)
        as numpy: `_live`, `_paused_c` `[C]` bool, `_row` `[C]`, `_next_row`."""
        flags, c = parallel.whole_on_host(flags), self.slots
        self._live, self._paused_c = flags[:c].astype(bool), flags[c:2 * c].astype(bool)
        self._row, self._next_row = flags[2 * c:3 * c], int(flags[-1])

    def _queue(self, token_lists, *, rows, name):
        """`([len(rows), Q] int32, [len(rows)] int32)` from token lists, each <= Q long."""
        if len(token_lists) != len(rows):
            raise ValueError(
                f"{name} has {len(token_lists)} token lists; give one per row ({len(rows)})"
            )
        long = [r for r, t in zip(rows, token_lists) if len(t) > self.max_append]
        if long:
            raise ValueError(
                f"{name}: rows {long} get more than max_append={self.max_append} tokens; "
                "raise max_append"
            )
        queue = np.zeros((len(rows), self.max_append), np.int32)
        for i, tokens in enumerate(token_lists):
            queue[i, :len(tokens)] = tokens
        return queue, np.asarray([len(t) for t in token_lists], np.int32)

    def run(self, max_steps=None):
        """Decodes until every row is done, a row pauses, or `max_steps` steps ran;
        returns the paused rows this process holds (sorted row ids; empty when none)."""
        if self._paused.size:
            raise ValueError(f"rows {self._paused.tolist()} are paused: give them tokens with "
                             "resume() or finish them with end() before run()")
        budget = np.iinfo(np.int32).max if max_steps is None else int(max_steps)
        self._slots, flags = _run(
            self._graphdef, self._state, self._slots, *self._prompt_state, self._cap_b,
            self._method, self._stop_tokens, self._pause_tokens, self._pad_id, _int32(budget),
            group_size=self._group_size, rules=self._rules)
        self._read_flags(flags)
        self._paused = np.intersect1d(self._row[self._paused_c], self.own_rows).astype(np.int64)
        return self._paused.copy()

    @property
    def finished(self):
        """Every row is done (no row live, paused or pending), the same on every process."""
        return (not self._live.any() and not self._paused_c.any()
                and self._next_row >= self.rows)

    def row_tokens(self, row):
        """Row `row`'s tokens so far (a list of ids, appended ones included); a row this
        process holds."""
        length, tokens = (parallel.read_rows(x, [row])[0]
                          for x in (self._slots.lengths, self._slots.tokens))
        return tokens[:length].tolist()

    def turn_tokens(self, rows):
        """Each row's tokens since its last appended ones (its current turn): one list per
        row of `rows` (rows this process holds), read from this process's devices."""
        lengths, tokens, appended = (parallel.read_rows(x, rows) for x in (
            self._slots.lengths, self._slots.tokens, self._slots.turns.appended))
        turns = []
        for n, row_tokens, row_appended in zip(lengths, tokens, appended):
            fed = np.flatnonzero(row_appended[:n])
            turns.append(row_tokens[fed.max() + 1 if fed.size else 0:n].tolist())
        return turns

    def resume(self, appended):
        """Gives paused rows their tokens and lets them go on: `{row: token ids}` (an
        empty list resumes a row with nothing appended)."""
        self.answer(appended)

    def end(self, rows, *, truncated=False):
        """Finishes paused rows: done (stop reason: stop token), or with `truncated` cut
        (stop reason: max_new_tokens, as a row at its budget)."""
        self.answer(**{"truncate" if truncated else "end": rows})

    def answer(self, replies=None, *, end=(), truncate=()):
        """Answers paused rows this process holds, in one call: `replies` (`{row: token
        ids}`) resume rows as `resume`, `end` rows finish as `end`, `truncate` rows as
        `end(truncated=True)`. On several processes every process calls it at once, each
        with its own rows (possibly none), and the replies go into the global queue."""
        replies = {int(r): list(ids) for r, ids in (replies or {}).items()}
        actions = {**{r: RESUME for r in replies}, **{int(r): END_STOPPED for r in end},
                   **{int(r): END_TRUNCATED for r in truncate}}
        strangers = sorted(set(actions) - set(self._paused.tolist()))
        if strangers:
            raise ValueError(f"rows {strangers} are not paused (paused: {self._paused.tolist()})")
        own = self.own_rows.tolist()
        queue, lengths = self._queue([replies.get(r, []) for r in own], rows=own, name="resume")
        action = np.asarray([actions.get(r, KEEP) for r in own], np.int32)
        if self._paused_c.any():   # the same flags on every process: all call `_resume` or none
            local = dict(action_b=action, tokens_bq=queue, lengths_b=lengths)
            self._slots, flags = _resume(self._slots, **{
                k: jax.make_array_from_process_local_data(
                    self._row_sharding, v, (self.rows, *v.shape[1:])) for k, v in local.items()})
            self._read_flags(flags)
        self._paused = np.setdiff1d(self._paused, list(actions))

    def unfinished(self):
        """Rows not done yet: decoding, paused or not yet admitted (sorted ids)."""
        started = np.union1d(self._row[self._live], self._row[self._paused_c])
        return np.union1d(started, np.arange(self._next_row, self.rows)).astype(np.int64)

    def rollout(self):
        """The `Rollout` so far (with `appended`); rows not done have their tokens so far."""
        return rollout_of(self._slots, *self._prompts, self._group_size, self._prompt_experts)

