"""Code rewards: run the model's program against the example's unit tests in the sandbox.

An example carries its tests in "tests", a JSON string in one of two forms (what
HumanEval, MBPP and APPS ship):

- `{"kind": "stdio", "cases": [{"input": "1 2\\n", "output": "3\\n"}, ...]}`: the program
  is run once per case with the input on stdin; the case passes when it exits 0 within
  the limits and its stdout equals the output, line by line, ignoring trailing whitespace
  on each line and trailing empty lines (APPS' comparison before its fallbacks). The
  expected outputs never enter the sandbox.
- `{"kind": "assert", "setup": "<test code>", "cases": ["assert f(2) == 4", ...]}`: the
  program and then the setup run once in `_code_harness`, each case after them; a case
  passes when it raises nothing. HumanEval is `setup` = its `test` (defining `check`) and
  one case `check(<entry_point>)`; MBPP is its `test_list`, one case per assert.

The program is the last fenced python block of the completion (```` ```python ````,
```` ```py ```` or ```` ```python3 ````); a completion without one, an empty or unclosed
block, a program over `MAX_PROGRAM_CHARS` or one that does not compile scores 0 without
running. Tests run under wall-clock limits per case (`case_s`) and per program
(`program_s`): a stdio program stops getting cases once `program_s` is spent.
"""

import functools
import hashlib
import json
import math
import pathlib
import re
import secrets
from typing import Any

from grpo_jax.rewards import _sandbox
from grpo_jax.rewards._registry import register

MAX_PROGRAM_CHARS = 20_000
_FENCE = re.compile(r"```[ \t]*(?:python3?|py)[ \t]*\n(.*?)```", re.IGNORECASE | re.DOTALL)
_HARNESS = "harness.py"
_PROGRAM = "solution.py"


@functools.cache
def _harness_source() -> str:
    return pathlib.Path(__file__).with_name("_code_harness.py").read_text(encoding="utf-8")


def extract_program(completion: str) -> str | None:
    """The last closed fenced python block of `completion`, or None.

    Example:
      >>> extract_program("Try:\\n```python\\nx = 1\\n```\\nthen\\n```py\\nprint(2)\\n```")
      'print(2)\\n'
      >>> extract_program("```python\\nprint(1)") is None
      True
    """
    blocks = _FENCE.findall(completion)
    return blocks[-1] if blocks else None


def program_format_ok(program: str | None) -> bool:
    """The format checks before execution: a non-empty program, at most
    `MAX_PROGRAM_CHARS`, that compiles (syntax only; nothing runs)."""
    if program is None or not program.strip() or len(program) > MAX_PROGRAM_CHARS:
        return False
    try:
        compile(program, _PROGRAM, "exec", dont_inherit=True)
    except (SyntaxError, ValueError, RecursionError, MemoryError, OverflowError):
        return False
    return True


def program_answer(completion: str) -> str | None:
    """What a majority vote over programs compares: a digest of the completion's program
    with trailing spaces and blank lines dropped, or None when it fails the format checks.

    A digest (hex digits) rather than the text, because the vote's key
    (``at_k.vote_key``) normalises answers as math, which would merge programs that
    differ only in ``%``, ``$`` or digit separators.

    Example:
      >>> a = program_answer("```python\\ndef f():  \\n\\n    return 1\\n```")
      >>> a == program_answer("```py\\ndef f():\\n    return 1\\n```"), len(a)
      (True, 64)
      >>> program_answer("no block") is None
      True
    """
    program = extract_program(completion)
    if not program_format_ok(program):
        return None
    lines = [line.rstrip() for line in program.splitlines() if line.strip()]
    return hashlib.sha256("\n".join(lines).encode("utf-8")).hexdigest()


def outputs_match(actual: bytes, expected: str) -> bool:
    """Whether stdout equals the expected output up to trailing whitespace per line and
    trailing empty lines.

    Example:
      >>> outputs_match(b"3 \\n\\n", "3"), outputs_match(b"3\\n4\\n", "3")
      (True, False)
    """
    def lines(text: str) -> list[str]:
        rows = [line.rstrip() for line in text.splitlines()]
        while rows and not rows[-1]:
            rows.pop()
        return rows

    return lines(actual.decode("utf-8", errors="replace")) == lines(expected)


def _run_stdio(sandbox, program: str, cases: list[dict], *, case_s: float,
               program_s: float, memory_mb: int) -> list[bool]:
    limits = _sandbox.Limits(wall_s=case_s, cpu_s=math.ceil(case_s), memory_mb=memory_mb)
    passed, spent = [], 0.0
    for case in cases:
        if spent >= program_s:
            passed.append(False)
            continue
        result = sandbox.run_python({_PROGRAM: program}, _PROGRAM,
                                    stdin=case["input"].encode("utf-8"), limits=limits)
        spent += result.wall_s
        passed.append(result.status == "ok" and outputs_match(result.stdout, case["output"]))
    return passed


def _run_asserts(sandbox, program: str, setup: str, cases: list[str], *, case_s: float,
                 program_s: float, memory_mb: int, plain_returns: bool) -> list[bool]:
    token = secrets.token_hex(16)
    request = {"token": token, "program": program, "setup": setup, "cases": cases,
               "case_s": case_s, "plain_returns": plain_returns}
    limits = _sandbox.Limits(wall_s=program_s, cpu_s=math.ceil(program_s),
                             memory_mb=memory_mb)
    result = sandbox.run_python({_HARNESS: _harness_source()}, _HARNESS,
                                stdin=json.dumps(request).encode("utf-8"), limits=limits)
    return harness_verdicts(result.stdout, token, len(cases))


def harness_verdicts(stdout: bytes, token: str, num_cases: int) -> list[bool]:
    """Per case, whether the harness reported it passed: only lines `<token> <i> pass`
    count, each case once.

    Example:
      >>> harness_verdicts(b"t 0 pass\\nt 1 fail\\nx 1 pass\\nt done\\n", "t", 2)
      [True, False]
    """
    passed = [False] * num_cases
    for line in stdout.decode("utf-8", errors="replace").splitlines():
        parts = line.split(" ")
        if len(parts) == 3 and parts[0] == token and parts[2] == "pass" and parts[1].isdigit():
            if int(parts[1]) < num_cases:
                passed[int(parts[1])] = True
    return passed


def run_tests(program: str, tests: dict[str, Any], *, backend: _sandbox.Backend = "auto",
              case_s: float = 2.0, program_s: float = 8.0, memory_mb: int = 512,
              plain_returns: bool = True) -> list[bool]:
    """Runs `program` against `tests` (module docstring) in the sandbox; per case, passed.

    Args:
      program: Python source (already through `program_format_ok`).
      tests: the parsed "tests" of an example.
      backend: the sandbox backend ("auto": bwrap where it works).
      case_s: wall-clock seconds per case (also its CPU seconds, rounded up).
      program_s: wall-clock seconds for the whole program.
      memory_mb: address space per process.
      plain_returns: assert tests only: the program's functions must return plain values.

    Raises:
      ValueError: `tests` is not one of the two forms.
    """
    sandbox = _sandbox.get_sandbox(backend)
    kind, cases = tests.get("kind"), tests.get("cases")
    if not isinstance(cases, list) or not cases:
        raise ValueError(f"tests must have a non-empty list of cases, got {cases!r}")
    if kind == "stdio":
        return _run_stdio(sandbox, program, cases, case_s=case_s, program_s=program_s,
                          memory_mb=memory_mb)
    if kind == "assert":
        return _run_asserts(sandbox, program, tests.get("setup", ""), cases, case_s=case_s,
                            program_s=program_s, memory_mb=memory_mb,
                            plain_returns=plain_returns)
    raise ValueError(f"tests kind must be 'stdio' or 'assert', got {kind!r}")


def sandbox_lines(specs) -> list[str]:
    """What a run says at start about its code rewards: per `code_tests` spec, the one line
    of `_sandbox.describe` (which backend runs programs, what the fallback misses)."""
    return [_sandbox.describe(_sandbox.get_sandbox(spec.options.get("backend", "auto")))
            for spec in specs if spec.name == "code_tests"]


@register("code_tests", where="pool")
def code_tests_reward(prompt: str, completion: str, example: dict, *,
                      all_or_nothing: bool = True, backend: _sandbox.Backend = "auto",
                      case_s: float = 2.0, program_s: float = 8.0, memory_mb: int = 512,
                      plain_returns: bool = True) -> float:
    """The share of the example's unit tests that the completion's program passes.

    With `all_or_nothing` (DeepCoder's and verl's choice; Luo et al. 2025, "DeepCoder: A
    Fully Open-Source 14B Coder at O3-mini Level"), 1.0 only when every case passes. A
    completion that fails the format checks scores 0 without running. The other options
    are `run_tests`'; `program_s` must stay under the pool's `reward.timeout_s`.
    """
    del prompt
    program = extract_program(completion)
    if not program_format_ok(program):
        return 0.0
    passed = run_tests(program, json.loads(example["tests"]), backend=backend, case_s=case_s,
                       program_s=program_s, memory_mb=memory_mb, plain_returns=plain_returns)
    if all_or_nothing:
        return float(all(passed))
    return sum(passed) / len(passed)
