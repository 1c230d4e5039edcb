"""The hostile-program table: each attack run through `code_tests` in a grader pool, under
each available backend, with its outcome asserted; the pool's worker and this process
survive every row.

A probe program does its attack and then solves the problem (echo the input) only if the
attack found nothing, so its reward says whether the sandbox held (1.0) and that normal
work still runs beside the attack; the rows with nothing to solve score 0.
"""

import json
import os
import socket
import subprocess
import time

import pytest

from grpo_jax import rewards
from grpo_jax.rewards import _sandbox

SECRET = "grpo-secret-4c9e1d"   # planted in this process's and a sibling's environment
ECHO = json.dumps({"kind": "stdio", "cases": [{"input": "7\n", "output": "7"},
                                             {"input": "11\n", "output": "11"}]})
SQUARE = json.dumps({"kind": "assert", "setup": "",
                     "cases": ["assert square(3) == 9",
                               "assert abs(square(-4) - 16) < 1e-9"]})
OPTIONS = {"case_s": 1.0, "program_s": 2.0, "memory_mb": 256}


def _backends():
    params = [pytest.param("subprocess", id="subprocess")]
    reason = "bwrap is not installed or cannot create namespaces here (probe run failed)"
    params.append(pytest.param("bwrap", id="bwrap", marks=pytest.mark.skipif(
        not _sandbox.bwrap_works(), reason=reason)))
    return params


def fenced(program):
    return f"Here it is:\n```python\n{program}\n```\n"


def probe(attack):
    """A stdio program: `attack` sets `leaks` (a list) to what got through; echo if none."""
    return (f"import os, sys\nleaks = []\n{attack}\n"
            "print('LEAK', leaks) if leaks else print(input())")


READ_SECRETS = """
for path in ["/etc/shadow", "{key}", "/root/.ssh/id_rsa"]:
    try:
        leaks.append(open(path).read()[:20])
    except OSError:
        pass
for name in os.listdir("/proc"):
    try:
        if "{secret}" in open(f"/proc/{{name}}/environ").read():
            leaks.append(name)
    except OSError:
        pass
if "{secret}" in str(os.environ):
    leaks.append("environ")
"""
WRITE_OUTSIDE = """
for path in ["{outside}/escaped", "/root/escaped-{secret}"]:
    try:
        open(path, "w").write("x")
        leaks.append(path)
    except OSError:
        pass
"""
NETWORK = """
import socket
for address in [("127.0.0.1", {port}), ("1.1.1.1", 53)]:
    try:
        socket.create_connection(address, timeout=0.5).close()
        leaks.append(address)
    except OSError:
        pass
"""
KILL = """
import signal
for pid in [os.getppid(), {holder}]:
    try:
        os.kill(pid, signal.SIGKILL)
        leaks.append(pid) if pid == {holder} else None
    except OSError:
        pass
"""
ALWAYS_EQUAL = """
class Anything(int):
    def __eq__(self, other):
        return True
def square(x):
    return Anything(0)
"""
PATCH_BUILTINS = """
import builtins
class Never(Exception):
    pass
builtins.AssertionError = Never
builtins.abs = lambda x: 0
def square(x):
    return 0
"""
FORGE_REPORT = """
import os, sys
for fd in range(3, 20):
    try:
        os.write(fd, b"0 pass\\n1 pass\\ndone\\n")
    except OSError:
        pass
try:
    frame = sys._getframe(1)
    token = [v for v in frame.f_locals.values() if isinstance(v, bytes)][0]
    for fd in range(3, 20):
        os.write(fd, token + b" 0 pass\\n" + token + b" 1 pass\\n")
except Exception:
    pass
try:
    import gc
    gc.get_objects()
except Exception:
    pass
os._exit(0)
"""


@pytest.fixture(scope="module")
def holder():
    """A process of this user started with the secret in its environment."""
    process = subprocess.Popen(["sleep", "600"], env={"SECRET_TOKEN": SECRET})
    yield process
    process.kill()
    process.wait()


@pytest.fixture(scope="module")
def listener():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    server.setblocking(False)
    yield server
    server.close()


@pytest.fixture(scope="module")
def pool():
    with rewards.GraderPool(1, timeout_s=10.0) as grader_pool:
        yield grader_pool


def _rows(tmp_path, holder, listener):
    """(name, program, tests, reward expected with all_or_nothing=False)."""
    key = tmp_path / "home" / ".ssh" / "id_rsa"
    key.parent.mkdir(parents=True)
    key.write_text("PRIVATE KEY " + SECRET)
    key.chmod(0o600)
    key.parent.chmod(0o700)
    fmt = dict(secret=SECRET, key=key, outside=tmp_path, port=listener.getsockname()[1],
               holder=holder.pid)
    return [
        ("fork_bomb", "import os\nwhile True:\n    os.fork()", ECHO, 0.0),
        ("memory_bomb", "blocks = []\nwhile True:\n    blocks.append(bytearray(10**7))", ECHO, 0.0),
        ("infinite_loop", "while True:\n    pass", ECHO, 0.0),
        ("print_loop", "while True:\n    print('x' * 80)", ECHO, 0.0),
        ("write_outside", probe(WRITE_OUTSIDE.format(**fmt)), ECHO, 1.0),
        ("read_secrets", probe(READ_SECRETS.format(**fmt)), ECHO, 1.0),
        ("socket", probe(NETWORK.format(**fmt)), ECHO, 1.0),
        ("kill_parent", probe(KILL.format(**fmt)), ECHO, 1.0),
        ("exit_before_tests", "import sys\nsys.exit(0)\ndef square(x):\n    return x * x",
         SQUARE, 0.0),
        ("os_exit_before_tests", "import os\nos._exit(0)\ndef square(x):\n    return x * x",
         SQUARE, 0.0),
        ("exit_stdio", "import sys\nsys.exit(0)", ECHO, 0.0),
        ("always_equal", ALWAYS_EQUAL, SQUARE, 0.0),
        ("patch_builtins", PATCH_BUILTINS, SQUARE, 0.0),
        ("forge_report", FORGE_REPORT, SQUARE, 0.0),
        ("ctypes_crash", "import ctypes\nctypes.string_at(0)", ECHO, 0.0),
        ("ctypes_crash_assert", "import ctypes\nctypes.string_at(0)\ndef square(x):\n"
         "    return x * x", SQUARE, 0.0),
        ("hardcoded_output", "print(7)", ECHO, 0.5),
        ("honest_stdio", "print(input())", ECHO, 1.0),
        ("honest_assert", "def square(x):\n    return x * x", SQUARE, 1.0),
    ]


@pytest.mark.slow
@pytest.mark.parametrize("backend", _backends())
def test_hostile_programs(backend, tmp_path, holder, listener, pool, monkeypatch):
    monkeypatch.setenv("SECRET_TOKEN", SECRET)
    sandbox = _sandbox.get_sandbox(backend)
    if not sandbox.as_root:
        pytest.skip("the subprocess fallback run by a normal user does not guard that "
                    "user's files, environment or processes (docs/code.md)")
    rows = _rows(tmp_path, holder, listener)
    calls = [("p", fenced(program), {"tests": tests}) for _, program, tests, _ in rows]
    start = time.monotonic()
    outcomes = pool.map(rewards.code_tests_reward, calls,
                        dict(OPTIONS, backend=backend, all_or_nothing=False))
    elapsed = time.monotonic() - start
    got = {name: (outcome.status, outcome.value) for (name, *_), outcome in zip(rows, outcomes)}
    expected = {name: ("ok", value) for name, _, _, value in rows}
    assert got == expected
    assert pool.replaced_workers == 0          # the worker survived every row
    assert holder.poll() is None               # the sibling holding the secret lives
    assert not (tmp_path / "escaped").exists()
    assert not os.path.exists(f"/root/escaped-{SECRET}")
    with pytest.raises(BlockingIOError):       # nothing connected to this host's port
        listener.accept()
    assert elapsed < 60, elapsed               # each row ends within its limits


@pytest.mark.parametrize("backend", _backends())
def test_no_process_of_a_run_outlives_it(backend):
    sandbox = _sandbox.get_sandbox(backend)
    program = ("import os, time\nif os.fork() == 0:\n    os.setsid()\n"
               "    time.sleep(60)\nprint(os.getpid(), flush=True)\ntime.sleep(60)")
    before = _processes_named("time.sleep")
    result = sandbox.run_python({"p.py": program}, "p.py",
                                limits=_sandbox.Limits(wall_s=1.0, cpu_s=1))
    assert result.status == "timeout"
    if sandbox.as_root or backend == "bwrap":   # a normal user's fallback may leave the
        time.sleep(0.2)                         # child that left its session (docs/code.md)
        assert _processes_named("time.sleep") == before


def _processes_named(text):
    found = set()
    for pid in os.listdir("/proc"):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if text.encode() in f.read():
                    found.add(pid)
        except OSError:
            pass
    return found


@pytest.mark.parametrize("backend", _backends())
def test_limits_end_runs_with_their_status(backend):
    sandbox = _sandbox.get_sandbox(backend)
    limits = _sandbox.Limits(wall_s=1.0, cpu_s=1, memory_mb=128, output_bytes=1000)
    run = lambda program: sandbox.run_python({"p.py": program}, "p.py", limits=limits)
    looping = run("while True:\n    pass")
    assert looping.status in ("timeout", "exit") and looping.wall_s < 3.0
    printing = run("while True:\n    print('x')")
    assert printing.status == "output_limit" and len(printing.stdout) == 1000
    memory = run("x = bytearray(300 * 2**20)")
    assert memory.status == "exit" and memory.returncode == 1   # MemoryError
    large_file = run("open('big', 'wb').write(b'x' * 20 * 2**20)")
    assert large_file.status == "exit"                          # past RLIMIT_FSIZE (8 MB)
    files = run("fs = [open('p.py') for _ in range(100)]")
    assert files.status == "exit"                               # past RLIMIT_NOFILE (64)
    ok = sandbox.run_python({"p.py": "import sys\nprint(sys.stdin.read()[::-1])"}, "p.py",
                            stdin=b"abc", limits=limits)
    assert (ok.status, ok.returncode, ok.stdout) == ("ok", 0, b"cba\n")


@pytest.mark.parametrize("backend", _backends())
def test_environment_is_empty_and_scratch_directory_removed(backend, monkeypatch):
    monkeypatch.setenv("SECRET_TOKEN", SECRET)
    sandbox = _sandbox.get_sandbox(backend)
    result = sandbox.run_python(
        {"p.py": "import os\nprint(sorted(os.environ))\nprint(os.getcwd())"}, "p.py")
    names, cwd = result.stdout.decode().splitlines()
    assert names == "['LC_CTYPE']" or names == "['LC_CTYPE', 'PWD']"   # the interpreter's own
    assert SECRET not in result.stdout.decode()
    if backend == "subprocess":
        assert not os.path.exists(cwd)


def test_describe_says_the_backend_and_what_the_fallback_misses():
    fallback = rewards.describe_sandbox(_sandbox.Sandbox())
    assert fallback.startswith("code sandbox: subprocess fallback")
    assert "does not guard against" in fallback and "\n" not in fallback
    assert rewards.describe_sandbox(_sandbox.BwrapSandbox()).startswith("code sandbox: bwrap")


def test_unknown_backend_names_the_choices():
    with pytest.raises(ValueError, match="'auto', 'bwrap' or 'subprocess', got 'docker'"):
        rewards.get_sandbox("docker")


def test_limits_must_be_positive():
    with pytest.raises(ValueError, match="sandbox limit wall_s must be > 0, got 0"):
        _sandbox.Limits(wall_s=0)



def test_bwrap_probe_and_error_without_bwrap(monkeypatch):
    monkeypatch.setattr(_sandbox.shutil, "which", lambda name: None)
    assert _sandbox.bwrap_works.__wrapped__() is False
    monkeypatch.setattr(_sandbox, "bwrap_works", lambda: False)
    with pytest.raises(ValueError, match=r"bwrap is not installed \(apt-get install bubblewrap\)"):
        _sandbox.get_sandbox.__wrapped__("bwrap")
    assert type(_sandbox.get_sandbox.__wrapped__("auto")) is _sandbox.Sandbox
