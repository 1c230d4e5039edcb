"""LoRA adapters on every family (routed experts too): the base at init, the merged
export, PEFT's format."""

import dataclasses

import jax
import numpy as np
import pytest
import qwix
from flax import nnx
from ml_collections import config_dict

from grpo_jax import models, parallel
from grpo_jax.models import lora
from tests.models.test_transformers_parity import max_rel_error, padded_batch

SPEC = lora.LoraSpec(rank=4, alpha=8.0, targets=lora.PROJECTIONS)
ATTENTION_ONLY = dataclasses.replace(SPEC, targets=lora.resolve_targets(("attn.*",)))




def logits(model, tokens, mask):
    return np.asarray(jax.jit(lambda t, m: model(t, attention_mask=m))(tokens, mask))


def with_random_adapters(model, seed=0):
    """`model` with every adapter factor drawn N(0, 0.05^2): B != 0, so the adapters act."""
    graphdef, state = nnx.split(model)
    rng = np.random.default_rng(seed)
    state = jax.tree.map(
        lambda v: v.replace(rng.normal(0, 0.05, v.get_value().shape).astype(np.float32))
        if isinstance(v, nnx.LoRAParam) else v,
        state, is_leaf=lambda x: isinstance(x, nnx.Variable))
    return nnx.merge(graphdef, state)


@pytest.fixture(scope="module")
def adapted(family, hf_checkpoint):
    """(checkpoint path, base model, adapters at init, random adapters, tokens, mask) of
    one family, every projection adapted (the routed experts too)."""
    path, _ = hf_checkpoint(family)
    base, _ = models.from_pretrained(path)
    start, _ = models.from_pretrained(path, lora=SPEC)
    tokens, mask = padded_batch(base.cfg.vocab_size)
    return path, base, start, with_random_adapters(start), tokens, mask


class TestTargets:
    def test_patterns_and_bare_names_select_projections(self):
        assert lora.resolve_targets(("attn.*",)) == ("attn.q", "attn.k", "attn.v", "attn.o")
        assert lora.resolve_targets(("q", "mlp.d*")) == ("attn.q", "mlp.down")

    def test_a_pattern_that_selects_nothing_names_the_field(self):
        with pytest.raises(ValueError, match=r"model.lora.targets: 'w_in' selects none"):
            lora.resolve_targets(("w_in",))

    def test_config_section_errors_name_the_field_and_rank_0_is_off(self):
        section = config_dict.ConfigDict(dict(rank=-1, alpha=16.0, targets=("q",), dropout=0.0,
                                              quantize=""))
        with pytest.raises(
            ValueError, match=r"model.lora.rank must be >= 0 \(0: no adapters\), got -1"
        ):
            lora.spec_from_config(section)
        section.rank = 0
        assert lora.spec_from_config(section) is None
        section.rank, section.targets = 8, ("v", "q")
        assert lora.spec_from_config(section) == lora.LoraSpec(8, 16.0, ("attn.q", "attn.v"))
        section.targets = ()
        with pytest.raises(ValueError, match=r"model.lora.targets is empty"):
            lora.spec_from_config(section)

    def test_dropout_and_quantize_are_checked_and_need_adapters(self):
        section = config_dict.ConfigDict(dict(rank=4, alpha=8.0, targets=("q",), dropout=1.0,
                                              quantize=""))
        with pytest.raises(ValueError, match=r"model.lora.dropout must be in \[0, 1\)"):
            lora.spec_from_config(section)
        section.dropout = 0.05
        assert lora.spec_from_config(section).dropout == 0.05
        section.quantize = "int2"
        with pytest.raises(
            ValueError, match=r"model.lora.quantize must be '' .* \('int8', 'int4'\)"
        ):
            lora.spec_from_config(section)
        section.quantize, section.rank = "int8", 0
        with pytest.raises(ValueError, match=r"model.lora.dropout=0.05, model.lora.quantize='int8' "
                                             r"acts on LoRA adapters, but model.lora.rank is 0"):
            lora.spec_from_config(section)
        moe = models.get_model_config("tiny_moe")
        with pytest.raises(ValueError, match=r"folded into the experts' weights.*attn\.\*"):
            models.init_model(dataclasses.replace(moe, lora=dataclasses.replace(SPEC, dropout=0.1)))
        models.init_model(dataclasses.replace(   # attention adapters only: dropout applies
            moe, lora=dataclasses.replace(ATTENTION_ONLY, dropout=0.1)))

    def test_experts_have_no_peft_form_and_say_what_to_do(self):
        cfg = dataclasses.replace(models.get_model_config("tiny_moe"), lora=SPEC)
        assert not lora.peft_exportable(cfg)
        assert lora.peft_exportable(dataclasses.replace(cfg, lora=ATTENTION_ONLY))
        with pytest.raises(
            ValueError, match=r"routed experts have no PEFT form; export the merged"
        ):
            lora.peft_tensors(nnx.state(models.init_model(cfg)), cfg)


class TestDropout:
    """Dropout on an adapter's input (PEFT's lora_dropout): with A = B = I the adapter's
    output is scale * dropout(x), so every element can be read off."""

    P, N = 0.25, 8

    def identity_adapter(self):
        adapter = nnx.LoRA(self.N, self.N, self.N, rngs=nnx.Rngs(0))
        adapter.lora_a[...] = np.eye(self.N, dtype=np.float32)
        adapter.lora_b[...] = np.eye(self.N, dtype=np.float32)
        return adapter

    def dropped(self, key, path="attn.q", p=P):
        spec = dataclasses.replace(SPEC, rank=self.N, alpha=2.0 * self.N, dropout=p)
        x = np.full((50, 250, self.N), 3.0, np.float32)
        return np.asarray(lora.apply(self.identity_adapter(), x, (self.N,), spec, key, path)) / 2.0

    def test_each_input_is_kept_with_probability_1_minus_p_and_scaled_by_its_inverse(self):
        out = self.dropped(jax.random.key(0))
        kept = out != 0
        np.testing.assert_allclose(out[kept], 3.0 / (1 - self.P), rtol=1e-6)
        # 100,000 Bernoulli(0.75) draws: the kept share is 0.75 within 6 standard errors
        assert abs(kept.mean() - (1 - self.P)) < 6 * np.sqrt(self.P * (1 - self.P) / kept.size)
        assert abs(out.mean() - 3.0) < 0.05   # E[dropout(x)] = x

    def test_masks_repeat_per_key_and_differ_per_projection_and_key(self):
        key = jax.random.key(0)
        first = self.dropped(key) != 0
        np.testing.assert_array_equal(self.dropped(key) != 0, first)
        for other in (self.dropped(key, "attn.k"), self.dropped(jax.random.key(1)),
                      self.dropped(lora.layer_key(key, 1))):
            assert 0.5 < np.mean((other != 0) == first) < 0.7   # independent: 0.75^2 + 0.25^2

    def test_no_key_or_p_0_is_the_plain_adapter(self):
        np.testing.assert_array_equal(self.dropped(None), 3.0)
        np.testing.assert_array_equal(self.dropped(jax.random.key(0), p=0.0), 3.0)


class TestAdapters:
    def test_first_forward_equals_the_base_exactly(self, adapted):
        """B = 0 (Hu et al., sec. 4.1): x A B adds exact zeros."""
        _, base, start, _, tokens, mask = adapted
        np.testing.assert_array_equal(logits(start, tokens, mask), logits(base, tokens, mask))

    def test_the_forward_is_the_base_plus_scaled_low_rank_products(self, adapted):
        """The adapted network equals the base with W + alpha/r A B written in by numpy."""
        path, base, _, model, tokens, mask = adapted
        flat = dict(nnx.to_flat_state(nnx.state(model)))
        graphdef, state = nnx.split(base)
        merged = dict(nnx.to_flat_state(state))
        for p, v in merged.items():
            block = (*p[:-1], f"{p[-1]}_lora")
            if (*block, "lora_a") in flat:
                a, b = (np.asarray(flat[(*block, k)].get_value()) for k in ("lora_a", "lora_b"))
                w = np.asarray(v.get_value())
                merged[p] = v.replace(w + SPEC.scale * (a @ b).reshape(w.shape))
        by_numpy = nnx.merge(graphdef, nnx.from_flat_state(merged))
        assert (
            max_rel_error(logits(model, tokens, mask), logits(by_numpy, tokens, mask), mask) < 1e-5
        )
        assert max_rel_error(logits(model, tokens, mask), logits(base, tokens, mask), mask) > 1e-3

    def test_expert_adapters_agree_across_moe_impls(self):
        """Each routed expert's adapter, folded into its weights, gives the same network
        whether the experts run ragged or dense."""
        cfg = dataclasses.replace(models.get_model_config("tiny_moe"), lora=SPEC)
        ragged = with_random_adapters(models.init_model(cfg, seed=2))
        graphdef, state = nnx.split(ragged)
        dense = nnx.merge(nnx.graphdef(models.init_model(
            dataclasses.replace(cfg, moe_impl="dense"), seed=2)), state)
        tokens, mask = padded_batch(cfg.vocab_size)
        assert max_rel_error(logits(dense, tokens, mask), logits(ragged, tokens, mask), mask) < 1e-5
        a = dict(nnx.to_flat_state(state))[("layers", 0, "mlp", "down_lora", "lora_a")]
        assert a.get_value().shape == (cfg.n_experts, cfg.moe_d_ff, SPEC.rank)

    def test_adapters_off_is_the_base(self, adapted):
        _, base, _, model, tokens, mask = adapted
        graphdef, state = nnx.split(model)
        off = nnx.merge(graphdef, lora.adapters_off(state))
        np.testing.assert_array_equal(logits(off, tokens, mask), logits(base, tokens, mask))

    def test_the_base_weights_do_not_depend_on_the_adapters(self):
        cfg = models.get_model_config("tiny")
        plain = nnx.state(models.init_model(cfg, seed=3))
        with_lora = nnx.state(models.init_model(dataclasses.replace(cfg, lora=SPEC), seed=3))
        frozen = nnx.filter_state(with_lora, nnx.Not(nnx.LoRAParam))
        jax.tree.map(np.testing.assert_array_equal, frozen, plain)


    def test_a_bfloat16_base_keeps_float32_adapters(self):
        cfg = dataclasses.replace(models.get_model_config("tiny"), param_dtype="bfloat16")
        plain = models.init_model(cfg, seed=3)
        adapted = models.init_model(dataclasses.replace(cfg, lora=SPEC), seed=3)
        state = nnx.state(adapted)
        frozen = nnx.filter_state(state, nnx.Not(nnx.LoRAParam))
        assert {a.dtype for a in jax.tree.leaves(lora.adapters(state))} == {np.dtype("float32")}
        assert {w.dtype for w in jax.tree.leaves(frozen)} == {np.dtype("bfloat16")}
        tokens = np.arange(12, dtype=np.int32).reshape(2, 6)
        np.testing.assert_array_equal(np.asarray(adapted(tokens)), np.asarray(plain(tokens)))


def numpy_quantized(w, channels, tiles, qtype):
    """qwix's symmetric absmax quantisation, by numpy: scale = max |w| over the input axes
    (over each block of `tiles[axis]` along a tiled axis) / (qmax + 0.5), q = clip(round(
    w / scale)) (qmax 127 for int8, 7 for int4). Returns (q, scale)."""
    qmax = {"int8": 127, "int4": 7}[qtype]
    absmax = np.abs(w)
    for axis in range(w.ndim):
        if axis in channels:
            continue
        block = tiles.get(axis, w.shape[axis])
        split = absmax.reshape(*absmax.shape[:axis], -1, block, *absmax.shape[axis + 1:])
        absmax = split.max(axis=axis + 1)
    scale = absmax / np.float32(qmax + 0.5)
    full = scale
    for axis, block in tiles.items():
        full = np.repeat(full, block, axis=axis)
    return np.clip(np.round(w / full), -qmax - 1, qmax), scale


@pytest.fixture(scope="module", params=["int8", "int4"])
def quantized(request, adapted):
    """(qtype, checkpoint path, float base, QLoRA model with random adapters) of a family."""
    path, base = adapted[0], adapted[1]
    spec = dataclasses.replace(SPEC, quantize=request.param)
    return (
        request.param, path, base, with_random_adapters(models.from_pretrained(path, lora=spec)[0]),
    )


class TestQuantizedBase:
    """QLoRA: every projection of the frozen base stored as integers with one scale per
    output channel, dequantised in the forward; on every family (experts included)."""

    def test_each_projection_is_integers_scaled_per_output_channel(self, quantized):
        qtype, _, base, model = quantized
        floats = dict(nnx.to_flat_state(nnx.state(base)))
        count = tiled = 0
        for path, variable in nnx.to_flat_state(nnx.state(model)):
            value = variable.get_value()
            if not lora.is_base_projection(path, variable):
                assert not isinstance(value, qwix.QArray), path   # embeddings, norms, router
                continue
            w = np.asarray(floats[path].get_value())
            q, scale = numpy_quantized(w, lora.channel_axes(path, variable),
                                       lora.tiled_axes(path, floats[path], qtype), qtype)
            tiled += bool(lora.tiled_axes(path, floats[path], qtype))
            assert value.qvalue.dtype == np.dtype(qtype), path
            np.testing.assert_allclose(np.asarray(value.scale), scale, rtol=1e-6, err_msg=str(path))
            # XLA's float32 w / scale can land on the other side of a .5 than numpy's
            off = np.abs(np.asarray(value.qvalue).astype(np.int32) - q)
            assert off.max() <= 1 and off.mean() < 0.02, path
            count += 1
        assert count == len(lora.INPUT_AXES) * base.cfg.n_layers
        assert (tiled > 0) == (qtype == "int4" and base.cfg.d_model > lora.INT4_BLOCK)

    def test_the_forward_is_the_dequantised_base_plus_the_adapters(self, quantized):
        """The QLoRA network equals a float network whose projections hold q * scale,
        written in by numpy, with the same adapters; the integers cost accuracy (int8:
        ~1e-2 of the logits' scale, int4 more), which the adapters then train around."""
        qtype, path, base, model = quantized
        tokens, mask = padded_batch(base.cfg.vocab_size)
        graphdef, state = nnx.split(model)
        flat = {p: v.replace(np.asarray(v.get_value().qvalue, np.float32)
                             * np.asarray(v.get_value().scale))
                if isinstance(v.get_value(), qwix.QArray) else v
                for p, v in nnx.to_flat_state(state)}
        by_numpy = nnx.merge(graphdef, nnx.from_flat_state(flat))
        ours = logits(model, tokens, mask)
        assert max_rel_error(ours, logits(by_numpy, tokens, mask), mask) < 1e-5
        same_adapters = with_random_adapters(models.from_pretrained(path, lora=SPEC)[0])
        error = max_rel_error(ours, logits(same_adapters, tokens, mask), mask)
        assert 1e-4 < error < {"int8": 0.05, "int4": 0.5}[qtype]

    def test_merged_export_is_the_quantised_forward(self, quantized, tmp_path):
        _, _, base, model = quantized
        tokens, mask = padded_batch(base.cfg.vocab_size)
        models.save_pretrained(model, str(tmp_path))
        loaded, _ = models.from_pretrained(str(tmp_path))
        assert loaded.cfg.lora is None
        assert max_rel_error(logits(loaded, tokens, mask), logits(model, tokens, mask), mask) < 1e-5


def test_int4_scales_blocks_of_64_inputs_sharded_where_the_blocks_divide():
    """The tiny model (D = 128, d_ff = 384): int4 scales every 64 inputs along "embed" and
    "mlp" (o's 32-wide head_dim stays whole), matching numpy; on a mesh with fsdp = 2 the
    two embed blocks' scales are split like the weight, and the sharded QLoRA forward
    equals the single-device one."""
    cfg = dataclasses.replace(models.get_model_config("tiny"),
                              lora=dataclasses.replace(SPEC, quantize="int4"))
    floats = dict(nnx.to_flat_state(nnx.state(models.init_model(
        dataclasses.replace(cfg, lora=SPEC), seed=1))))
    model = models.init_model(cfg, seed=1)
    tiled = 0
    for path, variable in nnx.to_flat_state(nnx.state(model)):
        if lora.is_base_projection(path, variable):
            tiles = lora.tiled_axes(path, floats[path], "int4")
            q, scale = numpy_quantized(np.asarray(floats[path].get_value()),
                                       lora.channel_axes(path, variable), tiles, "int4")
            np.testing.assert_allclose(np.asarray(variable.get_value().scale), scale, rtol=1e-6)
            off = np.abs(np.asarray(variable.get_value().qvalue).astype(np.int32) - q)
            assert off.max() <= 1 and off.mean() < 0.02, path
            tiled += bool(tiles)
            assert bool(tiles) == (path[-1] != "o"), path
    assert tiled == 6 * cfg.n_layers
    mesh = parallel.make_mesh((("data", 4), ("fsdp", 2), ("tensor", 1)))
    sharded = models.init_model(cfg, seed=1, mesh=mesh)
    q = dict(nnx.to_flat_state(nnx.state(sharded)))[("layers", 0, "attn", "q")].get_value()
    assert q.scale.shape == (2, cfg.n_heads, cfg.head_dim)
    assert q.qvalue.sharding.spec[0] == q.scale.sharding.spec[0] == "fsdp"
    tokens, mask = padded_batch(cfg.vocab_size)
    assert max_rel_error(logits(sharded, tokens, mask), logits(model, tokens, mask), mask) < 1e-5


class TestExport:
    def test_merged_export_equals_the_unmerged_forward(self, adapted, tmp_path):
        _, _, _, model, tokens, mask = adapted
        models.save_pretrained(model, str(tmp_path))
        loaded, _ = models.from_pretrained(str(tmp_path))
        assert loaded.cfg.lora is None
        assert max_rel_error(logits(loaded, tokens, mask), logits(model, tokens, mask), mask) < 1e-5

    def test_peft_loads_the_adapter_onto_transformers_and_agrees(self, adapted, tmp_path):
        torch = pytest.importorskip("torch", reason="the PEFT round trip needs torch (CPU)")
        peft = pytest.importorskip("peft", reason="the PEFT round trip needs peft (test extra)")
        import transformers
        path, _, start, model, tokens, mask = adapted
        spec = SPEC if lora.peft_exportable(start.cfg) else ATTENTION_ONLY
        model = with_random_adapters(models.from_pretrained(path, lora=spec)[0])
        models.save_peft_adapter(model, str(tmp_path / "adapter"), base_path=path)
        base = transformers.AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager")
        peft_model = peft.PeftModel.from_pretrained(base, str(tmp_path / "adapter")).eval()
        assert sorted(peft_model.peft_config["default"].target_modules) == sorted(
            lora.HF_NAMES[t] for t in spec.targets)
        positions = np.maximum(np.cumsum(mask, axis=1) - 1, 0)
        with torch.no_grad():
            theirs = peft_model(input_ids=torch.tensor(tokens).long(),
                                attention_mask=torch.tensor(mask).long(),
                                position_ids=torch.tensor(positions).long()).logits.numpy()
        assert max_rel_error(logits(model, tokens, mask), theirs, mask) < 1e-4

    def test_a_scanned_model_names_each_layer_as_the_unscanned_one(self):
        cfg = dataclasses.replace(models.get_model_config("tiny"), lora=SPEC)
        unscanned = lora.peft_tensors(nnx.state(models.init_model(cfg, seed=1)), cfg)
        scanned_cfg = dataclasses.replace(cfg, scan_layers=True)
        scanned = lora.peft_tensors(nnx.state(models.init_model(scanned_cfg, seed=1)), scanned_cfg)
        assert scanned.keys() == unscanned.keys() and len(unscanned) == 2 * 7 * cfg.n_layers
        for name, value in unscanned.items():
            np.testing.assert_array_equal(scanned[name], value, err_msg=name)
        a = unscanned["base_model.model.model.layers.2.self_attn.o_proj.lora_A.weight"]
        assert a.shape == (SPEC.rank, cfg.n_heads * cfg.head_dim)
