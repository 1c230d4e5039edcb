"""The small countdown generator: expressions, problems, the check tool's traces, the builder."""

import ast
import collections
import re

import numpy as np
import pytest

from grpo_jax import data, environments, rewards
from grpo_jax.data import countdown

OPS = ("+", "-", "*", "/")


def value(text):
    """The exact value of an expression text, by the graders' own parser."""
    return rewards.evaluate_expression(rewards.parse_expression(text)[0])


def tree(text):
    """The parse tree of an expression text, as a comparable string."""
    return ast.dump(rewards.parse_expression(text)[0])


def take(config, n):
    stream = countdown.generate(config)
    return [next(stream) for _ in range(n)]


class TestRandomExpression:

    def test_a_seeded_draw(self):
        # hand-checked: 9+3+7 uses each of 3, 7, 9 once and equals 19
        assert countdown.random_expression(np.random.default_rng(0), [3, 7, 9], ("+", "*")) == (
            "9+3+7", 19)

    def test_text_has_the_value_and_no_parentheses_it_could_drop(self):
        rng = np.random.default_rng(1)
        seen = 0
        for _ in range(400):
            numbers = [int(n) for n in rng.integers(1, 10, size=int(rng.integers(2, 6)))]
            drawn = countdown.random_expression(rng, numbers, OPS)
            if drawn is None:   # divided by zero
                continue
            text, exact = drawn
            assert value(text) == exact
            assert sorted(rewards.parse_expression(text)[1]) == sorted(numbers)
            # every pair of parentheses is needed: without it the text parses to another tree
            for start in [m.start() for m in re.finditer(r"\(", text)]:
                depth = 0
                for end in range(start, len(text)):
                    depth += {"(": 1, ")": -1}.get(text[end], 0)
                    if depth == 0:
                        break
                dropped = text[:start] + text[start + 1:end] + text[end + 1:]
                assert tree(dropped) != tree(text), (text, dropped)
                seen += 1
        assert seen > 100   # the draws had parentheses to test

    def test_division_by_zero_is_none(self):
        rng = np.random.default_rng(0)
        draws = [countdown.random_expression(rng, [2, 2, 5], ("-", "/")) for _ in range(200)]
        assert None in draws   # 5/(2-2) among them
        assert all(d is None or value(d[0]) == d[1] for d in draws)


class TestGenerate:

    def test_problems_within_the_knobs_and_the_answer_solves_them(self):
        config = data.CountdownConfig(count=4, max_number=12, max_target=50, ops=("+", "*"),
                                      seed=3)
        examples = take(config, 300)
        assert examples == take(config, 300)   # deterministic
        for example in examples:
            numbers, target = example["numbers"], example["target"]
            assert len(numbers) == 4 and all(1 <= n <= 12 for n in numbers)
            assert 1 <= target <= 50
            assert example["question"] == " ".join(map(str, numbers)) + f" -> {target}"
            assert sorted(rewards.parse_expression(example["answer"])[1]) == sorted(numbers)
            assert set(re.findall(r"[-+*/]", example["answer"])) <= {"+", "*"}
            assert value(example["answer"]) == target
            assert example["solution"] == f"<answer>{example['answer']}</answer>"
        assert take(data.CountdownConfig(seed=4), 20) != take(data.CountdownConfig(seed=3), 20)

    def test_check_fraction_makes_that_share_search_with_the_tool(self):
        plain = take(data.CountdownConfig(), 600)
        searching = take(data.CountdownConfig(check_fraction=0.5, max_misses=2), 600)
        environment = environments.make("countdown", max_calls=3)
        checks = []
        for direct, example in zip(plain, searching):
            assert ({k: v for k, v in direct.items() if k != "solution"}
                    == {k: v for k, v in example.items() if k != "solution"})
            assert rewards.countdown_reward("", example["solution"], example) == 1.0
            if example["solution"] == direct["solution"]:
                continue
            calls = re.findall(r"<check>(.*?)</check>(<result>.*?</result>)", example["solution"])
            checks.append(len(calls))
            assert example["solution"] == "".join(f"<check>{e}</check>{r}" for e, r in calls) + (
                f"<answer>{example['answer']}</answer>")
            *misses, (last, reply) = calls
            assert last == example["answer"]
            assert reply == f"<result>{example['target']} (reaches the target)</result>"
            assert len({e for e, _ in misses}) == len(misses) and last not in {e for e, _ in misses}
            for turn, (expression, reply) in enumerate(calls):   # what the environment replies
                turns = [f"<check>{e}</check>" for e, _ in calls[:turn + 1]]
                assert environment.step(example, turns).observation == reply
            distances = []
            for (
                expression, reply,
            ) in misses:  # valid expressions over all the numbers, off the target
                assert collections.Counter(rewards.parse_expression(expression)[1]) == (
                    collections.Counter(example["numbers"]))
                assert reply.endswith("(not the target)</result>")
                distances.append(abs(value(expression) - example["target"]))
            assert distances == sorted(distances, reverse=True)   # each try nearer than the last
            assert len({value(e) for e, _ in misses}) == len(misses)   # each tells something new
        assert 0.45 < len(checks) / len(searching) < 0.55
        counts = collections.Counter(checks)   # 0, 1 or 2 misses, about equally often
        assert set(counts) == {1, 2, 3} and min(counts.values()) > 60, counts

    @pytest.mark.parametrize("kwargs, message", [
        ({"count": 1}, "countdown.count must be >= 2, got 1"),
        ({"max_number": 0}, "countdown.max_number must be >= 1, got 0"),
        ({"max_misses": -1}, "countdown.max_misses must be >= 0, got -1"),
        ({"ops": ("^",)}, "countdown.ops must be a non-empty subset"),
        ({"check_fraction": 1.5}, "countdown.check_fraction must be in [0, 1], got 1.5"),
    ])
    def test_errors_name_the_field(self, kwargs, message):
        with pytest.raises(ValueError, match=re.escape(message)):
            data.CountdownConfig(**kwargs)


def test_plain_prompt_is_the_compact_question():
    example = countdown.make_example([3, 7, 9], 30, "3*7+9")
    assert data.format_prompt(example) == "3 7 9 -> 30:"
    assert example["solution"] == "<answer>3*7+9</answer>"


def test_builder_splits_are_disjoint_and_keep_numbers_and_target(data_dir):
    config = data.CountdownConfig(num_train=200, num_test=40, check_fraction=0.5)
    keys = {}
    for split in ("train", "test"):
        source = data.data_source("countdown", split=split, data_dir=data_dir, config=config)
        examples = [data.decode_example(r) for r in source]
        assert len(examples) == getattr(config, f"num_{split}")
        keys[split] = {countdown.example_key(e) for e in examples}
        assert len(keys[split]) == len(examples)
        assert all(rewards.countdown_reward("", e["solution"], e) == 1.0 for e in examples)
    assert not keys["train"] & keys["test"]
