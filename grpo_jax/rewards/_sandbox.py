"""A sandbox for untrusted programs: one interface, two backends.

A code reward runs what a policy wrote, so the program is hostile input (docs/code.md has
the threat model). `run_python(files, script, ...)` runs `python -I -S script` in a fresh
scratch directory holding `files` and returns what happened as a `RunResult`; it never
raises because of the program. Every run gets, in both backends:

- resource limits (`Limits`): CPU seconds, address space, processes, file size, open
  files, set on the program's process before it starts;
- a wall-clock limit, after which the whole run is killed (its process group, and when
  the trainer runs as root, every process of the run's own user id);
- stdout captured up to `Limits.output_bytes` (past it the run is killed);
- an empty environment, stdin from a file, a scratch directory removed afterwards;
- when the trainer runs as root: a user id of its own (`_run_uid`), so the program owns
  nothing of the trainer's, cannot signal it, and the process limit counts its processes
  only; and a network namespace of its own (no interface is up: network calls fail).

The `bwrap` backend (bubblewrap, Debian's `bubblewrap` package) adds new mount, PID, IPC,
UTS, user and network namespaces: the program sees only a read-only /usr and interpreter,
its own /tmp, /proc of its own PID namespace and its scratch directory, and everything it
started dies with the sandbox. The `subprocess` backend has the limits above and no
namespaces beyond the network one; `describe()` says in one line which backend runs and
what the fallback does not guard against.
"""

import contextlib
import ctypes
import dataclasses
import functools
import itertools
import os
import pathlib
import resource
import select
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from typing import Literal, Mapping

Status = Literal["ok", "exit", "timeout", "output_limit", "sandbox_error"]
Backend = Literal["auto", "bwrap", "subprocess"]
_CLONE_NEWUSER, _CLONE_NEWNET = 0x10000000, 0x40000000
_PR_SET_PDEATHSIG = 1
# User ids for runs started by root, far above login users: one per run (the worker's pid and
# a count), so a run's limit on processes never counts another run's, even one whose killed
# processes are not yet reaped.
_UID_BASE, _PIDS, _RUNS = 1_000_000, 100_000, 1_000
_SANDBOX_DIR = "/sandbox"   # where bwrap mounts the scratch directory


@dataclasses.dataclass(frozen=True)
class Limits:
    """Bounds on one run of a program.

    Attributes:
      wall_s: wall-clock seconds before the run is killed.
      cpu_s: CPU seconds (RLIMIT_CPU; SIGKILL past one more second).
      memory_mb: address space of each process (RLIMIT_AS); a bigger allocation fails.
      processes: processes and threads the run may start (RLIMIT_NPROC).
      file_mb: largest file it may write (RLIMIT_FSIZE).
      open_files: open file descriptors (RLIMIT_NOFILE).
      output_bytes: stdout kept; a run that writes more is killed ("output_limit").
    """

    wall_s: float = 2.0
    cpu_s: int = 2
    memory_mb: int = 512
    processes: int = 16
    file_mb: int = 8
    open_files: int = 64
    output_bytes: int = 1 << 16

    def __post_init__(self):
        for field in dataclasses.fields(self):
            if not getattr(self, field.name) > 0:
                raise ValueError(f"sandbox limit {field.name} must be > 0, "
                                 f"got {getattr(self, field.name)}")


@dataclasses.dataclass(frozen=True)
class RunResult:
    """What one run did.

    Attributes:
      status: "ok" (exited 0), "exit" (non-zero exit or killed by a signal, e.g. the CPU
        limit), "timeout" (past `Limits.wall_s`), "output_limit" (wrote more than
        `Limits.output_bytes`), "sandbox_error" (the sandbox itself could not start).
      returncode: the exit status (negative: the signal), None when killed by us.
      stdout: what it wrote to stdout, at most `Limits.output_bytes`.
      wall_s: seconds from start to end.
    """

    status: Status
    returncode: int | None
    stdout: bytes
    wall_s: float


def _libc():
    return ctypes.CDLL(None, use_errno=True)


def _world_reachable(path: str) -> bool:
    """Whether any user can read and execute `path` (every parent directory searchable)."""
    path = os.path.realpath(path)
    try:
        if not os.stat(path).st_mode & stat.S_IXOTH:
            return False
        parent = os.path.dirname(path)
        while True:
            if not os.stat(parent).st_mode & stat.S_IXOTH:
                return False
            if parent == "/":
                return True
            parent = os.path.dirname(parent)
    except OSError:
        return False


@functools.cache
def default_interpreter() -> str:
    """The Python that runs programs: this process's base interpreter, or, when the
    trainer runs as root and a run's own user could not reach it (e.g. pyenv under
    /root, mode 700), the system's `/usr/bin/python3`."""
    base = getattr(sys, "_base_executable", sys.executable)
    if os.geteuid() != 0 or _world_reachable(base):
        return base
    if _world_reachable("/usr/bin/python3"):
        return "/usr/bin/python3"
    raise RuntimeError(
        f"the sandbox runs programs as an unprivileged user when the trainer runs as root, "
        f"and that user cannot reach {base}; install a system python3 (apt-get install "
        f"python3) or run the trainer as a normal user")


_run_count = itertools.count()


def _run_uid() -> int:
    """A fresh user id for a run started by root (reused after 1,000 runs of a worker)."""
    return _UID_BASE + os.getpid() % _PIDS * _RUNS + next(_run_count) % _RUNS


def _tasks_of(uid: int) -> int:
    """Processes and threads of `uid` now (RLIMIT_NPROC counts them all)."""
    count = 0
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                if os.stat(f"/proc/{entry}").st_uid == uid:
                    count += len(os.listdir(f"/proc/{entry}/task"))
    return count


class _Child:
    """What runs in the child between fork and exec: namespaces, user, limits."""

    def __init__(self, limits: Limits, *, uid: int | None, own_network: bool):
        self.limits, self.uid, self.own_network = limits, uid, own_network
        # Computed before the fork: the child only makes system calls.
        # A normal user's limit counts all its tasks (the trainer's threads too), so it is
        # the run's allowance on top of those.
        self.nproc = limits.processes + (0 if uid is not None else _tasks_of(os.getuid()))
        self.libc = _libc()

    def __call__(self) -> None:
        if self.own_network:   # as root, or where unprivileged user namespaces are allowed
            flags = _CLONE_NEWNET if self.uid is not None else _CLONE_NEWUSER | _CLONE_NEWNET
            self.libc.unshare(flags)   # a failure leaves the network as it was (describe() says)
        if self.uid is not None:
            os.setgroups([])
            os.setgid(self.uid)
            os.setuid(self.uid)
        self.libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)   # dies with its grader worker
        mb = 1 << 20
        for name, value in ((resource.RLIMIT_CPU, self.limits.cpu_s),
                            (resource.RLIMIT_AS, self.limits.memory_mb * mb),
                            (resource.RLIMIT_NPROC, self.nproc),
                            (resource.RLIMIT_FSIZE, self.limits.file_mb * mb),
                            (resource.RLIMIT_NOFILE, self.limits.open_files),
                            (resource.RLIMIT_CORE, 0)):
            resource.setrlimit(name, (value, value))


class Sandbox:
    """Runs Python programs in a scratch directory under `Limits` (the subprocess backend).

    Args:
      interpreter: the Python to run (`default_interpreter()` when None).
    """

    name = "subprocess"

    def __init__(self, interpreter: str | None = None):
        self.interpreter = interpreter or default_interpreter()
        self.as_root = os.geteuid() == 0

    def command(self, script: str, workdir: str) -> tuple[list[str], str]:
        """(argv, working directory) of a run of `script` in `workdir`."""
        return [self.interpreter, "-I", "-S", script], workdir

    def own_network(self) -> bool:
        """Whether the child unshares its network itself (bwrap does it for its own)."""
        return True

    def run_python(self, files: Mapping[str, str | bytes], script: str, *,
                   stdin: bytes = b"", limits: Limits = Limits()) -> RunResult:
        """Runs `python -I -S script` in a fresh directory holding `files`.

        Args:
          files: file name -> contents, written into the scratch directory.
          script: the file to run (one of `files`).
          stdin: what the program reads on stdin.
          limits: the bounds of this run.

        Returns:
          The RunResult; never raises because of what the program does.
        """
        uid = _run_uid() if self.as_root else None
        workdir = tempfile.mkdtemp(prefix="grpo_sandbox_")
        start = time.monotonic()
        try:
            for name, contents in files.items():
                data = contents.encode("utf-8") if isinstance(contents, str) else contents
                pathlib.Path(workdir, name).write_bytes(data)
            if uid is not None:   # the run's user owns its directory, and nothing else
                for path in [workdir] + [os.path.join(workdir, name) for name in files]:
                    os.chown(path, uid, uid)
            argv, cwd = self.command(script, workdir)
            with tempfile.TemporaryFile() as stdin_file:
                stdin_file.write(stdin)
                stdin_file.seek(0)
                return self._launch(argv, cwd, stdin_file, limits, uid, start)
        except OSError as error:
            return RunResult("sandbox_error", None, str(error).encode(), time.monotonic() - start)
        finally:
            if uid is not None:
                _kill_user(uid)
            shutil.rmtree(workdir, ignore_errors=True)

    def _launch(self, argv, cwd, stdin_file, limits, uid, start) -> RunResult:
        child = _Child(limits, uid=uid, own_network=self.own_network())
        process = subprocess.Popen(
            argv, cwd=cwd, env={}, stdin=stdin_file, stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL, start_new_session=True, preexec_fn=child, close_fds=True)
        try:
            status, output = _collect(process, start + limits.wall_s, limits.output_bytes)
        finally:
            _kill_group(process)
            process.stdout.close()
        returncode = process.returncode if status is None else None
        if status is None:
            status = "ok" if returncode == 0 else "exit"
        return RunResult(status, returncode, output, time.monotonic() - start)


class BwrapSandbox(Sandbox):
    """The bubblewrap backend: the subprocess backend inside fresh namespaces."""

    name = "bwrap"

    def own_network(self) -> bool:
        return False

    def command(self, script: str, workdir: str) -> tuple[list[str], str]:
        interpreter = os.path.realpath(self.interpreter)
        prefix = os.path.dirname(os.path.dirname(interpreter))   # .../bin/python -> ...
        argv = ["bwrap", "--unshare-all", "--die-with-parent", "--new-session",
                "--clearenv", "--hostname", "sandbox", "--ro-bind", "/usr", "/usr"]
        for link in ("/bin", "/lib", "/lib64", "/lib32", "/sbin"):   # merged-/usr links
            if os.path.islink(link):
                argv += ["--symlink", os.readlink(link), link]
            elif os.path.isdir(link):
                argv += ["--ro-bind", link, link]
        if not prefix.startswith("/usr/"):
            argv += ["--ro-bind", prefix, prefix]
        argv += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp",
                 "--bind", workdir, _SANDBOX_DIR, "--chdir", _SANDBOX_DIR,
                 "--", interpreter, "-I", "-S", script]
        return argv, workdir


def _collect(process: subprocess.Popen, deadline: float,
             max_bytes: int) -> tuple[Status | None, bytes]:
    """Reads stdout until EOF and waits for the exit, by `deadline`; (None when it ended
    in time, else "timeout" or "output_limit", and the output kept)."""
    output = bytearray()
    fd = process.stdout.fileno()
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return "timeout", bytes(output)
        readable, _, _ = select.select([fd], [], [], remaining)
        if not readable:
            continue
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            break
        output += chunk
        if len(output) > max_bytes:
            return "output_limit", bytes(output[:max_bytes])
    try:
        process.wait(max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:   # closed stdout and went on running
        return "timeout", bytes(output)
    return None, bytes(output)


def _kill_group(process: subprocess.Popen) -> None:
    """Kills the run's process group until none of it is left, and reaps the leader."""
    for _ in range(100):   # a fork bomb forks while it is being killed
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            break
        time.sleep(0.001)
    process.wait()


def _kill_user(uid: int) -> None:
    """Kills every process of `uid` (a run's own user): those that left its process group.

    `kill(-1)` from a process of that user reaches exactly the processes it may signal, its
    own user's, in one pass that no fork can outrun (the kernel holds the task list, and a
    process with SIGKILL pending cannot finish a fork).
    """
    pid = os.fork()
    if pid == 0:   # the forked copy makes system calls only, then _exit
        try:
            os.setgid(uid)
            os.setuid(uid)
            os.kill(-1, signal.SIGKILL)
        finally:
            os._exit(0)
    os.waitpid(pid, 0)


@functools.cache
def bwrap_works() -> bool:
    """Whether bubblewrap is installed and can create its namespaces here (a probe run:
    a container may refuse user namespaces)."""
    if shutil.which("bwrap") is None:
        return False
    try:
        result = BwrapSandbox().run_python({"probe.py": "print(6 * 7)"}, "probe.py",
                                           limits=Limits(wall_s=20.0, cpu_s=10))
    except RuntimeError:   # no interpreter the run's user can reach
        return False
    return result.status == "ok" and result.stdout == b"42\n"


@functools.cache
def get_sandbox(backend: Backend = "auto") -> Sandbox:
    """The sandbox of `backend`: "bwrap", "subprocess", or "auto" (bwrap where it works).

    Raises:
      ValueError: an unknown backend, or "bwrap" where it cannot run (the error says why).
    """
    if backend not in ("auto", "bwrap", "subprocess"):
        raise ValueError(
            f"sandbox backend must be 'auto', 'bwrap' or 'subprocess', got {backend!r}")
    if backend == "subprocess" or (backend == "auto" and not bwrap_works()):
        return Sandbox()
    if not bwrap_works():
        raise ValueError("sandbox backend 'bwrap' cannot run here: "
                         + ("bwrap is not installed (apt-get install bubblewrap)"
                            if shutil.which("bwrap") is None else
                            "it cannot create its namespaces (user namespaces refused?); "
                            "use backend='auto' or 'subprocess'"))
    return BwrapSandbox()


def describe(sandbox: Sandbox) -> str:
    """One line: the backend that runs programs and what it does not guard against."""
    user = (f"as a user id of their own (from {_UID_BASE})" if sandbox.as_root
            else "as the trainer's own user")
    if isinstance(sandbox, BwrapSandbox):
        return (f"code sandbox: bwrap (mount, PID, network, IPC and user namespaces, "
                f"read-only /usr and interpreter, private /tmp), programs run {user} "
                f"with {sandbox.interpreter}")
    gaps = ["the program sees the whole filesystem its user may read or write "
            "(it writes only files up to the size limit)"]
    if not sandbox.as_root:
        gaps += ["it can read files, /proc/<pid>/environ and signal the processes of the "
                 "trainer's user", "a child that leaves its session may outlive the run"]
    gaps.append("network is refused only where a network namespace could be made")
    return (f"code sandbox: subprocess fallback (rlimits, empty environment, scratch "
            f"directory), programs run {user} with {sandbox.interpreter}; it does not "
            f"guard against: " + "; ".join(gaps) + " (apt-get install bubblewrap for the "
            "strong backend)")
