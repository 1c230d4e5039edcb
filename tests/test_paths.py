"""grpo_jax.paths: where relative, `~` and remote paths end up."""

import os
import threading
import time

import ml_collections
import pytest

from grpo_jax import paths


@pytest.mark.parametrize("given, expected", [
    ("runs/x", "{cwd}/runs/x"),
    ("./runs/../runs/x/", "{cwd}/runs/x"),
    ("~/runs/x", "{home}/runs/x"),
    ("~", "{home}"),
    ("/abs/runs/x", "/abs/runs/x"),
    ("gs://bucket/runs/x", "gs://bucket/runs/x"),
    ("s3://bucket/x", "s3://bucket/x"),
    ("", ""),
])
def test_resolve(given, expected, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", "/home/someone")
    assert paths.resolve(given) == expected.format(cwd=tmp_path, home="/home/someone")


def test_resolve_run_paths_returns_a_new_read_only_config_and_is_idempotent(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", "/home/someone")
    given = ml_collections.ConfigDict({
        "model": {"path": "ckpt/policy", "name": ""},
        "critic": {"path": "~/critic"},
        "task": {"data_dir": "~/tfds", "manual_dir": "", "name": "gsm8k"}})
    before = given.to_dict()
    config, workdir = paths.resolve_run_paths(given, "runs/a")
    assert given.to_dict() == before   # the caller's config is left as it was
    assert workdir == f"{tmp_path}/runs/a"
    assert config.model.path == f"{tmp_path}/ckpt/policy"
    assert config.critic.path == "/home/someone/critic"
    assert config.task.data_dir == "/home/someone/tfds"
    assert config.task.manual_dir == ""
    with pytest.raises(AttributeError, match="immutable"):
        config.model.path = "elsewhere"
    monkeypatch.chdir("/")
    again, same_workdir = paths.resolve_run_paths(config, workdir)
    assert same_workdir == workdir and again.to_dict() == config.to_dict()


def test_every_path_field_exists_in_the_base_config():
    from grpo_jax import config_lib
    config = config_lib.load_config(os.path.join(os.path.dirname(__file__), "..", "configs", "base.py"))
    for dotted in paths.CONFIG_PATH_FIELDS:
        section, field = dotted.split(".")
        assert isinstance(config[section][field], str), dotted


def test_exclusive_makes_a_second_holder_wait_for_the_first(tmp_path):
    """Two holders of one lock file (separate opens, as two processes would): the second
    enters only after the first has left; a URL takes no lock and enters at once."""
    lock = str(tmp_path / "sub" / "build.lock")   # its directory is created
    events, first_inside = [], threading.Event()

    def hold(name, seconds):
        with paths.exclusive(lock):
            events.append(f"{name} in")
            first_inside.set()
            time.sleep(seconds)
            events.append(f"{name} out")

    first = threading.Thread(target=hold, args=("first", 0.3))
    first.start()
    first_inside.wait(5)
    second = threading.Thread(target=hold, args=("second", 0.0))
    second.start()
    first.join(5)
    second.join(5)
    assert events == ["first in", "first out", "second in", "second out"]
    with paths.exclusive("gs://bucket/data/build.lock"):
        events.append("url in")
    assert events[-1] == "url in" and not os.path.exists("gs:")
