"""The project's own arithmetic generator: scratchpads, the noisy teacher, the builder."""

import re
import sys

import numpy as np
import pytest

from grpo_jax import data
from grpo_jax.data import arithmetic

NEVER = lambda: False
ALWAYS = lambda: True


def stated(solution):
    """The number after the last '####' of a solution."""
    return int(solution.rsplit("####", 1)[1])


class TestColumnSteps:

    def test_addition_with_carries(self):
        steps, result = arithmetic.column_steps(478, 256, "+", NEVER)
        assert steps == ["8+6+0=14", "7+5+1=13", "4+2+1=7"]
        assert result == 734

    def test_final_carry_adds_a_digit(self):
        steps, result = arithmetic.column_steps(999, 1, "+", NEVER)
        assert steps == ["9+1+0=10", "9+0+1=10", "9+0+1=10"]
        assert result == 1000

    def test_subtraction_with_borrows(self):
        steps, result = arithmetic.column_steps(503, 78, "-", NEVER)
        assert steps == ["3-8-0=-5", "0-7-1=-8", "5-0-1=4"]
        assert result == 425

    def test_forgetting_every_carry(self):
        steps, result = arithmetic.column_steps(478, 256, "+", ALWAYS)
        assert steps == ["8+6+0=14", "7+5+0=12", "4+2+0=6"]
        assert result == 624
        _, result = arithmetic.column_steps(503, 78, "-", ALWAYS)
        assert result == 535  # 3-8 -> 5, 0-7 -> 3, 5-0 -> 5: every borrow dropped.

    def test_exhaustive_two_digits(self):
        for a in range(100):
            for b in range(100):
                assert arithmetic.column_steps(a, b, "+", NEVER)[1] == a + b
                hi, lo = max(a, b), min(a, b)
                assert arithmetic.column_steps(hi, lo, "-", NEVER)[1] == hi - lo

    def test_extra_columns_work_zeros_and_take_the_final_carry(self):
        steps, result = arithmetic.column_steps(478, 256, "+", NEVER, extra_columns=2)
        assert steps == ["8+6+0=14", "7+5+1=13", "4+2+1=7", "0+0+0=0", "0+0+0=0"]
        assert result == 734
        steps, result = arithmetic.column_steps(999, 1, "+", NEVER, extra_columns=1)
        assert steps == ["9+1+0=10", "9+0+1=10", "9+0+1=10", "0+0+1=1"]
        assert result == 1000
        steps, result = arithmetic.column_steps(503, 78, "-", NEVER, extra_columns=1)
        assert steps == ["3-8-0=-5", "0-7-1=-8", "5-0-1=4", "0-0-0=0"]
        assert result == 425

    def test_product_steps(self):
        steps, result = arithmetic.product_steps(47, 26)
        assert steps == ["47*6=282", "47*20=940"]
        assert result == 1222


class TestSolve:

    def test_scratchpad_target(self):
        solution, result = arithmetic.solve(478, "+", 256, scratchpad=True, forget=NEVER)
        assert solution == "8+6+0=14 7+5+1=13 4+2+1=7 #### 734"
        assert result == 734

    def test_no_scratchpad_target(self):
        assert arithmetic.solve(47, "*", 26, scratchpad=False, forget=NEVER) == ("#### 1222", 1222)

    def test_example_answer_is_exact_even_when_teacher_errs(self):
        example = arithmetic.make_example(478, "+", 256, scratchpad=True, forget=ALWAYS)
        assert example == {"task": "arithmetic", "question": "478+256", "answer": "734",
                           "solution": "8+6+0=14 7+5+0=12 4+2+0=6 #### 624"}

    def test_problem_key_is_commutative_only_where_it_should_be(self):
        assert arithmetic.problem_key(5, "+", 3) == arithmetic.problem_key(3, "+", 5) == "3+5"
        assert arithmetic.problem_key(5, "*", 3) == "3*5"
        assert arithmetic.problem_key(5, "-", 3) == "5-3"
        assert arithmetic.example_key({"question": "478+256"}) == "256+478"


class TestGenerate:

    def take(self, config, n):
        stream = arithmetic.generate(config)
        return [next(stream) for _ in range(n)]

    def test_deterministic_and_within_knobs(self):
        config = data.ArithmeticConfig(digits=2, ops=("+", "-", "*"), seed=3)
        first, second = self.take(config, 300), self.take(config, 300)
        assert first == second
        ops = set()
        for example in first:
            a, op, b = re.fullmatch(r"(\d+)([-+*])(\d+)", example["question"]).groups()
            ops.add(op)
            assert 0 <= int(a) < 100 and 0 <= int(b) < 100
            assert int(example["answer"]) == {"+": int(a) + int(b), "-": int(a) - int(b),
                                              "*": int(a) * int(b)}[op]
            assert int(example["answer"]) >= 0
            assert stated(example["solution"]) == int(example["answer"])  # teacher_fraction=0
        assert ops == {"+", "-", "*"}

    def test_teacher_errs_only_on_problems_with_carries(self):
        config = data.ArithmeticConfig(digits=3, teacher_fraction=0.5, forget_carry_p=1.0)
        examples = self.take(config, 2000)
        wrong = [e for e in examples if stated(e["solution"]) != int(e["answer"])]
        # Half the targets come from the teacher; 3-digit sums carry with prob ~0.76.
        assert 0.3 < len(wrong) / len(examples) < 0.46
        for example in wrong:
            assert "+1=" not in example["solution"]  # the teacher never carried.

    def test_extra_columns_lengthen_solutions_and_change_nothing_else(self):
        plain = self.take(data.ArithmeticConfig(digits=3, teacher_fraction=0.5), 600)
        longer = self.take(
            data.ArithmeticConfig(digits=3, teacher_fraction=0.5, extra_columns=2), 600
        )
        extra = []
        for short, long in zip(plain, longer):
            assert (short["question"], short["answer"]) == (long["question"], long["answer"])
            a, b = re.fullmatch(r"(\d+)\+(\d+)", long["question"]).groups()
            columns = long["solution"].split(" ####")[0].split(" ")
            extra.append(len(columns) - max(len(a), len(b)))
            assert columns[max(len(a), len(b)):] in (["0+0+0=0"] * extra[-1],
                                                     ["0+0+1=1"] + ["0+0+0=0"] * (extra[-1] - 1))
        counts = np.bincount(extra, minlength=3)
        assert len(counts) == 3 and all(counts > 150), counts   # 0, 1, 2 about equally often

    def test_ramble_columns_lengthen_only_the_forgetful_teachers_solutions(self):
        plain = self.take(data.ArithmeticConfig(digits=3, teacher_fraction=0.5), 1000)
        rambling = self.take(data.ArithmeticConfig(digits=3, teacher_fraction=0.5,
                                                   ramble_columns=6), 1000)
        extra = {True: [], False: []}   # columns past the operands', by whether it is wrong
        for short, long in zip(plain, rambling):
            assert (short["question"], short["answer"]) == (long["question"], long["answer"])
            assert stated(short["solution"]) == stated(long["solution"])  # same teacher, same slips
            a, b = re.fullmatch(r"(\d+)\+(\d+)", long["question"]).groups()
            columns = long["solution"].split(" ####")[0].split(" ")
            extra[stated(long["solution"]) != int(long["answer"])].append(
                len(columns) - len(short["solution"].split(" ####")[0].split(" ")))
        # Every wrong target is the forgetful teacher's: 0..6 more columns, 3 on average.
        wrong = np.array(extra[True])
        assert set(np.unique(wrong)) == set(range(7)) and 2.6 < wrong.mean() < 3.4
        # Right targets: the exact teacher's (none) and the forgetful one's without a carry.
        right = np.array(extra[False])
        assert 0.1 < right.mean() < 1.5 and (right == 0).mean() > 0.6

    def test_calculator_fraction_makes_that_share_call_the_tool_and_changes_nothing_else(self):
        plain = self.take(data.ArithmeticConfig(digits=3, ops=("*",)), 1000)
        tools = self.take(
            data.ArithmeticConfig(digits=3, ops=("*",), calculator_fraction=0.3), 1000
        )
        calls = 0
        for worked, example in zip(plain, tools):
            assert (worked["question"], worked["answer"]) == (
                example["question"], example["answer"],
            )
            if example["solution"] != worked["solution"]:
                calls += 1
                assert example["solution"] == (f"<calculator>{example['question']}</calculator>"
                                               f"<result>{example['answer']}</result> "
                                               f"#### {example['answer']}")
        assert 0.25 < calls / len(tools) < 0.35

    def test_min_digits_draws_each_operand_size_uniformly(self):
        config = data.ArithmeticConfig(digits=4, min_digits=2, seed=5)
        sizes = []
        for example in self.take(config, 3000):
            a, b = re.fullmatch(r"(\d+)\+(\d+)", example["question"]).groups()
            sizes += [len(a), len(b)]   # exactly 2, 3 or 4 digits: no leading zeros
            assert stated(example["solution"]) == int(example["answer"]) == int(a) + int(b)
        counts = np.bincount(sizes, minlength=5)[2:]
        assert len(np.bincount(sizes)) == 5 and all(1800 < c < 2200 for c in counts), counts
        one = self.take(data.ArithmeticConfig(digits=3, min_digits=1, seed=5), 2000)
        assert {len(e["question"].split("+")[0]) for e in one} == {1, 2, 3}
        # Left at 0 it draws nothing new: the stream, and the dataset's name, stay as they were.
        assert "min_digits" not in data.ArithmeticConfig(digits=3).knobs()
        assert data.ArithmeticConfig(digits=3).name != data.ArithmeticConfig(
            digits=3, min_digits=1).name

    def test_seed_changes_the_stream(self):
        a = self.take(data.ArithmeticConfig(seed=0), 20)
        b = self.take(data.ArithmeticConfig(seed=1), 20)
        assert a != b


class TestConfig:

    def test_name_follows_the_knobs(self):
        assert data.ArithmeticConfig(digits=3).name == data.ArithmeticConfig(digits=3).name
        assert data.ArithmeticConfig(digits=3).name != data.ArithmeticConfig(digits=4).name
        assert data.ArithmeticConfig(digits=3).name.startswith("arithmetic_")

    @pytest.mark.parametrize("kwargs, message", [
        ({"digits": 0}, "arithmetic.digits must be >= 1, got 0"),
        ({"digits": 3, "min_digits": 4}, "arithmetic.min_digits must be in 0..digits (3), got 4"),
        ({"ops": ("/",)}, "arithmetic.ops must be a non-empty subset"),
        ({"teacher_fraction": 1.5}, "arithmetic.teacher_fraction must be in [0, 1]"),
        ({"extra_columns": -1}, "arithmetic.extra_columns must be >= 0, got -1"),
        ({"calculator_fraction": -0.1}, "arithmetic.calculator_fraction must be in [0, 1]"),
        ({"num_train": -1}, "arithmetic.num_train must be >= 0, got -1"),
        ({"test_fraction": 0.0}, "arithmetic.test_fraction must be in (0, 1)"),
    ])
    def test_errors_name_the_field(self, kwargs, message):
        with pytest.raises(ValueError, match=re.escape(message)):
            data.ArithmeticConfig(**kwargs)


class TestBuilder:

    def test_build_and_read_without_tensorflow(self, data_dir, arithmetic_config):
        train = data.data_source("arithmetic", split="train", data_dir=data_dir,
                                 config=arithmetic_config)
        test = data.data_source("arithmetic", split="test", data_dir=data_dir,
                                config=arithmetic_config)
        assert (len(train), len(test)) == (300, 60)
        example = data.decode_example(train[0])
        assert set(example) == {"task", "question", "answer", "solution"}
        assert all(isinstance(v, str) for v in example.values())
        a, b = example["question"].split("+")
        assert int(example["answer"]) == int(a) + int(b)
        assert "tensorflow" not in sys.modules

    def test_splits_are_disjoint(self, data_dir, arithmetic_config):
        keys = {}
        for split in ("train", "test"):
            source = data.data_source("arithmetic", split=split, data_dir=data_dir,
                                      config=arithmetic_config)
            keys[split] = [arithmetic.example_key(data.decode_example(r)) for r in source]
            assert len(set(keys[split])) == len(keys[split])  # no duplicates within a split
        assert not set(keys["train"]) & set(keys["test"])
        for key in keys["test"]:  # a test problem's mirror (b+a) is not in train either
            a, b = key.split("+")
            assert arithmetic.problem_key(int(b), "+", int(a)) not in keys["train"]

    def test_too_small_a_task_is_a_clear_error(self, tmp_path):
        config = data.ArithmeticConfig(digits=1, num_train=10, num_test=200)
        with pytest.raises(ValueError, match="fewer than num_test=200; lower num_test"):
            data.data_source("arithmetic", split="test", data_dir=str(tmp_path), config=config)

    def test_predefined_config_by_name(self, tmp_path):
        builder = data.Arithmetic(config="add3_teacher", data_dir=str(tmp_path))
        assert builder.builder_config.teacher_fraction == 0.5
        assert builder.builder_config.digits == 3
