"""The Pallas paged-attention kernel (TPU interpret mode on CPU) against the XLA gather path.

Both read the same pages through the same page tables: three rows of two prompts (GQA,
4 query heads on 2 kv heads), ragged left-padded prompts and ragged completion lengths,
pages scattered over the pool. The values are bfloat16-representable: the interpreted
kernel's matmuls round their operands as the TPU's default precision does, so exact
operands leave only float32 rounding between the two paths.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax._src import mesh as mesh_lib   # AbstractDevice: a TPU mesh without TPUs

from grpo_jax import models
from grpo_jax.models import layers, paged_kernel

N, K, H, PAGE, M = 4, 2, 128, 8, 14   # the kernel's head dim is a multiple of 128
TP, TC = 2, 3                          # prompt pages, own pages per row
PROMPT_LEN = np.array([5, 13])         # real tokens of each 16-column prompt (left padded)
PROMPT_OF = np.array([0, 1, 1])        # the prompt of each row
OWN_LEN = np.array([1, 9, 24])         # completion columns after this step's write


def bf16_normal(rng, shape):
    return np.asarray(jnp.asarray(rng.normal(size=shape), jnp.bfloat16).astype(jnp.float32))


def case(seed=0):
    """Pools in the gather path's layout, the new token's keys, values and query, the
    page index and the valid columns."""
    rng = np.random.default_rng(seed)
    pages = rng.permutation(M)
    prompt_pages = pages[:2 * TP].reshape(2, TP)
    own = pages[2 * TP:2 * TP + 3 * TC].reshape(3, TC)
    table = np.concatenate([prompt_pages[PROMPT_OF], own], axis=1).astype(np.int32)
    cols = np.arange(TP * PAGE)
    prompt_valid = cols[None] >= TP * PAGE - PROMPT_LEN[PROMPT_OF][:, None]
    own_valid = np.arange(TC * PAGE)[None] < OWN_LEN[:, None]
    valid = np.concatenate([prompt_valid, own_valid], axis=1)
    column = OWN_LEN - 1   # the new token's own column
    index = layers.PageIndex(table=jnp.asarray(table),
                             write_page=jnp.asarray(own[np.arange(3), column // PAGE], jnp.int32),
                             write_offset=jnp.asarray(column % PAGE, jnp.int32))
    pool_k = bf16_normal(rng, (M, K, H, PAGE))
    pool_v = bf16_normal(rng, (M, K, PAGE, H))
    k_new, v_new = bf16_normal(rng, (3, K, H, 1)), bf16_normal(rng, (3, K, 1, H))
    q = bf16_normal(rng, (3, 1, N, H))
    return (pool_k, pool_v), k_new, v_new, q, index, valid


@pytest.mark.slow
def test_the_kernel_attends_as_the_gather_path():
    pools, k_new, v_new, q, index, valid = case()
    scale = H**-0.5
    (gk, gv), keys, values = layers.paged_write_and_gather(
        tuple(map(jnp.asarray, pools)), jnp.asarray(k_new), jnp.asarray(v_new), index)
    want = layers.grouped_attention(jnp.asarray(q), keys, values, jnp.asarray(valid)[:, None],
                                    scale=scale)
    kernel_pools = paged_kernel.to_kernel_layout(*map(jnp.asarray, pools))
    (kk, kv), layer = paged_kernel.write_token(kernel_pools, jnp.asarray(k_new),
                                               jnp.asarray(v_new), index.write_page,
                                               index.write_offset)
    # Both paths wrote the same token to the same place.
    np.testing.assert_array_equal(kk, gk.transpose(1, 0, 3, 2))
    np.testing.assert_array_equal(kv, gv.transpose(1, 0, 2, 3))
    got = paged_kernel.paged_attention(jnp.asarray(q), layer, index.table, jnp.asarray(valid),
                                       shared_pages=TP, scale=scale)
    assert got.shape == (3, 1, N, H)
    np.testing.assert_allclose(got, want, atol=2e-6, rtol=2e-6)
    # The prompt's columns weigh: attention without them is far from both.
    own_only = valid & (np.arange(valid.shape[1]) >= TP * PAGE)[None]
    alone = layers.grouped_attention(jnp.asarray(q), keys, values,
                                     jnp.asarray(own_only)[:, None], scale=scale)
    assert np.abs(np.asarray(alone) - np.asarray(want)).max() > 0.05

def test_the_kernel_is_chosen_by_model_attention_off_tpu():
    """On CPU only `model.attention="splash"` (interpreted) takes the kernel."""
    tiny = models.get_model_config("tiny")
    assert jax.default_backend() == "cpu"
    assert paged_kernel.selected(dataclasses.replace(tiny, attention_impl="splash"))
    assert not paged_kernel.selected(tiny)
    with jax.set_mesh(jax.make_mesh((1,), ("data",), devices=jax.devices()[:1])):
        assert paged_kernel.target_platform() == "cpu"
        assert not paged_kernel.selected(dataclasses.replace(tiny, head_dim=128))


def test_the_kernel_follows_the_mesh_a_program_is_traced_for():
    """Under a TPU mesh (what the fit report compiles for on a CPU host) the kernel is
    chosen for the TPU: taken at a head dim of 128, refused for "splash" at 16."""
    tiny = models.get_model_config("tiny")
    tpu = mesh_lib.AbstractDevice(device_kind="TPU v5p", num_cores=None, platform="tpu")
    with jax.sharding.use_abstract_mesh(jax.sharding.AbstractMesh((1,), ("data",),
                                                                  abstract_device=tpu)):
        assert paged_kernel.target_platform() == "tpu"
        assert paged_kernel.selected(dataclasses.replace(tiny, head_dim=128))
        assert not paged_kernel.selected(dataclasses.replace(tiny, head_dim=64))
        with pytest.raises(ValueError, match=r"needs head_dim % 128 == 0 on TPU, got 16"):
            paged_kernel.selected(dataclasses.replace(tiny, head_dim=16,
                                                      attention_impl="splash"))


def test_pages_per_block_divides_the_row():
    assert [paged_kernel.pages_per_block(t) for t in (1, 3, 12, 16, 17, 48)] == [1, 3, 12, 16,
                                                                                  1, 16]


def kernel_reads(compiled, pool_shape):
    """Whether a Mosaic kernel of the compiled program takes an operand of `pool_shape`."""
    return any('custom_call_target="tpu_custom_call"' in line and pool_shape in line
               for line in compiled.as_text().splitlines())


@pytest.mark.slow
def test_the_kernel_compiles_for_a_tpu_and_reads_the_pages_in_place():
    """Qwen3-8B's heads (32 on 8 kv heads of 128) over bfloat16 pools of 16-token pages,
    compiled for a v5e chip (libtpu, no TPU): the Mosaic kernel is in the program, and its
    temporaries stay below one layer's gathered keys and values (the XLA path's copy)."""
    pytest.importorskip("libtpu", reason="compiling for a TPU topology needs libtpu: "
                                         "pip install -e '.[train,tpu]'")
    from jax.experimental import topologies
    device = topologies.get_topology_desc(platform="tpu", topology_name="v5e:2x2").devices[0]
    one = jax.sharding.SingleDeviceSharding(device)
    rows, n, kv, h, page, pool, tp, tc = 16, 32, 8, 128, 16, 512, 8, 32

    def spec(shape, dtype):
        return jax.ShapeDtypeStruct(shape, dtype, sharding=one)

    def attend(q, k_pages, v_pages, table, valid):
        return paged_kernel.paged_attention(q, (k_pages, v_pages), table, valid,
                                            shared_pages=tp, scale=h**-0.5)

    compiled = jax.jit(attend).lower(
        spec((rows, 1, n, h), jnp.bfloat16), spec((kv, pool, page, h), jnp.bfloat16),
        spec((kv, pool, page, h), jnp.bfloat16), spec((rows, tp + tc), jnp.int32),
        spec((rows, (tp + tc) * page), jnp.bool_)).compile()
    assert kernel_reads(compiled, f"bf16[{kv},{pool},{page},{h}]")
    gathered = 2 * rows * kv * (tp + tc) * page * h * 2   # keys and values, bfloat16
    assert compiled.memory_analysis().temp_size_in_bytes < gathered


@pytest.mark.slow
def test_the_paged_engine_compiles_for_a_tpu_with_the_kernel():
    """The whole paged sampler (8 slots, 16-token pages, a bfloat16 tiny model with head
    dim 128 and `attention="splash"`) compiles for a v5e chip, the kernel in it."""
    pytest.importorskip("libtpu", reason="compiling for a TPU topology needs libtpu: "
                                         "pip install -e '.[train,tpu]'")
    from jax.experimental import topologies

    from grpo_jax import sampling
    from grpo_jax.sampling import _paged
    device = topologies.get_topology_desc(platform="tpu", topology_name="v5e:2x2").devices[0]
    one = jax.sharding.SingleDeviceSharding(device)
    cfg = dataclasses.replace(models.get_model_config("tiny"), head_dim=128, dtype="bfloat16",
                              param_dtype="bfloat16", attention_impl="splash")
    graphdef, state = models.abstract_model(cfg)
    state = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=one), state)

    def spec(shape, dtype=jnp.int32):
        return jax.ShapeDtypeStruct(shape, dtype, sharding=one)

    key = jax.ShapeDtypeStruct((), jax.random.key(0).dtype, sharding=one)
    compiled = _paged.generate_paged.lower(
        graphdef, state, spec((4, 40)), spec((4, 40)), key, spec((4,)), sampling.Greedy(),
        spec((1,)), spec(()), spec(()), group_size=4, buffer_len=256, num_slots=8,
        page_size=16, kv_pages=0, rules=None).compile()
    # 2 kv heads; 4 prompts x 3 pages + 8 slots x 16 pages + the trash page.
    assert kernel_reads(compiled, "bf16[2,141,16,128]")
