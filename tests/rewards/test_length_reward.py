"""Length shaping through objectives.overlong_penalty: a hand-computed table of lengths."""

import numpy as np
import pytest

from grpo_jax import rewards

# (max_len, cache_len, completion length in tokens, expected penalty)
TABLE = [
    # max_len 20, cache 4: free up to 16, then -1/4 per token, -1 from 20 on
    *[(20, 4, n, 0.0) for n in (0, 1, 5, 10, 15, 16)],
    (20, 4, 17, -0.25),
    (20, 4, 18, -0.5),
    (20, 4, 19, -0.75),
    (20, 4, 20, -1.0),
    (20, 4, 21, -1.0),
    (20, 4, 100, -1.0),
    (20, 4, 10**9, -1.0),
    # DAPO's setting: 20480 tokens, cache 4096, free up to 16384
    (20480, 4096, 1, 0.0),
    (20480, 4096, 8000, 0.0),
    (20480, 4096, 16383, 0.0),
    (20480, 4096, 16384, 0.0),
    (20480, 4096, 16385, -1 / 4096),
    (20480, 4096, 17408, -0.25),
    (20480, 4096, 18432, -0.5),
    (20480, 4096, 19456, -0.75),
    (20480, 4096, 20479, -4095 / 4096),
    (20480, 4096, 20480, -1.0),
    (20480, 4096, 20481, -1.0),
    (20480, 4096, 40960, -1.0),
    # max_len 1024, cache 256: free up to 768
    *[(1024, 256, n, 0.0) for n in (3, 64, 500, 767, 768)],
    (1024, 256, 769, -1 / 256),
    (1024, 256, 800, -0.125),
    (1024, 256, 832, -0.25),
    (1024, 256, 896, -0.5),
    (1024, 256, 960, -0.75),
    (1024, 256, 1000, -232 / 256),
    (1024, 256, 1023, -255 / 256),
    (1024, 256, 1024, -1.0),
    (1024, 256, 1025, -1.0),
    (1024, 256, 4096, -1.0),
    # the whole budget is the zone (cache_len == max_len)
    (8, 8, 0, 0.0),
    (8, 8, 1, -0.125),
    (8, 8, 4, -0.5),
    (8, 8, 7, -0.875),
    (8, 8, 8, -1.0),
    (8, 8, 9, -1.0),
    # a one-token zone: a hard cliff at max_len
    (512, 1, 510, 0.0),
    (512, 1, 511, 0.0),
    (512, 1, 512, -1.0),
    (512, 1, 513, -1.0),
    # tiny CPU models
    (64, 16, 16, 0.0),
    (64, 16, 48, 0.0),
    (64, 16, 52, -0.25),
    (64, 16, 56, -0.5),
    (64, 16, 60, -0.75),
    (64, 16, 63, -15 / 16),
    (64, 16, 64, -1.0),
    (64, 16, 65, -1.0),
    # a zone of 3 tokens: thirds
    (10, 3, 7, 0.0),
    (10, 3, 8, -1 / 3),
    (10, 3, 9, -2 / 3),
    (10, 3, 10, -1.0),
    (10, 3, 11, -1.0),
]


def test_table_is_big_enough():
    assert len(TABLE) >= 60


@pytest.mark.parametrize("max_len, cache_len, length, expected", TABLE)
def test_overlong_reward(max_len, cache_len, length, expected):
    value = rewards.overlong_reward(
        ["p"], ["c"], [{"completion_length": length}], max_len=max_len, cache_len=cache_len
    )
    np.testing.assert_allclose(value, [expected], rtol=1e-6, atol=1e-7)


def test_whole_table_in_one_call_per_setting():
    for setting in {(m, c) for m, c, _, _ in TABLE}:
        rows = [row for row in TABLE if row[:2] == setting]
        examples = [{"completion_length": length} for _, _, length, _ in rows]
        values = rewards.overlong_reward(
            [""] * len(rows), [""] * len(rows), examples, max_len=setting[0], cache_len=setting[1]
        )
        np.testing.assert_allclose(values, [row[3] for row in rows], rtol=1e-6, atol=1e-7)


def test_score_batch_adds_lengths_and_weights_the_penalty():
    specs = rewards.as_specs(
        [("format", 1.0, {"tags": ["answer"]}), ("overlong", 0.5, {"max_len": 20, "cache_len": 4})]
    )
    completions = ["<answer>4</answer>", "<answer>4</answer>", "4"]
    values, metrics = rewards.score_batch(
        specs, ["Q"] * 3, completions, [{}] * 3, completion_lengths=[10, 18, 25]
    )
    np.testing.assert_allclose(values, [1.0, 1.0 - 0.25, -0.5])
    assert metrics["rewards/overlong"] == pytest.approx((0.0 - 0.5 - 1.0) / 3)


def test_missing_lengths_are_counted_not_raised():
    specs = rewards.as_specs([("overlong", 1.0, {"max_len": 20, "cache_len": 4})])
    values, metrics = rewards.score_batch(specs, ["Q"] * 2, ["a", "b"], [{}] * 2)
    np.testing.assert_array_equal(values, [0.0, 0.0])
    assert metrics["reward_errors/overlong"] == 2.0


def test_missing_length_message_names_the_fix():
    with pytest.raises(KeyError, match="completion_lengths="):
        rewards.overlong_reward(["p"], ["c"], [{}], max_len=20, cache_len=4)


def test_registered_as_batch_reward():
    assert rewards.get_reward("overlong").where == "batch"


@pytest.mark.parametrize("options, lengths, budget_tokens, expected", [
    ({"budget": 10}, [3, 10, 11, 40], 40, [1.0, 1.0, 0.0, 0.0]),
    ({"budget_fraction": 0.5}, [3, 20, 21, 40], 40, [1.0, 1.0, 0.0, 0.0]),
    ({"budget_fraction": 0.5}, [3, 20, 21, 40], 80, [1.0, 1.0, 1.0, 1.0]),   # follows the budget
])
def test_length_budget_reward(options, lengths, budget_tokens, expected):
    examples = [{"completion_length": n, "max_new_tokens": budget_tokens} for n in lengths]
    got = rewards.length_budget_reward([""] * 4, [""] * 4, examples, **options)
    np.testing.assert_array_equal(got, expected)


def test_overlong_reward_follows_the_run_budget():
    """cache_fraction and the default max_len come from the run's max_new_tokens."""
    def penalty(length, budget):
        example = {"completion_length": length, "max_new_tokens": budget}
        return float(rewards.overlong_reward([""], [""], [example], cache_fraction=0.2)[0])
    assert penalty(16, 20) == 0.0 and penalty(18, 20) == -0.5 and penalty(21, 20) == -1.0
    assert penalty(36, 40) == -0.5 and penalty(18, 40) == 0.0   # budget doubled: zone doubled
    with pytest.raises(ValueError, match="exactly one of the options cache_len"):
        rewards.overlong_reward([""], [""], [{"completion_length": 1, "max_new_tokens": 4}])
