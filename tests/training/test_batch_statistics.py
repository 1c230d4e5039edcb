"""The step metrics the ablations read: where the advantage weight sits, the spread of
the updates' gradient norms."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from grpo_jax import objectives
from grpo_jax.training import metrics as metrics_lib, rollout, steps


def _numpy_statistics(advantages, correct, row_valid, mask, group_size):
    """The same quantities, one group at a time in plain Python and numpy."""
    advantages, mask = np.asarray(advantages, np.float64), np.asarray(mask, np.float64)
    if advantages.ndim == 2:
        weight = [np.abs(a[m > 0]).mean() if m.sum() else 0.0 for a, m in zip(advantages, mask)]
    else:
        weight = np.abs(advantages)
    weight = np.asarray(weight) * row_valid
    carried = {"nearly_solved": 0.0, "nearly_failed": 0.0}
    counted = {"nearly_solved": 0, "nearly_failed": 0}
    real = 0
    for start in range(0, len(correct), group_size):
        rows = slice(start, start + group_size)
        solved = np.mean(correct[rows])
        kind = ("nearly_solved" if 0.75 <= solved < 1 else
                "nearly_failed" if 0 < solved <= 0.25 else None)
        real += bool(row_valid[start])
        if kind:
            carried[kind] += weight[rows].sum()
            counted[kind] += bool(row_valid[start])
    total = weight.sum()
    out = {}
    for kind in carried:
        out[f"advantage_share_{kind}"] = carried[kind] / total if total else 0.0
        out[f"groups_{kind}"] = counted[kind] / max(real, 1)
    return out


# Groups of 4: 3 right (nearly solved), 1 right (nearly failed), 2 right, all right,
# none right, and a padding group (row_valid False) that would count as nearly solved.
CORRECT = np.array([1, 1, 1, 0,  1, 0, 0, 0,  1, 1, 0, 0,  1, 1, 1, 1,  0, 0, 0, 0,  1, 1, 1, 0],
                   bool)
VALID = np.repeat([True, True, True, True, True, False], 4)


class TestAdvantageStatistics:

    def _check(self, advantages, mask):
        got = jax.jit(metrics_lib.advantage_statistics, static_argnames="group_size")(
            jnp.asarray(advantages), jnp.asarray(CORRECT), jnp.asarray(VALID), jnp.asarray(mask),
            group_size=4)
        want = _numpy_statistics(advantages, CORRECT, VALID, mask, 4)
        assert got.keys() == want.keys()
        for key in want:
            np.testing.assert_allclose(float(got[key]), want[key], rtol=1e-6, err_msg=key)
        return {k: float(v) for k, v in got.items()}

    def test_per_answer_advantages(self):
        advantages = np.random.default_rng(0).normal(size=24).astype(np.float32)
        got = self._check(advantages, np.ones((24, 3), np.float32))
        # 5 real groups, one of each kind; the padding group carries no weight.
        assert got["groups_nearly_solved"] == got["groups_nearly_failed"] == pytest.approx(0.2)

    def test_group_std_weighs_the_extreme_groups_more_than_no_division(self):
        """GRPO's division by the group std against Dr. GRPO's none, by hand: a 3-of-4
        group has std sqrt(3/16) = 0.433, so |A| sums to 1.5 / 0.433 = 3.46 (1.5 without
        division); a 2-of-4 group to 4 (2); all-equal groups to 0."""
        rewards = jnp.asarray(CORRECT, jnp.float32)
        std = objectives.group_advantages(rewards, 4, scale="group")
        none = objectives.group_advantages(rewards, 4, scale="none")
        mask = np.ones((24, 3), np.float32)
        with_std, without = self._check(np.asarray(std), mask), self._check(np.asarray(none), mask)
        total_std = 2 * 1.5 / np.sqrt(3 / 16) + 2 / 0.5   # the real rows: groups 0, 1, 2
        assert with_std["advantage_share_nearly_solved"] == pytest.approx(
            (1.5 / np.sqrt(3 / 16)) / total_std, rel=1e-4)
        assert without["advantage_share_nearly_solved"] == pytest.approx(1.5 / 5.0, rel=1e-6)
        assert with_std["advantage_share_nearly_failed"] > without["advantage_share_nearly_failed"]

    def test_per_token_advantages_average_over_the_loss_tokens(self):
        rng = np.random.default_rng(1)
        advantages = rng.normal(size=(24, 5)).astype(np.float32)
        mask = (rng.random((24, 5)) < 0.7).astype(np.float32)
        mask[3] = 0.0   # a row without loss tokens weighs 0
        self._check(advantages, mask)

    def test_no_weight_at_all_gives_zero_shares(self):
        got = self._check(np.zeros(24, np.float32), np.ones((24, 3), np.float32))
        assert got["advantage_share_nearly_solved"] == got["advantage_share_nearly_failed"] == 0.0


def test_update_metrics_are_the_mean_over_updates_and_the_spread_of_the_gradient_norms():
    norms = iter([1.0, 2.0, 3.0, 6.0])
    seen = []

    def update(params, opt_state, batch, index, plan=None):
        assert plan is None   # no packing planner given
        seen.append(sorted(index.tolist()))
        return (
            params + 1, opt_state, {"grad_norm": np.float32(next(norms)), "loss": np.float32(2.0)},
        )

    params, _, metrics = steps.update_on_batch(update, 0, None, {"mask": np.ones((8, 3))},
                                               (0, 1), epochs=2, minibatches=2)
    assert params == 4
    assert sorted(seen[0] + seen[1]) == sorted(seen[2] + seen[3]) == list(range(8))
    assert metrics == pytest.approx({"grad_norm": 3.0, "loss": 2.0,
                                     "grad_norm_std": np.sqrt((4 + 1 + 0 + 9) / 4)})


def test_each_update_of_a_step_gets_its_own_dropout_key():
    """update u of the step's epochs x minibatches gets fold_in(the step's key, u)."""
    keys = []

    def update(params, opt_state, batch, index, plan=None, rng=None):
        keys.append(jax.random.key_data(rng))
        return params, opt_state, {"grad_norm": np.float32(1.0)}

    step_key = jax.random.key(3)
    steps.update_on_batch(update, 0, None, {"mask": np.ones((8, 3))}, (0, 1), epochs=2,
                          minibatches=2, dropout_key=step_key)
    expected = [jax.random.key_data(jax.random.fold_in(step_key, u)) for u in range(4)]
    np.testing.assert_array_equal(np.stack(keys), np.stack(expected))
    assert len({tuple(np.asarray(k)) for k in keys}) == 4


def test_the_trainer_judges_its_rows_on_filtering_signal():
  """G = 2, hand-computed: (all wrong, one cut by the overlong penalty), (all right, one
  penalised), (one right, rewards tied). DAPO's test keeps only the third group; comparing
  the shaped reward keeps the first two."""
  rows = {"rewards": jnp.asarray([0.0, -0.3, 1.0, 0.8, 0.5, 0.5], jnp.float32),
          "correct": jnp.asarray([False, False, True, True, True, False])}
  assert int(rollout.groups_with_signal(rows, 2, "correct")) == 1
  assert int(rollout.groups_with_signal(rows, 2, "reward")) == 2


def test_the_length_of_a_class_no_row_is_in_is_left_out_of_the_row():
    """`response_length_correct` / `_wrong` are means over the rows of their class (by
    hand: lengths 3, 5, 9 with the first correct: 3 and 7); a step that drew no correct
    answer leaves `response_length_correct` out instead of logging 0, so the
    wrong-minus-right difference the ablations report is never a wrong answer's length
    minus 0."""
    def statistics(correct, lengths):
        n = len(lengths)
        draw = {"rewards": jnp.asarray(correct, jnp.float32), "correct": jnp.asarray(correct),
                "lengths": jnp.asarray(lengths), "truncated": jnp.zeros(n, bool)}
        return rollout.host_statistics(rollout.rollout_statistics(
            (draw,), jnp.ones(()), group_size=n, signal="correct"))
    mixed = statistics([True, False, False], [3, 5, 9])
    assert mixed["response_length_correct"] == 3.0 and mixed["response_length_wrong"] == 7.0
    none_right = statistics([False, False], [4, 6])
    assert "response_length_correct" not in none_right
    assert none_right["response_length_wrong"] == 5.0 and none_right["accuracy"] == 0.0
    all_right = statistics([True, True], [4, 6])
    assert "response_length_wrong" not in all_right and all_right["response_length_correct"] == 5
    assert all(isinstance(v, float) for v in mixed.values())
