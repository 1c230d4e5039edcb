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
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from grpo_jax.sampling._api import check_request, check_slots
from grpo_jax.sampling._engine import _admit, engine_step, init_slots, prefill_prompts, rollout_of
from grpo_jax.sampling._generate import _int32, _on_mesh, row_keys


@functools.partial(jax.jit, static_argnames=("graphdef", "group_size", "buffer_len", "num_slots",
                                             "rules", "record_support", "record_routing"))
def _start(graphdef, state, prompt_tokens, prompt_mask, rng, prompt_ids, queue, queued, pad_id,
           method, turn_budget, *, group_size, buffer_len, num_slots, rules, record_support,
           record_routing):
    """Prefills the prompts and admits the first rows: `(carry, (prompt cache, prompt
    logits, row keys), prompt experts or None)`."""
    state, _, _ = _on_mesh(state, rules)
    p, s = prompt_tokens.shape
    model = nnx.merge(graphdef, state)
    prompt_logits, prompt_cache, experts, records = prefill_prompts(
        model, prompt_tokens, prompt_mask, method=method, record_support=record_support,
        record_routing=record_routing)
    b = p * group_size
    slots = init_slots(model, prompt_logits, rows=b, prompt_len=s, buffer_len=buffer_len,
                       num_slots=num_slots, pad_id=pad_id, queue=queue, queued=queued,
                       turn_budget=turn_budget, **records)
    slots = _admit(slots, prompt_cache, prompt_logits, group_size=group_size, num_rows=b)
    return slots, (prompt_cache, prompt_logits, row_keys(rng, prompt_ids, group_size)), experts


@functools.partial(jax.jit, static_argnames=("graphdef", "group_size", "rules"),
                   donate_argnames=("slots",))
def _run(graphdef, state, slots, prompt_cache, prompt_logits, keys_b, cap_b, method, stop_tokens,
         pause_tokens, pad_id, max_steps, *, group_size, rules):
    """Decode steps until every row is done, a row pauses, or `max_steps` steps ran."""
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
    return slots


@functools.partial(jax.jit, donate_argnames=("slots",))
def _resume(slots, rows_r, tokens_rq, lengths_r, end_r, stop_r):
    """Queues `tokens_rq[r, :lengths_r[r]]` for paused row `rows_r[r]` and resumes it, or
    ends it where `end_r` (stopped where `stop_r`, else truncated); entries with a row id
    >= B are padding."""
    turns, b = slots.turns, slots.tokens.shape[0]
    resume_r = (rows_r < b) & ~end_r
    end_r = (rows_r < b) & end_r
    at_r = jnp.where(resume_r, rows_r, b)   # dropped
    resumed_c = turns.paused & jnp.isin(slots.row, jnp.where(resume_r, rows_r, -1))
    ended_c = turns.paused & jnp.isin(slots.row, jnp.where(end_r, rows_r, -1))
    return slots.replace(
        live=slots.live | resumed_c,
        stopped=slots.stopped.at[jnp.where(end_r & stop_r, rows_r, b)].set(True, mode="drop"),
        turns=turns.replace(
            paused=turns.paused & ~(resumed_c | ended_c),
            queue=turns.queue.at[at_r].set(tokens_rq, mode="drop"),
            queued=turns.queued.at[at_r].set(lengths_r, mode="drop"),
            fed=turns.fed.at[at_r].set(0, mode="drop"),
        ),
    )


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
      queued: None, or one token list per row (P*G) fed before the row first samples.
      record_support, record_routing: as `generate` (fed tokens record no support).
    """

    def __init__(self, graphdef, state, prompt_tokens, prompt_mask, *, method, group_size,
                 max_new_tokens, stop_tokens, pad_id, slots, rng=None, keys=None, pause_tokens=(),
                 max_append=64, turn_budget=0, queued=None, prompt_ids=None, max_len_bucket=None,
                 rules="sampling", record_support=False, record_routing=False):
        if (rng is None) == (keys is None):
            raise ValueError("give the Engine rng (each row's key drawn from it) or keys (one "
                             "per row), not both")
        max_len_bucket, prompt_ids = check_request(prompt_tokens, prompt_mask, group_size,
                                                   max_new_tokens, max_len_bucket, rules, prompt_ids)
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
        self._graphdef, self._state, self._rules, self._group_size = graphdef, state, rules, group_size
        self._prompts = (_int32(prompt_tokens), _int32(prompt_mask))
        self._method, self._pad_id = method, _int32(pad_id)
        self._stop_tokens = _int32(stop_tokens).reshape(-1)
        self._pause_tokens = _int32(pause_tokens).reshape(-1)
        self._cap_b = jnp.broadcast_to(_int32(max_new_tokens), (rows,))
        if keys is not None and np.shape(keys) != (rows,):
            raise ValueError(f"keys has shape {np.shape(keys)}; give one key per row ({rows},)")
        self._slots, self._prompt_state, self._prompt_experts = _start(
            graphdef, state, *self._prompts, jax.random.key(0) if rng is None else rng,
            _int32(prompt_ids), queue, lengths, self._pad_id,
            method, _int32(turn_budget or int(max_len_bucket) + 1), group_size=group_size,
            buffer_len=int(max_len_bucket), num_slots=self.slots, rules=rules,
            record_support=bool(record_support), record_routing=bool(record_routing))
        if keys is not None:   # `_start` drew keys from a placeholder: the rows' own replace them
            self._prompt_state = (*self._prompt_state[:2], keys)
        self._paused = np.zeros((0,), np.int64)

    def _queue(self, token_lists, *, rows, name):
        """`([len(rows), Q] int32, [len(rows)] int32)` from token lists, each <= Q long."""
        if len(token_lists) != len(rows):
            raise ValueError(f"{name} has {len(token_lists)} token lists; give one per row ({len(rows)})")
        long = [r for r, t in zip(rows, token_lists) if len(t) > self.max_append]
        if long:
            raise ValueError(f"{name}: rows {long} get more than max_append={self.max_append} tokens; "
                             "raise max_append")
        queue = np.zeros((len(rows), self.max_append), np.int32)
        for i, tokens in enumerate(token_lists):
            queue[i, :len(tokens)] = tokens
        return queue, np.asarray([len(t) for t in token_lists], np.int32)

    def run(self, max_steps=None):
        """Decodes until every row is done, a row pauses, or `max_steps` steps ran;
        returns the paused rows (sorted row ids; empty when none paused)."""
        if self._paused.size:
            raise ValueError(f"rows {self._paused.tolist()} are paused: give them tokens with "
                             "resume() or finish them with end() before run()")
        budget = np.iinfo(np.int32).max if max_steps is None else int(max_steps)
        self._slots = _run(self._graphdef, self._state, self._slots, *self._prompt_state,
                           self._cap_b, self._method, self._stop_tokens, self._pause_tokens,
                           self._pad_id, _int32(budget), group_size=self._group_size,
                           rules=self._rules)
        paused, row = jax.device_get((self._slots.turns.paused, self._slots.row))
        self._paused = np.sort(row[paused]).astype(np.int64)
        return self._paused.copy()

    @property
    def finished(self):
        """Every row is done (no row live, paused or pending)."""
        live, next_row = jax.device_get((self._slots.live, self._slots.next_row))
        return not live.any() and not self._paused.size and int(next_row) >= self.rows

    def row_tokens(self, row):
        """Row `row`'s tokens so far (a list of ids, appended ones included)."""
        length = int(self._slots.lengths[row])
        return np.asarray(self._slots.tokens[row, :length]).tolist()

    def turn_tokens(self, rows):
        """Each row's tokens since its last appended ones (its current turn): one list per
        row of `rows`, read from the device in one transfer."""
        at = np.asarray(rows, np.int32)
        lengths, tokens, appended = jax.device_get((
            self._slots.lengths[at], self._slots.tokens[at], self._slots.turns.appended[at]))
        turns = []
        for n, row_tokens, row_appended in zip(lengths, tokens, appended):
            fed = np.flatnonzero(row_appended[:n])
            turns.append(row_tokens[fed.max() + 1 if fed.size else 0:n].tolist())
        return turns

    def resume(self, appended):
        """Gives paused rows their tokens and lets them go on: `{row: token ids}` (an
        empty list resumes a row with nothing appended)."""
        self._answer(list(appended), list(appended.values()), end=False)

    def end(self, rows, *, truncated=False):
        """Finishes paused rows: done (stop reason: stop token), or with `truncated` cut
        (stop reason: max_new_tokens, as a row at its budget)."""
        rows = list(rows)
        self._answer(rows, [[]] * len(rows), end=True, stop=not truncated)

    def _answer(self, rows, token_lists, *, end, stop=True):
        strangers = sorted(set(rows) - set(self._paused.tolist()))
        if strangers:
            raise ValueError(f"rows {strangers} are not paused (paused: {self._paused.tolist()})")
        queue, lengths = self._queue(token_lists, rows=rows, name="resume" if not end else "end")
        pad = self.slots - len(rows)   # one compiled program: always C entries
        rows_r = np.concatenate([np.asarray(rows, np.int32), np.full(pad, self.rows, np.int32)])
        self._slots = _resume(self._slots, rows_r, np.pad(queue, ((0, pad), (0, 0))),
                              np.pad(lengths, (0, pad)), np.full(self.slots, end),
                              np.full(self.slots, stop))
        self._paused = np.setdiff1d(self._paused, rows)

    def unfinished(self):
        """Rows not done yet: decoding, paused or not yet admitted (sorted ids)."""
        live, row, next_row = jax.device_get((self._slots.live, self._slots.row,
                                              self._slots.next_row))
        started = np.union1d(row[live], self._paused)
        return np.union1d(started, np.arange(int(next_row), self.rows)).astype(np.int64)

    def rollout(self):
        """The `Rollout` so far (with `appended`); rows not done have their tokens so far."""
        return rollout_of(self._slots, *self._prompts, self._group_size, self._prompt_experts)

