"""The builders of the math training sets and benchmarks read their published files."""

import os

import pytest

from configs import base
from grpo_jax import config_lib
from grpo_jax import data
from grpo_jax import rewards
from grpo_jax.data import _release
from grpo_jax.data import math_train
from grpo_jax.training import task as task_lib
from tests.data import release_samples as samples
from tests.data.conftest import read_built as read


@pytest.fixture(scope="module")
def releases(tmp_path_factory):
    """Every sample file, as ``<root>/<name>/<file>`` (a benchmarks_dir too)."""
    return samples.write_all(tmp_path_factory.mktemp("releases"))



def by_answer(examples):
    return {e["answer"]: e for e in examples}


def trained_against(releases, name):
    return data.builder_config(name, {"benchmarks_dir": str(releases)})


class TestBenchmarks:

    def test_aime24_answers_without_leading_zeros(self, releases, out):
        test = by_answer(read("aime24", "test", out, releases / "aime24"))
        assert sorted(test) == ["4", "933"]
        assert test["4"]["question"] == (
            "Find the number of positive divisors of $2024$ that are odd.")
        # A published solution without a box gets the answer appended; one with a box is kept.
        assert test["4"]["solution"].endswith("= 4$.\n\n\\boxed{4}")
        assert test["933"]["solution"] == "The least such $x$ is $\\boxed{933}$."
        assert test["4"]["task"] == "aime24"

    def test_aime25_integer_answers(self, releases, out):
        test = read("aime25", "test", out, releases / "aime25")
        assert [(e["answer"], e["solution"]) for e in test] == [
            ("70", "\\boxed{70}"), ("117", "\\boxed{117}")]

    def test_amc23_keeps_the_2023_problems_and_writes_float_answers(self, releases, out):
        test = read("amc23", "test", out, releases / "amc23")
        assert [e["answer"] for e in test] == ["4", "1.5"]
        assert all("primes" not in e["question"] for e in test)   # the 2022 problem

    def test_amc_file_without_2023_problems(self, tmp_path):
        samples.write_parquet(tmp_path / samples.HUB_PARQUET, samples.AMC[2:])
        with pytest.raises(ValueError, match="amc23: no row of .* has a url naming a 2023 AMC"):
            read("amc23", "test", tmp_path / "out", tmp_path)

    def test_minerva(self, releases, out):
        test = read("minerva_math", "test", out, releases / "minerva_math")
        assert [e["answer"] for e in test] == ["10", "500"]
        assert test[0]["question"].startswith("Preamble: A star has a parallax")

    def test_olympiadbench_context_and_several_answers(self, releases, out):
        first, second = read("olympiadbench", "test", out, releases / "olympiadbench")
        assert first["answer"] == "\\frac{1}{2}, -\\frac{1}{2}"
        assert first["question"] == "Find all real $x$ such that $x^2 = \\frac{1}{4}$."
        assert second["answer"] == "5"
        assert second["question"] == (
            "A frog jumps on the integers, starting at $0$.\nEach jump moves it $1$ or $2$ "
            "to the right. In how many ways can it reach $4$?")
        assert second["solution"].endswith("$1, 2, 3, 5$.\n\n\\boxed{5}")

    def test_only_a_test_split(self, releases, out):
        with pytest.raises(ValueError, match="train"):
            read("aime25", "train", out, releases / "aime25")


class TestTrainingSets:

    def test_dapo_problems_unwrapped_and_deduplicated(self, releases, out):
        train = read("dapo_math_17k", "train", out, releases / "dapo_math_17k")
        assert [(e["question"], e["answer"]) for e in train] == samples.DAPO_PROBLEMS
        assert train[0]["solution"] == "\\boxed{25}"
        counts = data.metadata("dapo_math_17k", data_dir=out,
                               manual_dir=str(releases / "dapo_math_17k"))["train"]
        assert counts == {"rows": 9, "duplicates": 6, "no_answer": 0, "contaminated": 0,
                          "kept": 3, "decontaminated_against": []}

    def test_dapo_decontaminated_against_aime24(self, releases, out):
        config = trained_against(releases, "dapo_math_17k")
        manual = str(releases / "dapo_math_17k")
        train = read("dapo_math_17k", "train", out, manual, config)
        assert [e["answer"] for e in train] == ["25", "13"]   # AIME 2024's divisor problem gone
        counts = data.metadata("dapo_math_17k", data_dir=out, config=config,
                               manual_dir=manual)["train"]
        assert (counts["rows"], counts["duplicates"], counts["contaminated"], counts["kept"]) == (
            9, 6, 1, 2)
        assert counts["decontaminated_against"] == list(data.BENCHMARKS)

    def test_math_answers_from_the_last_box(self, releases, out):
        train = by_answer(read("math", "train", out, releases / "math"))
        assert sorted(train) == ["144", "4", "9\\pi"]
        circle = train["9\\pi"]   # \fbox counts as a box; an unknown level reads 0
        assert circle["solution"] == "The area is $\\pi r^2 = \\boxed{9\\pi}$."
        assert (circle["subject"], circle["level"], circle["unique_id"]) == (
            "Geometry", 0, "train/geometry/3.json")
        assert train["4"]["solution"] == samples.MATH_ROWS["MATH/train/algebra/1.json"]["solution"]
        (test,) = read("math", "test", out, releases / "math")
        assert (test["answer"], test["level"], test["unique_id"]) == (
            "2", 3, "test/number_theory/645.json")

    def test_math_train_decontaminated_against_math500_but_not_its_test_split(self, releases,
                                                                              out):
        config = trained_against(releases, "math")
        train = read("math", "train", out, releases / "math", config)
        assert sorted(e["answer"] for e in train) == ["4", "9\\pi"]
        assert len(read("math", "test", out, releases / "math", config)) == 1
        info = data.metadata("math", data_dir=out, config=config,
                             manual_dir=str(releases / "math"))
        assert info["train"]["contaminated"] == 1
        assert info["test"]["contaminated"] == 0 and info["test"]["decontaminated_against"] == []

    def test_deepscaler_counts(self, releases, out):
        config = trained_against(releases, "deepscaler")
        train = read("deepscaler", "train", out, releases / "deepscaler", config)
        assert [(e["answer"], e["solution"]) for e in train] == [
            ("55", "The sum is $\\frac{10 \\cdot 11}{2} = 55$.\n\n\\boxed{55}")]
        counts = data.metadata("deepscaler", data_dir=out, config=config,
                               manual_dir=str(releases / "deepscaler"))["train"]
        assert (counts["rows"], counts["duplicates"], counts["no_answer"], counts["contaminated"],
                counts["kept"]) == (4, 1, 1, 1, 1)


@pytest.mark.parametrize("name, split", [
    ("aime24", "test"), ("aime25", "test"), ("amc23", "test"), ("minerva_math", "test"),
    ("olympiadbench", "test"), ("dapo_math_17k", "train"), ("math", "train"),
    ("math", "test"), ("deepscaler", "train")])
def test_every_solution_scores_one_with_the_math_reward(releases, out, name, split):
    """The answers are written as the grader reads them: each example's own solution
    (its published one, or its boxed answer) is graded correct, a wrong answer is not."""
    for example in read(name, split, out, releases / name):
        assert rewards.math_reward("p", example["solution"], example) == 1.0, example
        assert rewards.math_reward("p", "\\boxed{999}", example) == 0.0, example


class TestMissingFiles:

    @pytest.mark.parametrize("name, expected", [
        ("dapo_math_17k", r"dapo-math-17k\.parquet \(published at https://huggingface\.co/"
                          r"datasets/BytedTsinghua-SIA/DAPO-Math-17k"),
        ("math", r"MATH\.tar \(published at https://people\.eecs\.berkeley\.edu/~hendrycks/"),
        ("deepscaler", r"deepscaler\.json \(published at .*agentica-org/DeepScaleR-Preview"),
        ("aime24", r"train-00000-of-00001\.parquet \(published at .*HuggingFaceH4/aime_2024"),
        ("aime25", r"train-00000-of-00001\.parquet \(published at .*MathArena/aime_2025"),
        ("amc23", r"train-00000-of-00001\.parquet \(published at .*AI-MO/aimo-validation-amc"),
        ("minerva_math", r"test\.jsonl \(published at .*math-ai/minervamath"),
        ("olympiadbench", r"OE_TO_maths_en_COMP\.json \(published at .*OpenBMB/OlympiadBench"),
    ])
    def test_names_the_file_and_where_it_is_published(self, tmp_path, name, expected):
        with pytest.raises(FileNotFoundError, match=f"{name}: expected {expected}"):
            read(name, "test", tmp_path / "out", tmp_path)

    def test_a_missing_benchmark_of_the_decontamination(self, releases, tmp_path):
        benchmarks_dir = samples.write_all(tmp_path / "partial")
        os.remove(benchmarks_dir / "minerva_math" / "test.jsonl")
        config = data.builder_config("deepscaler", {"benchmarks_dir": str(benchmarks_dir)})
        with pytest.raises(FileNotFoundError, match=r"minerva_math: expected test\.jsonl"):
            read("deepscaler", "train", tmp_path / "out", releases / "deepscaler", config)

    def test_a_missing_math500_of_the_decontamination(self, releases, tmp_path):
        benchmarks_dir = samples.write_all(tmp_path / "partial")
        os.remove(benchmarks_dir / "math500" / "test.jsonl")
        config = data.builder_config("math", {"benchmarks_dir": str(benchmarks_dir)})
        with pytest.raises(FileNotFoundError, match=r"math500: expected test\.jsonl \(published"
                                                    r" at https://github\.com/openai/prm800k"):
            read("math", "train", tmp_path / "out", releases / "math", config)

    def test_a_row_outside_the_schema(self, tmp_path):
        samples.write_json(tmp_path / "test.jsonl", [{"problem": "1+1?", "answer": "2"}],
                           lines=True)
        with pytest.raises(ValueError, match=r"lacks \['question'\]; expected the official"):
            read("minerva_math", "test", tmp_path / "out", tmp_path)


class TestCache:

    def test_an_edited_file_builds_again(self, tmp_path):
        manual = tmp_path / "manual"
        path = manual / "test.jsonl"
        samples.write_json(path, samples.MINERVA, lines=True)
        out = tmp_path / "out"
        assert [e["answer"] for e in read("minerva_math", "test", out, manual)] == ["10", "500"]
        stat = os.stat(path)
        samples.write_json(path, [{**samples.MINERVA[0], "answer": "11"}, samples.MINERVA[1]],
                           lines=True)
        # Same size, one nanosecond later: still a new copy.
        os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1))
        assert os.stat(path).st_size == stat.st_size
        assert [e["answer"] for e in read("minerva_math", "test", out, manual)] == ["11", "500"]
        assert data.is_prepared("minerva_math", data_dir=str(out), manual_dir=str(manual))

    def test_an_unchanged_file_is_read_from_the_prepared_copy(self, releases, tmp_path):
        out = tmp_path / "out"
        read("aime25", "test", out, releases / "aime25")
        built = sorted(p.name for p in (out / "aime25").iterdir())
        read("aime25", "test", out, releases / "aime25")
        assert sorted(p.name for p in (out / "aime25").iterdir()) == built
        assert len(built) == 1 and built[0].startswith("release_")


class TestHelpers:

    def test_dapo_problem(self):
        prompt = [{"content": samples.DAPO_PROMPT.format("Find $x$."), "role": "user"}]
        assert math_train.dapo_problem(prompt) == "Find $x$."

    def test_problem_key_ignores_spacing_punctuation_and_case(self):
        assert _release.problem_key("What is $1 + 2$?") == _release.problem_key("what is 1+2 ?")
        assert _release.problem_key("What is $1 + 2$?") != _release.problem_key("What is 1+3?")

    def test_boxed_answer_nested_and_missing(self):
        assert _release.boxed_answer("\\boxed{1} or $\\boxed{\\frac{1}{\\sqrt{2}}}$") == (
            "\\frac{1}{\\sqrt{2}}")
        with pytest.raises(ValueError, match="no closed"):
            _release.boxed_answer("The answer is 4.")

    @pytest.mark.parametrize("value, expected", [
        (4.0, "4"), ("033", "33"), (2.5, "2.5"), (70, "70"), (" 12 ", "12"), ("0", "0")])
    def test_number_answer(self, value, expected):
        assert _release.number_answer(value) == expected


class TestFromConfig:

    def test_a_run_reads_the_training_set_its_task_section_names(self, releases, tmp_path):
        config = base.get_config()
        config.task.name = "math"
        config.task.data_dir = str(tmp_path / "tfds")
        config.task.manual_dir = str(releases / "math")
        config.task.knobs.benchmarks_dir = str(releases)
        task_cfg = config_lib.frozen(config).task
        assert not task_lib.is_prepared(task_cfg)
        train = [data.decode_example(r) for r in task_lib.data_source(task_cfg, "train")]
        assert sorted(e["answer"] for e in train) == ["4", "9\\pi"]   # decontaminated
        assert task_lib.is_prepared(task_cfg)
