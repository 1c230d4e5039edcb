"""LoRA training: only the adapters are differentiated, updated, held by the optimizer
and checkpointed; a run trains, exports merged + PEFT, and resumes exactly after kill -9."""

import dataclasses
import json
import os
import pathlib
import signal
import subprocess
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import qwix
from flax import nnx

from grpo_jax import config_lib, models, objectives, parallel, paths
from grpo_jax.models import lora
from grpo_jax.training import rl, rl_checks
from grpo_jax.training.steps import init_optimizer_state, make_update_step
from tests.training.training_setups import (FAULTS, assert_rows_equal, assert_same_export, cli,
                                            cli_config_file, comparable, faults_config,
                                            finished_checkpoints, read_metrics, tiny_config,
                                            wait_for_step)
from tests.training.update_setups import B, V, counts_of, loss_of, shardings_of, update_rows

SPEC = lora.LoraSpec(rank=4, alpha=8.0, targets=lora.PROJECTIONS)


def _tree_bytes(tree):
    return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(tree))


def _lora_model(mesh, name="tiny", dropout=0.0, quantize=""):
    """A tiny model with adapters, their B drawn at random so that A has a gradient too
    (with `quantize`, on an integer base: QLoRA)."""
    # experts as dense einsums, CPU's fast path (tests/models/test_lora.py: same network)
    spec = dataclasses.replace(SPEC, dropout=dropout, quantize=quantize)
    cfg = dataclasses.replace(models.get_model_config(name, vocab_size=V), lora=spec,
                              moe_impl="dense")
    graphdef, params = nnx.split(models.init_model(cfg, seed=3, mesh=mesh, rules="fsdp"))
    rng = np.random.default_rng(0)
    params = jax.tree.map(
        lambda v: v.replace(jax.device_put(rng.normal(0, 0.1, v.shape).astype(np.float32),
                                           v.get_value().sharding))
        if isinstance(v, nnx.LoRAParam) and v.get_metadata()["init"] == "zeros" else v,
        params, is_leaf=lambda x: isinstance(x, nnx.Variable))
    return graphdef, params


@pytest.fixture(scope="module", params=[("tiny", ""), ("tiny_moe", ""), ("tiny", "int8")],
                ids=["tiny", "tiny_moe", "tiny_int8_base"])
def lora_update(request):
    """One SGD(1) step on the adapters of a tiny model (dense, with routed experts, each
    with its adapter, or on an int8 base: QLoRA) on 8 devices: the parameters before (host
    copies) and after, the metrics and the full-model gradient (through the dequantised
    base, whose integers have none)."""
    mesh = parallel.make_mesh((("data", 2), ("fsdp", 4), ("tensor", 1)))
    name, quantize = request.param
    graphdef, params = _lora_model(mesh, name, quantize=quantize)
    objective = objectives.policy_objective(config_lib.load_config("configs/base.py").objective)
    loss_fn, count_fn = loss_of(objective), counts_of(objective)
    batch = parallel.global_rows(mesh, update_rows())
    index = jnp.arange(B)

    def full_loss(floats, integers):   # the whole batch as one micro-batch, every float weight
        minibatch = {**batch, **count_fn(batch)}
        return loss_fn(nnx.merge(graphdef, floats, integers), minibatch)[0]

    integer = lambda path, variable: isinstance(variable.get_value(), qwix.QArray)
    floats, integers = nnx.split_state(params, nnx.Not(integer), ...)
    full_grad = jax.device_get(jax.jit(jax.grad(full_loss))(floats, integers))
    before = jax.device_get(params)
    tx = optax.sgd(1.0)
    opt_state = init_optimizer_state(tx, lora.adapters(params), mesh)
    update = make_update_step(graphdef, tx, loss_fn, count_fn, mesh=mesh,
                              param_shardings=shardings_of(params),
                              opt_shardings=shardings_of(opt_state), micro_batches=2,
                              trained=nnx.LoRAParam)
    after, _, metrics = update(params, opt_state, batch, index)
    return before, jax.device_get(after), jax.device_get(metrics), full_grad


@pytest.mark.slow
def test_only_the_adapters_move_by_their_gradient(lora_update):
    before, after, metrics, full_grad = lora_update
    frozen = lambda s: nnx.filter_state(s, nnx.Not(nnx.LoRAParam))
    jax.tree.map(np.testing.assert_array_equal, frozen(after), frozen(before))
    adapter_grad = lora.adapters(full_grad)
    expected = jax.tree.map(lambda p, g: p - g, lora.adapters(before), adapter_grad)
    jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-7),
                 lora.adapters(after), expected)
    norm = float(optax.tree.norm(adapter_grad))
    np.testing.assert_allclose(metrics["grad_norm"], norm, rtol=1e-5)
    assert norm > 0 and float(optax.tree.norm(frozen(full_grad))) > 0   # the base has one too


@pytest.mark.slow
def test_the_updates_dropout_key_draws_the_masks_of_its_micro_batches():
    """With a key, SGD(1) moves the adapters by the gradient of micro-batch m's loss with
    dropout_key = fold_in(key, m) (rows m, m + 2, ... of the minibatch, the global counts),
    summed: the gradient as the loss function computes it with those keys by hand. The
    same key gives the same update; without one it is the update of the same adapters on a
    dropout-free model (the program whose gradient test_only_the_adapters_move_by_their_gradient
    checks by hand)."""
    mesh = parallel.make_mesh((("data", 2), ("fsdp", 4), ("tensor", 1)))
    graphdef, params = _lora_model(mesh, dropout=0.3)
    objective = objectives.policy_objective(config_lib.load_config("configs/base.py").objective)
    loss_fn, count_fn = loss_of(objective), counts_of(objective)
    batch = parallel.global_rows(mesh, update_rows())
    host = update_rows()
    counts = jax.device_get(count_fn(host))
    key = jax.random.key(7)

    def summed_loss(adapters, keys):
        model = nnx.merge(graphdef, nnx.merge_state(params, adapters))
        micro = lambda m: {**{k: v[m::2] for k, v in host.items()}, **counts,
                           "dropout_key": keys[m]}
        return sum(loss_fn(model, micro(m))[0] for m in range(2))

    keys = tuple(jax.random.fold_in(key, m) for m in range(2))
    grads = jax.jit(jax.grad(summed_loss))(lora.adapters(params), keys)
    by_hand = jax.device_get(jax.tree.map(jnp.subtract, lora.adapters(params), grads))
    tx = optax.sgd(1.0)

    def update_of(graphdef, params):
        """`updated(**rng)`: the adapters after one update of fresh copies of `params`."""
        update = make_update_step(graphdef, tx, loss_fn, count_fn, mesh=mesh,
                                  param_shardings=shardings_of(params),
                                  opt_shardings=shardings_of(init_optimizer_state(
                                      tx, lora.adapters(params), mesh)),
                                  micro_batches=2, trained=nnx.LoRAParam)

        def updated(**rng):
            fresh = jax.tree.map(jnp.copy, params)   # the update donates its parameters
            state = init_optimizer_state(tx, lora.adapters(fresh), mesh)
            return jax.device_get(lora.adapters(update(fresh, state, batch, jnp.arange(B),
                                                       **rng)[0]))
        return updated

    updated = update_of(graphdef, params)
    plain = update_of(*_lora_model(mesh))()
    close = lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-7)
    with_key = updated(rng=key)
    jax.tree.map(close, with_key, by_hand)
    jax.tree.map(np.testing.assert_array_equal, updated(rng=key), with_key)
    jax.tree.map(close, updated(), plain)
    moved = lambda tree: float(optax.tree.norm(jax.tree.map(jnp.subtract, tree, plain)))
    assert moved(by_hand) > 1e-3   # the masks changed the gradient


def test_the_optimizer_state_holds_the_adapters_only():
    """Adam's two moments are adapter-sized: their bytes are 2x the adapters' (+ its count)."""
    mesh = parallel.make_mesh((("data", 2), ("fsdp", 4), ("tensor", 1)))
    _, params = _lora_model(mesh)
    tx = optax.adam(1e-3)
    state = init_optimizer_state(tx, lora.adapters(params), mesh)
    adapter_bytes, total_bytes = _tree_bytes(lora.adapters(params)), _tree_bytes(params)
    assert _tree_bytes(state) == 2 * adapter_bytes + 4   # mu, nu and an int32 count
    assert adapter_bytes < 0.15 * total_bytes


@pytest.mark.parametrize("overrides, message", [
    ({"train.ref_reset_every": 5, "objective.kl.beta": 0.01},
     r"the KL reference is the frozen base \(adapters off\); train.ref_reset_every cannot move it"),
    ({"critic.enabled": True, "objective.advantage.estimator": "gae"},
     r"model.lora.rank > 0 with critic.enabled is not supported yet"),
])
def test_settings_lora_cannot_serve_name_the_field(overrides, message):
    config = config_lib.apply_overrides(config_lib.load_config("configs/dapo.py:runlocal=True"),
                                        {"model.lora.rank": 4, **overrides})
    with pytest.raises(ValueError, match=message):
        rl_checks.check_config(config,
                               parallel.make_mesh((("data", 8), ("fsdp", 1), ("tensor", 1))))


# The LoRA runs: the fault tests' setting with rank-4 adapters on every projection, 4 steps.
LORA = {**FAULTS, "model.lora.rank": 4, "train.steps": 4, "train.checkpoint_every": 2,
        "train.export": True}


def _directory_bytes(path):
    return sum(f.stat().st_size for f in pathlib.Path(path).rglob("*") if f.is_file())


def _stored_bytes(step_dir):
    """The bytes a checkpoint's arrays hold in its OCDBT store: every key's value, as read
    back. Its files also keep the store's superseded b-tree nodes until compaction, more
    of them when tensorstore splits the writes into more batches (a loaded machine): on
    disk a rank-4 LoRA checkpoint measured 10-31% of the full one's for a payload of 5%."""
    import tensorstore
    store = tensorstore.KvStore.open(
        {"driver": "ocdbt", "base": f"file://{pathlib.Path(step_dir) / 'state'}"}).result()
    return sum(len(store.read(key).result().value) for key in store.list().result())


@pytest.fixture(scope="module")
def lora_run(data_dir, shared_tmp_dir):
    """The workdir of the uninterrupted LoRA run (once per session)."""
    workdir = shared_tmp_dir("lora_uninterrupted")
    with paths.exclusive(f"{workdir}.lock"):
        if not (workdir / "export" / "model.safetensors").exists():
            rl.train(faults_config(data_dir, **LORA), str(workdir))
    return workdir


@pytest.mark.slow
def test_a_lora_run_trains_checkpoints_little_and_exports_merged_and_peft(lora_run, reference):
    rows = read_metrics(lora_run)
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert all(r["grad_norm"] > 0 for r in rows)
    lora, full = lora_run / "checkpoints" / "4", reference / "checkpoints" / "12"  # every weight
    assert _stored_bytes(lora) <= 0.1 * _stored_bytes(full), (
        _stored_bytes(lora), _stored_bytes(full),
    )
    assert _directory_bytes(lora) < 0.5 * _directory_bytes(full)   # orbax's files and garbage too
    export = lora_run / "export"
    assert {"config.json", "model.safetensors"} <= set(os.listdir(export))
    assert {"adapter_config.json", "adapter_model.safetensors"} <= set(
        os.listdir(export / "adapter")
    )
    with open(lora_run / "checkpoints" / "4" / "meta" / "metadata") as f:
        meta = json.load(f)
    params = [k for k in meta["fingerprint"] if k.startswith("['params']")]
    assert len(params) == 2 * 7 * 3 and all("_lora']['lora_" in k for k in params)
    assert meta["base"] == str(base_of(lora_run))


def base_of(workdir):
    """The frozen base a LoRA run of `workdir` adapts: its warm start's export."""
    with open(pathlib.Path(workdir) / "config.json") as f:
        return json.load(f)["model"]["path"]


@pytest.mark.slow
def test_kill_9_mid_run_resumes_to_the_uninterrupted_lora_run(data_dir, lora_run, tmp_path):
    """SIGKILL once the (asynchronous) checkpoint of step 2 is finished, mid step 3; the
    rerun resumes from the adapters' checkpoint of step 2 (the base rebuilt from its
    pointer) and ends equal to the uninterrupted run."""
    command, where = cli([f"--config={cli_config_file(tmp_path, data_dir, LORA)}",
                          "--workdir=killed"], cwd=tmp_path)
    log, workdir = tmp_path / "killed.log", tmp_path / "killed"
    with open(log, "w") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, **where)
        wait_for_step(process, log, 2)
        while 2 not in finished_checkpoints(workdir):
            assert process.poll() is None, log.read_text()[-3000:]
            time.sleep(0.02)
        process.send_signal(signal.SIGKILL)
        assert process.wait(timeout=600) == -signal.SIGKILL
    assert finished_checkpoints(workdir) == [2]
    final = subprocess.run(command, capture_output=True, text=True, timeout=600, **where)
    assert final.returncode == 0, final.stdout[-3000:] + final.stderr[-3000:]
    assert "resumed from the checkpoint of step 2 in" in final.stdout
    assert_rows_equal(workdir, lora_run, range(1, 5))
    assert_same_export(workdir, lora_run)


@pytest.mark.slow
def test_the_reference_is_the_base_and_lagged_adapters_resume_exactly(data_dir, tmp_path):
    """With a KL term the reference is the policy with its adapters off: at step 1 (one
    update, B still 0) the policy is the base and KL(pi_theta || pi_ref) is exactly 0, then
    positive. A run with lagged rollouts cut at step 2 and resumed equals the whole run."""
    overrides = {"model.lora.rank": 4, "train.steps": 3, "train.checkpoint_every": 2,
                 "train.eval_every": 100, "train.minibatches": 1, "rollout.policy_lag": 1,
                 "objective.kl.beta": 0.01, "optimizer.warmup_steps": 0}   # step 1 updates
    rl.train(tiny_config("dapo", data_dir, **overrides), str(tmp_path / "whole"))
    rl.train(
        tiny_config("dapo", data_dir, **{**overrides, "train.steps": 2}), str(tmp_path / "cut")
    )
    rl.train(tiny_config("dapo", data_dir, **overrides), str(tmp_path / "cut"))
    whole, cut = read_metrics(tmp_path / "whole"), read_metrics(tmp_path / "cut")
    assert whole[0]["kl_ref"] == 0.0 and whole[1]["kl_ref"] > 0 and whole[2]["kl_ref"] > 0
    assert [r["step"] for r in cut] == [1, 2, 3]
    for got, want in zip(cut, whole):
        for key, value in comparable(want).items():
            np.testing.assert_allclose(got[key], value, rtol=1e-5, atol=1e-7, err_msg=key)
