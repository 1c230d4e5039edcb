"""`grpo_jax.objectives` against independent float64 numpy references.

Every function is called through `jax.jit` (hyper-parameters bound with
`functools.partial`) on float32 inputs; the references in `numpy_reference.py` get
the same float32 values widened to float64, so the only differences left are float32
rounding inside the code under test. Masks are ragged right-padded rows that include
a fully masked row and a length-1 row; masked positions hold garbage, which must not
leak into values or gradients.
"""

import functools

import hypothesis
from hypothesis import strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from grpo_jax import objectives as obj

from tests.objectives import numpy_reference as ref

RTOL, ATOL = 1e-5, 1e-6
# Row lengths of the standard ragged batch: a fully masked row (0) and a length-1 row.
LENGTHS = (7, 0, 1, 4, 7, 3, 5, 2)
T = 8
# Few, reproducible examples; no shrinking (each shrink step recompiles under jit).
FEW = hypothesis.settings(max_examples=10, deadline=None, derandomize=True,
                          phases=(hypothesis.Phase.explicit, hypothesis.Phase.generate))


def jitted(fn, **kwargs):
  return jax.jit(functools.partial(fn, **kwargs))


def close(actual, expected, rtol=RTOL, atol=ATOL):
  np.testing.assert_allclose(np.asarray(actual, dtype=np.float64), expected, rtol=rtol,
                             atol=atol)


def f32(x):
  return np.asarray(x, dtype=np.float32)


def ragged_mask(lengths=LENGTHS, length=T):
  mask = np.zeros((len(lengths), length), np.float32)
  for b, n in enumerate(lengths):
    mask[b, :n] = 1.0
  return mask


def signed_advantages(rng, shape):
  """Advantages with both signs and exact zeros."""
  size = int(np.prod(shape))
  if tuple(shape) == (len(LENGTHS),):
    # Per row: each sign on long rows of LENGTHS, zero on the length-1 row and another.
    signs = np.array([1.0, 1.0, 0.0, -1.0, -1.0, 0.0, 1.0, -1.0])
  else:
    signs = np.resize(np.array([1.0, -1.0, 0.0]), size)
    rng.shuffle(signs)
  return f32(signs.reshape(shape) * rng.uniform(0.1, 2.0, shape))


def policy_inputs(seed, *, spread=0.6, row_offset=0.0, lengths=LENGTHS, length=T):
  """(logp, old_logp, mask) with logp - old_logp in [-spread, spread] + a row offset.

  Masked positions hold garbage far outside the clamp range.
  """
  rng = np.random.default_rng(seed)
  mask = ragged_mask(lengths, length)
  shape = mask.shape
  old = rng.uniform(-3.0, -0.05, shape)
  offsets = rng.uniform(-row_offset, row_offset, (shape[0], 1))
  logp = old + offsets + rng.uniform(-spread, spread, shape)
  logp = np.where(mask > 0, logp, rng.normal(0.0, 40.0, shape))
  old = np.where(mask > 0, old, rng.normal(0.0, 40.0, shape))
  return f32(logp), f32(old), mask


def assert_masked_zero(x, mask):
  np.testing.assert_array_equal(np.asarray(x)[np.asarray(mask) == 0], 0.0)


# ================================================================== advantages


class TestGroupAdvantages:

  @pytest.mark.parametrize("scale", ["group", "batch", "none"])
  @pytest.mark.parametrize("ddof", [0, 1])
  def test_continuous_rewards(self, scale, ddof):
    rng = np.random.default_rng(0)
    rewards = rng.normal(0.3, 1.5, 20)
    rewards[5:10] = 0.25  # one group of equal rewards
    rewards = f32(rewards)
    got = jitted(obj.group_advantages, group_size=5, scale=scale, ddof=ddof)(rewards)
    close(got, ref.group_advantages(rewards, 5, scale=scale, ddof=ddof))
    np.testing.assert_array_equal(np.asarray(got)[5:10], 0.0)

  @FEW
  @hypothesis.given(num_groups=st.integers(1, 4), group_size=st.integers(2, 8),
                    seed=st.integers(0, 2**31 - 1),
                    scale=st.sampled_from(["group", "batch", "none"]), ddof=st.sampled_from([0, 1]))
  def test_binary_rewards(self, num_groups, group_size, seed, scale, ddof):
    rng = np.random.default_rng(seed)
    rewards = f32(rng.integers(0, 2, num_groups * group_size))
    got = jitted(obj.group_advantages, group_size=group_size, scale=scale, ddof=ddof)(rewards)
    close(got, ref.group_advantages(rewards, group_size, scale=scale, ddof=ddof))

  @pytest.mark.parametrize("scale", ["group", "batch", "none"])
  @pytest.mark.parametrize("group_size", [3, 7])
  def test_equal_group_is_exactly_zero(self, scale, group_size):
    # 0.1 is not exact in float32: a float mean would leave a residue.
    rewards = f32(np.concatenate([np.full(group_size, 0.1), np.arange(group_size)]))
    got = np.asarray(jitted(obj.group_advantages, group_size=group_size, scale=scale)(rewards))
    np.testing.assert_array_equal(got[:group_size], 0.0)
    close(got, ref.group_advantages(rewards, group_size, scale=scale))

  def test_group_size_one(self):
    rewards = f32([0.5, -1.0, 2.0])
    got = jitted(obj.group_advantages, group_size=1)(rewards)
    np.testing.assert_array_equal(np.asarray(got), 0.0)

  @pytest.mark.parametrize("ddof,pos,neg", [(0, 0.38, -2.65), (1, 0.35, -2.47)])
  def test_seed_worked_example(self, ddof, pos, neg):
    rewards = f32([1, 1, 1, 1, 1, 1, 1, 0])
    got = np.asarray(jitted(obj.group_advantages, group_size=8, ddof=ddof)(rewards))
    close(got, ref.group_advantages(rewards, 8, ddof=ddof))
    np.testing.assert_allclose(got, [pos] * 7 + [neg], atol=5e-3)


class TestRlooAdvantages:

  @pytest.mark.parametrize("group_size", [2, 3, 4, 8])
  def test_matches_reference(self, group_size):
    rng = np.random.default_rng(group_size)
    rewards = f32(rng.normal(0.0, 2.0, 3 * group_size))
    rewards[:group_size] = 0.7  # equal group
    got = jitted(obj.rloo_advantages, group_size=group_size)(rewards)
    close(got, ref.rloo_advantages(rewards, group_size))
    np.testing.assert_array_equal(np.asarray(got)[:group_size], 0.0)

  def test_equals_scaled_centred_reward(self):
    # The spec's second form, G/(G-1) (r_i - mean), checked on the reference itself.
    rng = np.random.default_rng(1)
    rewards = rng.normal(size=12)
    expected = []
    for g in rewards.reshape(3, 4):
      expected.extend(4 / 3 * (g - g.mean()))
    close(ref.rloo_advantages(rewards, 4), np.array(expected), rtol=1e-12, atol=1e-12)

  def test_group_size_below_two_is_value_error(self):
    with pytest.raises(ValueError):
      jitted(obj.rloo_advantages, group_size=1)(f32([1.0, 0.0]))


class TestReinforcePPAdvantages:

  @pytest.mark.parametrize("gamma", [1.0, 0.9])
  @pytest.mark.parametrize("group_size", [None, 4])
  @pytest.mark.parametrize("with_token_rewards", [False, True])
  def test_matches_reference(self, gamma, group_size, with_token_rewards):
    rng = np.random.default_rng(7)
    mask = ragged_mask()
    rewards = f32(rng.normal(0.0, 1.0, mask.shape[0]))
    token_rewards = f32(rng.normal(0.0, 0.1, mask.shape)) if with_token_rewards else None
    fn = jitted(obj.reinforce_pp_advantages, gamma=gamma, group_size=group_size)
    got = fn(rewards, mask, token_rewards=token_rewards)
    expected = ref.reinforce_pp_advantages(rewards, mask, gamma=gamma, group_size=group_size,
                                           token_rewards=token_rewards)
    close(got, expected)
    assert_masked_zero(got, mask)

  def test_docstring_example(self):
    got = jitted(obj.reinforce_pp_advantages)(f32([1.0, 0.0]), np.ones((2, 2), np.float32))
    close(got, ref.reinforce_pp_advantages([1.0, 0.0], np.ones((2, 2))))

  @pytest.mark.parametrize("gamma", [1.0, 0.8])
  def test_mask_with_holes_discounts_over_valid_tokens(self, gamma):
    # Valid tokens need not be contiguous: the discount counts valid tokens only.
    mask = f32([[1, 0, 1, 1, 0, 0], [0, 1, 1, 0, 1, 0], [1, 1, 1, 1, 1, 1]])
    rewards = f32([1.0, -0.5, 0.25])
    got = jitted(obj.reinforce_pp_advantages, gamma=gamma)(rewards, mask)
    close(got, ref.reinforce_pp_advantages(rewards, mask, gamma=gamma))
    assert_masked_zero(got, mask)


class TestGdpoAdvantages:

  @pytest.mark.parametrize("weights", [None, (1.0, 0.5, 2.0)])
  def test_matches_reference(self, weights):
    rng = np.random.default_rng(3)
    rewards = np.stack([rng.integers(0, 2, 12), rng.normal(0, 5, 12), rng.uniform(0, 1, 12)], -1)
    rewards[0:4, 1] = 2.0  # one reward equal within one group
    rewards = f32(rewards)
    fn = jitted(obj.gdpo_advantages, group_size=4,
                weights=None if weights is None else jnp.asarray(weights))
    close(fn(rewards), ref.gdpo_advantages(rewards, 4, weights=weights))

  def test_docstring_example(self):
    rewards = f32([[1, 0], [0, 0], [1, 1], [1, 0]])
    got = jitted(obj.gdpo_advantages, group_size=2)(rewards)
    close(got, ref.gdpo_advantages(rewards, 2))


class TestGae:

  def _inputs(self, seed, lengths=LENGTHS):
    rng = np.random.default_rng(seed)
    mask = ragged_mask(lengths)
    rewards = f32(rng.normal(0.0, 0.2, mask.shape))
    values = f32(rng.normal(0.0, 1.0, mask.shape))
    return rewards, values, mask

  @pytest.mark.parametrize("gamma,lam", [(1.0, 1.0), (0.99, 0.95), (0.9, 0.0)])
  def test_scalar_lambda(self, gamma, lam):
    rewards, values, mask = self._inputs(0)
    adv, ret = jitted(obj.gae, gamma=gamma, lam=lam)(rewards, values, mask)
    exp_adv, exp_ret = ref.gae(rewards, values, mask, gamma=gamma, lam=lam)
    close(adv, exp_adv)
    close(ret, exp_ret)
    assert_masked_zero(adv, mask)
    assert_masked_zero(ret, mask)

  @pytest.mark.parametrize("per_row", [True, False])
  def test_traced_lambda(self, per_row):
    # lam as an array argument of the jitted function: [B] per sequence, or a scalar.
    rewards, values, mask = self._inputs(1)
    lam = np.random.default_rng(1).uniform(0.0, 1.0, mask.shape[0])
    lam = f32(lam if per_row else lam[0])
    adv, ret = jitted(obj.gae, gamma=0.97)(rewards, values, mask, lam=lam)
    exp_adv, exp_ret = ref.gae(rewards, values, mask, gamma=0.97, lam=lam)
    close(adv, exp_adv)
    close(ret, exp_ret)

  def test_length_adaptive_lambda_feeds_gae(self):
    rewards, values, mask = self._inputs(2)
    lengths = mask.sum(-1)
    lam = jitted(obj.length_adaptive_lambda, alpha=0.3)(lengths)
    adv, _ = jitted(obj.gae, gamma=1.0)(rewards, values, mask, lam=lam)
    expected, _ = ref.gae(rewards, values, mask, gamma=1.0,
                          lam=ref.length_adaptive_lambda(lengths, alpha=0.3))
    close(adv, expected)

  def test_mask_with_holes_uses_next_valid_value(self):
    mask = f32([[1, 0, 1, 1, 0, 0], [0, 1, 1, 0, 1, 0]])
    rng = np.random.default_rng(4)
    rewards, values = f32(rng.normal(size=mask.shape)), f32(rng.normal(size=mask.shape))
    adv, ret = jitted(obj.gae, gamma=0.9, lam=0.8)(rewards, values, mask)
    exp_adv, exp_ret = ref.gae(rewards, values, mask, gamma=0.9, lam=0.8)
    close(adv, exp_adv)
    close(ret, exp_ret)

  def test_docstring_example(self):
    adv, ret = jitted(obj.gae, gamma=1.0, lam=1.0)(f32([[0.0, 1.0]]), f32([[0.5, 0.5]]),
                                                   np.ones((1, 2), np.float32))
    exp_adv, exp_ret = ref.gae([[0.0, 1.0]], [[0.5, 0.5]], np.ones((1, 2)), gamma=1.0, lam=1.0)
    close(adv, exp_adv)
    close(ret, exp_ret)


class TestLengthAdaptiveLambda:

  @pytest.mark.parametrize("alpha", [0.05, 0.1, 1.0])
  def test_matches_reference(self, alpha):
    lengths = np.array([0, 1, 5, 10, 19, 20, 21, 100, 1000, 4096], np.int32)
    got = np.asarray(jitted(obj.length_adaptive_lambda, alpha=alpha)(lengths))
    close(got, ref.length_adaptive_lambda(lengths, alpha=alpha))
    assert np.all((got >= 0) & (got < 1))

  def test_float_lengths(self):
    lengths = f32([3.0, 50.0, 640.0])
    close(jitted(obj.length_adaptive_lambda)(lengths), ref.length_adaptive_lambda(lengths))


class TestMaskedWhiten:

  @pytest.mark.parametrize("shift_mean", [True, False])
  def test_ragged_mask(self, shift_mean):
    rng = np.random.default_rng(5)
    mask = ragged_mask()
    x = f32(rng.normal(2.0, 3.0, mask.shape))
    got = jitted(obj.masked_whiten, shift_mean=shift_mean)(x, mask)
    close(got, ref.masked_whiten(x, mask, shift_mean=shift_mean))
    assert_masked_zero(got, mask)

  @FEW
  @hypothesis.given(rows=st.integers(1, 5), cols=st.integers(2, 9), seed=st.integers(0, 2**31 - 1),
                    shift_mean=st.booleans())
  def test_random_shapes(self, rows, cols, seed, shift_mean):
    rng = np.random.default_rng(seed)
    mask = f32(rng.random((rows, cols)) < 0.6)
    mask[0, :2] = 1.0  # at least two valid values
    x = f32(rng.normal(-1.0, 4.0, (rows, cols)))
    got = jitted(obj.masked_whiten, shift_mean=shift_mean)(x, mask)
    close(got, ref.masked_whiten(x, mask, shift_mean=shift_mean))

  def test_docstring_example(self):
    x, mask = f32([1, 2, 3, 100]), f32([1, 1, 1, 0])
    close(jitted(obj.masked_whiten)(x, mask), ref.masked_whiten(x, mask))


# ======================================================================= shaping


class TestOverlongPenalty:

  @pytest.mark.parametrize("max_len,cache_len", [(20_000, 4_000), (16, 4), (10, 10)])
  def test_matches_reference(self, max_len, cache_len):
    start = max_len - cache_len
    lengths = np.array(sorted({0, 1, start - 1, start, start + 1, (start + max_len) // 2,
                               max_len - 1, max_len, max_len + 1, 2 * max_len} - {-1}), np.int32)
    got = np.asarray(jitted(obj.overlong_penalty, max_len=max_len, cache_len=cache_len)(lengths))
    close(got, ref.overlong_penalty(lengths, max_len=max_len, cache_len=cache_len))
    assert np.all((got >= -1) & (got <= 0))


class TestTruncatedMask:

  @pytest.mark.parametrize("dtype", [np.float32, np.int32, np.bool_])
  def test_matches_reference(self, dtype):
    mask = ragged_mask().astype(dtype)
    truncated = np.array([True, False, True, False, False, True, False, True])
    got = jax.jit(obj.truncated_mask)(mask, truncated)
    assert got.dtype == mask.dtype
    close(np.asarray(got, np.float64), ref.truncated_mask(mask, truncated), rtol=0, atol=0)


class TestGroupHasSignal:

  @pytest.mark.parametrize("group_size", [1, 2, 4])
  def test_matches_reference(self, group_size):
    rng = np.random.default_rng(group_size)
    rewards = f32(rng.integers(0, 2, 8 * group_size))
    rewards[:group_size] = 0.1 + 1e-7  # equal, not exact in float32
    got = jitted(obj.group_has_signal, group_size=group_size)(rewards)
    assert got.dtype == jnp.bool_
    np.testing.assert_array_equal(np.asarray(got), ref.group_has_signal(rewards, group_size))

  def test_continuous_rewards(self):
    rewards = f32([0.3, 0.3, 0.3, 0.30001, -1.0, -1.0])
    got = jitted(obj.group_has_signal, group_size=3)(rewards)
    np.testing.assert_array_equal(np.asarray(got), ref.group_has_signal(rewards, 3))


class TestDynamicSamplingSignal:
  """Hand-computed: G = 2; groups (all wrong, one cut by the overlong penalty), (all right,
  one penalised), (one right, equal rewards: a graded reward that ties)."""

  REWARDS = f32([0.0, -0.3, 1.0, 0.8, 0.5, 0.5])
  CORRECT = np.array([False, False, True, True, True, False])

  def test_correctness_is_dapos_test_and_shaping_does_not_count(self):
    got = jax.jit(obj.dynamic_sampling_signal, static_argnums=(2, 3))(
        self.REWARDS, self.CORRECT, 2, "correct")
    np.testing.assert_array_equal(np.asarray(got), [False, False, True])

  def test_reward_counts_any_difference_in_the_advantages_input(self):
    got = obj.dynamic_sampling_signal(self.REWARDS, self.CORRECT, 2, signal="reward")
    np.testing.assert_array_equal(np.asarray(got), [True, True, False])

  def test_several_columns_have_signal_when_any_column_differs(self):
    columns = f32([[1, 0], [1, 0], [0, 1], [0, 0], [1, 1], [0, 0]])
    got = obj.dynamic_sampling_signal(columns, self.CORRECT, 2, signal="reward")
    np.testing.assert_array_equal(np.asarray(got), [False, True, True])

  def test_an_unknown_signal_names_the_config_field(self):
    with pytest.raises(ValueError, match=r"signal must be one of 'correct', 'reward'; "
                                         r"got 'accuracy'"):
      obj.dynamic_sampling_signal(self.REWARDS, self.CORRECT, 2, signal="accuracy")


class TestImportanceWeights:

  @pytest.mark.parametrize("level", ["token", "sequence"])
  @pytest.mark.parametrize("mode", ["truncate", "mask"])
  @pytest.mark.parametrize("cap", [1.5, 2.0])
  def test_matches_reference(self, level, mode, cap):
    old, behaviour, mask = policy_inputs(11, spread=0.9, row_offset=0.3)
    fn = jitted(obj.importance_weights, level=level, mode=mode, cap=cap)
    got = fn(old, behaviour, mask)
    expected = ref.importance_weights(old, behaviour, mask, level=level, mode=mode, cap=cap)
    close(got, expected)
    assert_masked_zero(got, mask)
    # The inputs reach both sides of the cap and the region inside it.
    valid = expected[mask > 0]
    raw = ref.importance_weights(old, behaviour, mask, level=level, mode="truncate", cap=1e30)
    raw = raw[mask > 0]
    assert (raw > cap).any() and ((raw >= 1 / cap) & (raw <= cap)).any()
    if mode == "mask":
      assert (valid == 0).any()

  @pytest.mark.parametrize("level", ["token", "sequence"])
  def test_stop_gradient(self, level):
    old, behaviour, mask = policy_inputs(12, spread=0.3)

    def total(o, b):
      return jnp.sum(obj.importance_weights(o, b, mask, level=level, cap=1e6))

    g_old, g_beh = jax.jit(jax.grad(total, argnums=(0, 1)))(old, behaviour)
    np.testing.assert_array_equal(np.asarray(g_old), 0.0)
    np.testing.assert_array_equal(np.asarray(g_beh), 0.0)


# ================================================================= policy losses


def _loss_and_grad(loss_fn, logp, old, adv, mask, **kwargs):
  """Per-token loss, diagnostics and d sum(loss)/d logp, all under jit."""
  fn = functools.partial(loss_fn, **kwargs)
  loss, diag = jax.jit(fn)(logp, old, adv, mask)
  grad = jax.jit(jax.grad(lambda lp: jnp.sum(fn(lp, old, adv, mask)[0])))(logp)
  return loss, diag, grad


def _check_loss(loss_fn, ref_fn, logp, old, adv, mask, diag_keys, **kwargs):
  loss, diag, grad = _loss_and_grad(loss_fn, logp, old, adv, mask, **kwargs)
  exp_loss, exp_grad, exp_diag = ref_fn(logp, old, adv, mask, **kwargs)
  close(loss, exp_loss)
  close(grad, exp_grad)
  # Masked positions (which hold garbage) contribute exactly zero.
  assert_masked_zero(loss, mask)
  assert_masked_zero(grad, mask)
  for key in diag_keys:
    close(diag[key], exp_diag[key])
  return exp_loss, exp_grad, exp_diag


class TestPpoClipLoss:

  @pytest.mark.parametrize("eps_low,eps_high", [(0.2, 0.2), (0.2, 0.28), (0.1, 0.05)])
  @pytest.mark.parametrize("per_token_adv", [False, True])
  def test_values_gradients_diagnostics(self, eps_low, eps_high, per_token_adv):
    logp, old, mask = policy_inputs(20)
    rng = np.random.default_rng(21)
    adv = signed_advantages(rng, mask.shape if per_token_adv else mask.shape[:1])
    _, exp_grad, exp_diag = _check_loss(
        obj.ppo_clip_loss, ref.ppo_clip_loss, logp, old, adv, mask,
        ("ratio", "kl_old", "clip_low", "clip_high"), eps_low=eps_low, eps_high=eps_high)
    # The inputs exercise both clip sides and the unclipped region.
    valid = mask > 0
    assert exp_diag["clip_low"].sum() > 0 and exp_diag["clip_high"].sum() > 0
    assert (exp_grad[valid] != 0).any()

  @pytest.mark.parametrize("dual_clip", [1.5, 3.0])
  def test_dual_clip(self, dual_clip):
    logp, old, mask = policy_inputs(22, spread=2.0)
    adv = signed_advantages(np.random.default_rng(23), mask.shape)
    exp_loss, _, exp_diag = _check_loss(
        obj.ppo_clip_loss, ref.ppo_clip_loss, logp, old, adv, mask,
        ("ratio", "kl_old", "clip_low", "clip_high", "clip_dual"),
        eps_low=0.2, eps_high=0.28, dual_clip=dual_clip)
    # The dual clip binds somewhere, and is counted apart from the eps_high clip.
    plain, _, plain_diag = ref.ppo_clip_loss(logp, old, adv, mask, eps_low=0.2, eps_high=0.28)
    assert (exp_loss < plain).any()
    assert exp_diag["clip_dual"].sum() > 0
    np.testing.assert_array_equal(exp_diag["clip_high"], plain_diag["clip_high"])

  def test_clip_dual_only_with_a_dual_clip(self):
    logp, old, mask = policy_inputs(24)
    _, diag = jax.jit(obj.ppo_clip_loss)(logp, old, f32(np.ones(mask.shape[0])), mask)
    assert set(diag) == {"ratio", "kl_old", "clip_low", "clip_high"}

  @FEW
  @hypothesis.given(seed=st.integers(0, 2**31 - 1), eps_low=st.floats(0.01, 0.5),
                    eps_high=st.floats(0.01, 0.5), spread=st.floats(0.05, 1.5))
  def test_random_inputs(self, seed, eps_low, eps_high, spread):
    logp, old, mask = policy_inputs(seed, spread=spread)
    adv = signed_advantages(np.random.default_rng(seed), mask.shape)
    _check_loss(obj.ppo_clip_loss, ref.ppo_clip_loss, logp, old, adv, mask,
                ("ratio", "clip_low", "clip_high"), eps_low=eps_low, eps_high=eps_high)

  def test_log_ratio_is_clamped(self):
    # logp - old_logp = +25 / -25 on valid tokens: r = exp(+-20), and no gradient
    # flows through the clamp.
    old = f32([[-30.0, -1.0, -2.0, -26.0]])
    logp = f32([[-5.0, -26.0, -2.0, -1.0]])
    mask = np.ones((1, 4), np.float32)
    adv = f32([[-1.0, 1.0, 0.5, -2.0]])
    _check_loss(obj.ppo_clip_loss, ref.ppo_clip_loss, logp, old, adv, mask, ("ratio",))

  def test_docstring_example(self):
    logp, old = np.log(f32([[0.75, 0.5]])), np.log(f32([[0.5, 0.5]]))
    loss, _ = jax.jit(obj.ppo_clip_loss)(f32(logp), f32(old), f32([1.0]),
                                         np.ones((1, 2), np.float32))
    close(loss, ref.ppo_clip_loss(logp, old, [1.0], np.ones((1, 2)))[0])


class TestPgLoss:

  @pytest.mark.parametrize("per_token_adv", [False, True])
  @pytest.mark.parametrize("spread", [0.6, 2.0])
  def test_values_gradients_diagnostics(self, per_token_adv, spread):
    logp, old, mask = policy_inputs(25, spread=spread)
    adv = signed_advantages(np.random.default_rng(26),
                            mask.shape if per_token_adv else mask.shape[:1])
    _, exp_grad, _ = _check_loss(obj.pg_loss, ref.pg_loss, logp, old, adv, mask,
                                 ("ratio", "kl_old"))
    # No clip: every valid token with A != 0 keeps its gradient.
    valid = mask > 0
    adv_tok = np.broadcast_to(adv if per_token_adv else adv[:, None], mask.shape)
    np.testing.assert_array_equal(exp_grad[valid] != 0, adv_tok[valid] != 0)

  def test_log_ratio_is_clamped(self):
    old = f32([[-30.0, -1.0, -2.0, -26.0]])
    logp = f32([[-5.0, -26.0, -2.0, -1.0]])
    _check_loss(obj.pg_loss, ref.pg_loss, logp, old, f32([[-1.0, 1.0, 0.5, -2.0]]),
                np.ones((1, 4), np.float32), ("ratio", "kl_old"))

  def test_docstring_example(self):
    logp, old = np.log(f32([[0.75, 0.5]])), np.log(f32([[0.5, 0.5]]))
    loss, _ = jax.jit(obj.pg_loss)(f32(logp), f32(old), f32([2.0]), np.ones((1, 2), np.float32))
    close(loss, ref.pg_loss(logp, old, [2.0], np.ones((1, 2)))[0])


class TestGspoLoss:

  @pytest.mark.parametrize("eps_low,eps_high,spread,row_offset", [
      (3e-4, 4e-4, 1e-3, 1.5e-3),  # the paper's range: sequence ratios on both sides
      (0.05, 0.1, 0.5, 0.2),
  ])
  @pytest.mark.parametrize("per_token_adv", [False, True])
  def test_values_and_token_gradients(self, eps_low, eps_high, spread, row_offset,
                                      per_token_adv):
    logp, old, mask = policy_inputs(30, spread=spread, row_offset=row_offset)
    adv = signed_advantages(np.random.default_rng(31),
                            mask.shape if per_token_adv else mask.shape[:1])
    _, exp_grad, exp_diag = _check_loss(
        obj.gspo_loss, ref.gspo_loss, logp, old, adv, mask,
        ("ratio", "clip_low", "clip_high"), eps_low=eps_low, eps_high=eps_high)
    valid = mask > 0
    ratios = exp_diag["ratio"][valid]
    assert (ratios < 1 - eps_low).any() and (ratios > 1 + eps_high).any()
    assert (exp_grad[valid] != 0).any() and (exp_grad[valid] == 0).any()

  @pytest.mark.parametrize("eps_low,eps_high,spread,row_offset", [
      (3e-4, 4e-4, 1e-3, 1.5e-3), (0.05, 0.1, 0.5, 0.2)])
  def test_seq_mean_token_mean_is_the_sequence_objective(self, eps_low, eps_high, spread,
                                                         row_offset):
    logp, old, mask = policy_inputs(32, spread=spread, row_offset=row_offset)
    adv = signed_advantages(np.random.default_rng(33), mask.shape[:1])
    fn = functools.partial(obj.gspo_loss, eps_low=eps_low, eps_high=eps_high)

    def objective(lp):
      return obj.aggregate(fn(lp, old, adv, mask)[0], mask, mode="seq-mean-token-mean")

    value, grad = jax.jit(jax.value_and_grad(objective))(logp)
    # Sequence objective: mean over rows of -min(s_i A_i, clip(s_i) A_i), with the
    # gradient -A_i s_i / n_i on each valid token where s_i is unclipped.
    tok_loss, tok_grad, _ = ref.gspo_loss(logp, old, adv, mask, eps_low=eps_low,
                                          eps_high=eps_high)
    num_rows = mask.shape[0]
    seq_values, exp_grad = [], np.zeros_like(tok_grad)
    for b in range(num_rows):
      n = int(mask[b].sum())
      seq_values.append(tok_loss[b, 0] if n else 0.0)  # every valid token holds the value
      if n:
        exp_grad[b] = tok_grad[b] / n / num_rows
    close(value, sum(seq_values) / num_rows)
    close(grad, exp_grad)

  def test_docstring_example(self):
    logp = np.log(f32([[0.5, 0.5]]))
    loss, _ = jax.jit(obj.gspo_loss)(logp, logp, f32([1.0]), np.ones((1, 2), np.float32))
    close(loss, ref.gspo_loss(logp, logp, [1.0], np.ones((1, 2)))[0])


class TestCispoLoss:

  @pytest.mark.parametrize("eps_low,eps_high", [(1.0, 0.2), (1e9, 0.28), (0.2, 0.2)])
  @pytest.mark.parametrize("per_token_adv", [False, True])
  def test_values_gradients_diagnostics(self, eps_low, eps_high, per_token_adv):
    logp, old, mask = policy_inputs(40)
    rng = np.random.default_rng(41)
    adv = signed_advantages(rng, mask.shape if per_token_adv else mask.shape[:1])
    _, exp_grad, exp_diag = _check_loss(
        obj.cispo_loss, ref.cispo_loss, logp, old, adv, mask,
        ("ratio", "kl_old", "clip_low", "clip_high"), eps_low=eps_low, eps_high=eps_high)
    assert exp_diag["clip_high"].sum() > 0
    # Every valid token with A != 0 keeps a gradient, clipped or not.
    valid = mask > 0
    adv_tok = np.broadcast_to(adv if per_token_adv else adv[:, None], mask.shape)
    np.testing.assert_array_equal(exp_grad[valid] != 0, adv_tok[valid] != 0)

  def test_docstring_example(self):
    logp, old = np.log(f32([[0.75]])), np.log(f32([[0.5]]))
    loss, _ = jitted(obj.cispo_loss, eps_low=1.0, eps_high=0.2)(
        f32(logp), f32(old), f32([1.0]), np.ones((1, 1), np.float32))
    close(loss, ref.cispo_loss(logp, old, [1.0], np.ones((1, 1)), eps_low=1.0, eps_high=0.2)[0])


class TestSapoLoss:

  @pytest.mark.parametrize("tau_pos,tau_neg", [(1.0, 1.05), (0.5, 2.0)])
  @pytest.mark.parametrize("per_token_adv", [False, True])
  def test_values_gradients_diagnostics(self, tau_pos, tau_neg, per_token_adv):
    logp, old, mask = policy_inputs(50, spread=1.5)
    rng = np.random.default_rng(51)
    adv = signed_advantages(rng, mask.shape if per_token_adv else mask.shape[:1])
    _check_loss(obj.sapo_loss, ref.sapo_loss, logp, old, adv, mask,
                ("ratio", "kl_old", "gate_scale"), tau_pos=tau_pos, tau_neg=tau_neg)

  def test_on_policy_gradient_is_policy_gradient(self):
    logp, _, mask = policy_inputs(52)
    adv = signed_advantages(np.random.default_rng(53), mask.shape[:1])
    _, _, grad = _loss_and_grad(obj.sapo_loss, logp, logp, adv, mask)
    close(grad, -adv[:, None] * mask)


# ========================================================================= KL, logits


class TestKlPenalty:

  @pytest.mark.parametrize("kind", obj.KL_KINDS)
  def test_value_and_gradient_match_reference(self, kind):
    rng = np.random.default_rng(60)
    ref_logp = f32(rng.uniform(-8.0, -0.01, (6, 9)))
    logp = f32(ref_logp + rng.uniform(-5.0, 5.0, ref_logp.shape))
    old_logp = f32(logp + rng.uniform(-0.7, 0.7, logp.shape))
    fn = functools.partial(obj.kl_penalty, kind=kind, old_logp=old_logp)
    got = jax.jit(fn)(logp, ref_logp)
    grad = jax.jit(jax.grad(lambda lp: jnp.sum(fn(lp, ref_logp))))(logp)
    exp_value, exp_grad = ref.kl_penalty_and_grad(logp, ref_logp, kind=kind, old_logp=old_logp)
    # k3 reaches exp(5) ~ 150: float32 rounding of the inputs' difference, not of the
    # formula, dominates; rtol 1e-5 still holds (the gradient is a few ulps looser).
    close(got, exp_value)
    close(grad, exp_grad, rtol=3e-5)

  @pytest.mark.parametrize("kind", obj.KL_KINDS)
  def test_difference_is_clamped(self, kind):
    logp, ref_logp = f32([[-0.5, -45.0, -1.0]]), f32([[-40.0, -1.0, -1.0]])
    old_logp = f32([[-30.0, -1.0, -1.5]])   # the ratio's clamp binds on the first token
    fn = functools.partial(obj.kl_penalty, kind=kind, old_logp=old_logp)
    got = jax.jit(fn)(logp, ref_logp)
    grad = jax.jit(jax.grad(lambda lp: jnp.sum(fn(lp, ref_logp))))(logp)
    exp_value, exp_grad = ref.kl_penalty_and_grad(logp, ref_logp, kind=kind, old_logp=old_logp)
    close(got, exp_value)
    close(grad, exp_grad)

  def test_k3_unbiased_is_k3_on_policy_with_the_gradient_r_d(self):
    # At pi = pi_old the estimate equals k3, but its gradient is d = logp - ref_logp,
    # not k3's 1 - pi_ref / pi: the ratio carries gradient (DeepSeek-V3.2, eq. 7).
    rng = np.random.default_rng(62)
    ref_logp = f32(rng.uniform(-4.0, -0.1, (3, 5)))
    logp = f32(ref_logp + rng.uniform(-2.0, 2.0, ref_logp.shape))
    fn = functools.partial(obj.kl_penalty, kind="k3_unbiased", old_logp=logp)
    close(jax.jit(fn)(logp, ref_logp), ref.kl_penalty(logp, ref_logp, kind="k3"))
    grad = jax.jit(jax.grad(lambda lp: jnp.sum(fn(lp, ref_logp))))(logp)
    close(grad, ref.f64(logp) - ref.f64(ref_logp), rtol=1e-5, atol=1e-6)

  def test_k3_never_negative_near_zero(self):
    rng = np.random.default_rng(61)
    ref_logp = f32(rng.uniform(-3.0, -0.1, 4096))
    logp = f32(ref_logp + rng.normal(0.0, 1e-3, ref_logp.shape))
    got = np.asarray(jitted(obj.kl_penalty, kind="k3")(logp, ref_logp))
    assert (got >= 0).all()
    close(got, ref.kl_penalty(logp, ref_logp, kind="k3"))

  def test_docstring_example(self):
    logp, ref_logp = np.log(f32([[0.5]])), np.log(f32([[0.25]]))
    close(jax.jit(obj.kl_penalty)(logp, ref_logp), ref.kl_penalty(logp, ref_logp))
    got = jitted(obj.kl_penalty, kind="k3_unbiased")(logp, ref_logp, old_logp=ref_logp)
    close(got, ref.kl_penalty(logp, ref_logp, kind="k3_unbiased", old_logp=ref_logp))


class TestEntropyFromLogits:

  @pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16, jnp.float16])
  def test_matches_reference(self, dtype):
    rng = np.random.default_rng(70)
    logits = jnp.asarray(rng.normal(0.0, 3.0, (3, 5, 37)), dtype)
    got = jax.jit(obj.entropy_from_logits)(logits)
    assert got.dtype == jnp.float32
    # The reference sees the same (rounded) logits, widened exactly to float64.
    close(got, ref.entropy_from_logits(np.asarray(logits.astype(jnp.float32))), rtol=2e-5)

  def test_uniform_and_one_hot(self):
    logits = f32([[0, 0, 0, 0], [50, -50, -50, -50]])
    got = jax.jit(obj.entropy_from_logits)(logits)
    close(got, ref.entropy_from_logits(logits))


class TestTokenLogprobs:

  @pytest.mark.parametrize("temperature", [1.0, 0.7, 1.6])
  @pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
  def test_matches_reference(self, temperature, dtype):
    rng = np.random.default_rng(80)
    logits = jnp.asarray(rng.normal(0.0, 4.0, (2, 3, 6, 41)), dtype)
    tokens = rng.integers(0, 41, (2, 3, 6)).astype(np.int32)
    got = jitted(obj.token_logprobs, temperature=temperature)(logits, tokens)
    assert got.dtype == jnp.float32
    # Log-probs down to ~-25: a few float32 ulps of the logsumexp.
    close(got, ref.token_logprobs(np.asarray(logits.astype(jnp.float32)), tokens,
                                  temperature=temperature), rtol=2e-5, atol=2e-6)

  def test_traced_temperature(self):
    rng = np.random.default_rng(81)
    logits = f32(rng.normal(0.0, 2.0, (4, 17)))
    tokens = rng.integers(0, 17, (4,)).astype(np.int32)
    fn = jax.jit(obj.token_logprobs)
    for temperature in (0.5, 1.3):
      got = fn(logits, tokens, temperature=jnp.float32(temperature))
      close(got, ref.token_logprobs(logits, tokens, temperature=np.float32(temperature)))


# ======================================================================== aggregation

MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")


class TestAggregate:

  @pytest.mark.parametrize("mode", MODES)
  @pytest.mark.parametrize("explicit", [False, True])
  def test_value_and_gradient(self, mode, explicit):
    rng = np.random.default_rng(90)
    mask = ragged_mask()
    loss = f32(rng.normal(0.0, 1.0, mask.shape))
    counts = dict(num_tokens=57.0, num_seqs=13.0, norm_len=20.0) if explicit else {}
    fn = jitted(obj.aggregate, mode=mode, **counts)
    value, grad = jax.jit(jax.value_and_grad(fn))(loss, mask)
    close(value, ref.aggregate(loss, mask, mode=mode, **counts))
    # aggregate is linear in loss: its gradient is the reference at each unit vector.
    exp_grad = np.zeros(mask.shape)
    for idx in np.ndindex(mask.shape):
      unit = np.zeros(mask.shape)
      unit[idx] = 1.0
      exp_grad[idx] = ref.aggregate(unit, mask, mode=mode, **counts)
    close(grad, exp_grad)
    assert_masked_zero(grad, mask)

  @FEW
  @hypothesis.given(rows=st.integers(1, 6), cols=st.integers(1, 9), seed=st.integers(0, 2**31 - 1),
                    mode=st.sampled_from(MODES))
  def test_random_shapes(self, rows, cols, seed, mode):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(0, cols + 1, rows)
    mask = ragged_mask(lengths, cols)
    loss = f32(rng.normal(0.0, 2.0, (rows, cols)))
    close(jitted(obj.aggregate, mode=mode)(loss, mask), ref.aggregate(loss, mask, mode=mode))

  @pytest.mark.parametrize("mode", MODES)
  def test_micro_batches_with_global_counts_add_up(self, mode):
    rng = np.random.default_rng(91)
    mask = ragged_mask()
    loss = f32(rng.normal(0.0, 1.0, mask.shape))
    counts = dict(num_tokens=float(mask.sum()), num_seqs=float(mask.shape[0]), norm_len=T)
    fn = jitted(obj.aggregate, mode=mode, **counts)
    pieces = [fn(loss[rows], mask[rows]) for rows in (slice(0, 3), slice(3, 5), slice(5, 8))]
    close(sum(float(p) for p in pieces), ref.aggregate(loss, mask, mode=mode))

  @pytest.mark.parametrize("mode", MODES)
  def test_fully_masked_batch_is_zero(self, mode):
    loss = f32(np.random.default_rng(92).normal(size=(3, 4)))
    mask = np.zeros((3, 4), np.float32)
    value, grad = jax.jit(jax.value_and_grad(jitted(obj.aggregate, mode=mode)))(loss, mask)
    assert float(value) == 0.0 == ref.aggregate(loss, mask, mode=mode)
    np.testing.assert_array_equal(np.asarray(grad), 0.0)

  def test_docstring_example(self):
    loss, mask = f32([[1, 1, 0], [2, 0, 0]]), f32([[1, 1, 0], [1, 0, 0]])
    for mode in MODES:
      close(jitted(obj.aggregate, mode=mode)(loss, mask), ref.aggregate(loss, mask, mode=mode))


class TestOffpolicySequenceMask:

  @pytest.mark.parametrize("delta", [0.0, 0.05, 0.3])
  @pytest.mark.parametrize("per_token_adv", [False, True])
  def test_matches_reference(self, delta, per_token_adv):
    logp, old, mask = policy_inputs(13, spread=0.2, row_offset=0.4)
    rng = np.random.default_rng(14)
    adv = signed_advantages(rng, mask.shape[:1])
    if per_token_adv:  # a row's tokens scattered around its advantage, same mean sign
      adv = f32(adv[:, None] + rng.uniform(-0.05, 0.05, mask.shape))
    got = jitted(obj.offpolicy_sequence_mask, delta=delta)(logp, old, adv, mask)
    expected = ref.offpolicy_sequence_mask(logp, old, adv, mask, delta=delta)
    assert got.shape == (mask.shape[0],) and got.dtype == jnp.float32
    np.testing.assert_array_equal(np.asarray(got), expected)

  def test_drops_some_rows_and_keeps_others(self):
    logp, old, mask = policy_inputs(13, spread=0.2, row_offset=0.4)
    adv = signed_advantages(np.random.default_rng(14), mask.shape[:1])
    expected = ref.offpolicy_sequence_mask(logp, old, adv, mask, delta=0.05)
    assert 0 < expected.sum() < len(expected)   # the fixture exercises both outcomes

  def test_stop_gradient(self):
    logp, old, mask = policy_inputs(15, spread=0.5)
    adv = -np.ones(mask.shape[0], np.float32)
    grad = jax.jit(jax.grad(lambda lp: jnp.sum(obj.offpolicy_sequence_mask(
        lp, old, adv, mask, delta=0.0))))(logp)
    np.testing.assert_array_equal(np.asarray(grad), 0.0)


class TestCompletionLogprobs:
    """A causal toy model, a bigram table W: the logits at position t are W[s_t], so they
    score the next token. Completion token j of a row whose prompt has length p is scored
    by W[s_{p+j-1}], computed here in numpy; scoring each token with its own position's
    logits (no shift) gives different numbers."""

    V = 7

    def bigram(self, seed=0):
        return np.random.default_rng(seed).normal(size=(self.V, self.V)).astype(np.float32)

    def expected(self, w, tokens, starts, n, temperature=1.0):
        logp = w / temperature - np.log(np.exp(w / temperature).sum(-1, keepdims=True))
        return np.array([[logp[row[p + j - 1], row[p + j]] for j in range(n)]
                         for row, p in zip(tokens, starts)], np.float32)

    def test_right_padded_prompts_of_each_length(self):
        w = self.bigram()
        tokens = np.random.default_rng(1).integers(0, self.V, (4, 9))
        starts, n = np.array([2, 3, 1, 4]), 5
        got = jax.jit(obj.completion_logprobs, static_argnums=3, static_argnames="temperature")(
            jnp.asarray(w)[tokens], tokens, starts, n, temperature=0.7)
        np.testing.assert_allclose(got, self.expected(w, tokens, starts, n, 0.7), rtol=1e-5)

    def test_left_padded_prompts_take_an_int_and_differ_from_no_shift(self):
        w = self.bigram(2)
        tokens = np.random.default_rng(3).integers(0, self.V, (3, 8))
        got = obj.completion_logprobs(jnp.asarray(w)[tokens], tokens, 3, 5)
        np.testing.assert_allclose(got, self.expected(w, tokens, [3, 3, 3], 5), rtol=1e-5)
        unshifted = obj.token_logprobs(jnp.asarray(w)[tokens], tokens)[:, 3:]
        assert np.abs(np.asarray(unshifted) - np.asarray(got)).max() > 0.1

    def test_a_gradient_step_raises_the_sampled_next_token(self):
        """Ascending the completion's log-prob raises p(s_{t+1} | s_t) in the table."""
        w = jnp.asarray(self.bigram(4))
        tokens = np.array([[1, 2, 3, 4]])
        step = jax.grad(lambda w: obj.completion_logprobs(w[tokens], tokens, 1, 3).sum())(w)
        probs = lambda w: jax.nn.softmax(w, -1)
        before, after = probs(w), probs(w + 0.1 * step)
        for prev, nxt in ((1, 2), (2, 3), (3, 4)):
            assert after[prev, nxt] > before[prev, nxt]

    def test_bad_shapes_name_the_fix(self):
        with pytest.raises(ValueError, match="completion_len must be a Python int >= 1"):
            obj.completion_logprobs(jnp.zeros((1, 4, 3)), jnp.zeros((1, 4), jnp.int32), 1, 0)
        with pytest.raises(
            ValueError, match=r"logits must be \[B, L, V\] with \[B, L\] = tokens' \(1, 4\)"
        ):
            obj.completion_logprobs(jnp.zeros((1, 5, 3)), jnp.zeros((1, 4), jnp.int32), 1, 2)
