"""Continuous batching (`generate(slots=C)`): the static sampler's rows, decoded C at a time."""

import jax
import numpy as np
import pytest
from flax import nnx

from grpo_jax import models, sampling
from grpo_jax.sampling import _engine

# 1 token in 16 stops a completion: lengths from 1 to the 40-token budget.
STOPS = np.arange(0, 512, 16)
PROMPTS = [[5, 6, 7], [8, 9], list(range(20, 30))]


def run_on_device(model, slots, method=sampling.TopP(0.95, temperature=1.0), **kwargs):
    tokens, mask = sampling.pad_prompts(PROMPTS, pad_id=0)
    args = dict(group_size=4, max_new_tokens=40, stop_tokens=STOPS, pad_id=0) | kwargs
    return sampling.generate(*model, tokens, mask, rng=jax.random.key(7), method=method,
                             slots=slots, **args)


def run(model, slots, **kwargs):
    return sampling.to_host(run_on_device(model, slots, **kwargs))


def assert_same_rows(got, want, logp_tol=1e-5):
    for name in ("tokens", "mask", "lengths", "truncated", "stop_reason", "prompt_tokens",
                 "prompt_mask"):
        np.testing.assert_array_equal(getattr(got, name), getattr(want, name), err_msg=name)
    np.testing.assert_allclose(got.logp, want.logp, atol=logp_tol, rtol=0)
    np.testing.assert_allclose(got.sample_logp, want.sample_logp, atol=logp_tol, rtol=0)


def assert_same_rows_but_a_rounding_flip(got, want, logp_tol=1e-5):
    """`assert_same_rows`, except that one row may pick a different token at one step and
    go its own way after it, provided both runs agree up to that token. A draw that lands
    within float32 rounding of a boundary of the cumulative distribution picks the
    neighbouring token when the batch's width changes how XLA's CPU matmul rounds (it
    chooses kernels by shape): seen on one CPU at 1 token of 768, never on another."""
    same = (got.tokens == want.tokens).all(axis=1)
    assert same.sum() >= len(same) - 1, f"rows {np.flatnonzero(~same)} differ"
    for row in np.flatnonzero(~same):
        first = int(np.argmax(got.tokens[row] != want.tokens[row]))
        np.testing.assert_allclose(got.logp[row, :first], want.logp[row, :first],
                                   atol=logp_tol, rtol=0)
    for name in ("tokens", "mask", "lengths", "truncated", "stop_reason", "logp", "sample_logp"):
        g, w = getattr(got, name)[same], getattr(want, name)[same]
        if name.endswith("logp"):
            np.testing.assert_allclose(g, w, atol=logp_tol, rtol=0, err_msg=name)
        else:
            np.testing.assert_array_equal(g, w, err_msg=name)
    for name in ("prompt_tokens", "prompt_mask"):
        np.testing.assert_array_equal(getattr(got, name), getattr(want, name), err_msg=name)


@pytest.fixture(scope="module")
def static(tiny_model):
    return run(tiny_model, slots=0)


@pytest.mark.slow
@pytest.mark.parametrize("slots", [2, 5])
def test_slots_give_the_static_samplers_rows(tiny_model, static, slots):
    """12 ragged rows through 2 or 5 slots: every slot is reused (rows stop at different
    steps, so rows are admitted mid-flight); the same tokens, lengths and log-probs."""
    assert len(set(static.lengths)) > 4 and static.truncated.any() and not static.truncated.all()
    assert_same_rows_but_a_rounding_flip(run(tiny_model, slots=slots), static)


@pytest.mark.slow
def test_per_row_budgets_cut_each_row_alike_in_both_samplers(tiny_model, static):
    """`max_new_tokens` per row: a row ends at its stop token or its own budget, and
    whatever it drew before that is what the 40-token run drew."""
    budgets = np.random.default_rng(1).integers(1, 41, 12)
    cut = run(tiny_model, slots=0, max_new_tokens=budgets)
    assert_same_rows(run(tiny_model, slots=3, max_new_tokens=budgets), cut)
    np.testing.assert_array_equal(cut.lengths, np.minimum(static.lengths, budgets))
    for row, n in enumerate(cut.lengths):
        np.testing.assert_array_equal(cut.tokens[row, :n], static.tokens[row, :n])
    np.testing.assert_array_equal(cut.truncated, ~(static.lengths <= budgets) | static.truncated)
    with pytest.raises(ValueError, match=r"one per row \(\[P\*G\] = \[12\]\), got shape \(5,\)"):
        run(tiny_model, slots=0, max_new_tokens=np.ones(5, int))


@pytest.mark.slow
def test_a_reused_slot_reads_nothing_of_its_previous_row(tiny_model, static, monkeypatch):
    """Admission marks the slot's completion columns invalid. Keeping them (the previous
    row's keys and values left readable) changes the rows: the check above would fail."""
    copy_prompts = _engine._copy_prompts

    def leaky(cache, prompt_cache, admit_c, prompt_c):
        copied = copy_prompts(cache, prompt_cache, admit_c, prompt_c)
        s = prompt_cache.valid.shape[1]
        return copied.replace(valid=copied.valid.at[:, s:].set(cache.valid[:, s:]))

    # jit keeps what it traced: drop the programs before the leaky run (so it is traced
    # with the leak) and after it (so no later test in this process decodes with it)
    jax.clear_caches()
    monkeypatch.setattr(_engine, "_copy_prompts", leaky)
    try:
        leaked = run(tiny_model, slots=3)
    finally:
        jax.clear_caches()
    assert np.abs(leaked.logp - static.logp).max() > 1e-3


@pytest.mark.slow
def test_on_a_mesh_slots_split_over_the_rows(static):
    mesh = jax.make_mesh((8, 1), ("fsdp", "tensor"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
    model = nnx.split(models.init_model(models.get_model_config("tiny"), seed=0, mesh=mesh))
    with jax.set_mesh(mesh):
        with pytest.raises(
            ValueError, match=r"slots=4 do not split over the mesh's batch axes \(8 ways\)"
        ):
            run(model, slots=4, group_size=8)
        on_mesh = run_on_device(model, slots=8, group_size=8, max_new_tokens=40)
        # the rows come back split over the row axes, as the static sampler's do: on
        # several processes each holds (and scores) its own prompts' rows
        for name in ("tokens", "logp", "lengths", "prompt_tokens"):
            assert getattr(on_mesh, name).sharding.spec[0] in ("fsdp", ("fsdp",)), name
        rows = sampling.to_host(on_mesh)
    # 24 rows, 8 at a time; completions 0-3 of each prompt are the static run's
    for prompt in range(3):
        np.testing.assert_array_equal(rows.tokens[prompt * 8:prompt * 8 + 4],
                                      static.tokens[prompt * 4:prompt * 4 + 4])


@pytest.mark.slow
def test_slots_keep_the_same_records(tiny_model, static):
    """The support of every sampled position (keep sampling mask) and, on an MoE, the
    experts of every token that was fed to sample the next (keep routing: what a
    training forward replays) are the static sampler's."""
    support = run(tiny_model, slots=3, record_support=True)
    want = run(tiny_model, slots=0, record_support=True)
    assert_same_rows(support, static)
    np.testing.assert_array_equal(support.support_size, want.support_size)
    np.testing.assert_array_equal(support.support_ids, want.support_ids)
    assert (want.support_size > 1).any() and support.routing is None
    moe = nnx.split(models.init_model(models.get_model_config("tiny_moe", vocab_size=512), seed=0))
    routed = run(moe, slots=5, record_routing=True, max_new_tokens=24)
    want = run(moe, slots=0, record_routing=True, max_new_tokens=24)
    assert_same_rows(routed, want)
    np.testing.assert_array_equal(routed.prompt_routing, want.prompt_routing)
    # fed to sample the next
    fed = np.arange(routed.routing.shape[1])[None] < routed.lengths[:, None] - 1
    np.testing.assert_array_equal(routed.routing[fed], want.routing[fed])
    assert routed.routing[fed].any() and not routed.routing[~fed].any()
    assert len(set(want.lengths)) > 3
