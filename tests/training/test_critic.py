"""The critic in the trainer: value pre-training, starting from a checkpoint, its errors."""

import json
import os

import jax
import numpy as np
import pytest
from flax import nnx
from safetensors.numpy import load_file

from grpo_jax import config_lib, models, objectives, parallel, sampling
from grpo_jax.training import critic as critic_lib, policy as policy_lib, rl, rollout
from grpo_jax.training import task as task_lib
from tests.training.training_setups import (comparable, finished_checkpoints, read_metrics,
                                            tiny_config)


def _unseen_rows(config, policy, mesh, *, skip):
    """Rollouts by `policy` of the 16 prompts the run's stream holds after its first `skip`
    batches (prompts the run never drew), 4 answers each."""
    stream = iter(task_lib.loader(task_lib.data_source(config.task, "train"), config,
                                  batch_size=config.rollout.prompts_per_batch))
    for _ in range(skip):
        next(stream)
    examples = [example for _ in range(16 // config.rollout.prompts_per_batch)
                for example in next(stream)]
    scorer = task_lib.Scorer(config.reward, separate=False,
                             max_new_tokens=config.rollout.max_new_tokens)
    try:
        rows, _ = rollout.draw(policy, mesh, examples, config=config, scorer=scorer,
                               rng=jax.random.key(123), method=sampling.Temperature(1.0))
    finally:
        scorer.close()
    return rows


def _value_loss(graphdef, params, rows, mesh):
    """Token-mean 1/2 (V - G)^2 against the Monte-Carlo return G (lambda = gamma = 1)."""
    values = critic_lib.make_value_fn(graphdef, mesh, num_pieces=1)(params, rows)
    returns = critic_lib.value_targets({**rows, "values": values}, 1.0, gamma=1.0)
    loss, _ = objectives.value_loss(values, values, returns, rows["mask"])
    return float(objectives.aggregate(loss, rows["mask"], mode="token-mean"))


def _best_constant_loss(rows):
    """The value loss of the best constant critic: half the variance of G over the tokens."""
    mask = np.asarray(rows["mask"]) > 0
    returns = np.broadcast_to(np.asarray(rows["rewards"])[:, None], mask.shape)[mask]
    return 0.5 * float(np.var(returns))


@pytest.mark.slow
def test_value_pretraining_lowers_the_held_out_value_loss(data_dir, tmp_path):
    """VAPO's value pre-training alone (train.steps = 0): only the critic moves, and its
    loss against Monte-Carlo returns on rollouts of prompts it never saw falls, closing at
    least half the gap between the fresh critic (V = 0: biased by the whole mean return,
    the initialisation bias pre-training is for) and the best constant."""
    steps = 8
    config = tiny_config("vapo", data_dir, **{
        "critic.pretrain_steps": steps, "train.steps": 0, "train.export": True})
    assert rl.train(config, str(tmp_path)) == steps
    rows = read_metrics(tmp_path)
    assert [r["step"] for r in rows] == list(range(1, steps + 1))
    assert all("grad_norm" not in r and "eval_accuracy" not in r for r in rows)   # frozen
    assert all(np.isfinite(r["value_loss"]) for r in rows)
    # The critic moves at every step but one whose returns it already predicts exactly (a
    # batch without a correct answer while V is still 0: loss 0, gradient 0).
    assert all(r["critic_grad_norm"] > 0 or r["value_loss"] == 0 for r in rows)
    assert sum(r["critic_grad_norm"] > 0 for r in rows) >= steps - 1
    with open(tmp_path / "config.json") as f:   # the run's config: from the warm start
        warm_start = json.load(f)["model"]["path"]
    start = load_file(os.path.join(warm_start, "model.safetensors"))
    end = load_file(str(tmp_path / "export" / "model.safetensors"))
    for name in start:
        np.testing.assert_array_equal(end[name], start[name], err_msg=name)

    config = config_lib.replaced(config, {"model.path": warm_start, "model.name": ""})
    mesh = parallel.setup_mesh(config)
    policy = policy_lib.start_policy(config, mesh, str(tmp_path), None)
    held_out = _unseen_rows(config, policy, mesh, skip=steps)
    fresh = critic_lib.start_critic(config, mesh, policy)
    trained = models.load_value_model(str(tmp_path / "export_critic"), mesh=mesh)
    before = _value_loss(fresh.graphdef, fresh.params, held_out, mesh)
    after = _value_loss(*nnx.split(trained), held_out, mesh)
    floor = _best_constant_loss(held_out)
    print(f"held-out value loss: {before:.4f} from the policy's weights, {after:.4f} after "
          f"{steps} steps of value pre-training (best constant: {floor:.4f}; accuracy "
          f"{float(np.mean(held_out['correct'])):.3f})")
    assert floor < before and after < before - 0.5 * (before - floor)


@pytest.mark.slow
def test_a_run_stopped_in_value_pretraining_resumes_there_exactly(data_dir, tmp_path, capsys):
    """A run that ends inside value pre-training (out of time after step 1 of 2) resumes
    there: the rest of pre-training and the RL steps after it, the policy and the critic
    it exports, equal an uninterrupted run's."""
    config = tiny_config("vapo", data_dir, **{"critic.pretrain_steps": 2, "train.steps": 2,
                                              "train.eval_every": 2, "train.export": True})
    rl.train(config, str(tmp_path / "whole"))
    assert rl.train(config, str(tmp_path / "cut"), seconds=0) == 1
    assert finished_checkpoints(tmp_path / "cut") == [1]
    capsys.readouterr()
    assert rl.train(config, str(tmp_path / "cut")) == 4
    assert f"resumed from the checkpoint of step 1 in {tmp_path / 'cut'}" in capsys.readouterr().out
    whole, cut = read_metrics(tmp_path / "whole"), read_metrics(tmp_path / "cut")
    assert [r["step"] for r in cut] == [1, 2, 3, 4]
    assert "grad_norm" not in cut[1] and "grad_norm" in cut[2] and "eval_accuracy" in cut[3]
    for got, want in zip(cut, whole):
        got, want = comparable(got), comparable(want)
        assert got.keys() == want.keys()
        for key in want:
            np.testing.assert_allclose(got[key], want[key], rtol=1e-5, atol=1e-7, err_msg=key)
    for export in ("export", "export_critic"):
        got = load_file(str(tmp_path / "cut" / export / "model.safetensors"))
        want = load_file(str(tmp_path / "whole" / export / "model.safetensors"))
        for name in want:
            np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-7,
                                       err_msg=f"{export}: {name}")


def test_the_critic_starts_from_the_policy_or_from_critic_path(data_dir, tmp_path):
    config = tiny_config("vapo", data_dir, **{"model.sft_warm_start": False})
    mesh = parallel.setup_mesh(config)
    corpus = task_lib.tokenizer_corpus(task_lib.data_source(config.task, "train"))
    policy = policy_lib.start_policy(config, mesh, str(tmp_path / "run"), corpus)
    fresh = critic_lib.start_critic(config, mesh, policy)
    model = nnx.merge(fresh.graphdef, fresh.params)
    np.testing.assert_array_equal(model.trunk.embed[...], policy.params["embed"][...])
    np.testing.assert_array_equal(model.head[...], 0.0)
    head = np.linspace(-1, 1, model.head[...].shape[0], dtype=np.float32)
    model.head[...] = jax.device_put(head, model.head[...].sharding)
    models.save_value_model(model, str(tmp_path / "critic"))

    config.critic.path = str(tmp_path / "critic")
    started = critic_lib.start_critic(config, mesh, policy)
    for (path, want), (_, got) in zip(nnx.to_flat_state(nnx.state(model)),
                                      nnx.to_flat_state(started.params)):
        np.testing.assert_array_equal(got.get_value(), want.get_value(), err_msg=str(path))
        assert got.get_value().sharding.spec == want.get_value().sharding.spec, path

    other_vocab = policy.model_config().vocab_size + 64
    other = models.value_model_from(models.init_model(models.get_model_config(
        "tiny", vocab_size=other_vocab)))
    models.save_value_model(other, str(tmp_path / "other"))
    config.critic.path = str(tmp_path / "other")
    with pytest.raises(ValueError, match=rf"critic.path .* has a vocabulary of {other_vocab} "
                                         r"tokens, the policy \d+: the critic reads the policy's"):
        critic_lib.start_critic(config, mesh, policy)
