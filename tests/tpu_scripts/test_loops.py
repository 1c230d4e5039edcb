"""babysit.sh and sweep.sh for real, against a fake gcloud that plays a preemption.

The fake answers `describe` with the next line of `states` (MISSING: a NOT_FOUND error,
ERROR: any other failure), fails a trainer launch with the next code of `run_codes`
or when its command holds $FAIL_MATCH, and logs every call.
"""

import pathlib
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[2]

FAKE_GCLOUD = r"""#!/bin/bash
cd "$FAKE_DIR"
echo "$*" >> calls
next() { local line; line=$(head -n 1 "$1"); sed -i 1d "$1"; echo "$line"; }
case "$*" in
  *" describe "*)
    state=$(next states)
    if [[ $state == MISSING ]]; then echo "ERROR: NOT_FOUND: node not found" >&2; exit 1; fi
    if [[ $state == ERROR ]]; then echo "ERROR: deadline exceeded" >&2; exit 1; fi
    echo "$state" ;;
  *grpo_jax.main*)
    if [[ -n ${FAIL_MATCH:-} && $* == *"$FAIL_MATCH"* ]]; then exit 1; fi
    if [[ -s run_codes ]]; then exit "$(next run_codes)"; fi ;;
esac
"""


def _run(tmp_path, script, *, states=(), run_codes=(), **env):
    (tmp_path / "bin").mkdir(exist_ok=True)
    gcloud = tmp_path / "bin" / "gcloud"
    gcloud.write_text(FAKE_GCLOUD)
    gcloud.chmod(0o755)
    (tmp_path / "states").write_text("".join(f"{s}\n" for s in states))
    (tmp_path / "run_codes").write_text("".join(f"{c}\n" for c in run_codes))
    (tmp_path / "calls").write_text("")
    source = tmp_path / "src"
    source.mkdir(exist_ok=True)
    (source / "setup.py").write_text("")
    env = {
        "PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin", "HOME": str(tmp_path), "TMPDIR": str(tmp_path),
        "FAKE_DIR": str(tmp_path), "POLL_SECONDS": "0", "TPU_NAME": "pod-a", "ZONE": "z",
        "PROJECT": "p", "ACCELERATOR_TYPE": "v5p-16", "RUNTIME_VERSION": "v2-alpha-tpuv5",
        "REPO": str(source), "CONFIG": "configs/dapo.py:runlocal=True", "WORKDIR": "gs://b/w",
        "PYTHON": sys.executable, **env,
    }
    result = subprocess.run(["bash", str(REPO / "tpu_scripts" / script)], env=env,
                            capture_output=True, text=True, timeout=60)
    return result, _verbs((tmp_path / "calls").read_text().splitlines())


def _verbs(calls):
    def verb(call):
        words = call.split()
        if words[2:4] == ["tpu-vm", "ssh"]:
            return "kill" if "pkill" in call else "run" if "grpo_jax.main" in call else "setup"
        return " ".join(words[2:4])
    return [verb(call) for call in calls]


SETUP = ["tpu-vm scp", "setup", "setup"]


def test_preempted_then_deleted_tpu_is_recreated_until_the_run_finishes(tmp_path):
    result, calls = _run(
        tmp_path, "babysit.sh", states=["PREEMPTED", "MISSING"], run_codes=[255, 0]
    )
    assert result.returncode == 0, result.stderr
    assert calls == (["tpu-vm describe", "tpu-vm delete", "tpu-vm create", *SETUP, "kill", "run",
                      "tpu-vm describe", "tpu-vm create", *SETUP, "kill", "run"])
    assert "run finished" in result.stderr


def test_failed_state_query_waits_instead_of_deleting(tmp_path):
    result, calls = _run(tmp_path, "babysit.sh", states=["ERROR", "CREATING", "READY"])
    assert result.returncode == 0, result.stderr
    assert calls == ["tpu-vm describe"] * 3 + ["kill", "run"]
    assert "deadline exceeded" in result.stderr


def test_run_crashing_on_a_healthy_tpu_gives_up(tmp_path):
    result, calls = _run(tmp_path, "babysit.sh", states=["READY"] * 3, run_codes=[1, 1, 1],
                         MAX_FAILURES="3")
    assert result.returncode != 0
    assert "run failed 3 times in a row on a healthy TPU" in result.stderr
    assert calls == ["tpu-vm describe", "kill", "run"] * 3


def test_a_run_stopped_by_sigterm_is_resumed_not_counted_as_a_failure(tmp_path):
    """Exit 75: the trainer saved its checkpoint on SIGTERM; babysit starts it again."""
    result, calls = _run(tmp_path, "babysit.sh", states=["READY", "PREEMPTED", "READY"],
                         run_codes=[75, 75, 0], MAX_FAILURES="1")
    assert result.returncode == 0, result.stderr
    assert calls == ["tpu-vm describe", "kill", "run",
                     "tpu-vm describe", "tpu-vm delete", "tpu-vm create", *SETUP, "kill", "run",
                     "tpu-vm describe", "kill", "run"]
    assert result.stderr.count("stopped by SIGTERM after saving its checkpoint") == 2


def test_queued_resource_is_waited_for_until_active(tmp_path):
    result, calls = _run(tmp_path, "create.sh", QUEUED="1",
                         states=["WAITING_FOR_RESOURCES", "PROVISIONING", "ACTIVE"])
    assert result.returncode == 0, result.stderr
    assert calls == ["queued-resources create"] + ["queued-resources describe"] * 3


def test_sweep_entry_failure_does_not_stop_the_others(tmp_path, gcs_emulator):
    """Before the pods start, each entry's sweep_run.json lands in its workdir (in the
    emulator's bucket), where grpo_jax.report reads it."""
    from grpo_jax import paths, sweep
    result, calls = _run(tmp_path, "sweep.sh", TPU_NAMES="pod-a pod-b", WORKDIR="gs://test-bucket/w",
                         FAIL_MATCH="01_eps_high-0.2_mode-seq-mean-token-mean", **gcs_emulator)
    assert result.returncode != 0
    assert calls == ["run"] * 4
    assert "sweep entry 01_eps_high-0.2_mode-seq-mean-token-mean failed on pod-b" in result.stderr
    assert "some sweep entries failed" in result.stderr
    records = sorted(p.name for p in paths.path("gs://test-bucket/w").iterdir()
                     if (p / sweep.RUN_RECORD).exists())
    assert records == [
        name for name, _ in sweep.sweep_entries(f"{REPO}/configs/dapo.py:runlocal=True")
    ]
