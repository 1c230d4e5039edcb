"""MoE routing churn (the share of tokens x layers whose top-k experts differ between the
sampling forward and the training forward) and the token log-ratio spread."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from grpo_jax import config_lib, models, objectives, parallel, sampling
from grpo_jax.training import batch as batch_lib, programs, rl
from grpo_jax.training import rollout as rollout_lib
from grpo_jax.training.steps import init_optimizer_state, make_update_step
from tests import readme_metrics
from tests.training.training_setups import read_metrics, tiny_config

PROMPTS = [[5, 6, 7], [8, 9], list(range(20, 30)), [41]]
ROW_KEYS = ("prompt_tokens", "prompt_mask", "tokens", "mask")


class TestChangedLayers:

    def test_a_hand_built_routing_gives_the_share_of_layers_changed(self):
        # [L=2, b=1, T=3, k=2]; token 0: both layers equal (layer 1 in another order);
        # token 1: layer 0 differs; token 2: both differ.
        experts = np.array([[[[0, 1], [2, 3], [4, 5]]], [[[1, 0], [1, 2], [0, 3]]]])
        recorded = np.array([[[[0, 1], [2, 4], [4, 6]]], [[[0, 1], [1, 2], [3, 1]]]])
        got = jax.jit(batch_lib.changed_layers)(jnp.asarray(experts), jnp.asarray(recorded))
        np.testing.assert_array_equal(np.asarray(got), [[0.0, 0.5, 1.0]])

    def test_same_sets_in_any_order_do_not_count(self):
        rng = np.random.default_rng(0)
        experts = np.stack([rng.permutation(8)[:3] for _ in range(24)]).reshape(2, 3, 4, 3)
        shuffled = np.array([[[rng.permutation(e) for e in row] for row in layer]
                             for layer in experts])
        got = jax.jit(batch_lib.changed_layers)(jnp.asarray(experts), jnp.asarray(shuffled))
        np.testing.assert_array_equal(np.asarray(got), np.zeros((3, 4)))


@pytest.fixture(scope="module")
def moe_rollout():
    """The tiny MoE's parameters and a rollout of it with its experts recorded."""
    graphdef, params = nnx.split(models.init_model(models.get_model_config("tiny_moe"), seed=1))
    tokens, mask = sampling.pad_prompts(PROMPTS, pad_id=0, buckets=(16,))
    rollout = sampling.generate(graphdef, params, tokens, mask, rng=jax.random.key(3),
                                method=sampling.Temperature(1.0), group_size=2,
                                max_new_tokens=12, stop_tokens=[1], pad_id=0,
                                record_routing=True)
    return graphdef, params, rollout


def _churn(graphdef, params, rows):
    fn = jax.jit(lambda p, r: batch_lib.completion_logprobs(
        nnx.merge(graphdef, p), r, with_stats=True, with_churn=True)[3])
    return np.asarray(fn(params, rows))


def _rows(rollout, keys):
    rows = {k: getattr(rollout, k) for k in ROW_KEYS}
    rows[keys[0]], rows[keys[1]] = rollout.prompt_routing, rollout.routing
    return rows


@pytest.mark.slow
@pytest.mark.parametrize("keys", [("prompt_routing", "routing"), batch_lib.SAMPLED_ROUTING_KEYS])
def test_churn_is_zero_at_the_samplers_parameters(moe_rollout, keys):
    """The training forward at the parameters that sampled routes every token as the
    sampler did, with keep routing (replayed) and without (only recorded)."""
    graphdef, params, rollout = moe_rollout
    churn = _churn(graphdef, params, _rows(rollout, keys))
    assert churn.shape == rollout.tokens.shape
    assert np.asarray(rollout.mask).sum() > 20
    np.testing.assert_array_equal(churn[np.asarray(rollout.mask, bool)], 0.0)


@pytest.mark.slow
def test_a_changed_recorded_expert_gives_a_known_churn(moe_rollout):
    """Recorded experts changed by hand at known (row, token, layer)s: the churn of the
    completion token each position scores is the share of its layers changed. The
    experts of completion token t feed the position that scores token t + 1; the last
    prompt token's, the position that scores token 0."""
    graphdef, params, rollout = moe_rollout
    cfg = nnx.merge(graphdef, params).cfg
    n_moe = sum(cfg.is_moe_layer(i) for i in range(cfg.n_layers))
    prompt_routing, routing = np.array(rollout.prompt_routing), np.array(rollout.routing)
    mask = np.asarray(rollout.mask, bool)
    lengths = mask.sum(1)
    assert n_moe >= 2 and lengths[0] >= 5 and lengths[3] >= 2
    unused = lambda e: next(x for x in range(cfg.n_experts) if x not in e)

    def change(records, row, position, layer):   # one expert swapped for one it lacked
        records[row, position, layer, 0] = unused(records[row, position, layer])

    want = np.zeros(mask.shape)
    change(routing, 0, 2, 0)
    change(routing, 0, 2, 1)
    want[0, 3] = 2 / n_moe
    change(routing, 0, 4, 1)
    want[0, 5] = 1 / n_moe if lengths[0] > 5 else 0   # past the row's end: not scored
    change(prompt_routing, 3, -1, 0)
    want[3, 0] = 1 / n_moe
    rows = {k: getattr(rollout, k) for k in ROW_KEYS}
    rows["sampled_prompt_routing"], rows["sampled_routing"] = prompt_routing, routing
    churn = _churn(graphdef, params, rows)
    np.testing.assert_allclose(churn[mask], want[mask], rtol=0, atol=1e-7)


@pytest.mark.slow
def test_the_update_reports_churn_and_the_token_log_ratio_spread(moe_rollout):
    """Two micro-batches: the update's routing_churn is the token mean of the churn over
    the loss tokens, and log_ratio_std the standard deviation of log(pi_theta / pi_old)
    over them (numpy), from the moments the micro-batches add up."""
    graphdef, params, rollout = moe_rollout
    rows = {k: np.asarray(getattr(rollout, k)) for k in ROW_KEYS}
    rng = np.random.default_rng(4)
    b = rows["tokens"].shape[0]
    routing = np.array(rollout.routing)   # top 2 of 8 experts
    changed = rng.random(routing.shape[:3]) < 0.3   # ~30% of (row, token, layer) moved
    routing[..., 0] = np.where(changed, (routing[..., 0] + 1) % 8, routing[..., 0])
    routing[..., 0] = np.where(changed & (routing[..., 0] == routing[..., 1]),
                               (routing[..., 0] + 1) % 8, routing[..., 0])
    rows.update(sampled_prompt_routing=np.asarray(rollout.prompt_routing),
                sampled_routing=routing,
                old_logp=(np.asarray(rollout.logp) + rng.normal(0, 0.1, rows["mask"].shape))
                .astype(np.float32),
                advantages=rng.normal(size=b).astype(np.float32), row_valid=np.ones(b, bool))
    objective = objectives.policy_objective(config_lib.load_config("configs/base.py").objective)
    mesh = parallel.make_mesh("data=-1,fsdp=1,tensor=1", jax.devices()[:1])   # the params' device
    logp, _, _, churn = jax.jit(lambda p, r: batch_lib.completion_logprobs(
        nnx.merge(graphdef, p), r, with_stats=True, with_churn=True))(params, rows)
    tx = optax.sgd(0.0)
    update = make_update_step(graphdef, tx, programs.policy_loss(objective, 1.0),
                              objective.global_counts, mesh=mesh, param_shardings=None,
                              opt_shardings=None, micro_batches=2,
                              finish_metrics=programs.log_ratio_spread)
    _, _, metrics = update(params, init_optimizer_state(tx, params, mesh),
                           parallel.global_rows(mesh, rows), jnp.arange(b, dtype=jnp.int32))
    metrics = jax.device_get(metrics)
    mask = rows["mask"] > 0
    assert 0.05 < metrics["routing_churn"] < 0.5
    np.testing.assert_allclose(metrics["routing_churn"], np.asarray(churn)[mask].mean(), rtol=1e-5)
    d = (np.asarray(logp) - rows["old_logp"])[mask]
    np.testing.assert_allclose(metrics["log_ratio_mean"], d.mean(), rtol=1e-4)
    np.testing.assert_allclose(metrics["log_ratio_std"], d.std(), rtol=1e-4)
    assert "log_ratio_sq_mean" not in metrics
    assert readme_metrics.undocumented(metrics) == []


@pytest.mark.slow
def test_an_moe_run_without_keep_routing_logs_the_churn(data_dir, tmp_path):
    """The tiny MoE with GRPO, 2 updates per batch, no keep routing: the sampler's experts
    ride the batch (kept, not replayed) and every step logs the churn and the spread."""
    config = tiny_config("grpo", data_dir, **{"model.name": "tiny_moe", "train.steps": 2})
    assert not config.rollout.keep_routing
    assert rl.train(config, str(tmp_path)) == 2
    rows = read_metrics(tmp_path)
    assert readme_metrics.undocumented(set().union(*rows)) == []
    for row in rows:
        assert 0 <= row["routing_churn"] <= 1 and row["log_ratio_std"] >= 0, row
    # the second update of a step is off the sampling policy: its log-ratios spread
    assert max(r["log_ratio_std"] for r in rows) > 0


def test_paged_or_partial_moe_rollouts_carry_no_sampled_experts(data_dir):
    """A paged KV cache records no routing (nor do partial rollouts' carried rows): an MoE
    run without keep routing then carries no experts; with keep routing they replay."""
    moe = models.get_model_config("tiny_moe")
    keys = {name: rollout_lib.routing_keys(tiny_config("grpo", data_dir, **{
        "model.name": "tiny_moe", **overrides}), moe) for name, overrides in {
            "contiguous": {}, "paged": {"rollout.slots": 8, "rollout.kv_page_size": 16},
            "partial": {"rollout.partial.enabled": True},
            "kept": {"rollout.keep_routing": True}}.items()}
    assert keys == {"contiguous": batch_lib.SAMPLED_ROUTING_KEYS, "paged": (), "partial": (),
                    "kept": ("prompt_routing", "routing")}
    assert rollout_lib.routing_keys(tiny_config("grpo", data_dir),
                                    models.get_model_config("tiny")) == ()


@pytest.mark.slow
def test_a_paged_moe_run_trains_without_the_churn(data_dir, tmp_path):
    """The tiny MoE with its slots' caches paged: one step trains; no churn is logged."""
    config = tiny_config("grpo", data_dir, **{"model.name": "tiny_moe", "train.steps": 1,
                                              "rollout.slots": 8, "rollout.kv_page_size": 16})
    assert rl.train(config, str(tmp_path)) == 1
    (row,) = read_metrics(tmp_path)
    assert "routing_churn" not in row and row["log_ratio_std"] >= 0
