"""The paged KV cache (`generate(slots=C, kv_page_size=...)`): the static sampler's and the
contiguous engine's rows, with pages freed, reused, waited for and preempted."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from grpo_jax import models, sampling
from grpo_jax.sampling import _paged
from tests.sampling.test_engine import (assert_same_rows,
                                        assert_same_rows_but_a_rounding_flip, run, run_on_device)

PAGE = 8


def run_paged(model, slots=3, kv_pages=0, **kwargs):
    """`(Rollout on host, PagedStats as ints)` of the engine test's 12 rows in pages of 8."""
    rollout, stats = run_on_device(model, slots, kv_page_size=PAGE, kv_pages=kv_pages,
                                   with_page_stats=True, **kwargs)
    return sampling.to_host(rollout), {k: int(v) for k, v in vars(jax.device_get(stats)).items()}


def fed_pages(lengths):
    """Pages a row of each length takes: its fed tokens (all but the last, which ends it)
    in pages of `PAGE`."""
    return int(np.sum(-(-(np.asarray(lengths) - 1) // PAGE)))


@pytest.fixture(scope="module")
def static(tiny_model):
    return run(tiny_model, slots=0)


@pytest.fixture(scope="module")
def paged(tiny_model):
    return run_paged(tiny_model)


@pytest.mark.slow
def test_paged_slots_give_the_static_and_contiguous_rows(tiny_model, static, paged):
    """12 ragged rows through 3 slots over a pool with every slot's budget: the static
    sampler's and the contiguous engine's tokens (up to one rounding flip: the paged
    columns pad the 10-token prompt to 16, a different summation in attention); each row
    took the pages of its fed tokens, and none waited or was preempted."""
    rows, stats = paged
    assert len(set(static.lengths)) > 4 and static.truncated.any()
    assert_same_rows_but_a_rounding_flip(rows, static)
    assert_same_rows_but_a_rounding_flip(rows, run(tiny_model, slots=3))
    assert stats["pages_taken"] == fed_pages(rows.lengths)
    assert stats["preemptions"] == 0 and stats["admission_waits"] == 0
    assert stats["peak_pages"] <= 3 * 64 // PAGE


@pytest.mark.slow
def test_a_small_pool_frees_reuses_waits_and_preempts(tiny_model, paged):
    """8 pages (one full 64-token row) for 3 slots: rows wait for pages at admission, a
    row that runs out is preempted and re-run, and pages go from stopped rows to new
    ones; the rows are the full pool's, token for token (each row's random stream does
    not depend on when or where it runs), and the top-p supports recorded are the static
    sampler's (a preempted row's are cleared and recorded again)."""
    full, _ = paged
    rows, stats = run_paged(tiny_model, kv_pages=8, record_support=True)
    assert_same_rows(rows, full)
    want = run(tiny_model, slots=0, record_support=True)
    same = (rows.tokens == want.tokens).all(axis=1)
    assert same.sum() >= len(same) - 1 and (want.support_size[same] > 1).any()
    np.testing.assert_array_equal(rows.support_size[same], want.support_size[same])
    np.testing.assert_array_equal(rows.support_ids[same], want.support_ids[same])
    assert stats["peak_pages"] == 8
    assert stats["admission_waits"] > 0
    assert stats["preemptions"] >= 1
    # every final row's pages, plus those its preempted runs took and gave back
    assert stats["pages_taken"] > fed_pages(rows.lengths) > 8


@pytest.mark.slow
def test_a_scanned_model_pages_alike(tiny_model, paged):
    """With `scan_layers` the pools are stacked per run of layers; the same rows."""
    cfg = dataclasses.replace(models.get_model_config("tiny"), scan_layers=True)
    scanned = nnx.split(models.init_model(cfg, seed=0))
    rows, _ = run_paged(scanned)
    assert_same_rows(rows, paged[0])


def test_bad_paging_arguments_name_the_fix(tiny_model):
    with pytest.raises(ValueError, match=r"kv_page_size=8 pages the slots' caches; set slots > 0"):
        run(tiny_model, slots=0, kv_page_size=8)
    with pytest.raises(ValueError, match=r"kv_pages=7 cannot hold one full row \(64 tokens in "
                                         r"pages of 8: 8 pages\); raise kv_pages to >= 8"):
        run(tiny_model, slots=3, kv_page_size=8, kv_pages=7)
    with pytest.raises(ValueError, match=r"with_page_stats needs kv_page_size > 0"):
        run(tiny_model, slots=3, with_page_stats=True)
    assert _paged.pool_pages(3, 64, 8) == 24 and _paged.pool_pages(3, 60, 8, 10) == 10
    assert _paged.pool_pages(2, 65, 8) == 18


def test_preemption_takes_the_latest_rows_until_the_others_fit():
    """3 live slots (rows 0, 5, 3), 4 pages all held (slot 0: pages 0 and 1, slot 1:
    page 2, slot 2: page 3); slots 0 and 2 need a page. Preempting row 5 frees one page
    for two needs; also preempting row 3 frees another and drops its need: rows 5 and 3
    go back to pending, outputs cleared, and slot 0 gets the first free page (2)."""
    c, rows, n = 3, 6, 4
    slots = _paged._Slots(
        cache=None, logits=jnp.zeros((c, 2)), row=jnp.array([0, 5, 3]), t=jnp.array([9, 3, 9]),
        live=jnp.ones(c, bool), next_row=jnp.int32(0), tokens=jnp.ones((rows, n), jnp.int32),
        logp=jnp.ones((rows, n)), sample_logp=jnp.ones((rows, n)),
        lengths=jnp.full((rows,), 3, jnp.int32), stopped=jnp.zeros(rows, bool))
    zero = jnp.int32(0)
    pages = _paged._Pages(
        owner=jnp.array([0, 0, 1, 2]), table=jnp.array([[0, 1], [2, 4], [3, 4]]),
        status=jnp.array([1, 0, 0, 1, 0, 1]),
        stats=_paged.PagedStats(pages_taken=zero, peak_pages=zero, preemptions=zero,
                                admission_waits=zero))
    pages, slots, need = _paged._preempt(pages, slots, jnp.array([True, False, True]), pad_id=7)
    np.testing.assert_array_equal(need, [True, False, False])
    np.testing.assert_array_equal(slots.live, [True, False, False])
    np.testing.assert_array_equal(pages.owner, [0, 0, 3, 3])   # 3 = free
    np.testing.assert_array_equal(pages.status, [1, 0, 0, 0, 0, 0])
    np.testing.assert_array_equal(slots.tokens[:, 0], [1, 1, 1, 7, 1, 7])
    np.testing.assert_array_equal(slots.lengths, [3, 3, 3, 0, 3, 0])
    assert int(pages.stats.preemptions) == 2
    pages = _paged._allocate(pages, need, jnp.array([8, 2, 8]), PAGE)
    np.testing.assert_array_equal(pages.owner, [0, 0, 0, 3])
    np.testing.assert_array_equal(pages.table[0], [0, 2])
    assert int(pages.stats.pages_taken) == 1 and int(pages.stats.peak_pages) == 3


@pytest.mark.slow
def test_on_a_mesh_the_paged_slots_give_the_same_rows(static):
    """8 paged slots on an 8-device mesh (rows split 8 ways, the pools left to XLA):
    completions 0-3 of each prompt are the static run's, and the rows come back split
    over the row axes."""
    mesh = jax.make_mesh((8, 1), ("fsdp", "tensor"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
    model = nnx.split(models.init_model(models.get_model_config("tiny"), seed=0, mesh=mesh))
    with jax.set_mesh(mesh):
        on_mesh = run_on_device(model, slots=8, group_size=8, kv_page_size=PAGE)
        assert on_mesh.tokens.sharding.spec[0] in ("fsdp", ("fsdp",))
        rows = sampling.to_host(on_mesh)
    for prompt in range(3):
        np.testing.assert_array_equal(rows.tokens[prompt * 8:prompt * 8 + 4],
                                      static.tokens[prompt * 4:prompt * 4 + 4])
