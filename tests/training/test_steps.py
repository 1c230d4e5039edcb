"""The jitted update: micro-batching and sharding do not change the step."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from grpo_jax import config_lib, models, objectives, parallel
from grpo_jax.training import batch as batch_lib, optimizer, programs
from grpo_jax.training.steps import init_optimizer_state, make_update_step
from tests import readme_metrics
from tests.training.update_setups import B, V, counts_of, loss_of, shardings_of, update_rows

def _sharded_model(mesh):
    cfg = models.get_model_config("tiny", vocab_size=V)
    return nnx.split(models.init_model(cfg, seed=3, mesh=mesh, rules="fsdp"))


def _update(mesh, tx, rows, micro_batches, mode="token-mean"):
    """One optimizer step of the tiny model: (params, opt_state) before, after, metrics."""
    graphdef, params = _sharded_model(mesh)
    opt_state = init_optimizer_state(tx, params, mesh)
    obj_cfg = config_lib.load_config("configs/base.py").objective
    obj_cfg.aggregation.mode = mode
    objective = objectives.policy_objective(obj_cfg)
    update = make_update_step(graphdef, tx, loss_of(objective), counts_of(objective), mesh=mesh,
                              param_shardings=shardings_of(params),
                              opt_shardings=shardings_of(opt_state), micro_batches=micro_batches)
    before = shardings_of((params, opt_state))
    batch = parallel.global_rows(mesh, rows)
    return before, update(params, opt_state, batch, jnp.arange(B))


def _step(mesh, rows, micro_batches, mode):
    # Adam's first step is ~lr*sign(g): tiny gradients would amplify float noise
    tx = optax.sgd(1.0)
    _, (params, _, metrics) = _update(mesh, tx, rows, micro_batches, mode)
    return jax.device_get(nnx.to_pure_dict(params)), jax.device_get(metrics)


def _close(a, b, rtol):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_allclose(x, y, rtol=rtol, atol=1e-6)


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean"])
def test_four_micro_batches_equal_the_full_batch(mode):
    mesh = parallel.make_mesh((("data", 1), ("fsdp", 1), ("tensor", 1)), devices=jax.devices()[:1])
    rows = update_rows()
    full_params, full_metrics = _step(mesh, rows, 1, mode)
    micro_params, micro_metrics = _step(mesh, rows, 4, mode)
    np.testing.assert_allclose(micro_metrics["loss"], full_metrics["loss"], rtol=1e-5)
    np.testing.assert_allclose(micro_metrics["grad_norm"], full_metrics["grad_norm"], rtol=1e-5)
    _close(micro_params, full_params, rtol=1e-5)
    assert full_metrics["grad_norm"] > 0


def test_eight_device_mesh_equals_one_device():
    one = parallel.make_mesh((("data", 1), ("fsdp", 1), ("tensor", 1)), devices=jax.devices()[:1])
    eight = parallel.make_mesh((("data", 2), ("fsdp", 4), ("tensor", 1)))
    rows = update_rows(1)
    # 4 micro-batches: on one device, the program of test_four_micro_batches_equal_the_full_batch
    p1, m1 = _step(one, rows, 4, "token-mean")
    p8, m8 = _step(eight, rows, 4, "token-mean")
    np.testing.assert_allclose(m8["loss"], m1["loss"], rtol=1e-5)
    _close(p8, p1, rtol=2e-4)


def test_mesh_errors_name_the_problem():
    with pytest.raises(ValueError, match=r"needs 3 devices, but there are 8"):
        parallel.make_mesh((("data", 3), ("fsdp", 1)))
    with pytest.raises(ValueError, match=r"at most one mesh axis may have size -1"):
        parallel.make_mesh((("data", -1), ("fsdp", -1)))
    with pytest.raises(ValueError, match=r"8 rows do not split into 3 pieces"):
        batch_lib.pieces({"x": np.zeros((8, 2))}, 3, parallel.make_mesh("data=-1"))


def _project_adamw():
    return optimizer.make_optimizer(config_lib.load_config("configs/base.py").optimizer, 10)


@pytest.mark.parametrize("field, value, message", [
    ("schedule", "step", r"optimizer.schedule must be one of \('constant', 'cosine', 'linear'\)"),
    ("learning_rate", 0.0, r"optimizer.learning_rate must be > 0.0, got 0.0"),
    ("warmup_steps", -1, r"optimizer.warmup_steps must be >= 0, got -1"),
    ("grad_clip", 0.0, r"optimizer.grad_clip must be > 0.0, got 0.0"),
])
def test_optimizer_config_errors_name_the_field(field, value, message):
    cfg = config_lib.load_config("configs/base.py").optimizer
    cfg[field] = value
    with pytest.raises(ValueError, match=message):
        optimizer.make_optimizer(cfg, 10)


def _moments(opt_state):
    """Adam's (count, mu, nu) inside the project's clip-then-AdamW chain."""
    adam = opt_state[1][0]
    return adam.count, adam.mu, adam.nu


def test_adam_moments_live_in_their_parameters_shards():
    mesh = parallel.make_mesh((("data", 2), ("fsdp", 4), ("tensor", 1)))
    _, params = _sharded_model(mesh)
    count, mu, nu = _moments(init_optimizer_state(_project_adamw(), params, mesh))
    for moments in (mu, nu):
        for param, moment in zip(jax.tree.leaves(params), jax.tree.leaves(moments), strict=True):
            assert moment.sharding == param.sharding
            assert [s.data.shape for s in moment.addressable_shards] == (
                [s.data.shape for s in param.addressable_shards])
    # [V, D] embedding with D over fsdp=4: each of the 8 devices holds [64, 128 / 4]
    assert {s.data.shape for s in mu["embed"].addressable_shards} == {(V, 32)}
    assert count.sharding.spec == jax.P() and len(count.addressable_shards) == 8


@pytest.mark.slow
def test_adamw_step_keeps_shardings_and_adam_moments():
    mesh = parallel.make_mesh((("data", 2), ("fsdp", 4), ("tensor", 1)))
    base = config_lib.load_config("configs/base.py").optimizer
    before, (params, opt_state, _) = _update(mesh, _project_adamw(), update_rows(2), 2)
    assert shardings_of((params, opt_state)) == before
    count, mu, nu = _moments(opt_state)
    assert int(count) == 1
    # From zero moments, one step gives mu = (1 - b1) g and nu = (1 - b2) g^2.
    for m, n in zip(jax.tree.leaves(mu), jax.tree.leaves(nu), strict=True):
        np.testing.assert_allclose(n, (1 - base.b2) / (1 - base.b1) ** 2 * np.square(m),
                                   rtol=1e-5, atol=1e-30)
    assert max(float(np.abs(m).max()) for m in jax.tree.leaves(mu)) > 0


def test_state_that_does_not_mirror_a_parameter_is_replicated():
    mesh = parallel.make_mesh((("data", 2), ("fsdp", 4), ("tensor", 1)))
    _, params = _sharded_model(mesh)
    tx = optax.adafactor(1e-3, min_dim_size_to_factor=32)   # factors the [V, D] embedding
    factored = init_optimizer_state(tx, params, mesh)[0]
    assert factored.v_row["embed"].shape == (V,)
    assert factored.v_row["embed"].sharding.spec == jax.P()
    assert factored.v_col["embed"].sharding.spec == jax.P()
    accumulated = init_optimizer_state(optax.MultiSteps(optax.sgd(1.0), 2), params, mesh)
    assert accumulated.acc_grads["embed"].sharding == params["embed"].sharding


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_overlong_masking_through_the_update_equals_the_pure_objective(mode):
    """DAPO's overlong filtering drops truncated answers from the loss AND from its token
    count: the update's loss over two micro-batches equals the objective on the whole batch."""
    mesh = parallel.make_mesh("data=-1,fsdp=1,tensor=1")
    rows = update_rows(2)
    rows["truncated"] = np.arange(B) % 3 == 0
    obj_cfg = config_lib.load_config("configs/base.py").objective
    obj_cfg.aggregation.mode, obj_cfg.overlong.mode = mode, "mask"
    objective = objectives.policy_objective(obj_cfg)
    graphdef, params = _sharded_model(mesh)
    logp = jax.jit(lambda p, r: batch_lib.completion_logprobs(nnx.merge(graphdef, p), r))(
        params, parallel.global_rows(mesh, rows))
    expected = objective(logp, {k: jnp.asarray(v) for k, v in rows.items()})[0]
    tx = optax.sgd(1.0)
    opt_state = init_optimizer_state(tx, params, mesh)
    update = make_update_step(graphdef, tx, loss_of(objective), counts_of(objective), mesh=mesh,
                              param_shardings=shardings_of(params),
                              opt_shardings=shardings_of(opt_state), micro_batches=2)
    _, _, metrics = update(params, opt_state, parallel.global_rows(mesh, rows), jnp.arange(B))
    np.testing.assert_allclose(float(metrics["policy_loss"]), float(expected), rtol=1e-5)
    # Counting tokens before masking (the old bug) shrinks token-mean by the kept share.
    kept = 1 - rows["mask"][rows["truncated"]].sum() / rows["mask"].sum()
    if mode == "token-mean":
        assert abs(float(expected) * kept - float(expected)) > 1e-4


def test_sft_weight_adds_the_token_mean_nll_of_the_targets_and_reports_it():
    """RPT's hybrid: the update's loss is the RL loss + w x the targets' token-mean NLL,
    over two micro-batches of each; both are metrics docs/metrics.md names."""
    mesh = parallel.make_mesh("data=-1,fsdp=1,tensor=1")
    rows, targets = update_rows(3), update_rows(4)
    objective = objectives.policy_objective(config_lib.load_config("configs/base.py").objective)
    graphdef, params = _sharded_model(mesh)
    logp = np.asarray(
        jax.jit(lambda p, r: batch_lib.completion_logprobs(nnx.merge(graphdef, p), r))(
            params, parallel.global_rows(mesh, targets)
        )
    )
    nll = -(logp * targets["mask"]).sum() / targets["mask"].sum()
    tx = optax.sgd(1.0)
    opt_state = init_optimizer_state(tx, params, mesh)
    update = make_update_step(graphdef, tx, loss_of(objective), counts_of(objective), mesh=mesh,
                              param_shardings=shardings_of(params),
                              opt_shardings=shardings_of(opt_state), micro_batches=2,
                              sft_weight=0.5)
    _, _, metrics = update(params, opt_state, parallel.global_rows(mesh, rows), jnp.arange(B),
                           parallel.global_rows(mesh, targets), jnp.arange(B))
    metrics = jax.device_get(metrics)
    np.testing.assert_allclose(metrics["sft_loss"], nll, rtol=1e-5)
    np.testing.assert_allclose(metrics["loss"], metrics["policy_loss"] + 0.5 * nll, rtol=1e-5)
    assert readme_metrics.undocumented(metrics) == []


def test_moe_router_term_is_in_the_loss_and_weighted_by_the_loss_tokens():
    """An MoE policy's update minimises objective + coef x the router's load-balancing loss:
    `loss` reports that sum, and with overlong masking the router term of one micro-batch
    is the whole batch's (its weight is the loss's kept tokens over their count: 1)."""
    mesh = parallel.make_mesh("data=-1,fsdp=1,tensor=1")
    rows = update_rows(5)
    rows["truncated"] = np.arange(B) % 4 == 0
    obj_cfg = config_lib.load_config("configs/base.py").objective
    obj_cfg.overlong.mode = "mask"
    objective = objectives.policy_objective(obj_cfg)
    cfg = models.get_model_config("tiny_moe", vocab_size=V)
    graphdef, params = nnx.split(models.init_model(cfg, seed=3, mesh=mesh, rules="fsdp"))
    batch = parallel.global_rows(mesh, rows)
    aux = jax.jit(lambda p, r: batch_lib.completion_logprobs(
        nnx.merge(graphdef, p), r, with_stats=True)[2])(params, batch)
    tx = optax.sgd(1.0)
    opt_state = init_optimizer_state(tx, params, mesh)
    update = make_update_step(
        graphdef, tx, programs.policy_loss(objective, 1.0), objective.global_counts, mesh=mesh,
        param_shardings=shardings_of(params), opt_shardings=shardings_of(opt_state),
        micro_batches=1,
    )
    _, _, metrics = jax.device_get(update(params, opt_state, batch, jnp.arange(B)))
    assert float(aux) > 0
    np.testing.assert_allclose(metrics["router_aux_loss"], float(aux), rtol=1e-5)
    np.testing.assert_allclose(
        metrics["loss"], metrics["policy_loss"] + cfg.router_aux_loss_coef * float(aux), rtol=1e-5)


def test_clip_cov_draws_through_the_update_with_the_trainers_row_seeds():
    """The trainer's per-row seeds ride the row split: the update's loss is the objective's
    on the same rows and seeds, and another step's seeds draw other tokens."""
    from grpo_jax.training.steps import loss_seeds
    mesh = parallel.make_mesh((("data", 1), ("fsdp", 1), ("tensor", 1)), devices=jax.devices()[:1])
    graphdef, params = _sharded_model(mesh)
    objective = objectives.presets.clip_cov(group_size=4, clip_fraction=0.3, cov_low=-10.0)
    tx = optax.sgd(0.0)
    opt_state = init_optimizer_state(tx, params, mesh)
    update = make_update_step(graphdef, tx, loss_of(objective), counts_of(objective), mesh=mesh,
                              param_shardings=shardings_of(params),
                              opt_shardings=shardings_of(opt_state), micro_batches=1)
    rows = update_rows(4)
    # jitted: one program each, where op-by-op dispatch compiled some 150 small ones
    logp = jax.jit(lambda p, r: batch_lib.completion_logprobs(nnx.merge(graphdef, p), r))(
        params, {k: jnp.asarray(v) for k, v in rows.items()})
    logp = jnp.copy(logp)   # the update donates the parameters
    objective_metrics = jax.jit(lambda logp, batch: objective(logp, batch)[1])
    losses = []
    for step in (1, 2):
        seeded = {**rows, "loss_seed": np.asarray(loss_seeds(jnp.asarray(rows["mask"]), step))}
        assert seeded["loss_seed"][0] == step * B
        fresh = jax.tree.map(jnp.copy, (params, opt_state))
        metrics = update(*fresh, parallel.global_rows(mesh, seeded), jnp.arange(B))[2]
        want = objective_metrics(logp, {
            **{k: jnp.asarray(v) for k, v in seeded.items()},
            "num_tokens": jnp.sum(jnp.asarray(rows["mask"]), dtype=jnp.float32),
            "num_seqs": jnp.float32(B)})
        np.testing.assert_allclose(metrics["loss"], want["loss"], rtol=1e-5)
        np.testing.assert_allclose(metrics["cov_detached"], want["cov_detached"], rtol=1e-5)
        assert float(want["cov_detached"]) > 0
        losses.append(float(metrics["loss"]))
    assert losses[0] != losses[1]
