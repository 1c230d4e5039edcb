"""mode=eval over a named suite: k samples per problem of each benchmark, avg@k, pass@k and
maj@k per benchmark and macro-averaged."""

import collections
import dataclasses
import fractions
import json
import math
import pathlib

import jax
import ml_collections
import numpy as np
import pytest

from configs import base
from grpo_jax import config_lib, data, models, rewards, run_files, sampling
from grpo_jax.training import evaluation, rl, sft, steps, suites, task as task_lib
from grpo_jax.training.tokenizer import train_char_tokenizer
from tests import readme_metrics
from tests.data import code_samples, release_samples
from tests.training.training_setups import tiny_config

SAMPLE_PROBLEMS = {"aime24": 2, "aime25": 2, "amc23": 2, "math500": 5, "minerva_math": 2,
                   "olympiadbench": 2}


def exact_pass(n, c, k):
    return float(1 - fractions.Fraction(math.comb(n - c, k), math.comb(n, k)))


class TestMetrics:

    def test_benchmark_metrics_by_hand(self):
        # 3 problems, 4 samples: 1, 0 and 4 correct; majority right on the third only.
        metrics = suites.benchmark_metrics([1, 0, 4], [False, False, True], 4)
        assert metrics == pytest.approx({
            "problems": 3, "samples": 4, "avg@4": 5 / 12,
            "pass@1": (1 / 4 + 0 + 1) / 3, "pass@2": (1 / 2 + 0 + 1) / 3,
            "pass@4": 2 / 3, "maj@4": 1 / 3})

    def test_macro_average_counts_each_benchmark_once(self):
        big = suites.benchmark_metrics([4] * 30, [True] * 30, 4)      # 30 problems, all right
        small = suites.benchmark_metrics([0, 0], [False, False], 4)   # 2 problems, all wrong
        macro = suites.macro_average({"big": big, "small": small})
        assert macro["avg@4"] == 0.5 and macro["maj@4"] == 0.5 and macro["pass@2"] == 0.5
        assert macro["problems"] == 32

    def test_table(self):
        rows = {"aime24": suites.benchmark_metrics([1, 0], [True, False], 2)}
        rows["macro"] = suites.macro_average(rows)
        assert suites.results_table(rows).splitlines() == [
            "| benchmark | problems | avg@2 | pass@1 | pass@2 | maj@2 |",
            "|---|---:|---:|---:|---:|---:|",
            "| aime24 | 2 | 25.0 | 25.0 | 50.0 | 50.0 |",
            "| macro | 2 | 25.0 | 25.0 | 50.0 | 50.0 |"]

    def test_unknown_suite(self):
        with pytest.raises(ValueError, match=r"eval.suite must be '' or one of "
                                             r"\['code', 'dapo_aime24', 'math_reasoning', "
                                             r"'oat_zero'\]"):
            suites.get_suite("aime")

    def test_the_suite_is_the_six_benchmarks(self):
        suite = suites.SUITES["math_reasoning"]
        assert suite.benchmarks == data.BENCHMARKS
        assert (suite.temperature, suite.top_p) == (0.6, 0.95)

    def test_oat_zero_is_dr_grpos_five_benchmarks_greedy(self):
        suite = suites.SUITES["oat_zero"]
        assert suite.benchmarks == tuple(b for b in data.BENCHMARKS if b != "aime25")
        assert (suite.temperature, suite.top_p) == (0.0, 1.0)
        assert type(sampling.make_method(temperature=suite.temperature, top_p=suite.top_p)
                    ).__name__ == "Greedy"


def suite_config(tmp_path, checkpoint, suite_dir, **overrides):
    config = base.get_config()
    config.mode = "eval"
    config.model.path = checkpoint
    config.task.data_dir = str(tmp_path / "tfds")
    config.eval.suite = "math_reasoning"
    config.eval.suite_dir = str(suite_dir)
    config.eval.samples = 4
    config.rollout.max_new_tokens = 6
    for key, value in overrides.items():
        section, field = key.split(".")
        config[section][field] = value
    return config


def test_the_suite_draws_with_keys_of_its_own(monkeypatch):
    """Every call of the sampler (`_correct`) gets its own key: the held-out evaluation's
    greedy and sampled calls the "eval" stream at the step and its fold_in 1, as without a
    suite, and each benchmark of the suite a key of the "eval_suite" stream."""
    keys = []

    def drawn(policy, mesh, scorer, examples, config, *, rng, method, group_size, count,
              episodic=None, answer_of=None):
        keys.append(tuple(np.asarray(jax.random.key_data(rng)).tolist()))
        rows = len(examples) * group_size
        return np.zeros(rows, bool), None, [None] * rows

    monkeypatch.setattr(evaluation, "_correct", drawn)
    monkeypatch.setattr(evaluation, "own_examples", lambda source, count: ([{}] * count, count))
    config = ml_collections.ConfigDict(dict(seed=3, eval=dict(samples=2, num_prompts=1,
                                                              suite_problems=1)))
    evaluation.evaluate(None, None, None, ([{}], 1), config, step=5, method=None)
    held_out = steps.step_rng(3, "eval", 5)
    assert keys == [tuple(np.asarray(jax.random.key_data(k)).tolist())
                    for k in (held_out, jax.random.fold_in(held_out, 1))]
    opened = evaluation.OpenSuite(sources={name: [{}] for name in data.BENCHMARKS},
                                  scorer=None, answer_of=lambda c: None, method=None)
    evaluation.suite_results(None, None, opened, config, step=5)
    assert len(keys) == 2 + len(data.BENCHMARKS) == len(set(keys))


def test_a_suite_without_its_directory_fails_before_loading(tmp_path):
    config = suite_config(tmp_path, str(tmp_path / "no_model"), "")
    with pytest.raises(ValueError, match=r"eval.suite='math_reasoning' needs eval.samples >= 1 "
                                         r"\(got 4\) and eval.suite_dir"):
        evaluation.evaluate_to_file(config, str(tmp_path / "eval"))


@pytest.fixture(scope="module")
def suite_dir(tmp_path_factory):
    return release_samples.write_all(tmp_path_factory.mktemp("suite"))


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory, suite_dir):
    """The tiny model, random, with a character tokenizer over the suite's prompts."""
    texts = ["0123456789"]
    for name in data.BENCHMARKS:
        source = data.data_source(name, split="test", manual_dir=str(suite_dir / name),
                                  data_dir=str(tmp_path_factory.mktemp("tok_tfds")))
        texts += [data.format_prompt(data.decode_example(r)) for r in source]
    return tiny_checkpoint(str(tmp_path_factory.mktemp("suite_ckpt")), texts)


def tiny_checkpoint(path, texts):
    """The tiny model, random, saved at `path` with a character tokenizer over `texts`."""
    tokenizer = train_char_tokenizer(texts)
    cfg = dataclasses.replace(models.get_model_config("tiny"), vocab_size=64 * -(-len(tokenizer)
                                                                                  // 64),
                              eos_token_id=tokenizer.eos_token_id,
                              pad_token_id=tokenizer.pad_token_id, bos_token_id=None)
    models.save_pretrained(models.init_model(cfg, seed=0), path, tokenizer=tokenizer)
    return path


def even_first_character(completion):
    return bool(completion) and ord(completion[0]) % 2 == 0


def grade_by_first_character(monkeypatch, *, only_math=False):
    """Each sample's answer becomes its first character, correct when that character's
    code is even (the random tiny model writes anything); returns the list every
    completion the suite's majority vote reads is appended to, in order. `only_math`:
    scorers of other rewards (a training run's) grade as before."""
    drawn, score = [], task_lib.Scorer.__call__

    def first_character(completion):
        drawn.append(completion)
        return completion[:1] or None

    def graded(self, prompts, completions, examples, lengths):
        if only_math and [spec.name for spec in self.specs] != ["math"]:
            return score(self, prompts, completions, examples, lengths)
        correct = np.array([even_first_character(c) for c in completions])
        return correct.astype(np.float32), correct, {}

    monkeypatch.setattr(rewards, "final_boxed_answer", first_character)
    monkeypatch.setattr(task_lib.Scorer, "__call__", graded)
    return drawn


def recomputed(drawn, problems, k):
    """`(correct counts, majority correct)` of `problems` problems' k samples each (`drawn`
    in order), by `grade_by_first_character`'s rule."""
    def vote(c):   # the answer's voting form: whitespace, $, % and a period read as blank
        return c[:1].strip().strip("$%.")

    counts, majority = [], []
    for p in range(problems):
        samples = drawn[p * k:(p + 1) * k]
        counts.append(sum(even_first_character(c) for c in samples))
        votes = collections.Counter(vote(c) for c in samples if c)
        # The most frequent vote; a tie goes to the one drawn first, its first sample wins.
        winner = next((c[:1] for c in samples if c and votes[vote(c)] == max(votes.values())),
                      None)
        majority.append(winner is not None and even_first_character(winner))
    return counts, majority


@pytest.mark.slow
def test_eval_mode_over_the_suite(tmp_path, monkeypatch, checkpoint, suite_dir):
    """`grade_by_first_character`: the counts, majorities and metrics are recomputed here
    from the completions the sampler drew."""
    drawn = grade_by_first_character(monkeypatch)
    config = suite_config(tmp_path, checkpoint, suite_dir)
    results = evaluation.evaluate_to_file(config, str(tmp_path / "eval"))

    with open(tmp_path / "eval" / "eval_suite.json") as f:
        assert json.load(f) == results
    assert list(results) == [*data.BENCHMARKS, "macro", "per_problem"]
    for name in (*data.BENCHMARKS, "macro"):
        assert readme_metrics.undocumented(results[name]) == []
    k, start = 4, 0
    for name in data.BENCHMARKS:
        problems = SAMPLE_PROBLEMS[name]
        counts, majority = recomputed(drawn[start:start + problems * k], problems, k)
        start += problems * k
        assert results["per_problem"][name] == {"correct": counts,
                                                "majority_correct": [float(m) for m in majority]}
        metrics = results[name]
        assert metrics["problems"] == problems and metrics["samples"] == k
        assert metrics["avg@4"] == pytest.approx(sum(counts) / (problems * k))
        for j in (1, 2, 4):
            assert metrics[f"pass@{j}"] == pytest.approx(
                np.mean([exact_pass(k, c, j) for c in counts]))
        assert metrics["maj@4"] == pytest.approx(np.mean(majority))
    assert start == len(drawn)
    assert 0 < results["macro"]["avg@4"] < 1   # the rule splits the random answers
    assert results["macro"]["avg@4"] == pytest.approx(
        np.mean([results[name]["avg@4"] for name in data.BENCHMARKS]))
    table = (tmp_path / "eval" / "eval_suite.md").read_text().splitlines()
    assert len(table) == 2 + len(data.BENCHMARKS) + 1 and table[-1].startswith("| macro | 15 |")


@pytest.mark.slow
def test_training_evaluates_the_suite(tmp_path, monkeypatch, data_dir, checkpoint, suite_dir):
    """A 2-step RL run from the tiny checkpoint with ``eval.suite``: its step-0 row (the
    starting policy) logs the metrics ``mode=eval`` gives on the same weights, and both of
    its rows' metrics are recomputed from the completions drawn (the suite graded by
    `grade_by_first_character`, the training reward as it is)."""
    drawn = grade_by_first_character(monkeypatch, only_math=True)
    problems, k = 2, 4
    config = tiny_config("dapo", data_dir, **{   # the random model fails every prompt:
        "filtering.dynamic_sampling": False,      # no group has signal to keep
        "model.path": checkpoint, "model.name": "", "train.eval_at_start": True,
        "eval.suite": "math_reasoning", "eval.suite_dir": str(suite_dir),
        "eval.suite_problems": problems, "eval.samples": k, "rollout.max_new_tokens": 6})
    rl.train(config, str(tmp_path / "rl"))
    rows = [row for row in run_files.read_metrics(str(tmp_path / "rl"))
            if "eval_suite/macro/avg@4" in row]
    assert [row["step"] for row in rows] == [0, 2]
    logged = [{key: value for key, value in row.items() if key.startswith("eval_suite/")}
              for row in rows]
    assert readme_metrics.undocumented(logged[0]) == []
    per_evaluation = len(data.BENCHMARKS) * problems * k
    assert len(drawn) == 2 * per_evaluation
    for row, completions in zip(logged, (drawn[:per_evaluation], drawn[per_evaluation:])):
        results = {}
        for index, name in enumerate(data.BENCHMARKS):
            start = index * problems * k
            results[name] = suites.benchmark_metrics(
                *recomputed(completions[start:start + problems * k], problems, k), k)
        results["macro"] = suites.macro_average(results)
        assert row == pytest.approx(evaluation.suite_metrics(results))
        assert len(row) == (len(data.BENCHMARKS) + 1) * 7   # problems .. maj@4
        assert row["eval_suite/aime24/problems"] == problems
    assert logged[0] != logged[1]   # the policy moved, or the draws of step 2 differ

    del drawn[:]
    eval_config = tiny_config("dapo", data_dir, **{
        "mode": "eval", "model.path": checkpoint, "model.name": "",
        "eval.suite": "math_reasoning", "eval.suite_dir": str(suite_dir),
        "eval.suite_problems": problems, "eval.samples": k, "rollout.max_new_tokens": 6})
    saved = evaluation.evaluate_to_file(eval_config, str(tmp_path / "eval"))
    assert evaluation.suite_metrics(saved) == logged[0]

    # The suite draws with keys of its own: the held-out metrics are a run's without it.
    rl.train(config_lib.replaced(config, {"eval.suite": ""}), str(tmp_path / "no_suite"))

    def held_out(workdir):
        return [{key: value for key, value in row.items()
                 if key.startswith("eval_") and not key.startswith("eval_suite/")}
                for row in run_files.read_metrics(str(workdir)) if "eval_accuracy" in row]

    assert [row["eval_k"] for row in held_out(tmp_path / "rl")] == [4.0, 4.0]
    assert held_out(tmp_path / "rl") == held_out(tmp_path / "no_suite")


@pytest.mark.slow
def test_sft_evaluates_the_suite(tmp_path, monkeypatch, data_dir, checkpoint, suite_dir):
    """A 1-step SFT run with ``eval.suite``: its evaluation row logs the suite's metrics,
    recomputed here from the completions drawn (`grade_by_first_character`)."""
    drawn = grade_by_first_character(monkeypatch, only_math=True)
    problems, k = 1, 2
    config = tiny_config("dapo", data_dir, **{
        "mode": "sft", "model.path": checkpoint, "model.name": "", "sft.steps": 1,
        "sft.eval_every": 1, "sft.batch_size": 4, "eval.suite": "math_reasoning",
        "eval.suite_dir": str(suite_dir), "eval.suite_problems": problems, "eval.samples": k,
        "rollout.max_new_tokens": 6})
    sft.train(config, str(tmp_path / "sft"))
    rows = [row for row in run_files.read_metrics(str(tmp_path / "sft"))
            if "eval_accuracy" in row]
    assert [row["step"] for row in rows] == [1]
    logged = {key: value for key, value in rows[0].items() if key.startswith("eval_suite/")}
    assert len(drawn) == len(data.BENCHMARKS) * problems * k
    results = {name: suites.benchmark_metrics(
        *recomputed(drawn[i * problems * k:(i + 1) * problems * k], problems, k), k)
        for i, name in enumerate(data.BENCHMARKS)}
    results["macro"] = suites.macro_average(results)
    assert logged == pytest.approx(evaluation.suite_metrics(results))
    assert logged["eval_suite/aime24/problems"] == problems


@pytest.mark.parametrize("fails_in, closed", [("start_policy", 1), ("load_teacher", 2)])
def test_a_set_up_that_fails_closes_its_grader_pools(tmp_path, monkeypatch, data_dir, checkpoint,
                                                      suite_dir, fails_in, closed):
    """A run whose set-up raises after the suite is open (loading the model) closes the
    suite's scorer; one that raises after the run's scorer is open too (loading a
    distillation teacher) closes both: no grader process outlives a failed start."""
    from grpo_jax.training import distill, policy as policy_lib
    stopped = []
    monkeypatch.setattr(task_lib.Scorer, "close", lambda self: stopped.append(self))

    def fail(*args, **kwargs):
        raise RuntimeError(f"{fails_in} failed")

    monkeypatch.setattr({"start_policy": policy_lib, "load_teacher": distill}[fails_in],
                        fails_in, fail)
    config = tiny_config("dapo", data_dir, **{
        "model.path": checkpoint, "model.name": "", "eval.suite": "math_reasoning",
        "eval.suite_dir": str(suite_dir), "eval.samples": 1, "rollout.max_new_tokens": 6})
    with pytest.raises(RuntimeError, match=f"{fails_in} failed"):
        rl.train(config, str(tmp_path / "rl"))
    assert len(stopped) == closed and len({id(s) for s in stopped}) == closed
    for scorer in stopped:   # the real close, so no worker is left behind
        if scorer.pool is not None:
            scorer.pool.close()


def test_the_code_suite_is_humaneval_and_mbpp_graded_by_code_tests():
    suite = suites.SUITES["code"]
    assert suite.benchmarks == ("humaneval", "mbpp") and suite.grader == "code_tests"
    assert (suite.temperature, suite.top_p) == (0.6, 0.95)
    reward, answer_of = evaluation.suite_grading(suite, 12.0)
    assert reward.to_dict() == {"specs": (("code_tests", 1.0),), "correct": "code_tests",
                                "timeout_s": 12.0}
    assert answer_of is rewards.program_answer
    with pytest.raises(ValueError, match="a suite's grader must be 'math' or 'code_tests', "
                                         "got 'regex'"):
        evaluation.suite_grading(dataclasses.replace(suite, grader="regex"), 12.0)


# Per problem of the code suite (in order: HumanEval's, then MBPP's test split), its 4
# samples: R the reference program, R_ the same with trailing spaces (votes with R), W it
# without its last line (fails its tests), N no python block (no vote). The correct counts
# and majorities are written by hand.
CODE_PLAN = [("R", "R", "R", "R"), ("W", "W", "W", "W"), ("N", "R", "W", "R_"),
             ("R", "W", "W", "N")]
CODE_COUNTS = [4, 0, 2, 1]
CODE_MAJORITY = [1.0, 0.0, 1.0, 0.0]


def planned_completion(example, kind):
    program = example["answer"]
    if kind == "R":
        return example["solution"]
    if kind == "R_":
        return "```python\n" + program.replace("\n", "  \n") + "```"
    if kind == "W":
        return "```python\n" + program.rstrip().rsplit("\n", 1)[0] + "\n```"
    return "I cannot write it."


@pytest.mark.slow
def test_eval_mode_over_the_code_suite_runs_the_programs(tmp_path_factory, tmp_path,
                                                         monkeypatch):
    """`eval.suite=code` on HumanEval's and MBPP's rows in their official schemas: every
    sample's text is replaced by a hand-written program (the random tiny model writes no
    python), and the real code_tests reward runs them in the sandbox pool."""
    fixtures = pathlib.Path(__file__).parents[1] / "data" / "fixtures"
    suite_dir = code_samples.write_all(tmp_path_factory.mktemp("code_suite"),
                                       fixtures / "humaneval" / "HumanEval.jsonl.gz")
    config = suite_config(tmp_path, "", suite_dir, **{"eval.suite": "code"})
    examples = [data.decode_example(row) for name in ("humaneval", "mbpp")
                for row in task_lib.data_source(evaluation.benchmark_task(config, name), "test")]
    assert len(examples) == len(CODE_PLAN) == 4   # 3 HumanEval problems, MBPP's task 11
    config.model.path = tiny_checkpoint(str(tmp_path / "ckpt"), [
        "0123456789", *(data.format_prompt(e) for e in examples)])
    # One sampler call per benchmark, its completions decoded twice (graded, then voted).
    plans = [[planned_completion(e, kind) for e, row in zip(examples, CODE_PLAN) for kind in row
              if e["task"] == name] for name in ("humaneval", "mbpp")]
    calls = []

    def planned(tokenizer, tokens, mask):
        plan = plans[len(calls) // 2]
        calls.append(len(tokens))
        return plan + [""] * (len(tokens) - len(plan))   # rows that pad the mesh

    monkeypatch.setattr(task_lib, "decode_completions", planned)
    results = evaluation.evaluate_to_file(config, str(tmp_path / "eval"))

    assert len(calls) == 4 and calls[0] == calls[1] and calls[2] == calls[3]
    assert list(results) == ["humaneval", "mbpp", "macro", "per_problem"]
    assert results["per_problem"] == {
        "humaneval": {"correct": CODE_COUNTS[:3], "majority_correct": CODE_MAJORITY[:3]},
        "mbpp": {"correct": CODE_COUNTS[3:], "majority_correct": CODE_MAJORITY[3:]}}
    assert results["humaneval"] == pytest.approx({
        "problems": 3, "samples": 4, "avg@4": 6 / 12,
        "pass@1": 6 / 12, "pass@2": (1 + 0 + exact_pass(4, 2, 2)) / 3, "pass@4": 2 / 3,
        "maj@4": 2 / 3})
    assert results["mbpp"] == pytest.approx({
        "problems": 1, "samples": 4, "avg@4": 1 / 4, "pass@1": 1 / 4,
        "pass@2": exact_pass(4, 1, 2), "pass@4": 1.0, "maj@4": 0.0})
    assert results["macro"]["avg@4"] == pytest.approx((6 / 12 + 1 / 4) / 2)
    table = (tmp_path / "eval" / "eval_suite.md").read_text().splitlines()
    assert table[2].startswith("| humaneval | 3 | 50.0 | 50.0 |")
    assert table[-1].startswith("| macro | 4 |")
