"""The suite's schedule (tests/schedule.py) on a hand-made durations table."""

import json
import subprocess
import sys

from tests import schedule

TABLE = {"files": {"training/test_multihost.py": 900.0, "test_aot.py": 70.0,
                   "test_config_lib.py": 4.0},
         "slow_test_s": 30.0, "quick_test_s": 0.5}

# Collection order: (nodeid, marked slow).
TESTS = [
    ("tests/test_config_lib.py::test_a", False),             # 0: recorded 4 s
    ("tests/test_new_quick.py::test_a", False),              # 1: new, 3 quick: 1.5 s
    ("tests/test_new_quick.py::test_b", False),              # 2
    ("tests/test_aot.py::test_a", True),                     # 3: recorded 70 s
    ("tests/test_new_quick.py::test_c", False),              # 4
    ("tests/training/test_new_runs.py::test_a[x]", True),    # 5: new, 3 slow + 1: 90.5 s
    ("tests/training/test_new_runs.py::test_a[y]", True),    # 6
    ("tests/training/test_new_runs.py::test_b", False),      # 7
    ("tests/training/test_new_runs.py::test_c", True),       # 8
    ("tests/training/test_multihost.py::test_a", True),      # 9: recorded 900 s
    ("tests/training/test_multihost.py::test_b", True),      # 10
    ("tests/test_aot.py::test_b", False),                    # 11
]


def test_files_run_longest_first_each_in_its_collection_order():
    assert schedule.order(TESTS, TABLE) == [9, 10, 5, 6, 7, 8, 3, 11, 0, 1, 2, 4]


def test_a_new_file_is_estimated_from_its_tests_marks():
    assert schedule.file_seconds("training/test_new_runs.py", [True, True, False, True],
                                 TABLE) == 90.5
    assert schedule.file_seconds("test_new_quick.py", [False] * 3, TABLE) == 1.5
    # Recorded: the table's number, whatever the marks.
    assert schedule.file_seconds("test_aot.py", [True, False], TABLE) == 70.0


def test_equal_estimates_keep_collection_order():
    tests = [("tests/b.py::t", False), ("tests/a.py::t", False), ("tests/c.py::t", True)]
    table = {"files": {"b.py": 2.0, "a.py": 2.0}, "slow_test_s": 2.0, "quick_test_s": 1.0}
    assert schedule.order(tests, table) == [0, 1, 2]
    assert schedule.order(tests, schedule.load(schedule.DURATIONS.with_name("none.json"))) \
        == [0, 1, 2]   # no table: every estimate 0, collection order


def test_a_recorded_run_replaces_the_files_it_ran_and_keeps_the_others():
    records = {"tests/test_aot.py::test_a": (50.0, True),
               "tests/test_aot.py::test_b": (0.25, False),
               "tests/test_new_quick.py::test_a": (0.75, False),
               "tests/test_new_quick.py::test_b": (0.5, False),
               "tests/test_new_quick.py::test_c": (1.0, False)}
    assert schedule.table_of(records, TABLE) == {
        "files": {"training/test_multihost.py": 900.0, "test_aot.py": 50.2,
                  "test_config_lib.py": 4.0, "test_new_quick.py": 2.2},
        "slow_test_s": 50.0, "quick_test_s": 0.625}   # medians: [50], [0.25, 0.5, 0.75, 1]
    quick_only = {k: v for k, v in records.items() if not v[1]}
    assert schedule.table_of(quick_only, TABLE)["slow_test_s"] == 30.0   # none ran: kept


def test_the_committed_table_is_well_formed_and_names_existing_files():
    table = schedule.load()
    assert table["slow_test_s"] > table["quick_test_s"] > 0
    seconds = list(table["files"].values())
    assert seconds == sorted(seconds, reverse=True) and min(seconds) >= 0
    for file in table["files"]:
        assert (schedule.DURATIONS.parent / file).is_file(), file


def test_record_durations_writes_the_files_of_the_run(tmp_path):
    """A pytest run with --record-durations, on a copy of this table, sums the run's tests."""
    conftest = schedule.DURATIONS.with_name("conftest.py").read_text()
    assert "def pytest_addoption" in conftest   # the option lives in the suite's conftest
    tests = tmp_path / "tests"
    tests.mkdir()
    (tests / "__init__.py").write_text("")
    (tests / "schedule.py").write_text(schedule.DURATIONS.with_name("schedule.py").read_text())
    (tests / "conftest.py").write_text(
        "from tests import schedule\n" + conftest[conftest.index("def pytest_addoption"):])
    (tests / "durations.json").write_text(json.dumps(TABLE))
    (tests / "test_two.py").write_text(
        "import time, pytest\n"
        "@pytest.mark.slow\ndef test_slow():\n    time.sleep(0.3)\n"
        "def test_quick():\n    pass\n")
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "--record-durations", "tests/test_two.py"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    table = json.loads((tests / "durations.json").read_text())
    assert list(table["files"])[:3] == ["training/test_multihost.py", "test_aot.py",
                                        "test_config_lib.py"]
    assert 0.3 <= table["files"]["test_two.py"] < 5 and 0.3 <= table["slow_test_s"] < 5
    assert table["quick_test_s"] < 0.3
