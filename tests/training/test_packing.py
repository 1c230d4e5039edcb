"""Packed forward passes: the plan puts every real token where it belongs, and the packed
log-probs, values, loss and gradients equal the padded ones."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from grpo_jax import config_lib, models, objectives, parallel
from grpo_jax.training import batch as batch_lib, critic as critic_lib, packing
from grpo_jax.training.steps import init_optimizer_state, make_update_step

B, S, N, V = 16, 6, 9, 64


def _rows(seed=0):
    """Ragged rows: left-padded prompts of 1..S tokens, completions of 0..N tokens."""
    rng = np.random.default_rng(seed)
    completion = rng.integers(0, N + 1, B)
    completion[:2] = (N, 1)   # a full row and a one-token answer
    prompt = rng.integers(1, S + 1, B)
    mask = (np.arange(N)[None] < completion[:, None]).astype(np.int32)
    prompt_mask = (np.arange(S)[None] >= S - prompt[:, None]).astype(np.int32)
    return {
        "prompt_tokens": rng.integers(3, V, (B, S)).astype(np.int32), "prompt_mask": prompt_mask,
        "tokens": rng.integers(3, V, (B, N)).astype(np.int32), "mask": mask,
        "old_logp": rng.normal(-3, 0.3, (B, N)).astype(np.float32) * mask,
        "advantages": rng.normal(size=B).astype(np.float32), "row_valid": completion > 0}


def _lengths(rows):
    return rows["prompt_mask"].sum(1), rows["mask"].sum(1)


def _plan(rows, pieces, ways=1):
    return packing.plan_pieces(*_lengths(rows), pieces, prompt_len=S, new_tokens=N, ways=ways)


def _chunks(rows, chunk_rows):
    return packing.plan_chunks(*_lengths(rows), chunk_rows, prompt_len=S, new_tokens=N)


def check_layout(rows, piece, src, segments, positions, target, back):
    """Every row of `piece` (batch row numbers) is one segment holding its real tokens
    in order, and `back` / `target` link each completion token to the position before it."""
    full = np.concatenate([rows["prompt_tokens"], rows["tokens"]], axis=1)[piece]
    flat, packed = full.reshape(-1), full.reshape(-1)[src]
    for i, row in enumerate(piece):
        real = np.concatenate([rows["prompt_tokens"][row][rows["prompt_mask"][row] > 0],
                               rows["tokens"][row][rows["mask"][row] > 0]])
        where = segments == i + 1
        c = rows["mask"][row].sum()
        if c == 0:
            assert not where.any()
            continue
        np.testing.assert_array_equal(packed[where], real[:-1])   # the last is not read
        np.testing.assert_array_equal(positions[where], np.arange(len(real) - 1))
        # the output before completion token t scores it: its next token is t
        np.testing.assert_array_equal(
            flat[src.reshape(-1)[back[i, :c]] + 1], rows["tokens"][row][:c]
        )
        np.testing.assert_array_equal(target.reshape(-1)[back[i, :c]], i * N + np.arange(c))


class TestFirstFitDecreasing:
    def test_places_longest_first_in_the_first_row_with_room(self):
        # by hand, capacity 6: 5 -> row 0 [1 free]; 4 -> row 1 [2]; 3 -> row 2 [3];
        # 2 -> row 1 at 4 [0]; 1 -> row 0 at 5; 0 is not placed
        row, offset, used = packing.first_fit_decreasing(np.array([2, 5, 0, 3, 4, 1]), 6)
        np.testing.assert_array_equal(row, [1, 0, -1, 2, 1, 0])
        np.testing.assert_array_equal(offset[row >= 0], [4, 0, 0, 0, 5])
        assert used == 3


class TestBucket:
    @pytest.mark.parametrize("needed, rows, ways, want", [
        (1, 64, 1, 8), (9, 64, 1, 16), (64, 64, 1, 64),   # steps of 64 / 8
        (5, 64, 8, 8), (13, 24, 8, 16), (17, 24, 8, 24),  # multiples of the row shards
        (3, 4, 1, 3)])                                    # fewer rows than buckets
    def test_rounds_up_to_a_step_and_never_past_the_rows(self, needed, rows, ways, want):
        assert packing.bucket(needed, rows, ways) == want


class TestPlan:
    def test_each_piece_packs_its_own_rows(self):
        rows = _rows()
        pieces = batch_lib.piece_rows(B, 2)
        plan = _plan(rows, pieces)
        for m, piece in enumerate(pieces):
            check_layout(rows, piece, *(plan[k][m] for k in packing.KEYS))
        p, c = _lengths(rows)
        needed = max(
            packing.first_fit_decreasing(np.where(c > 0, p + c - 1, 0)[piece], S + N - 1)[2]
            for piece in pieces
        )
        # 8 rows per piece: buckets of 1 row, so R is the most rows a piece needs
        assert plan["pack_src"].shape[1:] == (needed, S + N - 1) and needed < B // 2

    def test_chunks_pack_the_whole_batch(self):
        rows = _rows()
        plan = _chunks(rows, 3)
        flat = {k: plan[k].reshape(-1, S + N - 1) for k in packing.ROW_KEYS}
        check_layout(rows, np.arange(B), *(flat[k] for k in packing.ROW_KEYS), plan["pack_back"])
        p, c = _lengths(rows)
        needed = packing.first_fit_decreasing(np.where(c > 0, p + c - 1, 0), S + N - 1)[2]
        assert plan["pack_src"].shape[:2] == (-(-needed // 3), 3)


MESH_SPEC, WAYS = "data=2,fsdp=2", 4


@pytest.fixture(scope="module")
def mesh():
    return parallel.make_mesh(MESH_SPEC, jax.devices()[:4])


def _model(mesh, name="tiny", **overrides):
    cfg = models.get_model_config(name, vocab_size=V, **overrides)
    return nnx.split(models.init_model(cfg, seed=3, mesh=mesh))


def _forward(mesh, graphdef, params, rows, per_piece, *, packed, pieces=2, keys=None):
    """`per_piece` over the rows' pieces, padded or packed, as numpy `[B, N, ...]`."""
    plan = packing.place(_chunks(rows, B // pieces), mesh) if packed else None
    extra = {} if keys is None else {"keys": keys}
    fn = batch_lib.make_rows_fn(graphdef, mesh, per_piece, num_pieces=pieces, **extra)
    return np.asarray(fn(params, parallel.global_rows(mesh, rows), plan))


def _logp_and_entropy(model, piece):
    logp, entropy, _ = batch_lib.scored_logprobs(model, piece, temperature=0.7, with_stats=True)
    return jnp.stack([logp, entropy], axis=-1)


class TestPackedForward:
    """Packed and padded forwards see the same tokens at the same positions; only the
    order of float reductions may differ."""

    def test_logprobs_and_entropies_equal_the_padded_ones(self, mesh):
        rows, (graphdef, params) = _rows(), _model(mesh)
        padded, packed = (_forward(mesh, graphdef, params, rows, _logp_and_entropy, packed=p)
                          for p in (False, True))
        real = rows["mask"] > 0
        np.testing.assert_allclose(packed[real], padded[real], rtol=1e-6, atol=0)

    def test_kept_routing_and_sampling_masks_read_the_same_records(self, mesh):
        """An MoE forward replaying the sampler's experts, with log-probs renormalised over
        each token's recorded support (DeepSeek-V3.2's keep routing and keep sampling
        mask): the packed rows read each token's own records."""
        rows, (graphdef, params) = _rows(1), _model(mesh, "tiny_moe")
        rng = np.random.default_rng(2)
        cfg, k = nnx.merge(graphdef, params).cfg, 4
        layers = sum(cfg.is_moe_layer(i) for i in range(cfg.n_layers))
        experts = lambda width: rng.integers(
            0, cfg.n_experts, (B, width, layers, cfg.n_experts_per_tok)
        )
        support = rng.integers(3, V, (B, N, k))
        support[..., 0] = rows["tokens"]   # the sampled token is in its support
        rows.update(
            prompt_routing=experts(S).astype(np.int32), routing=experts(N).astype(np.int32),
            support_ids=support.astype(np.int32),
            support_size=rng.integers(2, 2 * k, (B, N)).astype(np.int32),   # > k: whole softmax
        )
        padded, packed = (_forward(mesh, graphdef, params, rows, _logp_and_entropy, packed=p)
                          for p in (False, True))
        real = rows["mask"] > 0
        np.testing.assert_allclose(packed[real], padded[real], rtol=1e-6, atol=0)
        # the records act: the same forward without them differs
        plain = {key: v for key, v in rows.items() if key not in batch_lib.RECORD_KEYS}
        differs = _forward(mesh, graphdef, params, plain, _logp_and_entropy, packed=True)
        assert not np.allclose(differs[real][:, 0], packed[real][:, 0], rtol=1e-3)

    def test_routing_churn_reads_the_same_records(self, mesh):
        """The churn against the sampler's experts (kept, not replayed): the packed rows
        compare each position's experts with its own token's records."""
        rows, (graphdef, params) = _rows(2), _model(mesh, "tiny_moe")
        rng = np.random.default_rng(3)
        cfg = nnx.merge(graphdef, params).cfg
        layers = sum(cfg.is_moe_layer(i) for i in range(cfg.n_layers))
        experts = lambda width: np.stack([rng.permutation(cfg.n_experts)[:2] for _ in range(
            B * width * layers)]).reshape(B, width, layers, 2).astype(np.int32)
        rows.update(sampled_prompt_routing=experts(S), sampled_routing=experts(N))
        churn = lambda model, piece: batch_lib.scored_logprobs(
            model, piece, with_stats=True, with_churn=True)[3]
        keys = batch_lib.TOKEN_KEYS + batch_lib.SAMPLED_ROUTING_KEYS
        padded, packed = (_forward(mesh, graphdef, params, rows, churn, packed=p, keys=keys)
                          for p in (False, True))
        real = rows["mask"] > 0
        assert 0.2 < padded[real].mean() < 1   # random records: most layers differ
        np.testing.assert_array_equal(packed[real], padded[real])

    def test_values_equal_the_padded_ones(self, mesh):
        rows, (graphdef, params) = _rows(), _model(mesh)
        critic = nnx.split(models.value_model_from(nnx.merge(graphdef, params), mesh=mesh))
        head = jax.random.normal(jax.random.key(0), critic[1]["head"].shape)   # a fresh head is 0
        critic[1]["head"].set_value(jax.device_put(head, critic[1]["head"].sharding))
        values = lambda model, piece: critic_lib.scored_values(model, piece)[0]
        padded, packed = (_forward(mesh, *critic, rows, values, packed=p, keys=batch_lib.TOKEN_KEYS)
                          for p in (False, True))
        real = rows["mask"] > 0
        np.testing.assert_allclose(packed[real], padded[real], rtol=1e-6, atol=1e-6)


def _update(mesh, rows, *, packed, micro_batches=2):
    """The tiny model's gradient (one SGD step of rate 1) and metrics on all rows."""
    graphdef, params = _model(mesh)
    before = jax.tree.map(np.asarray, params)
    tx = optax.sgd(1.0)
    objective = objectives.policy_objective(config_lib.load_config("configs/base.py").objective)

    def loss_fn(model, micro):
        logp, entropy, _ = batch_lib.completion_logprobs(model, micro, with_stats=True)
        return objective(logp, {**micro, "entropy": entropy})

    update = make_update_step(graphdef, tx, loss_fn, objective.global_counts, mesh=mesh,
                              param_shardings=parallel.tree_shardings(params),
                              opt_shardings=None, micro_batches=micro_batches)
    index = np.random.default_rng(1).permutation(B).astype(np.int32)
    plan = None
    if packed:
        plan = packing.place(_plan(rows, index.reshape(-1, micro_batches).T, ways=WAYS), mesh)
    after, _, metrics = update(params, init_optimizer_state(tx, params, mesh),
                               parallel.global_rows(mesh, rows), index, plan=plan)
    grads = jax.tree.map(lambda b, a: b - np.asarray(a), before, after)
    return np.concatenate([g.ravel() for g in jax.tree.leaves(grads)]), jax.device_get(metrics)


class TestPackedUpdate:
    def test_loss_and_gradients_equal_the_padded_ones(self, mesh):
        rows = _rows()
        (padded, padded_metrics), (packed, packed_metrics) = (
            _update(mesh, rows, packed=p) for p in (False, True))
        assert np.linalg.norm(packed - padded) <= 1e-6 * np.linalg.norm(padded)
        for name in ("loss", "entropy", "grad_norm"):
            np.testing.assert_allclose(packed_metrics[name], padded_metrics[name], rtol=1e-6,
                                       err_msg=name)


def test_rows_in_another_layout_are_refused():
    """Packing reads prompts left-padded and completion masks without holes."""
    rows = _rows()
    assert [x.tolist() for x in packing.row_lengths(rows)] == [x.tolist() for x in _lengths(rows)]
    holed = {**rows, "mask": rows["mask"].copy()}
    holed["mask"][0, 3] = 0   # row 0 answers all N tokens
    with pytest.raises(ValueError, match=r"rows \[0\] are not the sampler's layout"):
        packing.row_lengths(holed)


def test_plans_live_on_the_mesh_split_like_the_rows(mesh):
    """Each device holds its share of a plan: packed rows (and `pack_back`'s rows) split
    over the 4 row ways, the values those of the host plan."""
    rows = _rows()
    host = _chunks(rows, 8)
    placed = packing.place(host, mesh)
    for key, array in placed.items():
        shard = array.addressable_shards[0]
        assert shard.data.shape[-2] == host[key].shape[-2] // WAYS, key
        np.testing.assert_array_equal(np.asarray(array), host[key], err_msg=key)
