"""End-to-end settings for the trainer tests: each recipe's runlocal regime on a smaller task.

Every RL test starts from a supervised warm start (200 steps on 2-digit addition with a
scratchpad, built once per data_dir and cached) that answers right some of the time: its
groups have signal, so the losses, gradients and clip activity are real.

Also the helpers the trainer tests share to run `python -m grpo_jax.main` in subprocesses
and read what a run left in its workdir.
"""

import os
import pathlib
import re
import socket
import subprocess
import sys
import time

import numpy as np
import safetensors.numpy

from grpo_jax import config_lib, paths
from grpo_jax.run_files import read_metrics   # the tests' reader of a run's metrics
from grpo_jax.training import checkpoint

REPO = pathlib.Path(__file__).resolve().parents[2]

# Metrics whose name holds one of these vary from run to run (wall-clock time).
TIMING = ("time", "tokens_per_s", "s/step")


def runlocal_config(recipe, data_dir, **overrides):
    """`configs/<recipe>.py:runlocal=True` as it is (prompts, G, updates per rollout batch,
    learning rate), on 2-digit addition with a 34-token budget and a shorter warm start
    (rpt: on the builtin corpus, every 31st position; countdown: fewer problems, the
    recipe's budget)."""
    config = config_lib.load_config(f"{REPO / 'configs' / recipe}.py:runlocal=True")
    config.task.data_dir = data_dir
    if config.task.name == "arithmetic":
        config.task.knobs.digits = 2
        config.task.knobs.num_train = 512
        config.task.knobs.num_test = 16
        # A 2-digit scratchpad is at most 27 tokens with its stop token (DAPO's soft
        # overlong zone, the last fifth, starts at 27.2); a self-verification verdict adds ~25;
        # a calculator call, its reply and the answer are at most 62 with the stop token.
        config.rollout.max_new_tokens = (56 if config.task.knobs.get("verdicts") else
                                         64 if config.task.knobs.get("calculator_fraction") else 34)
    elif config.task.name in ("countdown", "code_tasks"):   # the recipe's budget
        config.task.knobs.num_train = 512
        config.task.knobs.num_test = 16
    else:   # rpt on the builtin corpus: fewer positions per document
        config.task.knobs.stride = 31
    config.train.steps = 2
    config.train.eval_every = 2
    config.train.checkpoint_every = 1
    config.train.export = False
    config.eval.num_prompts = 4
    config.eval.samples = 2
    # A shorter warm start, still with answers right and wrong, where a step costs more:
    # rpt's rows are 8x wider (its instruction takes a 256-token prompt bucket; half the
    # rows too) and its answers a token or two (its SFT loss is flat after ~40 steps); the
    # MoE model runs 8 experts per layer; the calculator's and the verdicts' rows are twice
    # as long (64 and 56 tokens), countdown's check traces 5x, and 100 steps already call the
    # tool or write a verdict; code_tasks' programs are up to 117 tokens.
    longer = any(config.task.knobs.get(k) for k in ("calculator_fraction", "verdicts",
                                                     "check_fraction"))
    longer = longer or config.task.name == "code_tasks"
    # The model an override names counts (a tiny_moe run of a dense recipe then shares the
    # MoE recipes' warm start instead of training its own).
    model = overrides.get("model.name", config.model.name)
    config.sft.steps = ({"rpt": 40}.get(config.task.name) or
                        (100 if model == "tiny_moe" or longer else 200))
    config.sft.batch_size = 16 if config.task.name == "rpt" else 32
    config.sft.optimizer.learning_rate = 2e-3
    config.sft.eval_every = 10**6   # never: no test reads the warm start's own evaluation
    config.sft.log_every = 50
    return config_lib.apply_overrides(config, overrides)


def tiny_config(recipe, data_dir, **overrides):
    """`runlocal_config` with 4 prompts x 4 answers and 2 updates per batch: a step in seconds."""
    small = {"rollout.prompts_per_batch": 4, "objective.group_size": 4, "train.minibatches": 2,
             "train.epochs": 1}
    return runlocal_config(recipe, data_dir, **{**small, **overrides})


# The plain tiny DAPO run (`tiny_config("dapo")`: 2 steps, evaluated at the second, a
# checkpoint each step) with every step's rollouts logged and the result exported (neither
# changes the numbers): the `dapo_run` fixture of conftest.py runs it once per session.
DAPO_RUN = {"train.log_rollouts_every": 1, "train.export": True}

# The runs the fault tests interrupt: 8 prompts, so the rows also split over two
# processes' 8-way mesh; 12 steps. Every interrupted run uses these settings (the
# learning-rate schedule depends on train.steps), varying only what does not change the
# numbers: checkpoints, export and the rollouts logged.
# The runs the synchronous and asynchronous loops are compared in (`lag_run` of conftest.py):
# 5 steps, evaluated at the last, exported, every step's rollouts logged.
LAG_RUN = {"train.steps": 5, "train.eval_every": 5, "train.export": True,
           "train.log_rollouts_every": 1}
LAG_STEPS = range(1, 6)

FAULTS = {"rollout.prompts_per_batch": 8, "train.steps": 12, "train.eval_every": 100}


def faults_config(data_dir, **overrides):
    """`tiny_config("dapo")` with the `FAULTS` settings and `overrides`."""
    return tiny_config("dapo", data_dir, **{**FAULTS, **overrides})


def comparable(row):
    """A metrics row without its timing entries: what two equal runs log alike."""
    return {k: v for k, v in row.items() if not any(t in k for t in TIMING)}


# Metrics that measure float rounding (the sampler's and the trainer's log-probs of the
# same tokens): equal between identical runs, but set by the programs' float order, so two
# device layouts give different noise. Across layouts they are compared to this tolerance.
ROUNDING_METRICS, ROUNDING_ATOL = ("mismatch/",), 1e-4


def assert_metric_close(key, got, want, *, rtol, atol, err_msg):
    """`assert_allclose` of one metric; a rounding metric gets at least ROUNDING_ATOL."""
    if key.startswith(ROUNDING_METRICS):
        atol = max(atol, ROUNDING_ATOL)
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, err_msg=err_msg)


def finished_checkpoints(workdir):
    """The steps of the finished checkpoints under `workdir/checkpoints` (local or in a
    bucket, where an unfinished save has its step's name too), ascending."""
    return checkpoint.complete_steps(paths.join(workdir, "checkpoints"))


def cli_config_file(tmp_path, data_dir, overrides, recipe="dapo"):
    """A config file for `python -m grpo_jax.main`: the tiny `recipe` setting with `overrides`."""
    config_file = tmp_path / "cli_config.py"
    config_file.write_text(
        "from tests.training.training_setups import tiny_config\n\n\n"
        "def get_config(arg=None):\n"
        f"    return tiny_config({recipe!r}, {data_dir!r}, **{overrides!r})\n")
    return config_file


def cli(args, cwd, **env):
    """`python -m grpo_jax.main ARGS` from `cwd` (this checkout's grpo_jax and tests importable)."""
    environment = {**os.environ, "PYTHONPATH": str(REPO), **env}
    return [sys.executable, "-m", "grpo_jax.main", *args], dict(cwd=cwd, env=environment)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main_commands(config_file, workdir, processes):
    """One `python -m grpo_jax.main` command and environment per process: `processes` JAX
    processes on localhost sharing 8 CPU devices."""
    port = free_port()
    commands = []
    for index in range(processes):
        env = {**os.environ, "PYTHONPATH": str(REPO), "JAX_PLATFORMS": "cpu",
               "XLA_FLAGS": f"--xla_force_host_platform_device_count={8 // processes}"}
        args = [sys.executable, "-m", "grpo_jax.main", f"--config={config_file}",
                f"--workdir={workdir}"]
        if processes > 1:
            args += [f"--config.distributed.coordinator_address=127.0.0.1:{port}",
                     f"--config.distributed.num_processes={processes}",
                     f"--config.distributed.process_id={index}"]
        commands.append((args, env))
    return commands


def start_processes(commands, logs):
    """Starts each (args, env) of `commands` from the repository root, output to its log."""
    return [subprocess.Popen(args, env=env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
            for (args, env), log in zip(commands, logs)]


def assert_rows_equal(workdir, reference, steps, rtol=0.0, atol=0.0, extra=()):
    """metrics.jsonl of `workdir` has one row per step of `steps`, equal to the reference's
    (`workdir` may log the `extra` keys besides)."""
    rows, want = read_metrics(workdir), {r["step"]: comparable(r) for r in read_metrics(reference)}
    assert [r["step"] for r in rows] == list(steps)
    for row in rows:
        got = {k: v for k, v in comparable(row).items() if k not in extra}
        assert got.keys() == want[row["step"]].keys()
        for key, value in want[row["step"]].items():
            assert_metric_close(key, got[key], value, rtol=rtol, atol=atol,
                                err_msg=f"step {row['step']} {key}")


def assert_same_export(workdir, reference, rtol=0.0, atol=0.0):
    """The exported policy of `workdir` (local or in a bucket) equals the reference's,
    tensor by tensor."""
    exported = lambda w: (paths.path(w) / "export" / "model.safetensors").read_bytes()
    got, want = (safetensors.numpy.load(exported(w)) for w in (workdir, reference))
    assert got.keys() == want.keys()
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=rtol, atol=atol, err_msg=name)


def step_lines(text):
    """The steps of the console lines ("step     3/12 ...") in a run's output."""
    return [int(s) for s in re.findall(r"^step +(\d+)/", text, flags=re.MULTILINE)]


def wait_for_step(process, log, step, timeout=600):
    """Waits until the run writing `log` has printed the line of `step`."""
    deadline = time.time() + timeout
    while step not in step_lines(log.read_text()):
        assert process.poll() is None, f"ended before step {step}: {log.read_text()[-3000:]}"
        assert time.time() < deadline, f"no step {step} after {timeout} s"
        time.sleep(0.02)
