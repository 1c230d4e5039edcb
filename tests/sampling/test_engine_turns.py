"""`sampling.Engine`: continuous batching run from the host, rows that pause on a token and
resume with appended tokens (a tool's reply), and a step budget that stops and goes on."""

import argparse
import importlib.util
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from grpo_jax import sampling
from grpo_jax.objectives import token_logprobs
from tests.sampling.test_engine import PROMPTS, STOPS, assert_same_rows, run

METHOD = sampling.TopP(0.95, temperature=1.0)
PAUSES = np.arange(3, 512, 8)   # 1 token in 8 pauses a row (a "tool call"), none stops it
BENCH = pathlib.Path(__file__).resolve().parents[2] / "experiments" / "bench_tool_turns.py"


def engine(model, slots, **kwargs):
    tokens, mask = sampling.pad_prompts(PROMPTS, pad_id=0)
    args = dict(group_size=4, max_new_tokens=40, stop_tokens=STOPS, pad_id=0) | kwargs
    return sampling.Engine(*model, tokens, mask, rng=jax.random.key(7), method=METHOD,
                           slots=slots, **args)


def reply(row, turn):
    """The host's answer to row's turn-th pause: a few tokens that depend on both."""
    return [300 + row, 301 + turn, 302][: 1 + (row + turn) % 3]


def converse(eng, turns=2):
    """Runs `eng` to the end: every paused row gets `reply` for its first `turns` pauses
    and is ended at the next. Returns (host rollout, {row: pauses seen})."""
    seen = {}
    while not eng.finished:
        paused = eng.run()
        for row in paused:
            assert eng.row_tokens(row)[-1] in PAUSES   # it paused right after the token
        seen.update({int(r): seen.get(int(r), 0) + 1 for r in paused})
        ending = [r for r in paused if seen[int(r)] > turns]
        eng.resume({int(r): reply(int(r), seen[int(r)]) for r in paused if seen[int(r)] <= turns})
        if ending:
            eng.end(ending)
    return sampling.to_host(eng.rollout()), seen


def teacher_forced_logp(model, rollout):
    """`[B, N]` log-probs of every completion token (sampled or appended) from one forward
    pass over prompt + completion: what the rows' caches held if they held the right thing."""
    s = rollout.prompt_tokens.shape[1]
    tokens = jnp.concatenate([rollout.prompt_tokens, rollout.tokens], axis=1)
    mask = jnp.concatenate([rollout.prompt_mask, rollout.mask], axis=1)
    logits = nnx.merge(*model)(tokens, attention_mask=mask)[:, s - 1:-1]
    return np.asarray(token_logprobs(logits, rollout.tokens, temperature=METHOD.temperature))


@pytest.fixture(scope="module")
def static(tiny_model):
    return run(tiny_model, slots=0)


@pytest.fixture(scope="module")
def conversation(tiny_model):
    return converse(engine(tiny_model, slots=3, pause_tokens=PAUSES))


@pytest.mark.slow
def test_without_pauses_the_engine_gives_generates_rows_in_any_step_budget(tiny_model, static):
    """Run to the end at once, or in budgets of 7 steps (partial rollouts going on later):
    the static sampler's rows either way; mid-way, `unfinished` names the rows not done."""
    whole = engine(tiny_model, slots=3)
    assert whole.run().size == 0 and whole.finished
    assert_same_rows(sampling.to_host(whole.rollout()), static)
    stepped, calls = engine(tiny_model, slots=3), 0
    while not stepped.finished:
        stepped.run(max_steps=7)
        calls += 1
        if calls == 1:   # 7 steps of 3 slots: 7 tokens per row at most, no row past 7
            partial = sampling.to_host(stepped.rollout())
            done = ~np.isin(np.arange(12), stepped.unfinished())
            assert done.sum() >= 1 and (partial.lengths <= 7).all()
            np.testing.assert_array_equal(
                done, partial.lengths == np.where(done, static.lengths, -1)
            )
    assert calls >= static.lengths.max() // 7
    got = sampling.to_host(stepped.rollout())
    assert_same_rows(got, static)
    assert not got.appended.any()


@pytest.mark.slow
def test_appended_tokens_are_in_the_cache_as_if_prefilled(tiny_model, conversation):
    """Rows pause on their pause tokens and take replies: each reply sits right after its
    pause token, marked appended, and every token's log-prob (sampled or appended) equals
    one forward pass over the whole row: the caches hold the replies at the right
    positions and nothing else (a reply missing from the cache, a stale column or a
    wrong position would each move the log-probs of the tokens after it)."""
    rollout, seen = conversation
    assert sum(seen.values()) >= 10 and max(seen.values()) == 3   # replied twice, ended at 3
    for row in range(12):
        tokens = rollout.tokens[row, :rollout.lengths[row]]
        appended = rollout.appended[row, :rollout.lengths[row]]
        pauses = [i for i, t in enumerate(tokens) if t in PAUSES and not appended[i]]
        turn, want = 0, np.zeros_like(appended)
        for i in pauses:
            turn += 1
            if turn <= 2 and i + 1 < len(tokens):   # a reply cut by the budget is shorter
                got = tokens[i + 1:i + 1 + len(reply(row, turn))]
                np.testing.assert_array_equal(got, reply(row, turn)[:len(got)])
                want[i + 1:i + 1 + len(got)] = True
        np.testing.assert_array_equal(appended, want, err_msg=f"row {row}")
        if seen.get(row, 0) == 3:   # ended by the host on its third pause
            assert not rollout.truncated[row] and tokens[-1] in PAUSES
    assert rollout.appended.sum() >= 10
    np.testing.assert_array_equal(rollout.sample_logp[rollout.appended], 0.0)
    m = rollout.mask.astype(bool)
    np.testing.assert_allclose(teacher_forced_logp(tiny_model, rollout)[m], rollout.logp[m],
                               atol=1e-5, rtol=0)


@pytest.mark.slow
def test_pausing_rows_sample_the_same_whatever_the_slots(tiny_model, conversation):
    """Through 5 slots the same conversation: every row's tokens, replies and log-probs."""
    rollout, seen = conversation
    other, other_seen = converse(engine(tiny_model, slots=5, pause_tokens=PAUSES))
    assert other_seen == seen
    assert_same_rows(other, rollout)
    np.testing.assert_array_equal(other.appended, rollout.appended)


@pytest.mark.slow
def test_rows_can_start_with_queued_tokens(tiny_model):
    """A partial rollout's earlier tokens, queued before the row first samples: fed first,
    marked appended, and the log-probs after them those of one forward pass."""
    queued = [[40 + r] * (r % 4) for r in range(12)]
    eng = engine(tiny_model, slots=4, queued=queued)
    eng.run()
    rollout = sampling.to_host(eng.rollout())
    for row, tokens in enumerate(queued):
        np.testing.assert_array_equal(rollout.tokens[row, :len(tokens)], tokens)
        np.testing.assert_array_equal(rollout.appended[row].nonzero()[0], np.arange(len(tokens)))
    m = rollout.mask.astype(bool)
    np.testing.assert_allclose(teacher_forced_logp(tiny_model, rollout)[m], rollout.logp[m],
                               atol=1e-5, rtol=0)


@pytest.mark.slow
def test_the_host_gets_clear_errors(tiny_model):
    eng = engine(tiny_model, slots=2, pause_tokens=PAUSES, max_append=4)
    paused = eng.run()
    assert paused.size
    with pytest.raises(ValueError, match=r"are paused: give them tokens with resume\(\) or finish"):
        eng.run()
    stranger = int(np.setdiff1d(np.arange(12), paused)[0])
    with pytest.raises(ValueError, match=rf"rows \[{stranger}\] are not paused"):
        eng.resume({stranger: [1]})
    with pytest.raises(ValueError, match=r"more than max_append=4 tokens; raise max_append"):
        eng.resume({int(paused[0]): [1, 2, 3, 4, 5]})
    with pytest.raises(ValueError, match=r"slots=13 must be in \[1, P\*G=12\]"):
        engine(tiny_model, slots=13)
    with pytest.raises(ValueError, match=r"queued has 2 token lists; give one per row \(12\)"):
        engine(tiny_model, slots=2, queued=[[1], [2]])


@pytest.mark.slow
def test_a_turn_budget_pauses_rows_every_k_sampled_tokens(tiny_model, static):
    """With turn_budget=5 and nothing appended, a row pauses after every 5 tokens it
    samples (not at its stop token or budget); resumed with nothing, the rows are
    `generate`'s."""
    eng, pauses = engine(tiny_model, slots=3, turn_budget=5), 0
    while not eng.finished:
        paused = eng.run()
        lengths = np.asarray(eng.rollout().lengths)[paused]
        assert (lengths % 5 == 0).all() and (lengths < 40).all()
        pauses += len(paused)
        eng.resume({int(r): [] for r in paused})
    got = sampling.to_host(eng.rollout())
    assert_same_rows(got, static)
    assert pauses == sum((n - 1) // 5 for n in static.lengths)


@pytest.mark.slow
def test_a_row_carried_into_another_engine_with_its_key_samples_on_as_before(tiny_model, static):
    """A partial rollout's rows cut at 9 tokens, carried into a new engine in another order
    (each its own prompt, its key, its tokens so far queued): they sample on exactly as the
    uninterrupted rows did (the same stream at the same positions), and the queued tokens'
    log-probs are the model's."""
    tokens, mask = sampling.pad_prompts(PROMPTS, pad_id=0)
    keys = sampling.row_keys(jax.random.key(7), jnp.arange(3), 4)
    rows = np.flatnonzero(static.lengths > 9)[::-1]   # the carried rows, reversed
    assert rows.size >= 4
    carried = sampling.Engine(
        *tiny_model, np.repeat(tokens, 4, axis=0)[rows], np.repeat(mask, 4, axis=0)[rows],
        keys=keys[rows], method=METHOD, group_size=1, max_new_tokens=40, stop_tokens=STOPS,
        pad_id=0, slots=3, max_append=9, queued=[static.tokens[r, :9].tolist() for r in rows])
    carried.run()
    got = sampling.to_host(carried.rollout())
    # One row may pick the neighbouring token at one draw and go its own way after it: a
    # draw within float32 rounding of a boundary, where XLA's CPU kernels for this batch's
    # shape round otherwise (`test_engine.assert_same_rows_but_a_rounding_flip`); seen on
    # one CPU, at the 25th token of one carried row. Up to that token it agrees.
    same = (got.tokens == static.tokens[rows]).all(axis=1)
    assert same.sum() >= len(same) - 1, f"rows {np.flatnonzero(~same)} differ"
    for row in np.flatnonzero(~same):
        first = int(np.argmax(got.tokens[row] != static.tokens[rows][row]))
        assert first > 9   # the queued tokens themselves are never redrawn
        np.testing.assert_allclose(got.logp[row, :first], static.logp[rows][row, :first],
                                   atol=1e-5, rtol=0)
    for name in ("tokens", "lengths", "truncated", "logp"):
        np.testing.assert_allclose(getattr(got, name)[same], getattr(static, name)[rows][same],
                                   atol=1e-5, rtol=0, err_msg=name)
    assert got.appended[:, :9].all() and not got.appended[:, 9:].any()
    with pytest.raises(ValueError, match=r"give the Engine rng .* or keys .*, not both"):
        engine(tiny_model, slots=3, keys=keys)
    with pytest.raises(ValueError, match=r"keys has shape \(3,\); give one key per row \(12,\)"):
        sampling.Engine(*tiny_model, tokens, mask, keys=keys[:3], method=METHOD, group_size=4,
                        max_new_tokens=40, stop_tokens=STOPS, pad_id=0, slots=3)


@pytest.mark.slow
def test_two_processes_answer_their_own_rows_as_one_process_without_a_gather_per_pause(
        tmp_path):
    """experiments/bench_tool_turns.py's episodes (8 prompts x 2, rows pausing on 1 token
    in 16, each pause answered by the process that holds the row) on two processes of 4
    CPU devices: the same rows token for token, the replies at the same places, as the
    one-process engine on the same prompts and key (this process's 8 devices); and
    neither process gathered anything on the host while the episodes ran (the slots'
    flags come whole with the programs that changed them)."""
    spec = importlib.util.spec_from_file_location("bench_tool_turns", BENCH)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    sizes = dict(prompts=8, group=2, max_new_tokens=24)
    two = bench.layout(argparse.Namespace(repeats=0, **sizes), 2, tmp_path)
    one = bench.rollouts(1, 0, repeats=0, **sizes)
    assert [p["rows"] for p in two] == [list(range(8)), list(range(8, 16))]
    assert one["rows"] == list(range(16))
    for key in ("tokens", "lengths", "appended"):
        assert bench.merged(two, key) == one[key], key
    assert one["pauses"] >= 8 and sum(p["pauses"] for p in two) == one["pauses"]
    assert np.sum(one["appended"]) >= 8
    assert [p["gathers"] for p in two] == [0, 0]
