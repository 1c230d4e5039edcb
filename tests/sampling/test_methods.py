"""Sampling methods: distributions against numpy references, and sampled token frequencies
against those distributions (chi-square, fixed seeds), directly and through generate()."""


import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.stats
from tests.sampling.toy_models import lookup_model

from grpo_jax import sampling
from grpo_jax.sampling import _buckets, _methods, _sample
from tests.doctest_numbers import run_examples

PROBS = np.array([0.3, 0.2, 0.15, 0.12, 0.1, 0.08, 0.05])  # distinct, so cuts are unambiguous
# an offset: methods must not assume normalised input
LOGITS = np.log(PROBS).astype(np.float32) + 1.0
DRAWS = 20_000
P_VALUE = 1e-3


def reference(method):
    """The method's distribution over LOGITS, from the definitions, in float64 numpy."""
    if isinstance(method, sampling.Greedy):
        return np.eye(len(PROBS))[np.argmax(LOGITS)]
    z = LOGITS.astype(np.float64) / float(method.temperature)
    p = np.exp(z - z.max())
    p /= p.sum()
    order = np.argsort(-p)
    keep = np.ones_like(p, bool)
    if isinstance(method, sampling.TopK):
        keep[order[int(method.k):]] = False
    if isinstance(method, sampling.TopP):
        mass_before = np.cumsum(p[order]) - p[order]
        keep[order[mass_before >= float(method.p)]] = False
    if isinstance(method, sampling.MinP):
        keep = p >= float(method.p) * p.max()
    p = np.where(keep, p, 0.0)
    return p / p.sum()


METHODS = [
    sampling.Temperature(0.7),
    sampling.Temperature(1.6),
    sampling.TopK(3, temperature=1.3),
    sampling.TopP(0.8, temperature=0.9),
    sampling.TopP(0.35),
    sampling.TopP(0.8, temperature=1.1, max_candidates=2),  # the nucleus overflows: bisection
    sampling.MinP(0.4, temperature=1.2),
]


@pytest.mark.parametrize("method", METHODS + [sampling.Greedy()], ids=repr)
def test_log_probs_match_the_definition(method):
    logp = jax.jit(lambda m, z: m.log_probs(z))(method, jnp.asarray(LOGITS)[None])
    np.testing.assert_allclose(
        np.exp(np.asarray(logp[0], np.float64)), reference(method), atol=1e-6
    )


def chi_square_p_value(tokens, expected):
    """p-value of the observed token counts under `expected`; tokens outside its support fail."""
    counts = np.bincount(np.asarray(tokens).ravel(), minlength=len(expected))
    support = expected > 0
    assert counts[~support].sum() == 0, "sampled a token the method excludes"
    n = counts.sum()
    return scipy.stats.chisquare(counts[support], n * expected[support]).pvalue


@pytest.mark.parametrize("method", METHODS, ids=repr)
def test_sampled_frequencies_match(method):
    logits = jnp.broadcast_to(jnp.asarray(LOGITS), (DRAWS, len(PROBS)))
    tokens, logp = jax.jit(sampling.sample)(method, jax.random.key(1), logits)
    assert chi_square_p_value(tokens, reference(method)) > P_VALUE
    np.testing.assert_allclose(np.exp(logp), reference(method)[tokens], rtol=1e-5)


def test_the_test_detects_a_small_temperature_error():
    logits = jnp.broadcast_to(jnp.asarray(LOGITS), (DRAWS, len(PROBS)))
    tokens, _ = jax.jit(sampling.sample)(sampling.Temperature(0.7), jax.random.key(1), logits)
    assert chi_square_p_value(tokens, reference(sampling.Temperature(0.8))) < P_VALUE


@pytest.mark.slow
def test_generated_frequencies_match():
    """End to end: a model whose logits are LOGITS after every token, sampled by generate()."""
    method = sampling.TopP(0.9, temperature=1.3)
    v = len(PROBS)
    rollout = sampling.to_host(
        sampling.generate(
            *lookup_model(np.tile(LOGITS, (v, 1))), np.zeros((1, 4), np.int32),
            np.ones((1, 4), np.int32), rng=jax.random.key(2), method=method, group_size=64,
            max_new_tokens=64, stop_tokens=[-1], pad_id=0,
        )
    )
    assert rollout.mask.all()  # stop id -1 never occurs
    assert chi_square_p_value(rollout.tokens, reference(method)) > P_VALUE
    # The behaviour log-prob: softmax(logits / 1.3), before the top-p cut.
    tempered = np.exp(LOGITS / 1.3) / np.exp(LOGITS / 1.3).sum()
    np.testing.assert_allclose(rollout.logp, np.log(tempered)[rollout.tokens], atol=1e-5)


@pytest.mark.parametrize("vocab", [1, 7, 255, 256, 257, 1000])
def test_inverse_cdf_matches_numpy(vocab):
    """The first index whose cumulative weight exceeds u * total, zeros never picked."""
    rng = np.random.default_rng(vocab)
    weights = rng.random((64, vocab)).astype(np.float32) * (rng.random((64, vocab)) < 0.3)
    weights[:, -1] += 1e-3 * (weights.sum(-1) == 0)  # every row needs some mass
    u = rng.random(64).astype(np.float32)
    u[:3] = [0.0, np.nextafter(np.float32(1), np.float32(0)), 0.5]  # the ends of [0, 1)
    index, total = jax.jit(_sample.inverse_cdf)(weights, u)
    cdf = np.cumsum(weights.astype(np.float64), axis=-1)
    expected = np.argmax(cdf > u[:, None].astype(np.float64) * cdf[:, -1:], axis=-1)
    expected = np.where(u >= 1.0 - 1e-7, np.argmax(cdf >= cdf[:, -1:], axis=-1), expected)
    np.testing.assert_array_equal(index, expected)
    assert (weights[np.arange(64), index] > 0).all()
    np.testing.assert_allclose(total, cdf[:, -1], rtol=1e-6)


@pytest.mark.parametrize("make, message", [
    (lambda: sampling.Temperature(0.0), r"Temperature.temperature must be > 0 \(use Greedy"),
    (lambda: sampling.TopP(0.0), r"TopP.p must be in \(0, 1\]"),
    (lambda: sampling.TopP(0.9, temperature=-1), "TopP.temperature must be > 0"),
    (lambda: sampling.MinP(1.5), r"MinP.p must be in \[0, 1\]"),
    (lambda: sampling.TopK(0), "TopK.k must be in"),
    (lambda: sampling.TopK(100), "raise TopK.max_k"),
])
def test_bad_parameters_name_the_field(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_python_numbers_become_fixed_dtype_scalars():
    """Temperature(1) and Temperature(1.0) must share one compilation."""
    assert sampling.Temperature(1).temperature.dtype == np.float32
    assert sampling.TopK(5, max_k=128).k.dtype == np.int32


@pytest.mark.parametrize("module", [_methods, _sample, _buckets], ids=lambda m: m.__name__)
def test_docstring_examples(module):
    result = run_examples(module)
    assert result.attempted > 0 and result.failed == 0


def test_bucket_errors():
    with pytest.raises(ValueError, match="add a larger bucket"):
        sampling.bucket_length(65, buckets=(32, 64))
    with pytest.raises(ValueError, match=r"prompts \[1\] have no tokens"):
        sampling.pad_prompts([[1], []], pad_id=0)
