"""The test harness that runs inside the sandbox with a program and its assert-style tests.

Run as `python -I -S harness.py` with a JSON request on stdin: `token` (a per-run random
hex string), `program` (the model's code), `setup` (test code run once after it, e.g.
HumanEval's `check`), `cases` (one statement each, e.g. `assert f(2) == 4` or
`check(f)`), `case_s` (seconds per case) and `plain_returns`. It reports on its original
stdout, one line per case, `<token> <case> pass|fail`, then `<token> done`; the parent
counts only lines with the token, so a program that exits before the tests, or prints
`pass` lines of its own, passes nothing.

What it does so that a program cannot pass without computing the answers:
- the request (the tests, the token) is read and stdin closed before the program runs;
  the program's stdout and stderr go to /dev/null;
- `SystemExit` (and any exception) while the program loads fails every case;
- the tests run with the builtins as they were before the program ran, so patching
  `builtins` (`AssertionError`, `isinstance`, `abs`) changes nothing for them; `assert`
  is a statement the program cannot patch;
- with `plain_returns`, a function the program defined must return plain values (int,
  float, str, lists of them...), so an object whose `__eq__` always says True fails;
- an audit hook (PEP 578) refuses what reads the harness's own memory: frames
  (`sys._getframe`, tracebacks' and generators' frames), `gc`'s object lists, tracing
  and profiling, `ctypes`, signal handlers (they receive frames) and /proc.
The hook is a barrier against the direct routes, not a proof: docs/code.md says what is
left. This file uses the standard library only; it runs under the sandbox's interpreter.
"""

import builtins
import faulthandler
import json
import os
import sys

_PLAIN = (int, float, complex, str, bytes, bool, type(None), list, tuple, dict, set, frozenset)
_MAX_NODES = 1_000_000
_FRAME_ATTRIBUTES = {"tb_frame", "gi_frame", "cr_frame", "ag_frame", "f_back"}
_BLOCKED = {"sys._getframe", "sys._current_frames", "sys._current_exceptions",
            "sys._getframemodulename", "sys.settrace", "sys.setprofile", "gc.get_objects",
            "gc.get_referrers", "gc.get_referents", "sys.monitoring.register_callback"}


def _audit(event, args):
    if event in _BLOCKED or event.startswith("ctypes."):
        raise ValueError(f"{event} is not allowed here")   # namedtuple and enum expect ValueError
    if event == "object.__getattr__" and args[1] in _FRAME_ATTRIBUTES:
        raise RuntimeError(f"{args[1]} is not allowed here")
    if event == "import" and args[0] in ("signal", "_signal", "ctypes", "_ctypes"):
        raise ImportError(f"import of {args[0]} is not allowed here")
    if event == "open" and isinstance(args[0], (str, bytes)):
        path = os.path.realpath(os.fsdecode(args[0]))   # /dev/fd and /proc/self resolve too
        if path == "/proc" or path.startswith("/proc/"):
            raise PermissionError(f"{path} is not allowed here")


def _is_plain(value) -> bool:
    """Whether `value` is built from plain types only (exact types: no subclasses)."""
    stack, nodes = [value], 0
    while stack:
        item = stack.pop()
        nodes += 1
        if type(item) not in _PLAIN or nodes > _MAX_NODES:
            return False
        if type(item) is dict:
            stack.extend(item.keys())
            stack.extend(item.values())
        elif type(item) in (list, tuple, set, frozenset):
            stack.extend(item)
    return True


def _guard(fn):
    """`fn`, failing the case when it returns anything but a plain value."""
    def call(*args, **kwargs):
        value = fn(*args, **kwargs)
        if not _is_plain(value):
            raise TypeError("the function returned a value that is not a plain value")
        return value
    return call


def main():
    request = json.loads(sys.stdin.buffer.read())
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    results = os.dup(1)   # the channel to the parent; the program's stdout goes nowhere
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    write, exit_now, function = os.write, os._exit, type(main)
    prefix = request.pop("token").encode()

    def report(line):
        write(results, prefix + b" " + line + b"\n")

    cases, setup = request["cases"], request["setup"]
    program, case_s = request["program"], request["case_s"]
    plain_returns = request["plain_returns"]
    del request
    clean_builtins = dict(builtins.__dict__)
    for name in ("signal", "_signal"):
        sys.modules.pop(name, None)
    sys.addaudithook(_audit)

    namespace = {"__name__": "solution", "__builtins__": builtins}
    try:
        exec(compile(program, "solution.py", "exec"), namespace)
        loaded = True
    except BaseException:   # SystemExit included: exiting before the tests passes nothing
        loaded = False
    tests = {"__name__": "tests", "__builtins__": clean_builtins}
    for name, value in list(namespace.items()):
        if name != "__builtins__":
            own = type(value) is function and value.__globals__ is namespace
            tests[name] = _guard(value) if own and plain_returns else value
    try:
        if loaded:
            exec(setup, tests)
    except BaseException:
        loaded = False
    for index, case in enumerate(cases):
        passed = False
        if loaded:
            faulthandler.dump_traceback_later(case_s, exit=True, file=devnull)
            try:
                exec(case, tests)
                passed = True
            except BaseException:
                pass
            faulthandler.cancel_dump_traceback_later()
        report(b"%d %s" % (index, b"pass" if passed else b"fail"))
    report(b"done")
    exit_now(0)   # no atexit handler or finaliser of the program runs after the report


if __name__ == "__main__":
    main()
