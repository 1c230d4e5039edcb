"""Top-p without a full sort: the same floor, support and tokens as a full sort of the vocabulary,
in rows whose nucleus fits the candidates and in rows where the bisection runs; ties at the
floor, -inf logits; and transformers' logits warpers as the reference for every cut."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.stats
from flax import struct

from grpo_jax import sampling
from grpo_jax.sampling import _nucleus


@struct.dataclass
class FullSortTopP:
    """Top-p by a full descending sort and a cumulative sum (the definition, O(V log V))."""

    p: float
    temperature: float = 1.0

    def cut(self, q_bv):
        sorted_bv = -jnp.sort(-q_bv, axis=-1)
        mass_before_bv = jnp.cumsum(sorted_bv, axis=-1) - sorted_bv
        floor_b = jnp.min(jnp.where(mass_before_bv < self.p, sorted_bv, jnp.inf), axis=-1)
        return floor_b, jnp.zeros((q_bv.shape[0], 0), jnp.int32)


def probabilities(logits, temperature=1.0):
    return jnp.exp(sampling.Temperature(temperature).log_probs(jnp.asarray(logits)))


def clear_of_rounding(q, p, margin=1e-6):
    """`[B]` rows where no token's preceding mass (float64) is within `margin` of p: float32
    sums in any order agree on the nucleus there (elsewhere they may differ by one token)."""
    sorted_q = -np.sort(-np.asarray(q, np.float64), axis=-1)
    mass_before = np.cumsum(sorted_q, axis=-1) - sorted_q
    return np.min(np.abs(mass_before - p), axis=-1) > margin


def rows(kind, n, vocab, seed=0):
    """`[n, vocab]` logits: "peaked" (nuclei of a few tokens, inside 64 candidates), "flat"
    (nuclei of most of the vocabulary: the bisection runs), "zipf" (a language model's
    heavy tail: both), "ties" (few distinct values, so many tokens tie at the floor)."""
    rng = np.random.default_rng(seed)
    if kind == "peaked":
        return (rng.standard_normal((n, vocab)) * 6.0).astype(np.float32)
    if kind == "flat":
        return (rng.standard_normal((n, vocab)) * 0.3).astype(np.float32)
    if kind == "zipf":
        ranks = np.argsort(rng.random((n, vocab)), axis=-1) + 1.0
        return (-rng.uniform(0.7, 2.5, (n, 1)) * np.log(ranks)).astype(np.float32)
    return rng.integers(0, 4, (n, vocab)).astype(np.float32)


@pytest.mark.parametrize("kind", ["peaked", "flat", "zipf", "ties"])
@pytest.mark.parametrize("p", [0.3, 0.9, 0.95])
def test_floor_equals_the_full_sort(kind, p):
    q = probabilities(rows(kind, 64, 3000, seed=int(p * 100)), temperature=0.8)
    floor, candidates = jax.jit(_nucleus.nucleus_floor, static_argnums=2)(q, p, 64)
    expected, _ = jax.jit(FullSortTopP(p).cut)(q)
    clear = clear_of_rounding(q, p)
    assert clear.mean() > 0.9
    np.testing.assert_array_equal(np.asarray(floor)[clear], np.asarray(expected)[clear])
    np.testing.assert_array_equal(candidates, jax.lax.top_k(q, 64)[1])


def test_both_paths_run_in_the_tests():
    """The rows above hold nuclei inside the 64 candidates and far outside them."""
    def nucleus_sizes(kind):
        q = probabilities(rows(kind, 64, 3000))
        floor, _ = jax.jit(_nucleus.nucleus_floor, static_argnums=2)(q, 0.9, 64)
        return np.sum(q >= floor[:, None], axis=-1)

    assert nucleus_sizes("peaked").max() < 64 and nucleus_sizes("flat").min() > 2000
    zipf = nucleus_sizes("zipf")
    assert (zipf < 64).any() and (zipf > 64).any()


@pytest.mark.parametrize("kind", ["peaked", "flat", "zipf", "ties"])
def test_same_tokens_and_log_probs_as_the_full_sort(kind):
    """Same uniform numbers, same floor: the same token in every row, bit for bit."""
    logits = jnp.asarray(rows(kind, 256, 2000, seed=5))
    clear = clear_of_rounding(probabilities(logits, 1.3), 0.9)
    assert clear.mean() > 0.9
    draw = jax.jit(sampling.sample)
    for seed in range(3):
        tokens, logp = draw(sampling.TopP(0.9, temperature=1.3), jax.random.key(seed), logits)
        expected_tokens, expected_logp = draw(
            FullSortTopP(0.9, temperature=1.3), jax.random.key(seed), logits
        )
        np.testing.assert_array_equal(np.asarray(tokens)[clear], np.asarray(expected_tokens)[clear])
        np.testing.assert_array_equal(np.asarray(logp)[clear], np.asarray(expected_logp)[clear])


class TestTiesAtTheFloor:
    """q = (0.3, 0.2, 0.2, 0.2, 0.1), p = 0.4: the first 0.2 is kept (0.3 before it), and the
    tokens tied with it are kept too, whatever order a sort puts them in."""

    LOGITS = np.log(np.array([[0.2, 0.3, 0.1, 0.2, 0.2]], np.float32))

    @pytest.mark.parametrize("max_candidates", [2, 3, 8])
    def test_every_tied_token_is_kept(self, max_candidates):
        """K = 2: the candidates end inside the nucleus (bisection); K = 3: the floor is a
        candidate but a tied token is not; K = 8: all fit."""
        method = sampling.TopP(0.4, max_candidates=max_candidates)
        probs = np.exp(np.asarray(jax.jit(method.log_probs)(self.LOGITS)))
        np.testing.assert_allclose(
            probs, [[0.2 / 0.9, 0.3 / 0.9, 0.0, 0.2 / 0.9, 0.2 / 0.9]], rtol=1e-6
        )
        _, _, support = jax.jit(sampling.sample, static_argnames="with_support")(
            method, jax.random.key(0), self.LOGITS, with_support=True)
        assert int(support.size[0]) == 4
        if max_candidates >= 4:
            assert sorted(np.asarray(support.ids[0, :4]).tolist()) == [0, 1, 3, 4]
            assert (np.asarray(support.ids[0, 4:]) == -1).all()
        else:  # the support does not fit: its K most likely tokens, size > K says so
            assert int(support.ids[0, 0]) == 1 and (np.asarray(support.ids[0]) >= 0).all()

    def test_a_flat_row_keeps_everything(self):
        q = probabilities(np.zeros((2, 1000), np.float32))
        floor, _ = _nucleus.nucleus_floor(q, 0.5, 16)
        assert (np.sum(q >= floor[:, None], axis=-1) == 1000).all()


class TestMinusInfinity:
    def test_excluded_tokens_are_never_kept_or_sampled(self):
        logits = np.full((512, 300), -np.inf, np.float32)
        logits[:, :5] = np.log([0.4, 0.3, 0.15, 0.1, 0.05])
        for method in (
            sampling.TopP(0.999, max_candidates=2), sampling.TopP(1.0), sampling.TopP(0.5),
        ):
            tokens, logp = jax.jit(sampling.sample)(method, jax.random.key(1), jnp.asarray(logits))
            assert (np.asarray(tokens) < 5).all() and np.isfinite(logp).all()
        floor, _ = _nucleus.nucleus_floor(probabilities(logits[:1]), 0.999, 2)
        assert float(floor[0]) == pytest.approx(0.05)

    def test_p_one_keeps_every_finite_token(self):
        logits = rows("zipf", 4, 5000)
        logits[:, ::7] = -np.inf
        logp = jax.jit(sampling.TopP(1.0, max_candidates=8).log_probs)(logits)
        np.testing.assert_array_equal(np.isfinite(logp), np.isfinite(logits))


def test_bisection_rows_sample_the_nucleus_distribution():
    """Chi-square of 40,000 draws from one flat-ish row whose nucleus (~150 of 200 tokens)
    is far beyond the 4 candidates, against the float64 definition."""
    logits = rows("flat", 1, 200, seed=3)[0] * 2
    z = logits.astype(np.float64) / 0.9
    q = np.exp(z - z.max())
    q /= q.sum()
    order = np.argsort(-q)
    expected = np.zeros_like(q)
    kept = order[(np.cumsum(q[order]) - q[order]) < 0.8]
    expected[kept] = q[kept] / q[kept].sum()
    assert 100 < len(kept) < 190
    tokens, _ = jax.jit(sampling.sample)(
        sampling.TopP(0.8, temperature=0.9, max_candidates=4), jax.random.key(4),
        jnp.broadcast_to(jnp.asarray(logits), (40_000, 200)),
    )
    counts = np.bincount(np.asarray(tokens), minlength=200)
    assert counts[expected == 0].sum() == 0
    assert scipy.stats.chisquare(counts[kept], 40_000 * expected[kept]).pvalue > 1e-3


@pytest.mark.parametrize("method, warper, value", [
    (sampling.TopP(0.9, temperature=0.7), "TopPLogitsWarper", 0.9),
    (sampling.TopP(0.5, temperature=1.2, max_candidates=4), "TopPLogitsWarper", 0.5),
    (sampling.TopK(20, temperature=0.7), "TopKLogitsWarper", 20),
    (sampling.MinP(0.05, temperature=1.1), "MinPLogitsWarper", 0.05),
], ids=["top_p_0.9", "top_p_0.5_bisection", "top_k_20", "min_p_0.05"])
def test_kept_sets_match_transformers_warpers(method, warper, value):
    """transformers' processors (temperature, then the cut) keep the same tokens, on
    distinct logits (on ties transformers keeps whichever its sort puts first)."""
    torch = pytest.importorskip(
        "torch", reason="the reference is transformers' PyTorch logits processors"
    )
    from transformers.generation import logits_process

    noise = np.random.default_rng(9).normal(0, 1e-3, (32, 3000)).astype(np.float32)
    logits = rows("zipf", 32, 3000, seed=9) + noise
    scores = getattr(logits_process, warper)(value)(
        None, torch.tensor(logits / float(method.temperature))
    )
    ours = np.isfinite(np.asarray(jax.jit(method.log_probs)(logits)))
    clear = (
        clear_of_rounding(probabilities(logits, method.temperature), value)
        if warper == "TopPLogitsWarper"
        else True
    )
    np.testing.assert_array_equal(ours[clear], np.isfinite(scores.numpy())[clear])


@pytest.mark.parametrize("with_support", [False, True])
@pytest.mark.parametrize("method", [sampling.TopP(0.9), sampling.TopK(20), sampling.MinP(0.1)],
                         ids=lambda m: type(m).__name__)
def test_the_compiled_sampler_sorts_nothing(method, with_support):
    """No sort in the compiled program, with the method's parameters traced or constant:
    XLA:CPU keeps `lax.top_k` as its partial-sort kernel (it falls back to a full sort
    when top-k values are sliced, as a constant index into them becomes)."""
    logits = jnp.zeros((8, 4096))
    traced = jax.jit(
        lambda m, z: sampling.sample(m, jax.random.key(0), z, with_support=with_support)
    )
    constant = jax.jit(
        lambda z: sampling.sample(method, jax.random.key(0), z, with_support=with_support)
    )
    for lowered in (traced.lower(method, logits), constant.lower(logits)):
        assert " sort(" not in lowered.compile().as_text()
