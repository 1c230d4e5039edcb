"""Partial rollouts: the pool's bookkeeping step by step (a fake sampler, hand-computed
steps), its checkpoint, the config's errors, and the trainer with it on the tiny model."""

import dataclasses
import functools
import threading

import jax
import numpy as np
import pytest
from flax import nnx

from grpo_jax import config_lib, models, parallel
from grpo_jax.objectives import token_logprobs
from grpo_jax.training import checkpoint, footprint, partial, partial_pool, rl, rl_run, rollout
from grpo_jax.training.partial_pool import Budget, Pool
from tests.training.training_setups import (assert_rows_equal, assert_same_export, read_metrics,
                                            tiny_config)

N, G = 10, 2
# Each example's rows stop after these many tokens (12 > N: cut at N, not stopped).
LENGTHS = {0: (3, 4), 1: (6, 2), 2: (5, 7), 3: (12, 3), 4: (2, 2), 5: (9, 9), 6: (1, 1),
           7: (1, 1), **{e: (1 + e % 4, 2 + e % 3) for e in range(8, 100)}}


def logp_of(version, position):
    """The fake sampler's log-prob of a token: says which version sampled it, and where."""
    return -(version + 1.0) - position / 100.0


def support_of(token, version):
    """The fake sampler's support of a token (`[K]` ids, its size): the token and 1000 +
    the version that sampled it, then -1 (K = `K`)."""
    return [token, 1000 + version] + [-1] * (K - 2), 2


K = 3   # support ids the fake sampler records per position, with `support_k`
ROUTING = (1, 2)   # (L_moe, k) of the fake sampler's experts, with `routing_shape`


class FakeSampler:
    """`run_step`'s draw and resume over rows of set lengths (`LENGTHS`): token t of
    example e's row g is 100 e + 10 g + t, sampled by version `version` at step `step`;
    with `support_k` each sampled token's support is `support_of` it; with
    `routing_shape` a row it runs routes prompt column s to experts (s, version) and token
    t to (t's id, version), as a resumption routes the prompt and every token again."""

    def __init__(self, stream, step, version, reward_columns=(), support_k=0,
                 routing_shape=()):
        self.stream, self.step, self.version = stream, step, version
        self.reward_columns = reward_columns
        self.support_k, self.routing_shape = support_k, routing_shape

    def draw(self, index, cap):
        ids = next(self.stream)
        width = 8 * (1 + ids[0] % 2)   # prompt buckets of 8 and 16
        p = len(ids)
        empty = Pool.empty(G, N, self.reward_columns, self.support_k)
        records = {}
        if self.support_k:   # nothing sampled yet: the sampler's blank records
            records.update(support_ids=np.full((p, G, N, self.support_k), -1, np.int32),
                           support_size=np.zeros((p, G, N), np.int32))
        if self.routing_shape:
            records.update(prompt_routing=np.zeros((p, G, width, *self.routing_shape), np.int32),
                           routing=np.zeros((p, G, N, *self.routing_shape), np.int32))
        pool = Pool(
            prompt_tokens=np.full((p, width), 5, np.int32),
            prompt_mask=np.ones((p, width), np.int32),
            prompt_width=np.full(p, width, np.int32), drawn=np.full(p, self.step, np.int32),
            order=np.asarray(ids, np.int64),
            scored=np.zeros(p, bool), keys=np.zeros((p, G, empty.keys.shape[2]), np.uint32),
            tokens=np.zeros((p, G, N), np.int32), logp=np.zeros((p, G, N), np.float32),
            version=np.zeros((p, G, N), np.int32), lengths=np.zeros((p, G), np.int32),
            stopped=np.zeros((p, G), bool), start=np.zeros((p, G), np.int32),
            rewards=np.zeros((p, G, *self.reward_columns), np.float32),
            correct=np.zeros((p, G), bool), examples=tuple({"id": e} for e in ids),
            texts=tuple(f"prompt {e}" for e in ids), **records)
        return self.resume(pool, np.full((p, G), cap, np.int32))

    def resume(self, pool, cap):
        tokens, logp, version = pool.tokens.copy(), pool.logp.copy(), pool.version.copy()
        lengths, stopped = pool.lengths.copy(), pool.stopped.copy()
        records = {k: getattr(pool, k).copy() for k in pool.fields if k in Pool.RECORDS}
        for i, example in enumerate(pool.examples):
            for g in range(G):
                natural, have = LENGTHS[example["id"]][g], lengths[i, g]
                if cap[i, g] <= have:
                    continue
                end = min(natural, cap[i, g], N)
                if "routing" in records:
                    width = pool.prompt_width[i]
                    records["prompt_routing"][i, g, -width:, 0] = [
                        (s, self.version) for s in range(width)]
                    records["routing"][i, g, :end, 0] = [
                        (100 * example["id"] + 10 * g + t, self.version) for t in range(end)]
                for t in range(have, end):
                    tokens[i, g, t] = 100 * example["id"] + 10 * g + t
                    logp[i, g, t], version[i, g, t] = logp_of(self.version, t), self.version
                    if "support_ids" in records:
                        ids, size = support_of(tokens[i, g, t], self.version)
                        records["support_ids"][i, g, t], records["support_size"][i, g, t] = (
                            ids, size)
                lengths[i, g], stopped[i, g] = end, end == natural
        return pool.replace(tokens=tokens, logp=logp, version=version, lengths=lengths,
                            stopped=stopped, **records)


def score_by_parity(groups):
    """Reward 1 for a row of even length (so a group has signal when its parities differ)."""
    rewards = (groups.lengths % 2 == 0).astype(np.float32)
    return rewards, rewards > 0, {"rewards/parity": float(rewards.mean())}


def steps(budget, count, short_batch="error", support_k=0, routing_shape=()):
    """`count` steps from an empty pool over examples 0, 1, 2, ... (P per draw), with
    support records of `support_k` ids (0: none), routing of `routing_shape` (): none)."""
    p = budget.num_groups
    stream = iter([list(range(i, i + p)) for i in range(0, 100, p)])
    pool, results = Pool.empty(G, N, support_k=support_k, routing_shape=routing_shape), []
    for step in range(1, count + 1):
        fake = FakeSampler(stream, step, version=step - 1, support_k=support_k,
                           routing_shape=routing_shape)
        result = partial_pool.run_step(pool, step=step, budget=budget, draw=fake.draw,
                                       resume=fake.resume, score=score_by_parity,
                                       short_batch=short_batch)
        results.append(result)
        pool = result.pool
    return results


def ids(pool):
    return [e["id"] for e in pool.examples]


BUDGET = Budget(tokens_per_step=4, max_carries=2, num_groups=2, max_draws=2, dynamic=False,
                signal="correct")


class TestRunStep:

    def test_four_steps_by_hand(self):
        """P = 2 groups of G = 2, a 10-token buffer, 4 tokens a step, 2 carries, 2 draws:
        each step's batch, pool, draws, forced groups and token counts as worked out from
        `LENGTHS` by hand (in the comments)."""
        r1, r2, r3, r4 = steps(BUDGET, 4)
        # Step 1: draw [0, 1] (0 done; 1's first row at 4 of 6), draw [2, 3] (nothing
        # ready); force the oldest unready group, 1, to its end: batch [0, 1].
        assert (r1.draws, r1.forced, ids(r1.batch), ids(r1.pool)) == (2, 1, [0, 1], [2, 3])
        assert r1.generated == 7 + 6 + 8 + 7 + 2
        # Step 2: 2 goes on to 5 and 7 (done), 3's first row to 8; one draw [4, 5] (4 done).
        assert (r2.draws, r2.forced, ids(r2.batch), ids(r2.pool)) == (1, 0, [2, 4], [3, 5])
        assert r2.generated == 4 + 4 + 4 + 8
        # Step 3: 3 was drawn 2 steps ago: its row runs to the end (cut at 10); draw
        # [6, 7] (both done): three ready, the batch takes the oldest two, 7 waits.
        assert (r3.draws, r3.forced, ids(r3.batch), ids(r3.pool)) == (1, 0, [3, 6], [5, 7])
        # Step 4: 5 (drawn at step 2) runs to its end; with 7 waiting, no draw.
        assert (r4.draws, r4.forced, ids(r4.batch), ids(r4.pool)) == (0, 0, [5, 7], [])
        assert r4.generated == 2
        for result in (r1, r2, r3, r4):   # whole groups, every row done and scored
            assert result.batch.done.all() and result.batch.scored.all() and result.valid.all()
        three = r3.batch
        np.testing.assert_array_equal(three.lengths, [[10, 3], [1, 1]])
        np.testing.assert_array_equal(three.stopped, [[False, True], [True, True]])
        np.testing.assert_array_equal(three.version[0, 0], [0] * 4 + [1] * 4 + [2] * 2)
        np.testing.assert_array_equal(three.start, [[8, 3], [0, 0]])

    def test_carried_tokens_keep_what_they_were_sampled_with(self):
        """A row's earlier tokens, log-probs and versions are the ones the pool held after
        the step that sampled them; its new tokens carry the new version's."""
        results = steps(BUDGET, 4)
        for before, after in zip(results, results[1:]):
            for i, example in enumerate(after.batch.examples):
                if example not in before.pool.examples:
                    continue
                j = before.pool.examples.index(example)
                for g in range(G):
                    n = before.pool.lengths[j, g]
                    for field in ("tokens", "logp", "version"):
                        np.testing.assert_array_equal(getattr(after.batch, field)[i, g, :n],
                                                      getattr(before.pool, field)[j, g, :n])
                    new = slice(n, after.batch.lengths[i, g])
                    assert (after.batch.version[i, g, new] > before.pool.version[j, g, :n].max(
                        initial=-1)).all()
                    positions = np.arange(N)[new]
                    np.testing.assert_allclose(after.batch.logp[i, g, new], logp_of(
                        after.batch.version[i, g, new], positions))

    def test_carried_rows_keep_the_supports_they_were_sampled_with(self):
        """With support records (keep sampling mask), the four steps of
        `test_four_steps_by_hand` take the same decisions, and every token of a batch row
        has the support the step that sampled it recorded, however many steps the row
        took: step 3's group 3 long row (tokens 300-309) holds version 0's supports at 0-3,
        1's at 4-7, 2's at 8-9; blank (-1, size 0) past a row's length. `batch_rows`
        gives them as `[B, N, K]` and `[B, N]`."""
        results, plain = steps(BUDGET, 4, support_k=K), steps(BUDGET, 4)
        for result, want in zip(results, plain):
            assert (ids(result.batch), ids(result.pool)) == (ids(want.batch), ids(want.pool))
            batch = result.batch
            assert batch.support_k == K and result.pool.support_k == K
            taken = np.arange(N) < batch.lengths[..., None]
            supports = np.stack([batch.tokens, 1000 + batch.version,
                                 np.full_like(batch.tokens, -1)], axis=-1)
            np.testing.assert_array_equal(batch.support_ids,
                                          np.where(taken[..., None], supports, -1))
            np.testing.assert_array_equal(batch.support_size, np.where(taken, 2, 0))
        long_row = results[2].batch.support_ids[0, 0]
        np.testing.assert_array_equal(long_row[:, 0], np.arange(300, 310))
        np.testing.assert_array_equal(long_row[:, 1], [1000] * 4 + [1001] * 4 + [1002] * 2)
        rows = partial_pool.batch_rows(results[2].batch)
        assert rows["support_ids"].shape == (2 * G, N, K) and rows["support_size"].shape == (
            2 * G, N)
        np.testing.assert_array_equal(rows["support_ids"][0], long_row)
        assert "support_ids" not in partial_pool.batch_rows(plain[2].batch)

    def test_carried_rows_keep_the_routing_of_the_step_that_last_ran_them(self):
        """With routing records (keep routing), the same decisions; every row of a batch
        holds the experts of the step that last ran it, for its prompt and every token
        (a resumption routes them again): step 3's group 3 long row, run at steps 1-3,
        version 2's; its short row, done at step 1 and waiting, version 0's. `batch_rows`
        gives them as `[B, S, L_moe, k]` and `[B, N, L_moe, k]`."""
        results, plain = steps(BUDGET, 4, routing_shape=ROUTING), steps(BUDGET, 4)
        for result, want in zip(results, plain):
            assert (ids(result.batch), ids(result.pool)) == (ids(want.batch), ids(want.pool))
            batch = result.batch
            assert batch.routing_shape == ROUTING and batch.fields[-2:] == Pool.RECORDS[2:]
            last = batch.version.max(axis=2, initial=0)   # the version that last ran the row
            taken = np.arange(N) < batch.lengths[..., None]
            np.testing.assert_array_equal(batch.routing[..., 0, 0],
                                          np.where(taken, batch.tokens, 0))
            np.testing.assert_array_equal(batch.routing[..., 0, 1],
                                          np.where(taken, last[..., None], 0))
            width = batch.prompt_width[:, None, None]
            column = np.arange(batch.prompt_tokens.shape[1]) - (
                batch.prompt_tokens.shape[1] - width)
            np.testing.assert_array_equal(batch.prompt_routing[..., 0, 0],
                                          np.broadcast_to(np.maximum(column, 0), (2, G, 8)))
            np.testing.assert_array_equal(batch.prompt_routing[..., 0, 1],
                                          np.broadcast_to(last[..., None], (2, G, 8)))
        group3 = results[2].batch
        assert ids(group3)[0] == 3
        np.testing.assert_array_equal(group3.routing[0, 0, :, 0], [(300 + t, 2) for t in range(10)])
        np.testing.assert_array_equal(group3.routing[0, 1, :4, 0], [(310, 0), (311, 0), (312, 0),
                                                                    (0, 0)])
        rows = partial_pool.batch_rows(group3)
        assert rows["prompt_routing"].shape == (2 * G, 8, *ROUTING)
        assert rows["routing"].shape == (2 * G, N, *ROUTING)

    def test_token_staleness_is_counted_per_token(self):
        """Step 3's batch: group 3's long row holds 4 tokens of version 0, 4 of 1 and 2
        of 2, its short row 3 of version 0; group 6, 2 tokens of version 2. Against the
        current parameters (version 2): staleness 2, 1, 0."""
        r3 = steps(BUDGET, 3)[-1]
        metrics = partial_pool.token_metrics(r3.batch, r3.valid, step=3)
        tokens = 10 + 3 + 2
        assert metrics == {"token_staleness_mean": pytest.approx((4 * 2 + 4 * 1 + 3 * 2) / tokens),
                           "token_staleness_max": 2.0,
                           "carried_token_share": pytest.approx((8 + 3) / tokens)}
        r4 = steps(BUDGET, 4)[-1]   # 5: 4 tokens of v1, 4 of v2, 1 of v3 a row; 7 waited
        metrics = partial_pool.token_metrics(r4.batch, r4.valid, step=4)
        assert metrics["token_staleness_mean"] == pytest.approx((2 * (4 * 2 + 4) + 2) / 20)
        assert metrics["carried_token_share"] == pytest.approx((16 + 2) / 20)

    def test_a_group_carried_max_carries_times_runs_to_its_end(self):
        """With one carry, group 3 (drawn at step 1) runs to its end at step 2 (cut at 10)."""
        _, r2 = steps(dataclasses.replace(BUDGET, max_carries=1), 2)
        assert ids(r2.batch) == [2, 3] and r2.pool.size == 0
        np.testing.assert_array_equal(r2.batch.lengths, [[5, 7], [10, 3]])
        assert not r2.batch.stopped[1, 0]

    def test_draws_stop_at_the_pools_capacity(self):
        """With one carry the pool holds (1 + 1) P = 4 groups after a draw: step 1 draws
        twice (not the 5 draws allowed) and then forces group 1 to its end."""
        wide = dataclasses.replace(BUDGET, max_carries=1, max_draws=5)
        assert wide.capacity == 4
        r1, r2 = steps(wide, 2)
        assert (r1.draws, r1.forced, ids(r1.batch), ids(r1.pool)) == (2, 1, [0, 1], [2, 3])
        # Step 2: both groups carried once, so they run to their end: nothing to draw.
        assert (r2.draws, r2.forced, ids(r2.batch), r2.pool.size) == (0, 0, [2, 3], 0)

    def test_dynamic_sampling_drops_done_groups_without_signal(self):
        """Rewards by length parity: groups 0 (3, 4), 2 (5, 7), 3 (12 -> 10, 3), ... Done
        groups whose rewards agree never enter a batch or the pool."""
        dynamic = dataclasses.replace(BUDGET, dynamic=True)
        results = steps(dynamic, 4, short_batch="pad")
        for result in results:
            signal = partial_pool.signal(result.batch, "correct")
            np.testing.assert_array_equal(signal, result.valid)
            assert not (result.pool.scored & ~partial_pool.signal(result.pool, "correct")).any()
        padded = [r for r in results if not r.valid.all()]
        assert padded, "no step ran short of groups with signal"
        assert all(r.batch.size == 2 for r in results)
        with pytest.raises(RuntimeError, match=r"found \d groups with signal in 2 draws .* "
                                                r"filtering.short_batch='pad'"):
            steps(dynamic, 4, short_batch="error")


def steps_on_processes(budget, count, processes, short_batch="error"):
    """`steps` with each draw's P examples split over `processes` threads standing for
    processes, each carrying its own groups and gathering through a barrier; returns each
    one's results and its staleness metrics (`token_metrics` over all processes)."""
    p, share = budget.num_groups, budget.num_groups // processes
    barrier, slots = threading.Barrier(processes, timeout=30), [None] * processes
    results = [[] for _ in range(processes)]

    def gather(me, value):
        slots[me] = value
        barrier.wait()
        every = list(slots)
        barrier.wait()
        return every

    def run(me):
        stream = iter([list(range(i + me * share, i + (me + 1) * share))
                       for i in range(0, 100, p)])
        pool = Pool.empty(G, N)
        for step in range(1, count + 1):
            fake = FakeSampler(stream, step, version=step - 1)
            mine = functools.partial(gather, me)
            result = partial_pool.run_step(
                pool, step=step, budget=budget, draw=fake.draw, resume=fake.resume,
                score=score_by_parity, short_batch=short_batch, gather=mine, me=me)
            metrics = partial_pool.token_metrics(result.batch, result.valid, step, mine)
            results[me].append((result, metrics))
            pool = result.pool

    threads = [threading.Thread(target=run, args=(me,)) for me in range(processes)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


@pytest.mark.parametrize("dynamic", [False, True])
def test_processes_carrying_their_own_groups_decide_as_one(dynamic):
    """Two processes, each holding the groups of its half of every draw, take one
    process's decisions over 6 steps (P = 4): the same draws and forced groups, the batch
    its groups in the same order (each process's part where `owners` says), the same
    groups carried over (each on the process that drew it), the same staleness metrics."""
    budget = Budget(tokens_per_step=2, max_carries=2, num_groups=4, max_draws=2,
                    dynamic=dynamic, signal="correct")
    one = steps(budget, 6, short_batch="pad")
    two = steps_on_processes(budget, 6, 2, short_batch="pad")
    assert sum(r.forced for r in one) > 0 and sum(r.pool.size for r in one) > 0
    for step, (want, *pairs) in enumerate(zip(one, *two), start=1):
        got = [result for result, _ in pairs]
        assert [(r.draws, r.forced) for r in got] == [(want.draws, want.forced)] * 2
        assert [r.owners.tolist() for r in got] == [got[0].owners.tolist()] * 2
        parts = [iter(ids(r.batch)) for r in got]
        valid = [iter(r.valid) for r in got]
        batch = [(next(parts[o]), bool(next(valid[o]))) for o in got[0].owners]
        assert batch == list(zip(ids(want.batch), want.valid.tolist())), step
        for me, r in enumerate(got):   # process me drew examples 2k + me of each 4
            assert ids(r.pool) == [e for e in ids(want.pool) if e % 4 // 2 == me], step
        assert sum(r.generated for r in got) == want.generated
        staleness = partial_pool.token_metrics(want.batch, want.valid, step)
        assert [metrics for _, metrics in pairs] == [staleness] * 2


def test_left_pad_widens_or_cuts_the_prompt_axis():
    """`partial_pool.left_pad`: zeros on the left up to the width, or the last columns."""
    x = np.arange(1, 7).reshape(1, 1, 3, 2)
    np.testing.assert_array_equal(partial_pool.left_pad(x, 5, axis=2)[0, 0],
                                  [[0, 0], [0, 0], [1, 2], [3, 4], [5, 6]])
    np.testing.assert_array_equal(partial_pool.left_pad(x, 2, axis=2)[0, 0], [[3, 4], [5, 6]])
    np.testing.assert_array_equal(partial_pool.left_pad(np.asarray([[7, 8]]), 3), [[0, 7, 8]])


def test_own_groups_are_those_of_the_process_share_of_each_draw(monkeypatch):
    """`partial.own_groups` on process 1 of 2, P = 4: the groups of prompts 2 and 3 of each
    draw (`Pool.order` mod 4), in order."""
    pool = steps(BUDGET, 1)[0].pool.take([0, 1, 0, 1])
    pool = pool.replace(order=np.asarray([3, 4, 6, 9], np.int64))
    monkeypatch.setattr(partial.parallel, "process_count", lambda: 2)
    monkeypatch.setattr(partial.parallel, "process_index", lambda: 1)
    assert partial.own_groups(pool, 4).order.tolist() == [3, 6]

@pytest.mark.parametrize("support_k, routing_shape", [(0, ()), (K, ROUTING)])
def test_the_pool_survives_a_checkpoint(tmp_path, support_k, routing_shape):
    """`Pool.to_checkpoint` through `Checkpointer.save_run(extra=...)` and back, bit for bit
    (with support and routing records too); an empty pool writes no arrays."""
    pool = steps(BUDGET, 2, support_k=support_k, routing_shape=routing_shape)[-1].pool
    assert pool.size == 2 and (pool.support_k, pool.routing_shape) == (support_k, routing_shape)

    class Position:
        def get_state(self):
            return {"position": 1}

        def set_state(self, state):
            pass

    saver = checkpoint.Checkpointer(str(tmp_path / "ckpt"), asynchronous=False)
    state = {"w": jax.numpy.ones(3)}
    empty = Pool.empty(G, N, support_k=support_k, routing_shape=routing_shape)
    saver.save_run(1, state, Position(), extra=empty.to_checkpoint())
    saver.save_run(2, state, Position(), extra=pool.to_checkpoint())
    saver.close()
    assert not (tmp_path / "ckpt" / "1" / checkpoint.EXTRA_ITEM).exists()
    back_empty = Pool.from_checkpoint(*empty.to_checkpoint())
    assert back_empty.size == 0 and back_empty.fields == empty.fields
    reader = checkpoint.Checkpointer(str(tmp_path / "ckpt"))
    step, _, (arrays, info) = reader.restore_run(state, Position(), extra=True)
    reader.close()
    back = Pool.from_checkpoint(arrays, info)
    assert step == 2 and back.fields == pool.fields
    for field in pool.fields:
        np.testing.assert_array_equal(getattr(back, field), getattr(pool, field), err_msg=field)
        assert getattr(back, field).dtype == getattr(pool, field).dtype, field
    assert back.examples == pool.examples and back.texts == pool.texts
    # A pool written before groups recorded their draw order (one process, kept in draw
    # order) restores with its indices as the order.
    older = Pool.from_checkpoint({k: v for k, v in arrays.items() if k != "order"}, info)
    assert older.order.tolist() == [0, 1] and older.order.dtype == np.int64


def test_an_empty_pool_keeps_its_reward_columns_through_a_checkpoint():
    """A run with several reward columns (GDPO's separate rewards) saves an empty pool
    whose rewards are [0, G, columns]; it restores with that shape, so the next groups
    concatenate onto it."""
    empty = Pool.empty(G, N, reward_columns=(3,))
    arrays, info = empty.to_checkpoint()
    assert arrays is None and info["reward_columns"] == [3]
    assert Pool.from_checkpoint(arrays, info).rewards.shape == (0, G, 3)


def test_a_pool_without_support_records_restores_with_its_supports_marked_not_recorded():
    """A pool written without support records (before pools kept them, or by a run
    without keep sampling mask) restores with none; a run that keeps them marks each of
    its tokens' supports not recorded (size K + 1, ids -1: the trainer then scores the
    token over the whole tempered softmax, which its log-prob was taken over). Step 2's
    pool holds groups 3 (rows of 8 and 3 tokens) and 5 (4 and 4). Records of another K,
    or records in a run that keeps none, are an error naming the fields."""
    pool = steps(BUDGET, 2, support_k=K)[-1].pool
    arrays, info = pool.to_checkpoint()
    arrays = {k: v for k, v in arrays.items() if k not in Pool.RECORDS}
    info = {k: v for k, v in info.items() if k != "support_k"}
    old = Pool.from_checkpoint(arrays, info)
    assert old.support_ids is None and old.support_size is None and old.fields == Pool.ARRAYS
    assert old.with_support(0) is old
    marked = old.with_support(K)
    np.testing.assert_array_equal(marked.lengths, [[8, 3], [4, 4]])
    want = np.zeros((2, G, N), np.int32)
    for (i, g), length in np.ndenumerate(marked.lengths):
        want[i, g, :length] = K + 1
    np.testing.assert_array_equal(marked.support_size, want)
    assert marked.support_ids.shape == (2, G, N, K) and (marked.support_ids == -1).all()
    assert marked.support_ids.dtype == marked.support_size.dtype == np.int32
    empty = Pool.from_checkpoint(None, {**info, "groups": 0}).with_support(K)
    assert empty.support_ids.shape == (0, G, N, K) and empty.support_size.shape == (0, G, N)
    for k in (0, K + 1):
        with pytest.raises(ValueError, match=rf"records supports of {K} ids .* this run keeps "
                                             rf"{k} .* rollout.keep_sampling_mask, top_k"):
            pool.with_support(k)


def test_a_pool_restores_with_the_routing_the_run_replays():
    """`Pool.with_routing`: a run without keep routing drops the records (they change no
    log-prob); an empty pool takes the run's; groups without records (or of another
    shape) in a run that replays experts are an error naming the field."""
    pool = steps(BUDGET, 2, routing_shape=ROUTING)[-1].pool
    assert pool.with_routing(ROUTING) is pool
    dropped = pool.with_routing(())
    assert dropped.fields == Pool.ARRAYS and dropped.prompt_routing is None
    empty = Pool.empty(G, N).with_routing(ROUTING)
    assert empty.routing.shape == (0, G, N, *ROUTING) and empty.prompt_routing.shape == (
        0, G, 1, *ROUTING)
    for old, shape in ((dropped, ROUTING), (pool, (2, 2))):
        with pytest.raises(ValueError, match=r"holds 2 groups with routing records of shape .* "
                                             r"rollout.keep_routing and model"):
            old.with_routing(shape)


def test_a_run_restores_the_pool_with_the_supports_it_keeps():
    """`partial.restored_pool`: the tiny model's K (64 candidates with keep sampling mask,
    0 without); a pool written without supports restored by a run that keeps them has
    each token's marked not recorded (65), one restored by a run that keeps none is as
    written. Keep routing on the tiny MoE records (3 MoE layers, 2 experts) a token: a
    pool of groups without experts is refused, an empty one takes the run's records."""
    model_cfg = models.get_model_config("tiny")
    keep = tiny_config("dapo", "/x", **{"rollout.partial.enabled": True, "rollout.top_p": 0.9,
                                        "rollout.keep_sampling_mask": True,
                                        "rollout.prompts_per_batch": 2})
    plain = tiny_config("dapo", "/x", **{"rollout.partial.enabled": True,
                                         "rollout.prompts_per_batch": 2})
    assert (partial.support_k(keep, model_cfg), partial.support_k(plain, model_cfg)) == (64, 0)
    pool = steps(BUDGET, 2)[-1].pool
    back = partial.restored_pool(*pool.to_checkpoint(), keep, model_cfg)
    assert ids(back) == [3, 5] and back.support_ids.shape == (2, G, N, 64)
    np.testing.assert_array_equal(back.support_size[0, 0], [65] * 8 + [0] * 2)
    same = partial.restored_pool(*pool.to_checkpoint(), plain, model_cfg)
    assert same.fields == Pool.ARRAYS and ids(same) == [3, 5]
    # keep routing on the tiny MoE: its 3 MoE layers' 2 experts a token
    moe_cfg = models.get_model_config("tiny_moe")
    routed = tiny_config("dapo", "/x", **{"rollout.partial.enabled": True,
                                          "rollout.keep_routing": True, "model.name": "tiny_moe"})
    assert partial.routing_shape(routed, moe_cfg) == (3, 2)
    assert partial.routing_shape(plain, moe_cfg) == ()
    with pytest.raises(ValueError, match=r"rollout.keep_routing"):
        partial.restored_pool(*pool.to_checkpoint(), routed, moe_cfg)
    empty = partial.restored_pool(*Pool.empty(G, N).to_checkpoint(), routed, moe_cfg)
    assert empty.routing.shape == (0, G, N, 3, 2)


@pytest.mark.parametrize("overrides, match", [
    ({"rollout.partial.tokens_per_step": 0},
     r"rollout.partial.tokens_per_step must be an int >= 1"),
    ({"rollout.partial.max_carries": 0}, r"rollout.partial.max_carries must be an int >= 1"),
    ({"filtering.max_gen_batches": 1}, r"needs filtering.max_gen_batches >= 2"),
    ({"environment.name": "calculator"}, r"environment.name='calculator': multi-turn"),
])
def test_config_errors_name_the_field(overrides, match):
    config = tiny_config("dapo", "/nonexistent", **{"rollout.partial.enabled": True, **overrides})
    with pytest.raises(ValueError, match=match):
        partial.check_config(config, 1)
    for processes in (1, 2):   # several processes carry their own groups (test_multihost.py)
        partial.check_config(tiny_config("dapo", "/x", **{"rollout.partial.enabled": True}),
                             processes)
        partial.check_config(tiny_config("dapo", "/x", **{   # a carried row keeps its records
            "rollout.partial.enabled": True, "rollout.keep_sampling_mask": True,
            "rollout.top_p": 0.9, "rollout.keep_routing": True, "model.name": "tiny_moe"}),
            processes)


@pytest.mark.parametrize("overrides, match", [
    ({"rollout.mesh": "data=4"}, r"rollout.mesh='data=4' on 2 processes: .* set rollout.mesh=''"),
    ({"train.sft_weight": 0.1}, r"train.sft_weight=0.1 on 2 processes: .* set train.sft_weight=0"),
])
def test_config_errors_of_several_processes_name_the_field(overrides, match):
    config = tiny_config("dapo", "/x", **{"rollout.partial.enabled": True, **overrides})
    partial.check_config(config, 1)
    with pytest.raises(ValueError, match=match):
        partial.check_config(config, 2)


# The tiny model's runs: 2-digit additions of 15-27 tokens in a 34-token buffer, 4
# groups of 4 a batch, no dynamic sampling (its surplus groups with signal would wait
# instead of being dropped, which changes later steps; see docs/async.md).
PARTIAL = {"filtering.dynamic_sampling": False, "filtering.max_gen_batches": 2,
           "train.eval_every": 100, "rollout.partial.enabled": True}
PARTIAL_METRICS = ("token_staleness_mean", "token_staleness_max", "carried_token_share",
                   "carried_groups", "forced_groups")


@pytest.mark.slow
def test_a_budget_that_cuts_nothing_gives_the_run_without_partial_rollouts(data_dir, tmp_path):
    """tokens_per_step = rollout.max_new_tokens: every row ends in its first step, so the
    run is the one without partial rollouts, bit for bit: every metric (the partial ones
    besides: nothing stale, nothing carried), the rollouts, the exported parameters."""
    common = {**PARTIAL, "rollout.partial.enabled": False, "train.steps": 3,
              "train.eval_every": 3, "train.export": True, "train.log_rollouts_every": 1}
    rl.train(tiny_config("dapo", data_dir, **common), str(tmp_path / "whole"))
    config = tiny_config("dapo", data_dir, **{**common, "rollout.partial.enabled": True,
                                              "rollout.partial.tokens_per_step": 34})
    assert config.rollout.partial.tokens_per_step == config.rollout.max_new_tokens
    rl.train(config, str(tmp_path / "partial"))
    assert_rows_equal(tmp_path / "partial", tmp_path / "whole", range(1, 4), extra=PARTIAL_METRICS)
    assert_same_export(tmp_path / "partial", tmp_path / "whole")
    for step in range(1, 4):
        assert (tmp_path / "partial" / "rollouts" / f"{step}.jsonl").read_text() == \
            (tmp_path / "whole" / "rollouts" / f"{step}.jsonl").read_text()
    for row in read_metrics(tmp_path / "partial"):
        assert {k: row[k] for k in PARTIAL_METRICS} == dict.fromkeys(PARTIAL_METRICS, 0.0)


def _teacher_forced_logp(graphdef, params, batch):
    """`[B, N]` log-probs of the batch's completion tokens under `params`, one forward
    pass over prompt + completion (temperature 1, the runs' rollout temperature)."""
    s = batch["prompt_tokens"].shape[1]
    tokens = np.concatenate([batch["prompt_tokens"], batch["tokens"]], axis=1)
    mask = np.concatenate([batch["prompt_mask"], batch["mask"]], axis=1)
    logits = nnx.merge(graphdef, params)(tokens, attention_mask=mask)[:, s - 1:-1]
    return np.asarray(token_logprobs(logits, batch["tokens"], temperature=1.0))


def _sampled_at(records, step, example, g, length):
    """`[length]`: the step that sampled each token of row g of `example`'s group trained
    at `step`, read off the lengths the pool held after each earlier step."""
    at = np.full(length, step)
    for record in records[:step - 1][::-1]:   # step - 1, step - 2, ...
        pool = record["carry_out"]
        if example not in pool.examples:
            break
        at[:pool.lengths[pool.examples.index(example), g]] = record["step"]
    return at


@pytest.mark.slow
def test_carried_rows_keep_their_tokens_and_log_probs_and_go_on_under_new_parameters(
        data_dir, tmp_path, monkeypatch):
    """10 tokens a step, 2 carries, 4 steps: rows carried over come back with the tokens
    and behaviour log-probs the pool held after the step before (exactly); each token's
    behaviour log-prob is the one-forward-pass log-prob under the parameters of the step
    that sampled it (the new tokens under the new parameters), not under the current
    ones; the batches hold whole groups of done rows; the staleness metrics equal a count
    of each token's age from the pools' lengths."""
    records, collect = [], partial.collect

    def recording(policy, mesh, train_iter, carry, **kwargs):
        params = jax.tree.map(np.asarray, policy.params)   # before the update donates them
        batch, metrics, examples, out = collect(policy, mesh, train_iter, carry, **kwargs)
        records.append({"step": kwargs["step"], "graphdef": policy.graphdef, "params": params,
                        "batch": jax.device_get(batch), "metrics": metrics,
                        "examples": examples, "carry_out": out})
        return batch, metrics, examples, out

    monkeypatch.setattr(partial, "collect", recording)
    config = tiny_config("dapo", data_dir, **{**PARTIAL, "train.steps": 4,
                                              "rollout.partial.tokens_per_step": 10})
    rl.train(config, str(tmp_path))
    g, n = config.objective.group_size, config.rollout.max_new_tokens
    ages, moved = set(), 0.0
    for record in records:
        step, batch, metrics = record["step"], record["batch"], record["metrics"]
        assert batch["tokens"].shape == (config.rollout.prompts_per_batch * g, n)
        assert batch["row_valid"].all()
        assert (~batch["truncated"] | (batch["lengths"] == n)).all()   # every row done
        for k in range(config.rollout.prompts_per_batch):   # whole groups, one prompt each
            prompts = batch["prompt_tokens"][k * g:(k + 1) * g]
            assert (prompts == prompts[0]).all()
        forced = {s: _teacher_forced_logp(records[s - 1]["graphdef"], records[s - 1]["params"],
                                          batch) for s in range(1, step + 1)}
        stale, carried = [], 0
        for row in range(batch["tokens"].shape[0]):
            length, example = batch["lengths"][row], record["examples"][row // g]
            at = _sampled_at(records, step, example, row % g, length)
            before = records[step - 2]["carry_out"] if step > 1 else None
            if before is not None and example in before.examples:   # exactly as the pool held it
                j = before.examples.index(example)
                m = before.lengths[j, row % g]
                np.testing.assert_array_equal(batch["tokens"][row, :m],
                                              before.tokens[j, row % g, :m])
                np.testing.assert_array_equal(batch["behaviour_logp"][row, :m],
                                              before.logp[j, row % g, :m])
            logp = batch["behaviour_logp"][row, :length]
            for s in set(at.tolist()):   # each token under the parameters that sampled it
                np.testing.assert_allclose(logp[at == s], forced[s][row, :length][at == s],
                                           atol=2e-5, err_msg=f"step {step} row {row} from {s}")
            if (at < step).any():   # ... which the current ones no longer are
                moved = max(moved, np.abs(logp - forced[step][row, :length])[at < step].max())
            stale += (step - at).tolist()
            carried += int((at < step).sum())
            ages.update((step - at).tolist())
        assert metrics["token_staleness_mean"] == pytest.approx(np.mean(stale))
        assert metrics["token_staleness_max"] == max(stale)
        assert metrics["carried_token_share"] == pytest.approx(carried / len(stale))
    assert ages == {0, 1, 2}, ages   # carried once and twice (then run to the end)
    assert moved > 1e-3


@pytest.mark.slow
def test_fixed_async_partial_rollouts_equal_the_synchronous_loop_with_policy_lag(data_dir,
                                                                                 tmp_path):
    """The producer carries its own pool from batch to batch: with every batch exactly 1
    step stale (async_rl.fixed) the run equals the synchronous loop with
    rollout.policy_lag = 1 and the same partial rollouts, bit for bit (every metric, the
    exported parameters). A token sampled at step t is min(1, t - 1) steps stale there
    (version max(0, t - 2)), one carried over from the step before a step more."""
    common = {**PARTIAL, "train.steps": 3, "rollout.partial.tokens_per_step": 10,
              "train.export": True}
    rl.train(tiny_config("dapo", data_dir, **common, **{"rollout.policy_lag": 1}),
             str(tmp_path / "sync"))
    rl.train(tiny_config("dapo", data_dir, **common, **{
        "async_rl.enabled": True, "async_rl.max_staleness": 1, "async_rl.fixed": True}),
        str(tmp_path / "async"))
    assert_rows_equal(tmp_path / "async", tmp_path / "sync", range(1, 4))
    assert_same_export(tmp_path / "async", tmp_path / "sync")
    rows = read_metrics(tmp_path / "async")
    assert [r["token_staleness_max"] for r in rows] == [0.0, 1.0, 2.0]


def _sample_in_steps(run, examples, tokens_per_step):
    """`examples`' groups sampled by `partial._Sampler` with `run`'s policy (one version,
    rng key 7): drawn up to `tokens_per_step` tokens a row, then resumed D more at a time
    until every row is done; returns the `Pool` and how many steps it took."""
    sampler = partial._Sampler(run.policy, run.mesh, iter([examples]), config=run.config,
                               method=run.method, rng=jax.random.key(7), step=1, version=0,
                               reward_columns=())
    n = run.config.rollout.max_new_tokens
    pool, count = sampler.draw(0, min(tokens_per_step, n)), 1
    while not pool.done.all():
        pool = sampler.resume(pool, np.where(pool.done, 0, np.minimum(
            n, pool.lengths + tokens_per_step)).astype(np.int32))
        count += 1
    return pool, count


@pytest.mark.slow
@pytest.mark.parametrize("model, keep_routing", [("tiny", False), ("tiny_moe", True)])
def test_records_assembled_over_partial_steps_equal_the_row_sampled_in_one_go(
        data_dir, tmp_path, model, keep_routing):
    """Keep sampling mask on the tiny model (at random, top-p 0.8: nuclei of ~47 tokens,
    within the K = 64 recorded), and keep routing besides on the tiny MoE: the rows a
    resumption carries on 10 tokens at a time (4 steps for 34 tokens) have the tokens,
    behaviour log-probs (of the cut distribution), support records and experts (the
    prompt's and every token's) of the same rows sampled in one go by `rollout.draw`
    (the run's sampler without partial rollouts): a row draws its token t with its own
    key whatever the step, and under the same parameters a resumption routes the prompt
    and the earlier tokens as the first step did."""
    config = tiny_config("dapo", data_dir, **{
        **PARTIAL, "rollout.keep_sampling_mask": True, "rollout.top_p": 0.8,
        "rollout.keep_routing": keep_routing, "model.name": model})
    partial.check_config(config, 1)
    config, workdir = config_lib.resolve_run_paths(config, str(tmp_path))
    mesh, _ = parallel.setup_meshes(config, lambda: footprint.replicated_state_bytes(config, "rl"))
    run = rl_run.set_up(config, workdir, mesh)
    try:
        assert run.carry.size == 0 and run.carry.support_k == 64
        assert bool(run.carry.routing_shape) == keep_routing
        examples = next(run.train_iter)
        pieces, count = _sample_in_steps(run, examples, 10)
        whole, _ = rollout.draw(run.policy, mesh, examples, config=config, scorer=run.scorer,
                                rng=jax.random.fold_in(jax.random.key(7), 0), method=run.method)
        whole = jax.device_get(whole)
    finally:
        run.checkpointer.close()
        run.scorer.close()
    rows = partial_pool.batch_rows(pieces)
    assert count == 4 and (rows["lengths"] > 20).any()
    for key in ("tokens", "mask", "lengths", "truncated", "support_size", "support_ids",
                "prompt_tokens", "prompt_mask") + (("prompt_routing",) if keep_routing else ()):
        np.testing.assert_array_equal(rows[key], whole[key], err_msg=key)
    if keep_routing:   # the experts of every token a later token's log-prob depends on (the
        # static sampler also writes past them: it decodes done rows in lockstep)
        before_last = np.arange(34) < rows["lengths"][:, None] - 1
        np.testing.assert_array_equal(rows["routing"][before_last], whole["routing"][before_last])
        assert (rows["routing"][before_last] > 0).any()
    np.testing.assert_allclose(rows["behaviour_logp"], whole["behaviour_logp"], atol=2e-5)
    sizes = rows["support_size"][rows["mask"] > 0]
    assert sizes.min() > 1 and sizes.max() <= 64
