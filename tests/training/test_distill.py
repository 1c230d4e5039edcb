"""On-policy distillation in the RL loop: the teacher's log-probs in the batch, the
advantages and gradient they give, the metrics, the refusals, and checkpoints without it."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from grpo_jax import config_lib, models, objectives, parallel
from grpo_jax.training import batch as batch_lib, distill, footprint, programs, rl, rl_checks
from grpo_jax.training import rl_run, warm_start
from grpo_jax.training.tokenizer import train_char_tokenizer
from tests import readme_metrics
from tests.training.training_setups import comparable, read_metrics, tiny_config

MIXED = {"train.steps": 3, "train.eval_every": 100, "train.checkpoint_every": 1,
         "train.export": True, "distill.weight": 0.5}
PURE = {"objective.advantage.estimator": "reverse_kl", "distill.weight": 1.0}


def _config(**overrides):
    return config_lib.apply_overrides(config_lib.load_config("configs/dapo.py:runlocal=True"),
                                      overrides)


@pytest.mark.parametrize("overrides, message", [
    ({"distill.weight": -0.5}, r"distill.weight must be a finite number >= 0, got -0.5"),
    ({"distill.weight": float("nan")}, r"distill.weight must be a finite number >= 0"),
    ({"objective.advantage.estimator": "reverse_kl"}, r"set distill.teacher_path"),
    ({"distill.weight": 0.5}, r"distill.weight=0.5 has no effect without a teacher"),
    ({**PURE, "distill.teacher_path": "/t", "distill.weight": 2.0},
     r"distill.weight=2.0 .* set distill.weight=1.0"),
    ({"distill.teacher_path": "/t", "distill.weight": 0.0},
     r"distill.weight=0 loads the teacher for nothing"),
])
def test_impossible_settings_name_the_field(overrides, message):
    with pytest.raises(ValueError, match=message):
        rl_checks.check_settings(_config(**overrides))


def test_a_teacher_of_another_vocabulary_or_tokenizer_is_refused():
    student = models.get_model_config("tiny", vocab_size=64)
    teacher = models.get_model_config("tiny", vocab_size=128)
    with pytest.raises(ValueError, match=r"distill.teacher_path '/t' has a vocabulary of 128 ids, "
                                         r"the policy 64"):
        distill.check_teacher(student, teacher, None, None, "/t")
    ours, theirs = train_char_tokenizer(["1+2=3"]), train_char_tokenizer(["abc"])
    with pytest.raises(ValueError, match=r"'/t' has another tokenizer than the policy"):
        distill.check_teacher(student, student, ours, theirs, "/t")
    distill.check_teacher(student, student, ours, train_char_tokenizer(["1+2=3"]), "/t")


def test_the_layout_carries_the_teacher_and_per_token_advantages():
    model_cfg = models.get_model_config("tiny", vocab_size=32)
    config = _config(**{"distill.teacher_path": "/t"})
    layout = programs.batch_layout(config, model_cfg, prompt_len=5)
    b, n = 16 * 4, config.rollout.max_new_tokens
    assert layout["teacher_logp"] == ((b, n), jnp.float32)
    assert layout["advantages"][0] == (b, n)   # the reward's [B] advantage + the teacher's [B, N]
    assert "teacher_logp" not in programs.batch_layout(_config(), model_cfg, prompt_len=5)


def test_mixed_advantages_add_the_weighted_negative_reverse_kl():
    config = _config(**{"distill.teacher_path": "/t", "distill.weight": 0.25,
                        "objective.group_size": 2})
    objective = programs.rl_objective(config)
    rng = np.random.default_rng(0)
    old = np.log(rng.uniform(0.05, 1.0, (4, 3))).astype(np.float32)
    teacher = np.log(rng.uniform(0.05, 1.0, (4, 3))).astype(np.float32)
    teacher[0, 0] = -60.0   # a reverse KL past the clamp of 20
    mask = np.array([[1, 1, 0], [1, 1, 1], [1, 0, 0], [1, 1, 1]], np.int32)
    rewards = np.array([1.0, 0.0, 0.0, 1.0], np.float32)
    batch = {"old_logp": old, "teacher_logp": teacher, "mask": mask, "rewards": rewards,
             "truncated": np.zeros(4, bool)}
    got = np.asarray(distill.advantages_fn(config, objective)(batch))
    k = np.clip(old - teacher, -20, 20) * mask
    want = np.asarray(objective.advantages(batch))[:, None] - 0.25 * k
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    assert got.shape == (4, 3) and want[0, 0] == pytest.approx(1.0 - 0.25 * 20, abs=1e-5)
    assert distill.advantages_fn(_config(), objective) == objective.advantages   # off: untouched


def _first_batch(config, workdir):
    """Step 1 of `config`'s run up to its advantages, in this process: `(run, batch,
    metrics)`, the metrics those of the teacher (and the sampler's mismatch)."""
    config, workdir = config_lib.resolve_run_paths(config, str(workdir))
    mesh, _ = parallel.setup_meshes(config,
                                    lambda: footprint.replicated_state_bytes(config, "rl"))
    rl_checks.check_config(config, mesh)
    config = warm_start.prepared(config)
    run = rl_run.set_up(config, workdir, mesh)
    try:
        batch, _, _, behaviour = rl._rollouts(run, 1)
        metrics = rl._policy_targets(run, batch, behaviour, 1, None)
        programs.check_batch(batch, run.layout, pretraining=False)
    finally:
        run.checkpointer.close()
        run.scorer.close()
    return run, jax.device_get(batch), metrics


def _independent_teacher_logp(path, batch, temperature):
    """The teacher's log-probs of the batch's completions, read from `path` anew, on the
    default device, outside the trainer's programs."""
    model, _ = models.from_pretrained(path)
    rows = {k: jnp.asarray(batch[k]) for k in batch_lib.TOKEN_KEYS if k in batch}
    return np.asarray(batch_lib.completion_logprobs(model, rows, temperature=temperature))


def _grad(objective, batch, logp):
    """d loss / d logp `[B, N]` of `objective` on `batch` at `logp`, and the loss."""
    loss, grad = jax.value_and_grad(lambda x: objective(x, batch)[0])(jnp.asarray(logp))
    return float(loss), np.asarray(grad)


def _token_mean_distill(logp, batch, loss_mask):
    """The token mean over `loss_mask` of `reverse_kl_distill_loss`: loss and gradient."""
    def f(x):
        loss, _ = objectives.reverse_kl_distill_loss(x, batch["teacher_logp"], batch["mask"])
        return jnp.sum(loss * loss_mask) / jnp.maximum(jnp.sum(loss_mask), 1)
    loss, grad = jax.value_and_grad(f)(jnp.asarray(logp))
    return float(loss), np.asarray(grad)


@pytest.fixture(scope="module")
def distilled(data_dir, tmp_path_factory):
    """A 3-step DAPO run mixed with distillation (weight 0.5) from a teacher equal to its
    own start (the warm start), checkpointed every step and exported: `(config, workdir)`."""
    workdir = tmp_path_factory.mktemp("distilled")
    config = tiny_config("dapo", data_dir, **MIXED)
    teacher = os.path.join(warm_start.warm_start_dir(config), "export")
    config = tiny_config("dapo", data_dir, **MIXED, **{"distill.teacher_path": teacher})
    rl.train(config, str(workdir))
    return config, workdir


@pytest.mark.slow
def test_a_teacher_equal_to_the_start_gives_zero_kl_then_the_student_moves(distilled):
    _, workdir = distilled
    rows = read_metrics(workdir)
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert readme_metrics.undocumented(set().union(*rows)) == []
    assert rows[0]["distill_reverse_kl"] == pytest.approx(0.0, abs=1e-6)
    assert all(r["distill_reverse_kl"] != 0.0 and r["grad_norm"] > 0 for r in rows[1:])
    assert all(r["distill_teacher_logp"] < 0 for r in rows)


@pytest.mark.slow
def test_checkpoints_hold_no_teacher_and_a_resume_equals_the_whole_run(distilled, tmp_path):
    config, workdir = distilled
    with open(workdir / "checkpoints" / "3" / "meta" / "metadata") as f:
        meta = json.load(f)
    # The policy's parameters and optimizer state only (no lagged copies at policy_lag 0):
    # as many parameter arrays as the student has, not the teacher's besides.
    assert {key.split("]")[0] + "]" for key in meta["fingerprint"]} == {
        "['params']", "['opt_state']"}
    student, _ = models.from_pretrained(config.distill.teacher_path)   # the start's shape
    arrays = len(jax.tree.leaves(nnx.state(student, nnx.Param)))
    assert sum(key.startswith("['params']") for key in meta["fingerprint"]) == arrays
    items = {p.name for p in (workdir / "checkpoints" / "3").iterdir() if p.is_dir()}
    assert items == {"meta", "state"}   # orbax's items: no other saved tree
    cut = tmp_path / "cut"
    rl.train(config_lib.replaced(config, {"train.steps": 2, "train.export": False}), str(cut))
    rl.train(config, str(cut))   # resumes from step 2, the teacher loaded again from its path
    whole, resumed = read_metrics(workdir), read_metrics(cut)
    assert [r["step"] for r in resumed] == [1, 2, 3]
    for got, want in zip(resumed, whole):
        for key, value in comparable(want).items():
            np.testing.assert_allclose(got[key], value, rtol=1e-5, atol=1e-7, err_msg=key)


@pytest.mark.slow
@pytest.mark.parametrize("lora_rank", [0, 4])
def test_the_batch_holds_the_teachers_log_probs_and_the_mixed_gradient(distilled, data_dir,
                                                                        tmp_path, lora_rank):
    """The student is the warm start (with LoRA adapters: the teacher has none), the
    teacher the distilled run's export (another model, the same tokenizer)."""
    _, workdir = distilled
    teacher = str(workdir / "export")
    config = tiny_config("dapo", data_dir, **{"distill.teacher_path": teacher,
                                             "distill.weight": 0.5,
                                             "model.lora.rank": lora_rank})
    run, batch, metrics = _first_batch(config, tmp_path)
    mask = batch["mask"].astype(bool)
    want = _independent_teacher_logp(teacher, batch, config.rollout.temperature)
    np.testing.assert_allclose(batch["teacher_logp"][mask], want[mask], rtol=1e-5, atol=1e-5)
    assert np.max(np.abs(batch["teacher_logp"] - batch["old_logp"])[mask]) > 1e-3   # not pi_old
    loss_mask = np.asarray(run.objective.loss_mask(batch), np.float32)
    k = np.clip(batch["old_logp"] - want, -20, 20)
    assert metrics["distill_reverse_kl"] == pytest.approx(
        np.sum(k * loss_mask) / np.sum(loss_mask), rel=1e-4, abs=1e-6)
    # On-policy (logp = old_logp, ratio 1, no clip acting) the policy loss is linear in the
    # advantages: the mixed gradient is the reward's plus 0.5 x the distillation loss's.
    counts = {"num_tokens": jnp.sum(loss_mask)}
    rl_only = {k: v for k, v in batch.items() if k != "teacher_logp"}
    rl_only["advantages"] = run.objective.advantages(rl_only)
    _, mixed = _grad(run.objective, {**batch, **counts}, batch["old_logp"])
    _, reward = _grad(run.objective, {**rl_only, **counts}, batch["old_logp"])
    _, teacher_term = _token_mean_distill(batch["old_logp"], batch, loss_mask)
    np.testing.assert_allclose(mixed, reward + 0.5 * teacher_term, rtol=1e-5, atol=1e-7)
    assert np.max(np.abs(teacher_term)) > 0


@pytest.mark.slow
def test_pure_distillation_gives_the_pure_objectives_loss_and_gradient(distilled, data_dir,
                                                                       tmp_path):
    _, workdir = distilled
    config = tiny_config("dapo", data_dir, **PURE,
                         **{"distill.teacher_path": str(workdir / "export")})
    run, batch, _ = _first_batch(config, tmp_path)
    mask = batch["mask"].astype(np.float32)
    np.testing.assert_allclose(batch["advantages"],
                               (batch["teacher_logp"] - batch["old_logp"]) * mask, atol=1e-6)
    loss_mask = np.asarray(run.objective.loss_mask(batch), np.float32)
    counts = {"num_tokens": jnp.sum(loss_mask)}
    loss, grad = _grad(run.objective, {**batch, **counts}, batch["old_logp"])
    want_loss, want_grad = _token_mean_distill(batch["old_logp"], batch, loss_mask)
    assert loss == pytest.approx(want_loss, rel=1e-5, abs=1e-7) and want_loss != 0
    np.testing.assert_allclose(grad, want_grad, rtol=1e-5, atol=1e-7)
    preset = objectives.presets.distill(group_size=config.objective.group_size)
    np.testing.assert_allclose(_grad(preset, {**batch, **counts}, batch["old_logp"])[1],
                               want_grad, rtol=1e-5, atol=1e-7)
