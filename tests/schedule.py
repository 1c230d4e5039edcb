"""The suite's schedule: test files longest first, from the durations a run recorded.

`tests/durations.json` holds each test file's seconds (setup, call and teardown of all its
tests, summed, as a `--record-durations` run of pytest measured them) and the median
seconds of one test marked `slow` and of one not. `tests/conftest.py` orders the collected
tests by file, the longest file first; a file the table lacks (a new one) is estimated from
its tests' marks with those two medians, so a new file of end-to-end runs starts among the
long ones and a new file of quick checks among the short. A file's tests stay together, in
their own order (module-scoped fixtures are set up once). Standard library only: the core's
CI step runs the objectives' tests without the package's dependencies.
"""

import json
import pathlib
import statistics

DURATIONS = pathlib.Path(__file__).with_name("durations.json")


def file_of(nodeid: str) -> str:
    """The file of a test id, relative to tests/: `training/test_rl.py` for
    `tests/training/test_rl.py::test_x[a]`."""
    return nodeid.split("::")[0].removeprefix("tests/")


def load(path: pathlib.Path = DURATIONS) -> dict:
    """The recorded table (`{"files": {file: seconds}, "slow_test_s": s, "quick_test_s": s}`),
    or an empty one where there is no file."""
    if not path.exists():
        return {"files": {}, "slow_test_s": 0.0, "quick_test_s": 0.0}
    return json.loads(path.read_text())


def file_seconds(file: str, marks: list[bool], table: dict) -> float:
    """The seconds `file` is expected to take: its recorded total, else the sum over its
    tests (`marks`, one bool a test: marked `slow`) of the table's median for their mark."""
    if file in table["files"]:
        return table["files"][file]
    return sum(table["slow_test_s"] if slow else table["quick_test_s"] for slow in marks)


def order(tests: list[tuple[str, bool]], table: dict) -> list[int]:
    """The run order of `tests` (`(nodeid, marked slow)` in collection order) as indices
    into it: grouped by file, the files by `file_seconds` descending (ties keep collection
    order), each file's tests in collection order."""
    groups: dict[str, list[int]] = {}
    for i, (nodeid, _) in enumerate(tests):
        groups.setdefault(file_of(nodeid), []).append(i)
    expected = {file: file_seconds(file, [tests[i][1] for i in members], table)
                for file, members in groups.items()}
    files = sorted(groups, key=lambda file: -expected[file])   # stable
    return [i for file in files for i in groups[file]]


def table_of(records: dict[str, tuple[float, bool]], old: dict) -> dict:
    """The table a run writes: `records` (nodeid -> (seconds of setup, call and teardown,
    marked slow)) summed per file over the run's tests, replacing those files' entries of
    `old` (files the run did not reach keep theirs), with the medians of this run's slow
    and other tests (the old ones where it ran none of a kind)."""
    files = dict(old["files"])
    run: dict[str, float] = {}
    for nodeid, (seconds, _) in records.items():
        run[file_of(nodeid)] = run.get(file_of(nodeid), 0.0) + seconds
    files.update(run)
    slow = [seconds for seconds, marked in records.values() if marked]
    quick = [seconds for seconds, marked in records.values() if not marked]
    return {"files": {f: round(s, 1) for f, s in sorted(files.items(), key=lambda x: -x[1])},
            "slow_test_s": round(statistics.median(slow), 3) if slow else old["slow_test_s"],
            "quick_test_s": round(statistics.median(quick), 3) if quick else old["quick_test_s"]}


def write(table: dict, path: pathlib.Path = DURATIONS) -> None:
    """Writes `table` as `tests/durations.json`, one file a line."""
    path.write_text(json.dumps(table, indent=1) + "\n")
