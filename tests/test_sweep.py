"""grpo_jax.sweep: the runs a sweep expands to, their commands, the cores they get, the
order they start in, and what a signal to the sweep does. (The launcher running real
trainers, killed and resumed: tests/training/test_sweep_launcher.py.)"""

import io
import os
import pathlib
import shlex
import signal
import sys
import threading

import ml_collections
import pytest
from absl import flags
from ml_collections import config_flags

from grpo_jax import config_lib, objectives, rewards, run_files, sweep

REPO = pathlib.Path(__file__).resolve().parents[1]


def _has_sweep(path):
    return hasattr(config_lib.load_module(path), "get_sweep")


# Every config with a sweep: the recipes (at their runlocal scale) and the ablations.
SWEPT = [
    f"configs/{p.name}:runlocal=True"
    for p in sorted((REPO / "configs").glob("*.py"))
    if _has_sweep(p)
] + [
    f"configs/ablations/{p.name}"
    for p in sorted((REPO / "configs" / "ablations").glob("*.py"))
    if _has_sweep(p)
] + [
    f"configs/paper/{p.name}:runlocal=True"
    for p in sorted((REPO / "configs" / "paper").glob("[!_]*.py"))
    if _has_sweep(p)
]


def _parse_like_the_trainer(argv):
    """The config that `python -m grpo_jax.main ARGV` builds (its --config flags)."""
    argv = ["main"] + [a for a in argv if a.startswith("--config")]
    flag_values = flags.FlagValues()
    config_flags.DEFINE_config_file("config", None, "", flag_values=flag_values, sys_argv=argv)
    flag_values(argv)
    return flag_values.config


def test_each_ablation_has_a_config_with_a_sweep():
    assert {s.split("/")[-1][:-3] for s in SWEPT if "ablations" in s} == {
        "loss_aggregation", "advantage_scale", "clip_higher", "dynamic_sampling", "overlong",
        "ratio_level", "baselines", "stability_frontier", "long_loss_aggregation",
        "long_clip_higher", "long_overlong", "long_advantage_scale", "long_vapo_vs_dapo",
        "low_precision", "moe_ratio", "frontier_edge", "hard_testbed_calibration",
        "hard_testbed_calibration_2", "hard_loss_aggregation", "hard_overlong"}


def test_the_paper_configs_with_a_sweep_are_listed():
    assert {s.split(":")[0] for s in SWEPT if "/paper/" in s} == {
        "configs/paper/dapo_qwen25_32b.py", "configs/paper/gspo_qwen3_30b_a3b.py"}


@pytest.mark.parametrize("spec", SWEPT)
def test_dry_run_prints_every_entry_and_seed_with_the_command_that_builds_its_config(
        spec, tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)
    root = tmp_path / "runs"
    out = io.StringIO()
    assert sweep.main(["--config", spec, "--workdir_root", str(root), "--seeds", "0,2",
                       "--dry_run"], stream=out) == 0
    assert not root.exists()   # a dry run writes nothing
    lines = out.getvalue().splitlines()
    entries = config_lib.load_module(spec.partition(":")[0]).get_sweep()
    assert lines[0].startswith(f"[sweep] {spec}: {len(entries)} entries x 2 seed(s) = "
                               f"{2 * len(entries)} runs, 0 finished, {2 * len(entries)} to run, "
                               "1 at a time")
    runs = list(zip(lines[1::2], lines[2::2]))
    assert len(runs) == 2 * len(entries) and len(lines) == 1 + 2 * len(runs)
    names = set()
    for index, overrides in enumerate(entries):
        for seed_position, seed in enumerate((0, 2)):
            status, command = runs[2 * index + seed_position]
            name, state = status.strip().rsplit(": ", 1)
            assert (
                state == "new"
                and name.startswith(f"{index:02d}_")
                and name.endswith(f"/seed-{seed}")
            )
            names.add(name.split("/")[0])
            argv = shlex.split(command)
            assert argv[:4] == [sys.executable, "-m", "grpo_jax.main", f"--config={spec}"]
            assert argv[4] == f"--workdir={root / name}"
            assert argv[-1] == f"--config.seed={seed}"
            want = config_lib.apply_overrides(
                config_lib.load_config(spec), {**overrides, "seed": seed}
            )
            assert _parse_like_the_trainer(argv).to_dict() == want.to_dict(), name
            objectives.policy_objective(want.objective, reward_weights=rewards.spec_weights(
                rewards.as_specs(want.reward.specs)))   # the entry's objective builds
    assert len(names) == len(entries)   # one workdir per entry


def test_names_and_flags():
    overrides = {"objective.loss.eps_high": 0.2, "objective.aggregation.mode": "token-mean"}
    assert sweep.entry_name(0, overrides) == "00_eps_high-0.2_mode-token-mean"
    assert sweep.entry_name(12, {"a.path": "gs://b/x y"}) == "12_path-gs-b-x-y"
    assert sweep.override_args({"a.b": "x y", "c": True, "d": (1, "z")}) == [
        "--config.a.b=x y", "--config.c=True", "--config.d=(1, 'z')"]


def test_a_run_ends_after_the_critics_pretraining_and_the_rl_steps():
    """VAPO's value pre-training steps come before train.steps in the step count, so its
    run's last checkpoint is step pretrain_steps + train.steps (5 + 100 here)."""
    vapo = config_lib.load_config(str(REPO / "configs" / "vapo.py") + ":runlocal=True")
    vapo.train.steps = 100
    assert vapo.critic.pretrain_steps == 5 and sweep.final_step(vapo) == 105
    grpo = config_lib.load_config(str(REPO / "configs" / "grpo.py") + ":runlocal=True")
    assert sweep.final_step(grpo) == grpo.train.steps
    grpo.mode = "sft"
    assert sweep.final_step(grpo) == grpo.sft.steps


def _recipe(tmp_path, body):
    path = tmp_path / "recipe.py"
    path.write_text("from ml_collections import config_dict\n"
                    "def get_config(arg=None):\n"
                    "    return config_dict.ConfigDict({'seed': 0, 'mode': 'rl', "
                    "'train': {'steps': 3, 'lr': 1.0}, 'sft': {'steps': 5}, "
                    "'critic': {'pretrain_steps': 0}})\n" + body)
    return str(path)


class TestExpand:

    def test_entries_times_seeds_in_order(self, tmp_path):
        spec = _recipe(
            tmp_path, "def get_sweep():\n    return [{'train.lr': 0.1}, {'train.lr': 0.2}]\n"
        )
        runs = sweep.expand(spec, tmp_path / "r", seeds=[3, 1])
        assert [r.name for r in runs] == ["00_lr-0.1/seed-3", "00_lr-0.1/seed-1",
                                          "01_lr-0.2/seed-3", "01_lr-0.2/seed-1"]
        assert [(r.config.train.lr, r.config.seed) for r in runs] == [
            (0.1, 3), (0.1, 1), (0.2, 3), (0.2, 1),
        ]
        assert sweep.expand(spec, tmp_path / "r")[0].seed == 0   # default: the config's seed

    @pytest.mark.parametrize("body, seeds, message", [
        ("def get_sweep():\n    return [{'seed': 1}]\n", None,
         "sets 'seed'; give seeds with --seeds"),
        ("def get_sweep():\n    return [{'train.lr': 1}]\n", [1, 1], "--seeds repeats a seed"),
        ("def get_sweep():\n    return [{'train.lrr': 1}]\n", None,
         "'train.lrr' names no config field"),
        ("def get_sweep():\n    return [{'mode': 'demo'}]\n", None, "mode 'rl' or 'sft'"),
        ("", None, "defines no get_sweep()"),
    ])
    def test_bad_sweeps_fail_before_any_run(self, tmp_path, body, seeds, message):
        with pytest.raises((KeyError, ValueError), match=message):
            sweep.expand(_recipe(tmp_path, body), tmp_path / "r", seeds=seeds)

    def test_a_root_holding_another_sweep_is_refused(self, tmp_path, capsys):
        spec = _recipe(tmp_path, "def get_sweep():\n    return [{'train.lr': 0.1}]\n")
        [run] = sweep.expand(spec, tmp_path / "r")
        other = sweep.Run(
            "other.py",
            *[
                getattr(run, f)
                for f in (
                    "entry", "entry_name", "overrides", "seed", "workdir", "command", "config",
                )
            ],
        )
        sweep.write_record(other, commit="c", machine="m")
        assert (
            sweep.main(["--config", spec, "--workdir_root", str(tmp_path / "r"), "--dry_run"]) == 2
        )
        assert "holds a run of the sweep of 'other.py'" in capsys.readouterr().err


class TestWhereARunStands:

    def _run(self, tmp_path, steps=3):
        spec = _recipe(tmp_path, "def get_sweep():\n    return [{'train.steps': %d}]\n" % steps)
        return sweep.expand(spec, tmp_path / "r")[0]

    def _checkpoint(self, run, step, complete=True):
        path = pathlib.Path(run.workdir) / "checkpoints" / (str(step) if complete else
                                                            f"{step}.orbax-checkpoint-tmp-1")
        path.mkdir(parents=True)
        (path / "commit_success.txt").write_text("")

    def _log(self, run, *steps):
        with open(pathlib.Path(run.workdir) / run_files.METRICS, "a") as f:
            f.writelines(f'{{"step": {s}, "loss": 0.5}}\n' for s in steps)

    def test_new_resumable_and_finished(self, tmp_path):
        run = self._run(tmp_path)
        assert sweep.describe_state(run) == "new"
        self._checkpoint(run, 2)
        self._log(run, 1, 2)
        assert sweep.describe_state(run) == "resumes from step 2"
        self._log(run, 3)   # the last row is logged before its checkpoint is written
        assert not sweep.is_finished(run)
        self._checkpoint(run, 3, complete=False)   # an interrupted save
        assert sweep.describe_state(run) == "resumes from step 2"
        self._checkpoint(run, 3)
        assert sweep.is_finished(run) and sweep.describe_state(run) == "finished"

    def test_a_checkpoint_without_its_metric_row_is_not_finished(self, tmp_path):
        run = self._run(tmp_path)
        self._checkpoint(run, 3)
        self._log(run, 1, 2)
        assert not sweep.is_finished(run)


def test_missing_inputs_are_the_dataset_and_the_warm_start_the_trainer_would_build(
        tmp_path, monkeypatch):
    from grpo_jax.training import task, warm_start
    from tests.training.training_setups import tiny_config
    monkeypatch.setenv("HOME", str(tmp_path))
    config = tiny_config("dapo", "~/tfds")   # a path the trainer makes absolute first
    trainer_sees, _ = config_lib.resolve_run_paths(config, ".")
    where = warm_start.warm_start_dir(trainer_sees)
    assert where.startswith(str(tmp_path / "tfds" / "warm_starts"))
    assert sweep.missing_inputs(config) == [f"the arithmetic dataset in {tmp_path / 'tfds'}",
                                            f"the warm start {where}"]
    task.data_source(trainer_sees.task, "train")
    assert sweep.missing_inputs(config) == [f"the warm start {where}"]
    (pathlib.Path(where) / "export").mkdir(parents=True)
    (pathlib.Path(where) / "export" / "config.json").write_text("{}")
    assert sweep.missing_inputs(config) == []


class TestCores:

    def test_equal_disjoint_shares(self):
        assert sweep.core_shares(2, cores=[3, 0, 1, 2]) == [[0, 1], [2, 3]]
        assert sweep.core_shares(3, cores=[0, 1, 2, 3]) == [[0], [1], [2]]
        assert sweep.core_shares(1, cores=[5, 4]) == [[4, 5]]
        with pytest.raises(ValueError, match="--parallel must be between 1 and the 2 cores"):
            sweep.core_shares(3, cores=[0, 1])

    def test_thread_pools_follow_the_share(self):
        env = sweep.run_environment([2, 3], base={"PATH": "/bin", "OMP_NUM_THREADS": "16"})
        assert env == {"PATH": "/bin", "OMP_NUM_THREADS": "2", "OPENBLAS_NUM_THREADS": "2",
                       "MKL_NUM_THREADS": "2", "PYTHONUNBUFFERED": "1"}


class _Running:
    """A stand-in for a started run (`sweep._Started`)."""

    def __init__(self, run, building):
        self.run, self._building = run, building

    def still_building(self):
        return self._building


class TestStartOrder:
    """A run whose dataset or warm start is missing starts only while no other run is
    building; runs whose inputs exist start in any free share."""

    def _runs(self, tmp_path):
        spec = _recipe(
            tmp_path, "def get_sweep():\n    return [{'train.lr': 0.1}, {'train.lr': 0.2}]\n"
        )
        return sweep.expand(spec, tmp_path / "r", seeds=[0, 1])   # a0 a1 b0 b1

    def test_order(self, tmp_path, monkeypatch):
        a0, a1, b0, b1 = self._runs(tmp_path)
        built = set()   # the seeds whose warm start exists
        monkeypatch.setattr(
            sweep, "missing_inputs",
            lambda config: [] if config.seed in built else [f"warm start {config.seed}"],
        )
        launcher = sweep.Launcher([[0], [1]], stream=io.StringIO())
        # Nothing is built: the first run builds, alone.
        assert launcher._next_startable([a0, a1, b0, b1]) is a0
        launcher._running = [_Running(a0, building=True)]
        assert launcher._next_startable([a1, b0, b1]) is None
        # Seed 0's warm start is written but a0 has not logged a step: still nothing.
        built.add(0)
        assert launcher._next_startable([a1, b0, b1]) is None
        # a0 trains: b0 (seed 0, ready) goes before a1 (seed 1, to build).
        launcher._running = [_Running(a0, building=False)]
        assert launcher._next_startable([a1, b0, b1]) is b0
        # With b0 running on ready inputs, a1 may build seed 1's warm start beside it.
        launcher._running = [_Running(b0, building=False)]
        assert launcher._next_startable([a1, b1]) is a1


def _sleeper(tmp_path, index):
    """A run whose command waits for SIGTERM and exits 75, as the trainer does."""
    code = ("import signal, sys, time\n"
            "signal.signal(signal.SIGTERM, lambda *a: sys.exit(75))\n"
            "print('waiting', flush=True)\n"
            "time.sleep(120)\n")
    config = ml_collections.ConfigDict({"mode": "rl", "train": {"steps": 1}, "seed": 0,
                                        "critic": {"pretrain_steps": 0}})
    workdir = str(tmp_path / f"run{index}")
    return sweep.Run("sleeper.py", index, f"{index:02d}", {}, 0, workdir,
                     (sys.executable, "-c", code), config)


def test_a_signal_to_the_sweep_stops_every_run_with_sigterm(tmp_path, monkeypatch):
    monkeypatch.setattr(sweep, "missing_inputs", lambda config: [])
    runs = [_sleeper(tmp_path, i) for i in range(3)]
    out = io.StringIO()
    launcher = sweep.Launcher([[0], [1]], stream=out, poll_seconds=0.1)

    def interrupt_once_both_wait():
        for run in runs[:2]:
            log = pathlib.Path(run.workdir) / sweep.LOG
            while not (log.exists() and "waiting" in log.read_text()):
                threading.Event().wait(0.05)
        os.kill(os.getpid(), signal.SIGINT)

    before = signal.getsignal(signal.SIGINT)
    threading.Thread(target=interrupt_once_both_wait, daemon=True).start()
    failed, stopped = launcher.run(runs)
    assert failed == [] and sorted(stopped) == ["00/seed-0", "01/seed-0", "02/seed-0"], (
        out.getvalue()
    )
    assert signal.getsignal(signal.SIGINT) is before   # the sweep's handler is gone
    text = out.getvalue()
    assert "SIGINT: stopping; SIGTERM to 2 run(s)" in text
    assert text.count("(resumable)") == 2 and "start 02" not in text
