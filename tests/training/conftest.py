"""Fixtures of the trainer tests."""

import pytest

from grpo_jax import paths
from grpo_jax.training import rl
from tests.training.training_setups import DAPO_RUN, LAG_RUN, faults_config, tiny_config


@pytest.fixture(scope="session")
def data_dir(shared_tmp_dir):
    """The session's datasets and SFT warm starts, shared by every worker: each warm start
    (keyed by everything it depends on) is trained once per session."""
    return str(shared_tmp_dir("tfds"))


@pytest.fixture(scope="session")
def reference(data_dir, shared_tmp_dir):
    """The workdir of the uninterrupted `faults_config` run that every interrupted run
    must end equal to: metrics.jsonl, export/ and each step's rollouts/ (run once per
    session: a worker that finds another's finished run reuses it)."""
    workdir = shared_tmp_dir("faults_uninterrupted")
    config = faults_config(data_dir, **{"train.checkpoint_every": 12, "train.export": True,
                                        "train.log_rollouts_every": 1})
    with paths.exclusive(f"{workdir}.lock"):
        if not (workdir / "export" / "model.safetensors").exists():
            rl.train(config, str(workdir))
    return workdir


@pytest.fixture(scope="session")
def dapo_run(data_dir, shared_tmp_dir):
    """The workdir of `tiny_config("dapo", **DAPO_RUN)`, run once per session (every worker
    reuses it): the single-turn run the environment tests compare with, and the good steps
    the non-finite-loss test resumes from (from a copy). Read it, never write into it."""
    workdir = shared_tmp_dir("dapo_run")
    with paths.exclusive(f"{workdir}.lock"):
        if not (workdir / "export" / "model.safetensors").exists():
            rl.train(tiny_config("dapo", data_dir, **DAPO_RUN), str(workdir))
    return workdir


@pytest.fixture(scope="session")
def lag_run(data_dir, shared_tmp_dir):
    """`lag_run(k, rollout_mesh)`: the workdir of the synchronous loop with
    rollout.policy_lag = k (`LAG_RUN`), on one mesh (`rollout_mesh` "") or split meshes,
    run once per session (every worker reuses it). The fixed asynchronous loop equals it
    bit for bit (test_async_rl.py), so runs on several processes compare with it too."""
    def run(k, rollout_mesh):
        workdir = shared_tmp_dir(f"sync_lag{k}_{rollout_mesh or 'one_mesh'}")
        with paths.exclusive(f"{workdir}.lock"):
            if not (workdir / "export" / "model.safetensors").exists():
                rl.train(tiny_config("dapo", data_dir, **LAG_RUN, **{
                    "rollout.policy_lag": k, "rollout.mesh": rollout_mesh}), str(workdir))
        return workdir

    return run
