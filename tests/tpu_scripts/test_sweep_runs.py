"""tpu_scripts/sweep_runs.py: the flags it prints set what the sweep entry sets."""

import pathlib
import shlex

import pytest
from absl import flags
from ml_collections import config_flags

from grpo_jax import config_lib

REPO = pathlib.Path(__file__).resolve().parents[2]
sweep_runs = config_lib.load_module(REPO / "tpu_scripts" / "sweep_runs.py")
SWEPT = sorted(p.name for p in (REPO / "configs").glob("*.py")
               if hasattr(config_lib.load_module(p), "get_sweep"))


def _parse_like_the_trainer(spec, flag_line):
    """The config that `python -m grpo_jax.main --config=SPEC FLAGS` builds."""
    argv = ["main", f"--config={spec}", *shlex.split(flag_line)]
    flag_values = flags.FlagValues()
    config_flags.DEFINE_config_file("config", None, "", flag_values=flag_values, sys_argv=argv)
    flag_values(argv)
    return flag_values.config


@pytest.mark.parametrize("name", SWEPT)
def test_printed_flags_build_the_entrys_config(name, monkeypatch):
    monkeypatch.chdir(REPO)
    spec = f"configs/{name}:runlocal=True"
    entries = config_lib.load_module(REPO / "configs" / name).get_sweep()
    runs = sweep_runs.sweep_runs(spec)
    assert len(runs) == len(entries) >= 2
    assert len({run_name for run_name, _ in runs}) == len(runs)   # one workdir each
    for (run_name, flag_line), overrides in zip(runs, entries):
        expected = config_lib.apply_overrides(config_lib.load_config(spec), overrides)
        assert _parse_like_the_trainer(spec, flag_line).to_dict() == expected.to_dict(), run_name


def test_flags_are_quoted_for_a_shell(tmp_path):
    recipe = tmp_path / "recipe.py"
    recipe.write_text(
        "from ml_collections import config_dict\n"
        "def get_config(arg=None):\n"
        "    return config_dict.ConfigDict({'a': {'b': 'x', 'path': ''}, 'c': False})\n"
        "def get_sweep():\n"
        "    return [{'a.b': 'x y', 'c': True}, {'a.path': 'gs://b/x y'}]\n")
    assert sweep_runs.sweep_runs(str(recipe)) == [
        ("00_b-x-y_c-True", "'--config.a.b=x y' --config.c=True"),
        ("01_path-gs-b-x-y", "'--config.a.path=gs://b/x y'")]


def test_unknown_field_fails_before_any_run(tmp_path):
    recipe = tmp_path / "recipe.py"
    recipe.write_text(
        "from ml_collections import config_dict\n"
        "def get_config(arg=None):\n"
        "    return config_dict.ConfigDict({'train': {'steps': 1}})\n"
        "def get_sweep():\n"
        "    return [{'train.steps': 2}, {'train.step': 3}]\n")
    with pytest.raises(KeyError, match="'train.step' names no config field"):
        sweep_runs.sweep_runs(str(recipe))


def test_recorded_entries_are_a_sweep_that_the_report_reads_in_the_bucket(
    gcs_emulator, monkeypatch
):
    """`--record_into gs://...` (what sweep.sh runs before the pods start) leaves each
    selected entry's sweep_run.json in the workdir sweep.sh gives it: the report finds
    those runs there and lists them as not finished yet."""
    from grpo_jax import paths, report, sweep
    monkeypatch.chdir(REPO)
    spec, root = "configs/dapo.py:runlocal=True", "gs://test-bucket/dapo_sweep"
    names = [name for name, _ in sweep_runs.sweep_runs(spec)]
    written = sweep_runs.record_runs(spec, root, entries={0, 2}, machine="Cloud TPU v5p-16: pod-a")
    assert written == [f"{root}/{names[0]}", f"{root}/{names[2]}"]
    runs = report.load_runs(root)
    assert [run.path for run in runs] == [names[0], names[2]]
    assert [run.record["entry"] for run in runs] == [0, 2]
    assert runs[0].record["starts"][0]["machine"] == "Cloud TPU v5p-16: pod-a"
    assert runs[0].record["command"][-2:] == sweep.override_args(sweep.sweep_entries(spec)[0][1])
    assert not any(run.finished for run in runs)
    assert report.main([root]) == 0
    text = (paths.path(root) / "report.md").read_text()
    assert f"Not finished, left out: {names[0]} (at step 0 of" in text
