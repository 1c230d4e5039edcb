"""Faults and hostile inputs, one case each: the fault, what the run does, and that nothing
is lost. Settings the loop cannot run are checked by calling the check functions directly
(no run), against the refusal table of docs/faults.md, so the table cannot drift. The one
case that needs a run (a full disk while a metrics row is appended) resumes and ends equal
to the uninterrupted run of test_faults.py (the shared `reference` fixture).
"""

import ast
import copy
import errno
import io
import json
import os
import re
import subprocess
import sys
import time
import types

import jax.numpy as jnp
import numpy as np
import pytest

from grpo_jax import config_lib, rewards, run_files
from grpo_jax.environments import Step, ToolEnvironment, _episodes
from grpo_jax.training import checkpoint, metrics as metrics_lib, rl, rl_checks, rl_run, sft
from grpo_jax.training import task as task_lib
from grpo_jax.training import tokenizer as tokenizer_lib, warm_start
from tests.environments.envs import HostileReply
from tests.training.test_faults import _Position
from tests.training.training_setups import (REPO, assert_rows_equal, assert_same_export,
                                            faults_config, finished_checkpoints, read_metrics)

pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")

DOCS = REPO / "docs" / "faults.md"
TABLE_HEADING = "## Settings refused before a run starts"


# --- Settings refused before anything compiles: the table of docs/faults.md ----------------

def documented_refusals():
    """`(field, bad value, message)` of each row of docs/faults.md's refusal table."""
    section = DOCS.read_text(encoding="utf-8").split(TABLE_HEADING, 1)[1].split("\n## ")[0]
    rows = [re.fullmatch(r"\| `([^`]+)` \| `([^`]*)` \| (.+) \|", line)
            for line in section.splitlines()]
    return [(m[1], ast.literal_eval(m[2]), m[3]) for m in rows if m]


# The degenerate settings that ran before they were refused (ZeroDivisionError after a
# compiled step, an untrained export with exit 0, no signal at all): each has a row.
MUST_REFUSE = {
    ("train.checkpoint_every", 0), ("train.checkpoint_every", -3), ("train.keep_checkpoints", 0),
    ("train.minibatches", 0), ("train.micro_batches", 0), ("rollout.prompts_per_batch", 0),
    ("eval.num_prompts", -1), ("objective.group_size", 1), ("rollout.temperature", 0.0),
    ("filtering.max_gen_batches", 0), ("train.steps", -1), ("rollout.top_p", 1.5),
    ("--workdir", ""),
}


@pytest.fixture(scope="module")
def runlocal():
    return config_lib.load_config(f"{REPO / 'configs' / 'dapo.py'}:runlocal=True")


def test_the_refusal_table_lists_every_degenerate_setting():
    assert MUST_REFUSE <= {(field, value) for field, value, _ in documented_refusals()}


@pytest.mark.parametrize("field, value, message", documented_refusals(),
                         ids=[f"{field}={value!r}" for field, value, _ in documented_refusals()])
def test_a_documented_setting_is_refused_with_its_message(runlocal, field, value, message):
    with pytest.raises(ValueError) as refused:
        if field == "--workdir":
            config_lib.resolve_run_paths(runlocal, value)
        else:
            config = config_lib.apply_overrides(copy.deepcopy(runlocal), {field: value})
            (sft.check_settings if field.startswith("sft.") else rl_checks.check_settings)(config)
    assert str(refused.value) == message


@pytest.mark.parametrize("recipe", ["dapo", "grpo", "ppo", "vapo", "rloo", "tool_calculator"])
def test_the_recipes_pass_the_checks(recipe):
    config = config_lib.load_config(f"{REPO / 'configs' / recipe}.py:runlocal=True")
    rl_checks.check_settings(config)
    sft.check_settings(config)


@pytest.mark.parametrize("entry", [rl.train, sft.train])
def test_every_entry_point_refuses_before_its_warm_start_or_model(entry, runlocal, tmp_path,
                                                                  monkeypatch):
    def no_further(*args, **kwargs):
        raise AssertionError("reached the warm start or the model: the check came too late")

    monkeypatch.setattr(warm_start, "prepared", no_further)
    monkeypatch.setattr(task_lib, "data_source", no_further)
    config = config_lib.apply_overrides(copy.deepcopy(runlocal), {"train.checkpoint_every": 0})
    with pytest.raises(ValueError, match=r"^train.checkpoint_every must be an int >= 1"):
        entry(config, str(tmp_path))


# --- A torn last metrics row, a full disk during the append -------------------------------

ROWS = '{"step": 1, "loss": 0.5}\n{"step": 2, "loss": 0.25}\n'
DROPPED = f"{run_files.METRICS}:3: dropping a torn last row"
TORN = [   # (metrics.jsonl, resumed after step, steps kept, the line the resume prints)
    (ROWS + '{"step": 3, "time": 17', 2, [1, 2], DROPPED),
    (ROWS + '{"step": 3, "time": 17', 1, [1], DROPPED),
    (ROWS + '{"st\n', 2, [1, 2], DROPPED),
    (ROWS + '{"step": 3}', 3, [1, 2, 3], None),   # whole but for its newline: kept
    (ROWS, 2, [1, 2], None),
]


@pytest.mark.parametrize("text, start, kept, said", TORN,
                         ids=["torn", "torn-resumed-earlier", "torn-then-newline",
                              "whole-without-newline", "whole"])
def test_a_torn_last_row_is_dropped_named_and_repaired(text, start, kept, said, tmp_path, capsys):
    path = tmp_path / run_files.METRICS
    path.write_text(text)
    writer = metrics_lib.MetricWriter(str(tmp_path), total_steps=6, start_step=start,
                                      stream=io.StringIO())
    out = capsys.readouterr().out
    assert (f"{path}:3: dropping a torn last row" in out) == (said is not None)
    writer.write(start + 1, {"loss": 0.125})
    writer.close()
    assert [r["step"] for r in read_metrics(tmp_path)] == kept + [start + 1]


def test_a_line_that_is_not_a_row_before_the_last_names_the_file_and_line(tmp_path):
    (tmp_path / run_files.METRICS).write_text('{"step": 1}\n{"step": 2\n{"step": 3}\n')
    with pytest.raises(ValueError, match=re.escape(f"{tmp_path / run_files.METRICS}:2 is not a "
                                                   "metrics row (JSONDecodeError")):
        metrics_lib.MetricWriter(str(tmp_path), total_steps=6, start_step=3, stream=io.StringIO())


def test_a_metrics_file_deleted_mid_run_is_named_and_the_later_rows_kept(tmp_path, capsys):
    writer = metrics_lib.MetricWriter(str(tmp_path), total_steps=4, stream=io.StringIO())
    writer.write(1, {"loss": 0.5})
    (tmp_path / run_files.METRICS).unlink()
    writer.write(2, {"loss": 0.25})
    writer.write(3, {"loss": 0.125})
    writer.close()
    assert [r["step"] for r in read_metrics(tmp_path)] == [2, 3]
    assert (f"{tmp_path / run_files.METRICS} was deleted while the run wrote it; the rows from "
            "step 2 on go to a new one" in capsys.readouterr().out)


class _FullDisk:
    """A file that takes the first `room` characters of a write, then fails as a full disk."""

    def __init__(self, real, room):
        self.real, self.room = real, room

    def write(self, text):
        self.real.write(text[:self.room])
        self.real.flush()
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def flush(self):
        self.real.flush()

    def close(self):
        self.real.close()


def _fill_the_disk_at(step, room=20):
    """A `MetricWriter.write` whose append of `step`'s row writes `room` characters, then
    fails with ENOSPC (the rest of the row lost, as on a full disk)."""
    real_write = metrics_lib.MetricWriter.write

    def write(self, at, metrics):
        if at == step:
            self._appending = _FullDisk(self._appending, room)
        real_write(self, at, metrics)
    return write


def test_a_full_disk_during_the_append_names_the_file_and_the_fix(tmp_path, monkeypatch):
    monkeypatch.setattr(metrics_lib.MetricWriter, "write", _fill_the_disk_at(2))
    writer = metrics_lib.MetricWriter(str(tmp_path), total_steps=4, stream=io.StringIO())
    writer.write(1, {"loss": 0.5})
    with pytest.raises(OSError) as failure:
        writer.write(2, {"loss": 0.25})
    writer.close()   # the failed file is closed already: nothing more to raise
    assert failure.value.errno == errno.ENOSPC
    message = str(failure.value)
    assert (f"appending the metrics row of step 2 to {tmp_path / run_files.METRICS} failed: No "
            "space left on device") in message
    assert "Free some space" in message and "re-run the same command" in message
    assert (tmp_path / run_files.METRICS).read_text().splitlines()[-1] == '{"step": 2, "time": '

    monkeypatch.undo()
    metrics_lib.MetricWriter(str(tmp_path), total_steps=4, start_step=1,
                             stream=io.StringIO()).close()
    assert [r["step"] for r in read_metrics(tmp_path)] == [1]


@pytest.mark.slow
def test_a_full_disk_during_an_append_ends_after_a_resume_as_the_uninterrupted_run(
        data_dir, reference, tmp_path, monkeypatch, capsys):
    """The disk fills while step 5's row is appended (checkpoints every 2 steps): the run
    stops with the file named, half a row left; the re-run drops it, resumes from step 4
    and ends as the uninterrupted run, metric for metric."""
    config = faults_config(data_dir, **{"train.checkpoint_every": 2, "train.export": True})
    monkeypatch.setattr(metrics_lib.MetricWriter, "write", _fill_the_disk_at(5))
    with pytest.raises(OSError, match=re.escape(
            f"appending the metrics row of step 5 to {tmp_path / run_files.METRICS} failed")):
        rl.train(config, str(tmp_path))
    monkeypatch.undo()
    assert finished_checkpoints(tmp_path) == [2, 4]
    lines = (tmp_path / run_files.METRICS).read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines[:-1]] == [1, 2, 3, 4]
    assert lines[-1] == '{"step": 5, "time": '   # the torn row

    capsys.readouterr()
    assert rl.train(config, str(tmp_path)) == 12
    out = capsys.readouterr().out
    assert f"{tmp_path / run_files.METRICS}:5: dropping a torn last row" in out
    assert f"resumed from the checkpoint of step 4 in {tmp_path}" in out
    assert_rows_equal(tmp_path, reference, range(1, 13))
    assert_same_export(tmp_path, reference)


# --- Checkpoints: keep none, another base, a directory that cannot be made ----------------


def test_a_checkpointer_that_would_keep_none_is_refused(tmp_path):
    with pytest.raises(ValueError, match="keep must be >= 1"):
        checkpoint.Checkpointer(str(tmp_path / "checkpoints"), keep=0)


def test_a_resume_onto_another_base_is_refused_naming_both(tmp_path):
    directory = tmp_path / "checkpoints"
    state = {"lora_a": jnp.arange(6.0).reshape(2, 3)}
    checkpointer = checkpoint.Checkpointer(str(directory))
    checkpointer.save_run(2, state, _Position(2), base="/bases/a")
    checkpointer.close()

    checkpointer = checkpoint.Checkpointer(str(directory))
    with pytest.raises(ValueError, match=re.escape(
            f"the checkpoint {directory}/2 was written by a run on another starting point (base: "
            "the checkpoint has '/bases/a', this run '/bases/b')")):
        checkpointer.restore_run({"lora_a": jnp.zeros((2, 3))}, _Position(),
                                 expect={"base": "/bases/b"})
    position = _Position()
    step, restored = checkpointer.restore_run({"lora_a": jnp.zeros((2, 3))}, position,
                                              expect={"base": "/bases/a"})
    checkpointer.close()
    assert (step, position.index) == (2, 2)
    np.testing.assert_array_equal(restored["lora_a"], np.arange(6.0).reshape(2, 3))


@pytest.mark.parametrize("overrides, expected", [
    ({"model.lora.rank": 4, "model.path": "/bases/a"}, {"base": "/bases/a"}),
    ({"model.lora.rank": 4, "model.name": "tiny", "seed": 3},
     {"base": "model.name=tiny seed=3"}),
    ({"model.lora.rank": 0}, {}),   # every weight is in the checkpoint: no base to compare
])
def test_the_rl_resume_expects_the_base_of_a_lora_run(runlocal, overrides, expected, monkeypatch):
    class Stop(Exception):
        pass

    seen = []

    def restore_run(state, data_iterator, extra, expect):
        seen.append(expect)
        raise Stop

    config = config_lib.apply_overrides(copy.deepcopy(runlocal), overrides)
    run = types.SimpleNamespace(config=config, train_iter=None,
                                checkpointer=types.SimpleNamespace(restore_run=restore_run))
    monkeypatch.setattr(rl_run, "checkpoint_state", lambda run: {})
    with pytest.raises(Stop):
        rl_run.restore(run)
    assert seen == [expected]


def test_an_edited_data_position_is_named_and_the_checkpoint_before_it_resumes(tmp_path,
                                                                              capsys):
    """The data position is in the checkpoint's JSON, outside the arrays' checksums: it
    has its own, so an edited position is not resumed from silently elsewhere."""
    directory = tmp_path / "checkpoints"
    checkpointer = checkpoint.Checkpointer(str(directory))
    for step in (1, 2):
        checkpointer.save_run(step, {"w": jnp.full((3,), float(step))}, _Position(10 * step))
    checkpointer.close()
    meta = directory / "2" / "meta" / "metadata"
    meta.write_text(meta.read_text().replace('"index": 20', '"index": 25'))

    checkpointer = checkpoint.Checkpointer(str(directory))
    position = _Position()
    step, restored = checkpointer.restore_run({"w": jnp.zeros(3)}, position)
    checkpointer.close()
    assert (step, position.index) == (1, 10)
    np.testing.assert_array_equal(restored["w"], [1.0, 1.0, 1.0])
    assert (f"the checkpoint {directory}/2 cannot be read: its data position differs from the "
            "checksum saved with it" in capsys.readouterr().out)
    assert sorted(os.listdir(directory)) == ["1", "2.unreadable"]


_SAVE_WHERE_NO_DIRECTORY_CAN_BE_MADE = """
import shutil, sys, time
import jax.numpy as jnp
from grpo_jax.training import checkpoint

class Position:
    def get_state(self):
        return {}

root = sys.argv[1]
checkpointer = checkpoint.Checkpointer(root + "/checkpoints")
checkpointer.save_run(1, {"w": jnp.zeros((64, 64))}, Position())
checkpointer.wait()
shutil.rmtree(root + "/checkpoints")
open(root + "/checkpoints", "w").close()   # a file where the directory must be
try:
    checkpointer.save_run(2, {"w": jnp.ones((64, 64))}, Position())
    checkpointer.wait()
except OSError as error:
    print("failed:", str(error).splitlines()[0], flush=True)
checkpointer.close()
print("closed at", time.time(), flush=True)
"""


def test_a_save_whose_directory_cannot_be_made_lets_the_process_exit_at_once(tmp_path):
    """A save that fails before its directory exists (read-only, or a file in the way)
    left orbax's threads waiting 300 s for the directory's signal, keeping the process."""
    done = subprocess.run([sys.executable, "-c", _SAVE_WHERE_NO_DIRECTORY_CAN_BE_MADE,
                           str(tmp_path)], cwd=REPO, capture_output=True, text=True, timeout=240,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    ended = time.time()
    assert done.returncode == 0, done.stderr[-3000:]
    assert (f"failed: writing the checkpoint of step 2 to {tmp_path}/checkpoints failed"
            in done.stdout)
    closed = float(re.search(r"closed at ([0-9.]+)", done.stdout)[1])
    assert ended - closed < 60   # the interpreter's exit, not orbax's 300 s timeout


# --- The model's context -----------------------------------------------------------------

def test_a_prompt_and_budget_past_the_models_context_are_refused_naming_the_fields(runlocal):
    task_lib.check_positions(2000, 48, 2048, "a train batch")   # exactly the context: runs
    with pytest.raises(ValueError, match=re.escape(
            "a train batch: a prompt of 2001 tokens + rollout.max_new_tokens=48 = 2049 positions, "
            "more than the model's context of 2048 (max_position_embeddings")):
        task_lib.check_positions(2001, 48, 2048, "a train batch")

    tokenizer = tokenizer_lib.train_char_tokenizer(["What is 12 + 30? x"])
    example = {"task": "arithmetic", "question": "What is 12 + 30?", "answer": "42"}
    text = task_lib.prompt_text(runlocal.task, example, tokenizer)
    length = len(tokenizer.encode(text, add_special_tokens=False))
    budget = runlocal.rollout.max_new_tokens
    task_lib.check_context(runlocal, length + budget, [example], tokenizer, "held out")
    with pytest.raises(ValueError, match=re.escape(
            f"held out: a prompt of {length} tokens + rollout.max_new_tokens={budget}")):
        task_lib.check_context(runlocal, length + budget - 1, [example], tokenizer, "held out")


# --- Environment replies ------------------------------------------------------------------

MAX_APPEND = 32
REPLIES = [   # (what the environment's step gives, status, observation's length or None)
    (HostileReply(observation="x" * 20_000_000), "ok", 64 * MAX_APPEND),
    (HostileReply(observation="<result>42</result>"), "ok", 19),
    (HostileReply(observation=b"bytes"), "error", None),
    (HostileReply(observation=12), "error", None),
    (HostileReply(returned="a string, not a Step"), "error", None),
]


@pytest.fixture(scope="module")
def pool():
    with rewards.GraderPool(1, timeout_s=60.0) as workers:
        yield workers


@pytest.mark.parametrize("environment, status, length", REPLIES,
                         ids=["20MB", "short", "bytes", "int", "not-a-step"])
def test_an_environment_reply_is_bounded_or_refused_in_the_worker(pool, environment, status,
                                                                  length):
    """What crosses from the worker to the trainer: a `Step` whose observation is at most
    `reply_chars` characters, or a failed step naming the environment's mistake."""
    (outcome,) = _episodes._steps(environment, [({"id": 0}, ["<t>1</t>"])], pool,
                                  _episodes.reply_chars(MAX_APPEND))
    assert outcome.status == status, outcome.detail
    if length is None:
        assert outcome.value is None and "HostileReply.step" in outcome.detail
    else:
        assert isinstance(outcome.value, Step) and len(outcome.value.observation) == length


def test_a_failed_tool_step_is_an_error_the_model_reads_not_a_crash():
    reply = ToolEnvironment().failed("error", "TypeError: HostileReply.step's observation is a "
                                     "bytes; give a str (or None for no reply)")
    assert reply == Step(observation="<result>error: the tool failed</result>", tool_call=True,
                         tool_error=True)


def test_reply_ids_cut_the_text_before_tokenizing():
    tokenizer = tokenizer_lib.train_char_tokenizer(["ab"])
    ids = _episodes.reply_ids(tokenizer, "ab" * 10_000, 4)
    assert ids == tokenizer.encode("abab", add_special_tokens=False)


SPECIAL = ["42", "error: bad call 'x<eos>'", "error: bad call '<pad><eos>'"]


@pytest.mark.parametrize("output", SPECIAL, ids=["plain", "eos", "pad-eos"])
def test_a_tool_reply_quoting_special_token_text_gets_no_special_token(output):
    """Inside a tool's reply the model's own text is plain text (one id per character of
    this tokenizer); the reply's frame keeps its markers (here a chat-like frame that
    closes the turn with <eos>) as one id each."""
    tokenizer = tokenizer_lib.train_char_tokenizer(["<result></result>\n" + " ".join(SPECIAL)])
    forged = {tokenizer.eos_token_id, tokenizer.pad_token_id}
    plain = ToolEnvironment()
    observation = plain.reply.format(output)
    ids = _episodes.reply_ids(tokenizer, observation, 256, _episodes.reply_frame(plain))
    assert not forged & set(ids) and len(ids) == len(observation)
    chat = ToolEnvironment(reply="<eos>\n<result>{}</result>")
    ids = _episodes.reply_ids(tokenizer, chat.reply.format(output), 256,
                              _episodes.reply_frame(chat))
    assert [i for i in ids if i in forged] == [tokenizer.eos_token_id]   # the frame's own
    assert len(ids) == len(chat.reply.format(output)) - len("<eos>") + 1
