"""The RL loop end to end on the tiny model: every recipe, resume, filtering, errors."""

import glob
import json
import os
import shutil
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from safetensors.numpy import load_file

from grpo_jax import config_lib, objectives, parallel, run_files, sampling
from grpo_jax.training import (evaluation, policy as policy_lib, programs, rl, rl_run, rollout,
                               task as task_lib, warm_start)
from tests import readme_metrics
from tests.training.training_setups import (REPO, assert_metric_close, cli, cli_config_file,
                                            comparable, faults_config, finished_checkpoints,
                                            read_metrics, runlocal_config, tiny_config)

RECIPES = sorted(os.path.basename(p)[:-3] for p in glob.glob(str(REPO / "configs" / "*.py"))
                 if not p.endswith(("demo.py", "smollm2.py", "tool_countdown.py")))
# demo: tests/training/test_demo.py; smollm2 (a real checkpoint): test_smollm2_recipe.py;
# tool_countdown: a warm start whose rollouts have signal takes its 400 steps of 208-token
# check traces (~11 CPU minutes; 100 steps answer nothing right), so its run is measured by
# experiments/tool_vs_no_tool.py, and the multi-turn path runs here as tool_calculator.


def _off_policy_activity(recipe, row):
    """How much the recipe's clip (or gate, or cap) acted in a step: 0 when it did not."""
    if recipe == "sapo":
        return abs(row["gate_scale"] - 1.0)   # the gate's factor on the gradient moved off 1
    if recipe == "gspo":
        return row["clip_low"] + row["clip_high"]   # whole answers clipped (their tokens counted)
    return row["clip_low"] + row["clip_high"]


# Recipes whose paper trains on-policy, one update per rollout batch with the parameters
# that sampled: their ratio is exactly 1, so there is nothing to clip.
ON_POLICY = {"rloo", "rpt", "base"}


@pytest.mark.slow
@pytest.mark.parametrize("recipe", RECIPES)
def test_every_recipe_learns_in_its_runlocal_regime(recipe, data_dir, tmp_path):
    """Three steps of the recipe's runlocal regime from a warm start with signal: groups
    with signal (rewards that differ, with one answer per prompt), non-zero gradients
    (the critic's too, after one step of value pre-training where the recipe has it),
    every metric finite, and (off-policy recipes) the clip, gate or cap acting by the
    last update."""
    # The last step's checkpoint alone (the one asserted; a checkpoint changes no number).
    config = runlocal_config(recipe, data_dir, **{"train.steps": 3, "train.eval_every": 3,
                                                  "train.checkpoint_every": 100})
    pretrain = config.critic.pretrain_steps = min(config.critic.pretrain_steps, 1)
    assert rl.train(config, str(tmp_path)) == pretrain + 3
    rows = read_metrics(tmp_path)
    assert [r["step"] for r in rows] == list(range(1, pretrain + 4))
    assert readme_metrics.undocumented(set().union(*rows)) == []   # docs/metrics.md names each one
    for row in rows:
        assert all(np.isfinite(v) for v in row.values()), row
        assert row["updates_per_step"] == config.train.minibatches * config.train.epochs
        if config.critic.enabled:
            assert row["critic_grad_norm"] > 0 and row["value_loss"] > 0, row
            for key in ("explained_variance", "value_mean", "return_mean", "value_clip_fraction"):
                assert key in row, key
    assert all("grad_norm" not in r for r in rows[:pretrain])   # the policy is frozen
    rows = rows[pretrain:]
    for row in rows:
        assert row["grad_norm"] > 0, row
        if config.objective.group_size > 1:
            assert row["groups_without_signal"] < 1.0, row
        else:
            assert 0 < row["accuracy"] < 1, row
    for key in ("loss", "reward_mean", "accuracy", "response_length_mean", "entropy", "kl_old",
                "gen_batches", "truncation_rate", "rollout_tokens_per_s", "update_tokens_per_s",
                "time_rollout", "time_update", "eval_accuracy", "eval_mean_at_k",
                "generated_tokens", "grad_norm_std", "advantage_share_nearly_solved",
                "advantage_share_nearly_failed", "groups_nearly_solved", "groups_nearly_failed"):
        assert key in rows[-1], key
    for row in rows:   # every drawn answer's tokens, 0 < share <= 1
        model_tokens = row["response_length_mean"] - row.get("environment_tokens_per_episode", 0)
        assert row["generated_tokens"] == pytest.approx(
            model_tokens * row["gen_batches"] * config.rollout.prompts_per_batch
            * config.objective.group_size)
        assert (
            0
            <= row["advantage_share_nearly_solved"] + row["advantage_share_nearly_failed"]
            <= 1 + 1e-6
        )
    if recipe in ON_POLICY:   # the ratio is 1 up to the rounding of two compiled programs
        assert all(abs(r["kl_old"]) < 1e-6 and abs(r["ratio"] - 1.0) < 1e-5 for r in rows), rows
    else:
        assert max(_off_policy_activity(recipe, r) for r in rows) > 0, rows
        assert max(r["kl_old"] for r in rows) > 0
    if config.critic.enabled:
        assert "advantage_mean_q1" in rows[-1] and "advantage_std_q4" in rows[-1]
    if config.objective.positive_nll_weight:
        assert rows[-1]["positive_nll"] > 0
    if config.environment.name:   # the warm start calls the tool, and the rollouts answer it
        assert min(r["tool_use_rate"] for r in rows) > 0 and "eval_tool_use_rate" in rows[-1]
    assert os.path.isdir(tmp_path / "checkpoints" / str(pretrain + 3))
    assert os.path.isdir(tmp_path / "tensorboard")


@pytest.mark.slow
@pytest.mark.parametrize("recipe, overrides", [
    # A critic (its parameters and optimizer state) and a step of value pre-training. (A
    # policy alone, killed and stopped in a relative workdir: test_faults.py's soak.)
    ("vapo", {"train.steps": 5, "critic.pretrain_steps": 1, "train.export": True}),
    # Multi-turn episodes: the calculator answers the model's calls in every rollout.
    ("tool_calculator", {"train.steps": 5}),
    # Asynchronous with partial rollouts, every batch exactly 2 steps stale (10 tokens a
    # step, dynamic sampling padding short batches): the producer has sampled ahead of the
    # checkpoint when the kill comes, and the checkpoint holds the groups carried over; the
    # resumed producer samples those steps again from the checkpoint's prompt position,
    # lagged copies and pool, taking the carried groups up where they were.
    ("dapo", {"train.steps": 5, "async_rl.enabled": True, "async_rl.max_staleness": 2,
              "async_rl.fixed": True, "rollout.partial.enabled": True,
              "rollout.partial.tokens_per_step": 10, "filtering.max_gen_batches": 2,
              "filtering.short_batch": "pad", "train.export": True}),
])
def test_kill_minus_nine_then_resume_continues_exactly_from_a_relative_workdir(
        data_dir, tmp_path, recipe, overrides):
    overrides = {**overrides, "train.checkpoint_every": 2, "train.eval_every": 100}
    reference = tmp_path / "uninterrupted"
    config = tiny_config(recipe, data_dir, **overrides)
    rl.train(config, str(reference))
    expected = {r["step"]: comparable(r) for r in read_metrics(reference)}
    if recipe.startswith("tool_"):   # the resumed episodes' calls are answered too
        assert min(r["tool_calls_per_episode"] for r in expected.values()) > 0

    # A relative --workdir: orbax needs absolute paths, so this is what a user's
    # `--workdir runs/x` meets; the rerun must find the same checkpoints.
    config_file = cli_config_file(tmp_path, data_dir, overrides, recipe)
    command, where = cli([f"--config={config_file}", "--workdir=runs/killed"], cwd=tmp_path)
    workdir = tmp_path / "runs" / "killed"
    process = subprocess.Popen(
        command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, **where
    )
    deadline = time.time() + 600
    while time.time() < deadline and process.poll() is None:
        # Mid-run, past step 3, once the step-2 checkpoint is on disk (saves are async).
        if (os.path.exists(workdir / run_files.METRICS) and len(read_metrics(workdir)) >= 3
                and finished_checkpoints(workdir)):
            process.kill()   # SIGKILL: no cleanup, no final save
            break
        time.sleep(0.02)
    assert process.wait() == -9, "the run finished before it could be killed"
    logged = [r["step"] for r in read_metrics(workdir)]
    resume_from = finished_checkpoints(workdir)[-1]
    assert resume_from < max(expected) and logged[-1] >= resume_from
    if overrides.get("rollout.partial.enabled"):   # rows were in flight at the checkpoint
        assert expected[resume_from]["carried_groups"] > 0

    resumed = subprocess.run(
        command, check=True, capture_output=True, text=True, timeout=600, **where
    )
    assert f"resumed from the checkpoint of step {resume_from} in {workdir}" in resumed.stdout
    rows = read_metrics(workdir)   # the rows logged past the checkpoint were dropped and redone
    assert [r["step"] for r in rows] == list(range(1, max(expected) + 1)) == sorted(expected)
    for row in rows:
        got, want = comparable(row), expected[row["step"]]
        assert got.keys() == want.keys()
        for key in want:
            np.testing.assert_allclose(got[key], want[key], rtol=1e-5, atol=1e-7, err_msg=key)
    if overrides.get("train.export"):   # the final parameters: the policy's (and the critic's)
        exports = ["export"] + (["export_critic"] if config.critic.enabled else [])
        for export in exports:
            got = load_file(str(workdir / export / "model.safetensors"))
            want = load_file(str(reference / export / "model.safetensors"))
            assert got.keys() == want.keys()
            for name in want:
                np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-7,
                                           err_msg=f"{export}: {name}")


@pytest.mark.slow
def test_continuous_batching_and_packing_give_the_reference_step(data_dir, reference, tmp_path):
    """Step 1 with 8 decode slots for the 32 rows and packed forward passes: the same
    prompts, completions and rewards, row for row, as the reference run (static batch,
    padded), and the same pi_old, updates and metrics up to float reordering."""
    config = faults_config(data_dir, **{"train.steps": 1, "rollout.slots": 8,
                                        "train.log_rollouts_every": 1, "train.packing": "on"})
    # reference: padded
    assert programs.packs(config) and not programs.packs(faults_config(data_dir))
    rl.train(config, str(tmp_path))
    assert (tmp_path / "rollouts" / "1.jsonl").read_text() == \
        (reference / "rollouts" / "1.jsonl").read_text()
    got, want = read_metrics(tmp_path)[0], read_metrics(reference)[0]
    for key in ("reward_mean", "accuracy", "response_length_mean", "truncation_rate"):
        assert got[key] == want[key], key
    assert 0 < got["pack_rows_fraction"] <= 1 and 0 < got["pack_fill"] <= 1
    for key, value in comparable(want).items():
        assert_metric_close(key, got[key], value, rtol=1e-5, atol=1e-7, err_msg=key)


@pytest.mark.slow
def test_a_paged_kv_cache_gives_the_same_step(data_dir, dapo_run, tmp_path):
    """Step 1 with 8 slots over 16-token pages: the same rollouts, row for row, and the
    same rewards and loss as the static sampler's step (4 prompts x 4 answers): step 1 of
    the session's `dapo_run`, which a one-step run equals (its two updates are inside the
    learning rate's 5-step warmup, and neither run evaluates at step 1)."""
    overrides = {"train.steps": 1, "train.log_rollouts_every": 1}
    rl.train(tiny_config("dapo", data_dir, **overrides, **{"rollout.slots": 8,
                                                           "rollout.kv_page_size": 16}),
             str(tmp_path / "paged"))
    assert (tmp_path / "paged" / "rollouts" / "1.jsonl").read_text() == \
        (dapo_run / "rollouts" / "1.jsonl").read_text()
    got, want = read_metrics(tmp_path / "paged")[0], read_metrics(dapo_run)[0]
    for key in ("reward_mean", "accuracy", "response_length_mean", "truncation_rate"):
        assert got[key] == want[key], key
    for key, value in comparable(want).items():
        assert_metric_close(key, got[key], value, rtol=1e-5, atol=1e-7, err_msg=key)


@pytest.mark.slow
def test_lagged_rollouts_and_reference_resets_resume_exactly(data_dir, tmp_path):
    """The state beyond parameters (lagged rollout parameters, a reset KL reference) is
    checkpointed: a run stopped at step 2 and resumed equals an uninterrupted one. With
    ``train.eval_at_start`` the starting policy's evaluation is step 0's row, kept (not
    redone) by the resume, and equal to the "eval" mode's score of the warm start."""
    overrides = {"train.steps": 4, "train.checkpoint_every": 2, "train.eval_every": 100,
                 "rollout.policy_lag": 2, "objective.kl.beta": 0.01, "train.ref_reset_every": 3,
                 "train.eval_at_start": True}
    config = tiny_config("dapo", data_dir, **overrides)
    rl.train(config, str(tmp_path / "whole"))
    rl.train(
        tiny_config("dapo", data_dir, **{**overrides, "train.steps": 2}), str(tmp_path / "cut")
    )
    rl.train(tiny_config("dapo", data_dir, **overrides), str(tmp_path / "cut"))
    whole, cut = read_metrics(tmp_path / "whole"), read_metrics(tmp_path / "cut")
    assert [r["step"] for r in cut] == [0, 1, 2, 3, 4]
    start = evaluation.evaluate_export(config, os.path.join(warm_start.warm_start_dir(config),
                                                            "export"))
    assert set(start) == {"eval_accuracy", "eval_mean_at_k", "eval_pass_at_k", "eval_k"}
    assert {key: whole[0][key] for key in start} == start
    for got, want in zip(cut, whole):
        for key, value in comparable(want).items():
            np.testing.assert_allclose(got[key], value, rtol=1e-5, atol=1e-7, err_msg=key)
    # With a lag of 2, steps 1 and 2 sample with the starting parameters, which the update
    # of step 1 has already left by step 2: the ratio moves off 1 before any minibatch.
    assert whole[1]["kl_old"] < whole[2]["kl_old"]


@pytest.mark.slow
def test_home_relative_paths_are_expanded(tmp_path):
    """`~` in --workdir, task.data_dir and model.path means the user's home directory."""
    home = tmp_path / "home"
    home.mkdir()
    # Its own dataset and warm start under the fake home: a 10-step one (paths are under test).
    # A 10-step warm start may answer every prompt wrong: dynamic sampling then trains on
    # the padded batch instead of stopping (the run, not its signal, is under test).
    overrides = {"train.steps": 1, "train.eval_every": 100, "train.export": True,
                 "sft.steps": 10, "filtering.short_batch": "pad"}
    config_file = cli_config_file(tmp_path, "~/tfds", overrides)
    command, where = cli([f"--config={config_file}", "--workdir=~/runs/first"], cwd=tmp_path,
                         HOME=str(home))
    subprocess.run(command, check=True, capture_output=True, timeout=600, **where)
    assert (home / "runs" / "first" / "checkpoints" / "1").is_dir()
    assert (home / "runs" / "first" / "export" / "config.json").is_file()
    assert any((home / "tfds").iterdir())
    # The export read back through a `~` model.path, by the eval mode into a relative workdir.
    command, where = cli([f"--config={config_file}", "--workdir=eval_run",
                          "--config.mode=eval", "--config.model.path=~/runs/first/export",
                          "--config.model.name="], cwd=tmp_path, HOME=str(home))
    subprocess.run(command, check=True, capture_output=True, timeout=600, **where)
    assert (tmp_path / "eval_run" / "eval.json").is_file()
    assert not list(tmp_path.rglob("~"))   # nothing was written to a directory named "~"


class _PatternScorer:
    """Group g of each draw: all correct (g % 4 == 0), all wrong (1, 3) or mixed (2)."""

    weights = np.ones(1, np.float32)

    def __call__(self, prompts, completions, examples, lengths):
        rows = len(prompts)
        group = np.arange(rows) // 4
        mixed = (np.arange(rows) % 2).astype(np.float32)
        values = np.where(group % 4 == 0, 1.0, np.where(group % 4 == 2, mixed, 0.0)).astype(
            np.float32
        )
        return values, values >= 1, {}


# The dynamic-sampling tests draw from a policy initialised at random (no warm start).
_PATTERN_RUN = {"model.sft_warm_start": False}


@pytest.fixture(scope="module")
def pattern_policy(data_dir, tmp_path_factory):
    """`(mesh, source, policy)` of `tiny_config("dapo", **_PATTERN_RUN)`, built once for the
    dynamic-sampling tests: the filtering settings they vary are read by `rollout.collect`
    alone, and sampling leaves the policy as it was."""
    config = tiny_config("dapo", data_dir, **_PATTERN_RUN)
    mesh = parallel.setup_mesh(config)
    source = task_lib.data_source(config.task, "train")
    policy = policy_lib.start_policy(config, mesh, str(tmp_path_factory.mktemp("pattern")),
                                     task_lib.tokenizer_corpus(source))
    return mesh, source, policy


def _collect_with_pattern(data_dir, pattern_policy, **overrides):
    config = tiny_config("dapo", data_dir, **{**_PATTERN_RUN, **overrides})
    mesh, source, policy = pattern_policy
    train_iter = iter(task_lib.loader(source, config, batch_size=config.rollout.prompts_per_batch))
    batch, metrics, _ = rollout.collect(policy, mesh, train_iter, config=config,
                                        scorer=_PatternScorer(), rng=jax.random.key(0),
                                        method=sampling.Temperature(1.0))
    return batch, metrics


@pytest.mark.slow
@pytest.mark.parametrize("max_gen_batches, draws, filled", [(3, 3, 0.75), (5, 4, 1.0)])
def test_dynamic_sampling_keeps_only_groups_with_signal(data_dir, pattern_policy,
                                                        max_gen_batches, draws, filled):
    batch, metrics = _collect_with_pattern(
        data_dir, pattern_policy, **{"filtering.max_gen_batches": max_gen_batches,
                               "filtering.short_batch": "pad"})
    assert metrics["gen_batches"] == draws
    assert metrics["groups_without_signal"] == 0.75   # 3 of every 4 groups drawn
    assert metrics["batch_filled"] == filled
    valid = np.asarray(batch["row_valid"])
    assert valid.sum() == 16 * filled
    signal = np.asarray(objectives.group_has_signal(jnp.asarray(batch["rewards"]), 4))
    assert signal[:int(4 * filled)].all()
    assert np.all(np.asarray(batch["mask"])[~valid] == 0)      # top-up rows count for nothing
    # The batch stays on the mesh, its rows split 8 ways (one block per device).
    assert len({shard.index[0].start for shard in batch["tokens"].addressable_shards}) == 8


@pytest.mark.slow
def test_dynamic_sampling_that_runs_out_of_draws_stops_with_a_message(data_dir,
                                                                     pattern_policy):
    with pytest.raises(RuntimeError, match=r"dynamic sampling found 3 groups with signal in 3 "
                                            r"draws.*filtering.max_gen_batches"):
        _collect_with_pattern(data_dir, pattern_policy, **{"filtering.max_gen_batches": 3,
                                                     "filtering.short_batch": "error"})


@pytest.mark.parametrize("overrides, error, message", [
    ({"objective.loss.eps_high": -0.1}, ValueError,
     r"objective.loss.eps_high must be >= 0, got -0.1"),
    ({"objective.loss.dual_clip": 1.0}, ValueError, r"objective.loss.dual_clip must be > 1.0"),
    ({"objective.kl.kind": "k9"}, ValueError, r"objective.kl.kind must be one of 'k1', 'k2', 'k3'"),
    ({"train.micro_batches": 3}, ValueError, r"16 rows must divide into train.minibatches \* "
                                             r"train.micro_batches = 6 pieces"),
    ({"train.micro_batches": 2, "mesh": "data=8,fsdp=1,tensor=1"}, ValueError,
     r"a micro-batch of 4 rows does not split over the 8-way row axes"),
    ({"train.old_logp": "vllm"}, ValueError,
     r"train.old_logp must be one of \('recompute', 'sampler'\)"),
    ({"train.old_logp": "sampler", "objective.importance.enabled": True}, ValueError,
     r"with train.old_logp='sampler' they are the same numbers"),
    ({"filtering.short_batch": "skip"}, ValueError, r"filtering.short_batch must be one of"),
    ({"rollout.policy_lag": -1}, ValueError, r"rollout.policy_lag must be >= 0"),
    ({"rollout.slots": -2}, ValueError, r"rollout.slots must be an int >= 0"),
    ({"rollout.dtype": "bf16"}, ValueError, r"rollout.dtype must be '' \(model.dtype\) or one of"),
    ({"rollout.kv_page_size": 16}, ValueError, r"rollout.kv_page_size=16 pages the "
     r"continuous-batching slots' caches, but rollout.slots is 0; set rollout.slots > 0"),
    ({"rollout.kv_pages": 4}, ValueError, r"rollout.kv_pages=4 sizes the page pool of "
     r"rollout.kv_page_size, which is 0"),
    ({"rollout.slots": 8, "rollout.kv_page_size": 16, "rollout.kv_pages": 1}, ValueError,
     r"rollout.kv_pages=1 cannot hold one row of rollout.max_new_tokens=\d+ in pages of 16"),
    ({"rollout.slots": 8, "rollout.kv_page_size": -1}, ValueError,
     r"rollout.kv_page_size must be an int >= 0"),
    ({"rollout.partial.enabled": True, "rollout.partial.tokens_per_step": 0}, ValueError,
     r"rollout.partial.tokens_per_step must be an int >= 1"),
    ({"train.packing": "yes"}, ValueError,
     r"train.packing must be one of \('auto', 'on', 'off'\), got 'yes'"),
    ({"train.ref_reset_every": 5}, ValueError, r"train.ref_reset_every replaces the KL reference"),
    ({"mesh": "data:8"}, ValueError, r"write it as name=size pairs"),
    ({"model.path": "/no/such/checkpoint"}, FileNotFoundError,
     r"model.path '/no/such/checkpoint' is not a directory"),
    ({"objective.advantage.estimator": "gae"}, ValueError,
     r"estimator='gae' takes the critic's values; set critic.enabled=True"),
    ({"critic.enabled": True}, ValueError, r"critic.enabled trains a value model that "
                                          r"objective.advantage.estimator='group' never reads"),
    ({"critic.pretrain_steps": 2}, ValueError, r"critic.pretrain_steps pre-trains a critic, but "
                                              r"critic.enabled is False"),
    ({"critic.enabled": True, "objective.advantage.estimator": "gae", "critic.lam": 1.5},
     ValueError, r"critic.lam must be in \[0, 1\], got 1.5"),
    ({"critic.enabled": True, "objective.advantage.estimator": "gae", "critic.value_clip": 0.0},
     ValueError, r"critic.value_clip must be > 0 \(None: no clip\), got 0.0"),
])
def test_bad_configs_name_the_field(data_dir, tmp_path, overrides, error, message):
    with pytest.raises(error, match=message):
        rl.train(tiny_config("dapo", data_dir, **overrides), str(tmp_path))


class _AtSetUp(Exception):
    """Raised in place of the set-up: the test reads what train() hands to it."""


def test_train_reads_a_resolved_read_only_copy_and_records_it(tmp_path, monkeypatch, capsys):
    """The loop sees a new config, paths absolute, that raises on assignment; it is printed
    once and saved as workdir/config.json; the caller's config is left as it was."""
    monkeypatch.setenv("HOME", str(tmp_path))
    given = tiny_config("dapo", "~/tfds", **{"model.sft_warm_start": False})
    before = given.to_dict()
    seen = []

    def stop_at_set_up(config, workdir, mesh, rollout_mesh=None):
        seen.append((config, workdir))
        raise _AtSetUp

    monkeypatch.setattr(rl_run, "set_up", stop_at_set_up)
    with pytest.raises(_AtSetUp):
        rl.train(given, "~/run")
    assert given.to_dict() == before
    [(config, workdir)] = seen
    assert workdir == str(tmp_path / "run") and config.task.data_dir == str(tmp_path / "tfds")
    with pytest.raises(AttributeError, match="immutable"):
        config.train.steps = 1
    with open(tmp_path / "run" / "config.json") as f:
        assert json.load(f) == json.loads(config_lib.to_json(config))
    assert capsys.readouterr().out.count(f"config ({workdir}/config.json):") == 1


def test_unknown_recipe_and_field_fail_at_the_command_line(tmp_path):
    def run(*flags):
        return subprocess.run([sys.executable, "-m", "grpo_jax.main", *flags,
                               f"--workdir={tmp_path}"], cwd=REPO, capture_output=True, text=True,
                              timeout=300)

    missing = run("--config=configs/no_such_recipe.py")
    assert missing.returncode != 0 and "no_such_recipe.py" in missing.stderr
    typo = run("--config=configs/dapo.py:runlocal=True", "--config.objective.loss.eps_hihg=0.3")
    assert typo.returncode != 0 and "eps_hihg" in typo.stderr


@pytest.mark.slow
def test_non_finite_loss_stops_and_keeps_the_last_good_checkpoint(data_dir, dapo_run, tmp_path):
    """Two good steps (a copy of the session's `dapo_run`, checkpointed each step), then a
    loss that is NaN from step 3: the run stops there, naming step 2's checkpoint."""
    shutil.copytree(dapo_run, tmp_path, dirs_exist_ok=True)

    def nan_loss(logp, old_logp, adv, mask):
        return jnp.where(mask > 0, logp * jnp.nan, 0.0), {}

    objectives.register_policy_loss("nan_loss", nan_loss, fields=())
    try:
        config = tiny_config(
            "dapo", data_dir, **{"train.steps": 4, "objective.loss.kind": "nan_loss"}
        )
        with pytest.raises(
            FloatingPointError,
            match=r"step 3: (loss|grad_norm) = nan is not finite.*"
            r"last good checkpoint is step 2",
        ):
            rl.train(config, str(tmp_path))
    finally:
        del objectives.POLICY_LOSSES["nan_loss"]
    assert (
        sorted(int(os.path.basename(p)) for p in glob.glob(str(tmp_path / "checkpoints" / "*")))[-1]
        == 2
    )
    assert [r["step"] for r in read_metrics(tmp_path)] == [1, 2]
