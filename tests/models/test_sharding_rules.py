"""Loaded onto an 8-device CPU mesh with each rule set: same logits, shardings as the rules say."""

import dataclasses
import math
import types

import jax
import numpy as np
import pytest
from flax import nnx

from grpo_jax import models

# One model that has every kind of weight: attention biases, q/k norms, a dense layer and
# routed experts, an untied output layer.
CFG = dataclasses.replace(
    models.get_model_config("tiny_moe"), qkv_bias=True, o_bias=True, mlp_only_layers=(1,)
)
AUTO = jax.sharding.AxisType.Auto
MESHES = {  # rule set -> (mesh shape, mesh axis names)
    "fsdp": ((8,), ("fsdp",)),
    "fsdp_tp": ((4, 2), ("fsdp", "tensor")),
    "fsdp_expert": ((2, 4), ("fsdp", "expert")),
    "sampling": ((4, 2), ("data", "tensor")),
}


def make_mesh(rules):
    shape, names = MESHES[rules]
    return jax.make_mesh(shape, names, axis_types=(AUTO,) * len(names))


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A checkpoint directory written by save_pretrained, and the unsharded logits."""
    path = str(tmp_path_factory.mktemp("sharding"))
    model = models.init_model(CFG, seed=5)
    models.save_pretrained(model, path)
    tokens = np.random.default_rng(0).integers(0, CFG.vocab_size, (8, 16)).astype(np.int32)
    mask = np.ones_like(tokens)
    mask[3, :6] = 0
    logits = nnx.jit(lambda m, t, a: m(t, attention_mask=a))(model, tokens, mask)
    return path, tokens, mask, np.asarray(logits)


def forward(model, tokens, mask):
    return nnx.jit(lambda m, t, a: m(t, attention_mask=a))(model, tokens, mask)


@pytest.mark.slow
@pytest.mark.parametrize("rules", list(MESHES))
class TestRuleSets:
    def test_logits_equal_unsharded(self, rules, checkpoint):
        path, tokens, mask, ref = checkpoint
        model, _ = models.from_pretrained(path, mesh=make_mesh(rules), rules=rules)
        np.testing.assert_allclose(forward(model, tokens, mask), ref, rtol=1e-5, atol=1e-5)

    def test_each_parameter_is_sharded_as_the_rules_say(self, rules, checkpoint):
        mesh = make_mesh(rules)
        model, _ = models.from_pretrained(checkpoint[0], mesh=mesh, rules=rules)
        table = models.RULE_SETS[rules]
        for path, variable in nnx.to_flat_state(nnx.state(model)):
            value = variable.get_value()
            axes = variable.get_metadata()["logical_axes"]
            spec = jax.P(*(table[a] for a in axes))
            assert value.sharding.is_equivalent_to(jax.NamedSharding(mesh, spec), value.ndim), path
            ways = [
                math.prod(mesh.shape[a] for a in ((e,) if isinstance(e, str) else e or ()))
                for e in spec
            ]
            want = tuple(d // w for d, w in zip(value.shape, ways))
            assert value.addressable_shards[0].data.shape == want, path


def test_init_model_on_a_mesh_equals_unsharded():
    mesh = make_mesh("fsdp_tp")
    sharded = nnx.state(models.init_model(CFG, seed=2, mesh=mesh, rules="fsdp_tp"))
    plain = nnx.state(models.init_model(CFG, seed=2))
    for (path, a), (_, b) in zip(nnx.to_flat_state(sharded), nnx.to_flat_state(plain)):
        np.testing.assert_array_equal(
            np.asarray(a.get_value()), np.asarray(b.get_value()), err_msg=str(path)
        )


class TestErrors:
    def test_mesh_without_the_rules_axis(self):
        with pytest.raises(ValueError, match=r"mesh axes \['tensor'\].*add them to the mesh"):
            models.init_model(CFG, mesh=make_mesh("fsdp"), rules="fsdp_tp")

    def test_dimension_that_does_not_divide(self):
        mesh = jax.make_mesh((8,), ("tensor",), axis_types=(AUTO,))
        with pytest.raises(ValueError, match=r"layers\.0\.attn\.k: dimension 2 does not divide"):
            models.init_model(CFG, mesh=mesh, rules="sampling")

    def test_unknown_rule_set(self):
        with pytest.raises(ValueError, match="unknown sharding rule set 'zero3'"):
            models.logical_to_spec(("embed",), "zero3")

    def test_logical_axis_without_a_rule(self):
        with pytest.raises(ValueError, match=r"\['embedding'\] have no sharding rule"):
            models.logical_to_spec(("embedding",), "fsdp")


class TestActivationSharding:
    """Activations: rows over every mesh axis but "tensor", heads and the MLP width over it."""

    def test_specs(self):
        from grpo_jax.models import sharding
        mesh = jax.make_mesh((2, 2, 2), ("data", "fsdp", "tensor"), axis_types=(AUTO,) * 3)
        spec = lambda shape, axes: sharding.activation_spec(shape, axes, mesh)
        assert spec((8, 5, 4, 3), ("batch", None, "heads")) == jax.P(
            ("data", "fsdp"), None, ("tensor",)
        )
        assert spec((8, 5, 6), ("batch", None, "mlp")) == jax.P(("data", "fsdp"), None, ("tensor",))
        # dimensions that do not divide stay whole
        assert spec((6, 3), ("batch", "kv_heads")) == jax.P(None, None)
        single = jax.make_mesh((8,), ("fsdp",), axis_types=(AUTO,))
        assert sharding.activation_spec((8, 4), ("batch", "heads"), single) == jax.P(
            ("fsdp",), None
        )

    def test_constrain_is_a_no_op_without_a_mesh(self):
        from grpo_jax.models import sharding
        x = np.ones((4, 2), np.float32)
        assert sharding.constrain(x, ("batch",)) is x

    def test_forward_under_the_mesh_keeps_rows_split(self):
        """Under `jax.set_mesh` the logits leave the model with their rows over data x fsdp
        and equal the unsharded ones."""
        mesh = jax.make_mesh((2, 2, 2), ("data", "fsdp", "tensor"), axis_types=(AUTO,) * 3)
        tokens = np.random.default_rng(0).integers(0, CFG.vocab_size, (4, 6)).astype(np.int32)
        model = models.init_model(CFG, seed=2, mesh=mesh, rules="fsdp_tp")
        with jax.set_mesh(mesh):
            hidden = nnx.jit(lambda m, t: m.hidden_states(t)[0])(model, tokens)
        assert hidden.sharding.spec[0] == ("data", "fsdp")
        want = nnx.jit(lambda m, t: m.hidden_states(t)[0])(models.init_model(CFG, seed=2), tokens)
        np.testing.assert_allclose(hidden, want, atol=1e-5, rtol=1e-5)


def test_run_overrides_map_the_config_model_section():
    from ml_collections import config_dict
    section = config_dict.ConfigDict(dict(dtype="bfloat16", param_dtype="float32", remat="full",
                                          attention="splash", moe="ragged", scan_layers=True,
                                          rules="fsdp",
                                          lora=dict(rank=8, alpha=16.0, targets=("q",), dropout=0.0,
                                                    quantize="")))
    assert models.run_overrides(section) == dict(
        dtype="bfloat16", param_dtype="float32", remat="full", attention_impl="splash",
        moe_impl="ragged", scan_layers=True, lora=models.LoraSpec(8, 16.0, ("attn.q",)))
    del section["attention"]
    with pytest.raises(ValueError, match="model.attention"):
        models.run_overrides(section)


def test_moe_auto_is_dense_on_cpu_devices_and_ragged_on_others():
    from ml_collections import config_dict
    section = config_dict.ConfigDict(dict(dtype="float32", param_dtype="float32", remat="off",
                                          attention="xla", moe="auto", scan_layers=False,
                                          lora=dict(rank=0, alpha=32.0, targets=(), dropout=0.0,
                                                    quantize="")))
    cpu_mesh = jax.make_mesh((8,), ("data",), axis_types=(AUTO,))
    assert models.run_overrides(section, cpu_mesh)["moe_impl"] == "dense"
    assert models.run_overrides(section)["moe_impl"] == "dense"   # the default backend: cpu
    tpu_mesh = types.SimpleNamespace(devices=np.array([types.SimpleNamespace(platform="tpu")]))
    assert models.run_overrides(section, tpu_mesh)["moe_impl"] == "ragged"
    from grpo_jax.models.config import moe_impl_for
    assert [moe_impl_for("auto", p) for p in ("cpu", "tpu", "gpu")] == ["dense", "ragged", "ragged"]
    assert moe_impl_for("ragged", "cpu") == "ragged" and moe_impl_for("dense", "tpu") == "dense"
    section.moe = "sorted"
    with pytest.raises(ValueError, match="model.moe"):
        dataclasses.replace(CFG, **models.run_overrides(section))


@pytest.mark.parametrize(
    "field,value", [("remat", "some"), ("attention_impl", "flash"), ("moe_impl", "sorted")]
)
def test_config_rejects_unknown_choices(field, value):
    with pytest.raises(ValueError, match=field):
        dataclasses.replace(CFG, **{field: value})


def test_remat_flag_reads_as_a_policy():
    assert dataclasses.replace(CFG, remat=True).remat == "full"
    assert dataclasses.replace(CFG, remat=False).remat == "off"
    for spelling, policy in (
        ("True", "full"), ("true", "full"), ("False", "off"), ("false", "off"),
    ):
        # as the command line gives it
        assert dataclasses.replace(CFG, remat=spelling).remat == policy
