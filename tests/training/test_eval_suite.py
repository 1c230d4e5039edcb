"""mode=eval over a named suite: k samples per problem of each benchmark, avg@k, pass@k and
maj@k per benchmark and macro-averaged."""

import collections
import dataclasses
import fractions
import json
import math
import pathlib

import numpy as np
import pytest

from configs import base
from grpo_jax import data, models, rewards, sampling
from grpo_jax.training import evaluation, suites, task as task_lib
from grpo_jax.training.tokenizer import train_char_tokenizer
from tests import readme_metrics
from tests.data import code_samples, release_samples

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


@pytest.mark.slow
def test_eval_mode_over_the_suite(tmp_path, monkeypatch, checkpoint, suite_dir):
    """Each sample's answer is its first character, correct when that character's code
    is even (the random tiny model writes anything): the counts, majorities and metrics
    are recomputed here from the completions the sampler drew."""
    drawn = []

    def first_character(completion):
        drawn.append(completion)
        return completion[:1] or None

    def even_first_character(self, prompts, completions, examples, lengths):
        correct = np.array([bool(c) and ord(c[0]) % 2 == 0 for c in completions])
        return correct.astype(np.float32), correct, {}

    monkeypatch.setattr(rewards, "final_boxed_answer", first_character)
    monkeypatch.setattr(task_lib.Scorer, "__call__", even_first_character)
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
        rows = drawn[start:start + problems * k]
        start += problems * k
        counts, majority = [], []
        for p in range(problems):
            samples = rows[p * k:(p + 1) * k]
            ok = [bool(c) and ord(c[0]) % 2 == 0 for c in samples]
            counts.append(sum(ok))
            votes = collections.Counter(c[:1] for c in samples if c)
            # The most frequent first character; a tie goes to the one drawn first.
            winner = next((c[:1] for c in samples if c and votes[c[:1]] == max(votes.values())),
                          None)
            majority.append(winner is not None and ord(winner) % 2 == 0)
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
