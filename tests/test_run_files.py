"""grpo_jax.run_files: a run's metrics read from hand-written files (plain, gzipped, a
killed run's torn last line, empty), the same rows whichever way the file is named."""

import gzip
import pathlib
import re
import subprocess
import sys

import pytest

from grpo_jax import run_files

REPO = pathlib.Path(__file__).resolve().parents[1]

ROWS = '{"step": 2, "loss": 0.25}\n\n{"step": 1, "loss": 0.5, "eval_accuracy": 0.1}\n'
# Blank lines skipped, step order whatever the file's order.
EXPECTED = ({"step": 1, "loss": 0.5, "eval_accuracy": 0.1}, {"step": 2, "loss": 0.25})


def test_a_plain_file_by_workdir_or_by_name(tmp_path):
    (tmp_path / "metrics.jsonl").write_text(ROWS)
    assert run_files.read_metrics(tmp_path) == EXPECTED
    assert run_files.read_metrics(str(tmp_path / "metrics.jsonl")) == EXPECTED
    assert run_files.last_logged_step(tmp_path) == 2


def test_a_gzipped_copy_by_workdir_or_by_name(tmp_path):
    with gzip.open(tmp_path / "metrics.jsonl.gz", "wt") as f:
        f.write(ROWS)
    assert run_files.read_metrics(tmp_path) == EXPECTED
    named = tmp_path / "seed-0_rl_metrics.jsonl.gz"   # a copy kept under another name
    named.write_bytes((tmp_path / "metrics.jsonl.gz").read_bytes())
    assert run_files.read_metrics(named) == EXPECTED
    (tmp_path / "metrics.jsonl").write_text('{"step": 7}\n')   # the live file comes first
    assert run_files.read_metrics(tmp_path) == ({"step": 7},)


@pytest.mark.parametrize("torn", ['{"step": 3, "time": 17', '{"st\n', '{"time": 17}'],
                         ids=["cut-mid-row", "cut-then-newline", "no-step"])
def test_a_killed_runs_torn_last_line_is_left_out(torn, tmp_path):
    """A run killed mid-append leaves part of a row last: the reader drops it, as the
    trainer's resume does (and then redoes that step)."""
    (tmp_path / "metrics.jsonl").write_text(ROWS + torn)
    assert run_files.read_metrics(tmp_path) == EXPECTED
    assert run_files.last_logged_step(tmp_path) == 2
    rows, dropped = run_files.parse_rows(ROWS + torn)
    assert [row for _, row in rows] == [EXPECTED[1], EXPECTED[0]]   # file order
    error = "KeyError" if torn == '{"time": 17}' else "JSONDecodeError"
    assert dropped == run_files.TornLine(4, torn.rstrip("\n"), error)


def test_a_bad_line_before_the_last_names_the_file_and_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1}\n{"step": 2\n{"step": 3}\n')
    with pytest.raises(ValueError, match=re.escape(f"{path}:2 is not a metrics row "
                                                   "(JSONDecodeError")):
        run_files.read_metrics(tmp_path)


def test_empty_missing_and_whole_files(tmp_path):
    assert run_files.read_metrics(tmp_path) == ()   # a workdir with no metrics yet
    assert run_files.last_logged_step(tmp_path) is None
    with pytest.raises(FileNotFoundError):   # a file named but not there
        run_files.read_metrics(tmp_path / "metrics.jsonl")
    (tmp_path / "metrics.jsonl").write_text("")
    assert run_files.read_metrics(tmp_path) == ()
    assert run_files.last_logged_step(tmp_path) is None
    assert run_files.parse_rows("", "x") == ([], None)
    (tmp_path / "metrics.jsonl").write_text('{"step": 0, "eval_accuracy": 0.5}')   # no newline
    assert run_files.read_metrics(tmp_path) == ({"step": 0, "eval_accuracy": 0.5},)
    assert run_files.last_logged_step(tmp_path) == 0


def test_the_run_files_the_report_and_the_sweep_import_no_jax():
    """They read runs on any machine, fast: importing them must not pull in jax."""
    code = ("import sys; import grpo_jax.run_files, grpo_jax.report, grpo_jax.sweep; "
            "print(sorted(m for m in sys.modules if m == 'jax' or m.startswith('jax.')))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=REPO, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "[]"
