"""The fit report's decode KV arithmetic (`grpo_jax.aot.kv`): bytes per chip and the slots
that fit, contiguous vs paged, against hand-computed values; the lognormal lengths against
scipy; the layout and the paged decode program against the fit report's own lowering."""

import math
import re

import jax
import pytest
from scipy import stats

from grpo_jax import aot, config_lib, models, parallel
from grpo_jax.aot import kv, programs as programs_lib

from tests.test_aot import tiny_config, tpu_topology

# b = 1,000 bytes a token column, rows split 4 ways; P = 8 prompts of S = 10, N = 30, pages of 4.
LAYOUT = kv.KVLayout(column_bytes=1000, head_ways=1, row_ways=4)
SHAPE = dict(prompts=8, prompt_len=10)


def test_contiguous_bytes_are_prompts_and_slot_rings_split_over_the_rows():
    # per chip: 8/4 prompts x 10 + 12/4 slots x (10 + 30) = 140 columns
    assert kv.contiguous_kv_bytes(LAYOUT, slots=12, new_tokens=30, **SHAPE) == 140_000
    # 6 prompts do not split 4 ways: whole on each chip, 6 x 10 + 3 x 40 = 180 columns
    assert kv.contiguous_kv_bytes(LAYOUT, prompts=6, prompt_len=10, slots=12,
                                  new_tokens=30) == 180_000
    # kv heads split 2 ways halve a column
    halved = kv.KVLayout(column_bytes=1000, head_ways=2, row_ways=4)
    assert kv.contiguous_kv_bytes(halved, slots=12, new_tokens=30, **SHAPE) == 70_000


def test_paged_bytes_are_the_prompt_pages_the_pool_and_a_trash_page():
    # 8 x ceil(10 / 4) = 24 prompt pages, 12 x ceil(30 / 4) = 96 completion pages, 1 trash
    assert kv.pool_pages(12, 30, 30, 4) == 96
    assert kv.paged_kv_bytes(LAYOUT, pages=96, page=4, **SHAPE) == 121 * 4 * 1000
    # split over the 4 row ways: ceil(121 / 4) = 31 pages a chip
    assert kv.paged_kv_bytes(LAYOUT, pages=96, page=4, pool_ways=4, **SHAPE) == 31 * 4 * 1000
    # rows of 5 tokens take 2 pages each, but a pool holds one full row (8 pages) at least
    assert kv.pool_pages(3, 5, 30, 4) == 8 and kv.pool_pages(12, 5, 30, 4) == 24


def test_contiguous_slots_that_fit_come_in_groups_of_the_row_ways():
    fit = lambda budget: kv.contiguous_slots_that_fit(LAYOUT, budget, new_tokens=30, **SHAPE)
    # 20,000 bytes of prompts, then 40,000 per group of 4 slots (one slot a chip)
    assert fit(140_000) == 12 and fit(179_999) == 12 and fit(180_000) == 16
    assert fit(59_999) == 0 and fit(60_000) == 4 and fit(19_999) == 0


def test_paged_slots_that_fit_follow_the_row_length():
    def fit(budget, length, pool_ways=1):
        return kv.paged_slots_that_fit(LAYOUT, budget, new_tokens=30, page=4, length=length,
                                       pool_ways=pool_ways, **SHAPE)
    # (25 + 8 C) pages x 4,000 <= 484,000: C <= 12
    assert fit(484_000, 30) == 12 and fit(483_999, 30) == 8
    # rows of 5 tokens: (25 + 2 C) <= 121: C <= 48
    assert fit(484_000, 5) == 48
    # split 4 ways: ceil((25 + 8 C) / 4) <= 121: C <= 57, in groups of 4: 56
    assert fit(484_000, 30, pool_ways=4) == 56
    # not even 4 slots' pool (57 pages of rows of 30, 33 of rows of 5): none, 4
    assert fit(131_999, 30) == 0 and fit(132_000, 5) == 4


def test_lognormal_lengths_have_the_asked_p99_over_mean_with_p99_at_the_budget():
    sigma = kv.lognormal_sigma(4.0)
    assert sigma == pytest.approx(0.701754, abs=1e-6)   # 2.326348 - sqrt(5.411894 - 2 ln 4)
    budget = 7168
    lengths = stats.lognorm(s=sigma, scale=budget * math.exp(-kv.Z99 * sigma))
    assert lengths.ppf(0.99) == pytest.approx(budget)
    assert lengths.ppf(0.99) / lengths.mean() == pytest.approx(4.0)
    for q, tokens in ((0.5, 1401), (0.9, 3444)):   # 1400.88, 3443.32 rounded up
        assert kv.lognormal_length(q, budget, 4.0) == tokens == math.ceil(lengths.ppf(q))
    assert kv.lognormal_length(0.999, budget, 4.0) == budget   # capped at the budget
    with pytest.raises(ValueError, match=r"--length_p99_over_mean must be in \(1, 14.97\]"):
        kv.lognormal_sigma(20.0)
    with pytest.raises(ValueError, match=r"--length_quantile must be in \(0, 1\), got 1"):
        kv.lognormal_length(1, budget, 4.0)


def mesh_of(spec):
    return parallel.make_mesh(parallel.parse_mesh(spec))


def test_layout_reads_the_fit_reports_cache_sharding():
    cfg = models.get_model_config("tiny")   # 3 layers, 2 kv heads of 32, float32
    column = 2 * 3 * 2 * 32 * 4
    assert kv.kv_layout(cfg, mesh_of("data=2,fsdp=4,tensor=1")) == kv.KVLayout(column, 1, 8)
    assert kv.kv_layout(cfg, mesh_of("data=2,fsdp=2,tensor=2")) == kv.KVLayout(column, 2, 4)


def test_report_rows_for_the_tiny_model():
    config = tiny_config(**{"rollout.slots": 8, "rollout.kv_page_size": 16})
    cfg = models.get_model_config("tiny")
    n = config.rollout.max_new_tokens   # runlocal's budget
    result = kv.report(config, cfg, mesh_of("data=2,fsdp=4,tensor=1"), prompt_len=16,
                       budget=None, quantiles=(0.5,))
    layout = kv.KVLayout(2 * 3 * 2 * 32 * 4, 1, 8)
    rows = {(r["engine"], r["pool_ways"]): r for r in result["rows"]}
    assert rows[("contiguous", None)]["bytes"] == kv.contiguous_kv_bytes(
        layout, prompts=16, prompt_len=16, slots=8, new_tokens=n)
    median = kv.lognormal_length(0.5, n, 4.0)
    for ways in (1, 8):
        assert rows[("paged (q0.5)", ways)]["pages"] == kv.pool_pages(8, median, n, 16)
        assert rows[("paged (budget)", ways)]["bytes"] == kv.paged_kv_bytes(
            layout, prompts=16, prompt_len=16, pages=kv.pool_pages(8, n, n, 16), page=16,
            pool_ways=ways)
    assert all(r["slots_that_fit"] is None for r in result["rows"])
    assert "| paged (q0.5) |" in result["table"] and "not compiler output" in result["table"]


@pytest.mark.slow
def test_the_decode_programs_cache_is_the_arithmetics():
    """The contiguous engine's lowered cache (keys and values, plus a valid byte per column
    and an int32 index per cache) is `contiguous_kv_bytes`; with pages, decode is the paged
    engine's whole call over a pool of the lowered size."""
    mesh = mesh_of("data=2,fsdp=4,tensor=1")
    config = tiny_config(**{"rollout.slots": 8})
    n, layout = config.rollout.max_new_tokens, kv.kv_layout(models.get_model_config("tiny"), mesh)
    decode, = [p for p in programs_lib.build(config, mesh, prompt_len=16) if p.name == "decode"]
    extra = (8 * (16 + n) + 16 * 16) // 8 + 2 * 4
    assert decode.parts["cache"] == kv.contiguous_kv_bytes(
        layout, prompts=16, prompt_len=16, slots=8, new_tokens=n) + extra
    paged = config_lib.replaced(config, {"rollout.kv_page_size": 16, "rollout.kv_pages": 12})
    decode, = [p for p in programs_lib.build(paged, mesh, prompt_len=16) if p.name == "decode"]
    assert "8 paged slots" in decode.shape and "pool of 12 + 16 pages of 16" in decode.shape
    # 16 prompt pages, 12 completion pages and the trash page, split over the 8 row ways
    assert decode.parts["cache"] == -(-(16 + 12 + 1) // 8) * 16 * layout.chip_column_bytes
    assert isinstance(decode.lowered, jax.stages.Lowered)


@pytest.mark.slow
def test_the_report_sizes_the_compiled_pool_at_the_first_quantile():
    """On CPU devices (no HBM) with a given budget: the paged decode compiles with
    rollout.kv_pages from the median length and the KV table counts the slots that fit."""
    config = tiny_config(**{"rollout.slots": 8, "rollout.kv_page_size": 16})
    lines = []
    result = aot.compile_run(config, "cpu", prompt_len=16, programs=("decode",),
                             log=lines.append, length_quantiles=(0.5,), kv_budget=2**20)
    n = config.rollout.max_new_tokens
    pages = kv.pool_pages(8, kv.lognormal_length(0.5, n, 4.0), n, 16)
    assert any(f"rollout.kv_pages={pages}" in line for line in lines)
    decode = result["programs"]["decode"]
    assert not decode["compile_failed"] and f"pool of {pages} + 16 pages" in decode["shape"]
    layout = kv.KVLayout(2 * 3 * 2 * 32 * 4, 1, 8)
    contiguous = result["kv"]["rows"][0]
    assert contiguous["slots_that_fit"] == kv.contiguous_slots_that_fit(
        layout, 2**20, prompts=16, prompt_len=16, new_tokens=n)
    assert result["kv"]["budget_bytes"] == 2**20


@pytest.mark.slow
def test_the_paged_decode_program_carries_the_tpu_kernel_for_a_topology():
    """For v5p:2x2x2 the report's paged decode lowers the Pallas paged-attention kernel
    (one layer of Qwen3-0.6B: head dim 128, as the kernel needs on TPU), the prefill the
    splash kernel: a kernel or layout the topology cannot take fails here, without a TPU."""
    tpu_topology()
    config = tiny_config(**{"mesh": "data=1,fsdp=-1,tensor=1", "rollout.slots": 8,
                            "rollout.kv_page_size": 16, "model.attention": "splash",
                            "model.dtype": "bfloat16", "model.param_dtype": "bfloat16",
                            "rollout.prompts_per_batch": 8, "model.name": "qwen3_0_6b",
                            "model.path": ""})
    mesh, _, _ = aot.meshes(config, aot.topology_devices("v5p:2x2x2"))
    decode, = [p for p in programs_lib.build(config, mesh, prompt_len=16, layers=1)
               if p.name == "decode"]
    kernels = set(re.findall(r'kernel_name = "([^"]+)"', decode.lowered.as_text()))
    assert "paged_flash_attention_kernel_inline_seq_dim" in kernels
    assert "pool of 24 + 8 pages of 16" in decode.shape   # 8 x ceil(48 / 16); 8 x ceil(16 / 16)
