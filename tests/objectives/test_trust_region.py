"""GMPO, DPPO, M2PO, Clip-Cov and KL-Cov against the peers' own code and the papers.

Two independent checks per method:

1. The peers' outputs, recorded by experiments/peer_agreement/record_trust_region.py
   from their unmodified functions (torch, float64) into peer_outputs/*.json: verl's
   ``geo_mean``, ``dppo_tv``/``dppo_kl``, ``clip_cov`` and ``kl_cov`` losses, the DPPO
   authors' (sail-sg/Stable-RL), the Entropy-Mechanism authors'
   (PRIME-RL/Entropy-Mechanism-of-RL) and AReaL's M2PO mask. Each file names the
   repository, commit, file and function. The aggregated loss (per loss_agg_mode) and
   its gradient with respect to log_prob must match to 1e-6, computed in float32 from
   the float64 inputs (in float64 they agree to 4e-9; float32 keeps this file to one
   set of op compiles). verl's seq-mean modes divide by the rows with a valid token, so
   those runs pass that count as num_seqs; verl's geo_mean averages over all rows.
2. Small numpy transcriptions of each paper's equation below (value, and gradient by
   central differences), written from the papers, not from the peers' code.

Clip-Cov draws its tokens at random: torch.randperm cannot be reproduced, so the tests
pin what can be: the candidate set equals verl's, the loss given verl's own draw equals
verl's, the number drawn is min(max(floor(r N), 1), candidates), and with a fraction that
draws every candidate the whole function equals verl's for any key.
"""

import functools
import json
import math
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from grpo_jax import objectives
from grpo_jax.objectives import _covariance, _trust_region
from grpo_jax.objectives._covariance import (_clip_cov, clip_cov_loss, kl_cov_loss,
                                             token_covariance)
from grpo_jax.objectives._trust_region import (binary_divergence, dppo_loss, gmpo_loss,
                                               m2po_mask)
from tests.doctest_numbers import run_examples

PEER_DIR = pathlib.Path(__file__).parent / "peer_outputs"
ATOL = 1e-6


@functools.lru_cache(maxsize=None)
def _peer(name):
    return json.loads((PEER_DIR / f"{name}.json").read_text())


def _cases(*names):
    return [pytest.param(name, case, id=f"{name}:{case['name']}")
            for name in names for case in _peer(name)["cases"]]


def _arrays(case, dtype):
    inp = case["inputs"]
    as_ = lambda k: jnp.asarray(np.asarray(inp[k]), dtype)  # noqa: E731
    adv = as_("advantages") if "advantages" in inp else None
    return as_("log_prob"), as_("old_log_prob"), adv, as_("response_mask")


def _num_seqs(mask, mode, all_rows):
    """verl's seq-mean modes count the rows with a valid token (geo_mean: every row)."""
    if all_rows or mode == "token-mean":
        return None
    return jnp.sum(jnp.any(mask > 0, axis=1)).astype(mask.dtype)


# The losses under test, (logp, old, adv, mask, extra, **hyper-parameters) -> loss;
# `extra` carries Clip-Cov's draw (an array) or key seed.
LOSS_BY_NAME = {
    "gmpo": lambda lp, old, adv, mask, extra, **kw: gmpo_loss(lp, old, adv, mask, **kw),
    "dppo": lambda lp, old, adv, mask, extra, **kw: dppo_loss(lp, old, adv, mask, **kw),
    "kl_cov": lambda lp, old, adv, mask, extra, **kw: kl_cov_loss(lp, old, adv, mask, **kw),
    "clip_cov": lambda lp, old, adv, mask, extra, **kw: clip_cov_loss(
        lp, old, adv, mask, key=jax.random.key(extra), **kw),
    "clip_cov_given_draw": lambda lp, old, adv, mask, extra, **kw: _clip_cov(
        lp, old, adv, mask, select=lambda eligible, count: extra, **kw),
}
_COMPILED = {}


def _value_and_grad(loss, kw, mode, all_rows=False):
    """value_and_grad of the aggregated loss in logp, per (loss, hyper-parameters, mode).
    Eager on purpose: op-by-op compiles are shared by every case of every test, where a
    jit compiles each function anew (Clip-Cov's random draw alone takes seconds)."""
    key = (loss, tuple(sorted(kw.items())), mode, all_rows)
    if key not in _COMPILED:
        fn = LOSS_BY_NAME[loss]

        def aggregated(lp, old, adv, mask, extra):
            return objectives.aggregate(fn(lp, old, adv, mask, extra, **kw)[0], mask, mode=mode,
                                        num_seqs=_num_seqs(mask, mode, all_rows))
        _COMPILED[key] = jax.value_and_grad(aggregated)
    return _COMPILED[key]


def _agree(loss, kw, case, *, all_rows=False, row_adv=False, x64=False, extra=0):
    """Max |ours - peer| over the aggregated loss and its gradient, for every mode."""
    dtype = jnp.float64 if x64 else jnp.float32
    worst = 0.0
    logp, old, adv, mask = _arrays(case, dtype)
    if row_adv:
        adv = adv[:, 0]
    for mode, out in case["outputs"].items():
        value, grad = _value_and_grad(loss, kw, mode, all_rows)(logp, old, adv, mask, extra)
        worst = max(worst, abs(float(value) - out["loss"]),
                    float(np.max(np.abs(np.asarray(grad, np.float64) - np.asarray(out["grad"])))))
    return worst


def _check_peer(loss, kw, case, **options):
    worst = _agree(loss, kw, case, **options)
    assert worst < ATOL, worst


def _kwargs(case, *drop):
    return {k: v for k, v in case["kwargs"].items() if k not in drop}


# --------------------------------------------------------------------------- peers

class TestPeerAgreement:

    @pytest.mark.parametrize("name, case", _cases("gmpo_verl"))
    def test_gmpo(self, name, case):
        _check_peer("gmpo", _kwargs(case), case, all_rows=True)
        _check_peer("gmpo", _kwargs(case), case, all_rows=True, row_adv=True)   # [B] advantages

    @pytest.mark.parametrize("name, case", _cases("dppo_verl", "dppo_stable_rl"))
    def test_dppo(self, name, case):
        _check_peer("dppo", _kwargs(case), case)

    @pytest.mark.parametrize("name, case", _cases("kl_cov_verl", "kl_cov_authors"))
    def test_kl_cov(self, name, case):
        kw = _kwargs(case)
        n_valid = int(np.sum(case["inputs"]["response_mask"]))
        if name == "kl_cov_authors" and 100 * kw["kl_fraction"] > n_valid:
            # The authors' code takes k = min(k_percent, N) percent: past N percent it
            # penalises N% of the tokens (70% of 10 tokens -> 10% -> 1 token); verl's
            # port and ours take the fraction as given.
            kw["kl_fraction"] = n_valid / 100
        _check_peer("kl_cov", kw, case)

    @pytest.mark.parametrize("name, case", _cases("m2po_areal"))
    def test_m2po_mask(self, name, case):
        logp, old, _, mask = _arrays(case, jnp.float32)
        ours = m2po_mask(logp, old, mask, **case["kwargs"])
        np.testing.assert_array_equal(ours, np.asarray(case["outputs"]["mask"]))

    @pytest.mark.parametrize("name, case", _cases("clip_cov_verl", "clip_cov_authors"))
    def test_clip_cov_candidates_and_loss_given_the_peer_draw(self, name, case):
        kw = _kwargs(case)
        seen = {}

        def every_candidate(eligible, count):
            seen["count"] = count
            return eligible

        logp, old, adv, mask = _arrays(case, jnp.float32)
        _, diag = _clip_cov(logp, old, adv, mask, select=every_candidate, **kw)
        np.testing.assert_array_equal(diag["cov_detached"], np.asarray(case["candidates"]))
        n_chosen = int(np.sum(case["chosen"]))
        assert n_chosen == min(int(seen["count"]), int(np.sum(case["candidates"])))
        peer_draw = jnp.asarray(np.asarray(case["chosen"]) > 0)
        _check_peer("clip_cov_given_draw", kw, case, extra=peer_draw)

    @pytest.mark.parametrize("name, case", [c for c in _cases("clip_cov_verl")
                                            if c.values[1]["kwargs"]["clip_fraction"] >= 1.0])
    def test_clip_cov_drawing_every_candidate_is_exact(self, name, case):
        for seed in (0, 1):
            _check_peer("clip_cov", _kwargs(case), case, extra=seed)

    @pytest.mark.parametrize("name, case", _cases("clip_cov_verl"))
    def test_clip_cov_draws_the_peers_count(self, name, case):
        logp, old, adv, mask = _arrays(case, jnp.float32)
        draw = lambda key: clip_cov_loss(logp, old, adv, mask, key=key,  # noqa: E731
                                         **_kwargs(case))[1]["cov_detached"]
        for seed in range(3):
            drawn = np.asarray(draw(jax.random.key(seed)))
            assert drawn.sum() == np.sum(case["chosen"])
            assert np.all(drawn <= np.asarray(case["candidates"]))

    def test_peer_files_name_their_source(self):
        for path in PEER_DIR.glob("*.json"):
            peer = json.loads(path.read_text())["peer"]
            if path.stem.split("_")[0] in ("gmpo", "dppo", "m2po", "kl", "clip"):
                assert (
                    len(peer["commit"]) == 40 and peer["repo"] and peer["file"] and peer["function"]
                )


# --------------------------------------------------------------------------- papers

def _random_batch(seed, *, spread=0.4, lengths=(7, 5, 3, 6, 2, 0), adv=None):
    rng = np.random.default_rng(seed)
    b, t = len(lengths), 7
    mu = rng.uniform(0.03, 0.97, (b, t))
    old = np.log(mu)
    logp = np.minimum(old + rng.normal(0, spread, (b, t)), math.log(0.995))
    mask = np.array([[1.0 if j < n else 0.0 for j in range(t)] for n in lengths])
    adv = rng.normal(0, 1.0, b) if adv is None else np.asarray(adv, float)
    return logp, old, adv, mask


def _central_difference(f, x, h=1e-6):
    grad = np.zeros_like(x)
    for idx in np.ndindex(x.shape):
        up, down = x.copy(), x.copy()
        up[idx] += h
        down[idx] -= h
        grad[idx] = (f(up) - f(down)) / (2 * h)
    return grad


def _ours(loss, logp, old, adv, mask, mode, extra=0, **kw):
    """Our aggregated loss and gradient, float32 (`aggregate`'s own counts)."""
    args = (jnp.asarray(x, jnp.float32) for x in (logp, old, adv, mask))
    value, grad = _value_and_grad(loss, kw, mode, all_rows=True)(*args, extra)
    return float(value), np.asarray(grad, np.float64)


def gmpo_reference(logp, old, adv, mask, eps_low, eps_high):
    """Paper: J = 1/G sum_i sgn(A_i) (prod_t |min(rho A_i, clip(rho, e^-lo, e^hi) A_i)|)^(1/|o_i|);
    returns the loss -J."""
    total = 0.0
    for i in range(len(adv)):
        ts = [t for t in range(mask.shape[1]) if mask[i, t] > 0]
        if not ts or adv[i] == 0:
            continue
        product = 1.0
        for t in ts:
            rho = math.exp(logp[i, t] - old[i, t])
            clipped = min(max(rho, math.exp(-eps_low)), math.exp(eps_high))
            product *= abs(min(rho * adv[i], clipped * adv[i]))
        total += math.copysign(product ** (1.0 / len(ts)), adv[i])
    return -total / len(adv)


def dppo_masked_surrogate(logp, old, adv, mask, divergence, delta_low, delta_high, mask_at):
    """Paper: -sum_t M_t r_t A_t / N with the trust-region mask M of the point `mask_at`
    (M is piecewise constant; its gradient is 0 almost everywhere)."""
    total, n = 0.0, mask.sum()
    for i, t in zip(*np.nonzero(mask)):
        p, mu = math.exp(mask_at[i, t]), math.exp(old[i, t])
        if divergence == "binary_tv":
            div = abs(p - mu)
        else:
            div = mu * math.log(mu / p) + (1 - mu) * math.log((1 - mu) / (1 - p))
        if adv[i] > 0:
            keep = not (p > mu and div > delta_high)
        else:
            keep = not (p < mu and div > delta_low)
        total += -keep * math.exp(logp[i, t] - old[i, t]) * adv[i]
    return total / n


def m2po_reference(logp, old, mask, tau):
    """Paper: drop the largest (log r)^2 one at a time until the rest's mean is < tau
    (at least one token kept)."""
    tokens = [(float((logp[i, t] - old[i, t]) ** 2), i, t) for i, t in zip(*np.nonzero(mask))]
    tokens.sort(key=lambda x: -x[0])
    while len(tokens) > 1 and sum(x[0] for x in tokens) / len(tokens) >= tau:
        tokens.pop(0)
    keep = np.zeros_like(mask)
    for _, i, t in tokens:
        keep[i, t] = 1.0
    return keep


def covariance_reference(logp, adv_bt, mask):
    idx = list(zip(*np.nonzero(mask)))
    mean_logp = sum(logp[i, t] for i, t in idx) / len(idx)
    mean_adv = sum(adv_bt[i, t] for i, t in idx) / len(idx)
    cov = np.zeros_like(logp)
    for i, t in idx:
        cov[i, t] = (logp[i, t] - mean_logp) * (adv_bt[i, t] - mean_adv)
    return cov


def kl_cov_reference(logp, old, adv, mask, fraction, coef):
    """Paper (with the authors' |log r| for the KL): token-mean of -r A, plus beta |log r|
    on the max(floor(kN), 1) tokens of largest covariance."""
    adv_bt = np.repeat(adv[:, None], mask.shape[1], 1)
    cov = covariance_reference(logp, adv_bt, mask)
    idx = sorted(zip(*np.nonzero(mask)), key=lambda it: -cov[it])
    chosen = set(idx[:max(int(len(idx) * fraction), 1)])
    total = 0.0
    for i, t in idx:
        d = logp[i, t] - old[i, t]
        total += -math.exp(d) * adv[i] + (coef * abs(d) if (i, t) in chosen else 0.0)
    return total / len(idx)


def clip_cov_reference(logp, old, adv, mask, chosen, eps):
    """Paper: PPO's clipped loss, 0 on the chosen tokens; token-mean."""
    total = 0.0
    for i, t in zip(*np.nonzero(mask)):
        if chosen[i, t]:
            continue
        r = math.exp(logp[i, t] - old[i, t])
        total += -min(r * adv[i], min(max(r, 1 - eps), 1 + eps) * adv[i])
    return total / mask.sum()


class TestPaperEquations:
    """Numpy transcriptions of the papers' equations (no peer code involved)."""

    @pytest.mark.parametrize("seed, eps", [(0, (0.4, 0.4)), (1, (0.2, 0.3)), (2, (0.4, 0.1))])
    def test_gmpo_geometric_mean_objective(self, seed, eps):
        logp, old, adv, mask = _random_batch(seed, adv=[1.3, -0.7, 0.0, -1.6, 2.1, 0.9])
        ref = lambda lp: gmpo_reference(lp, old, adv, mask, *eps)  # noqa: E731
        value, grad = _ours("gmpo", logp, old, adv, mask, "seq-mean-token-mean",
                            eps_low=eps[0], eps_high=eps[1])
        assert value == pytest.approx(ref(logp), abs=1e-6)
        np.testing.assert_allclose(grad, _central_difference(ref, logp), atol=1e-6)

    @pytest.mark.parametrize("divergence", ["binary_tv", "binary_kl"])
    @pytest.mark.parametrize("seed", [3, 4])
    def test_dppo_gradient_is_the_masked_surrogates(self, divergence, seed):
        logp, old, adv, mask = _random_batch(seed, spread=0.6)
        delta = _trust_region.DPPO_DEFAULT_DELTA[divergence]
        ref = lambda lp: dppo_masked_surrogate(lp, old, adv, mask, divergence, delta, delta,  # noqa: E731
                                               mask_at=logp)
        _, grad = _ours("dppo", logp, old, adv, mask, "token-mean", divergence=divergence)
        expected = _central_difference(ref, logp)
        np.testing.assert_allclose(grad, expected, atol=1e-6)
        assert np.any((expected == 0) & (mask > 0) & (adv[:, None] != 0)), "nothing masked"

    def test_binary_divergences(self):
        p, mu = np.array([[0.9, 0.05]]), np.array([[0.6, 0.1]])
        tv = binary_divergence(jnp.log(p), jnp.log(mu), divergence="binary_tv")
        kl = binary_divergence(jnp.log(p), jnp.log(mu), divergence="binary_kl")
        np.testing.assert_allclose(tv, np.abs(p - mu), atol=1e-7)
        expected = mu * np.log(mu / p) + (1 - mu) * np.log((1 - mu) / (1 - p))
        np.testing.assert_allclose(kl, expected, rtol=1e-5)
        # mu = 1: the limit mu log(mu / p); p = 1: the rest of the vocabulary lost all its mass
        edges = binary_divergence(
            jnp.log(jnp.array([[0.5, 1.0]])), jnp.log(jnp.array([[1.0, 0.3]])),
            divergence="binary_kl",
        )
        np.testing.assert_allclose(edges[0, 0], math.log(2.0), rtol=1e-6)
        assert np.isinf(edges[0, 1])

    @pytest.mark.parametrize("seed, tau", [(5, 0.04), (6, 0.04), (7, 0.01), (8, 1e-5), (9, 10.0)])
    def test_m2po_mask_drops_the_largest_until_m2_is_within_tau(self, seed, tau):
        logp, old, _, mask = _random_batch(seed, spread=0.3)
        logp[1, 2] -= 2.0
        ours = np.asarray(m2po_mask(*(jnp.asarray(x, jnp.float32) for x in (logp, old, mask)),
                                    tau=tau))
        np.testing.assert_array_equal(ours, m2po_reference(logp, old, mask, tau))
        kept = ours > 0
        if kept.sum() > 1:
            assert np.mean((logp - old)[kept] ** 2) < tau

    @pytest.mark.parametrize("seed, fraction", [(10, 0.1), (11, 0.3), (12, 1e-4)])
    def test_kl_cov(self, seed, fraction):
        logp, old, adv, mask = _random_batch(seed, spread=0.3, adv=[2.2, -1.8, 1.5, -2.4, 2.0, 0.5])
        value, grad = _ours("kl_cov", logp, old, adv, mask, "token-mean",
                            kl_fraction=fraction, kl_coef=0.7)
        ref = lambda lp: kl_cov_reference(lp, old, adv, mask, fraction, 0.7)  # noqa: E731
        assert value == pytest.approx(ref(logp), abs=1e-6)
        np.testing.assert_allclose(grad, _central_difference(ref, logp), atol=1e-6)

    @pytest.mark.parametrize("seed, eps", [(13, 1.0), (14, 0.2)])
    def test_clip_cov_given_its_draw(self, seed, eps):
        logp, old, adv, mask = _random_batch(seed, spread=0.3, adv=[2.2, -1.8, 1.5, -2.4, 2.0, 0.5])
        adv_bt = np.repeat(adv[:, None], 7, 1)
        cov = covariance_reference(logp, adv_bt, mask)
        np.testing.assert_allclose(token_covariance(jnp.asarray(logp), jnp.asarray(adv),
                                                    jnp.asarray(mask)), cov, atol=1e-5)
        ratio = np.exp(logp - old)
        ppo_clipped = (((adv_bt > 0) & (ratio > 1 + eps)) | ((adv_bt < 0) & (ratio < 1 - eps)))
        candidates = (mask > 0) & ~ppo_clipped & (cov > 1.0) & (cov < 5.0)
        assert candidates.sum() >= 2
        chosen = np.zeros_like(candidates)
        chosen[tuple(np.argwhere(candidates)[0])] = True          # any draw: the first
        value, grad = _ours("clip_cov_given_draw", logp, old, adv, mask, "token-mean",
                            extra=jnp.asarray(chosen), clip_fraction=1.0, cov_low=1.0,
                            cov_high=5.0, eps_low=eps, eps_high=eps)
        ref = lambda lp: clip_cov_reference(lp, old, adv, mask, chosen, eps)  # noqa: E731
        assert float(value) == pytest.approx(ref(logp), abs=1e-6)
        np.testing.assert_allclose(grad, _central_difference(ref, logp), atol=1e-6)
        _, diag = clip_cov_loss(jnp.asarray(logp), jnp.asarray(old), jnp.asarray(adv),
                                jnp.asarray(mask), key=jax.random.key(0), clip_fraction=1.0,
                                eps_low=eps, eps_high=eps)
        np.testing.assert_array_equal(diag["cov_detached"], candidates)


# --------------------------------------------------------------------------- randomness

class TestClipCovDraw:

    def _batch(self):
        case = [c for c in _peer("clip_cov_verl")["cases"] if c["name"] == "random_tenth"][0]
        return _arrays(case, jnp.float32), case

    def test_same_key_same_tokens_and_jit(self):
        (logp, old, adv, mask), _ = self._batch()
        f = jax.jit(lambda key: clip_cov_loss(logp, old, adv, mask, key=key, clip_fraction=0.1,
                                              eps_low=0.2, eps_high=0.2))
        a, b = f(jax.random.key(7)), f(jax.random.key(7))
        np.testing.assert_array_equal(a[0], b[0])
        eager = clip_cov_loss(logp, old, adv, mask, key=jax.random.key(7), clip_fraction=0.1,
                              eps_low=0.2, eps_high=0.2)
        np.testing.assert_array_equal(a[1]["cov_detached"], eager[1]["cov_detached"])

    def test_draw_is_uniform_over_the_candidates(self):
        """The draw is the `count` candidates of largest uniform priority: a uniformly
        random subset (checked on 400 priority draws, the selector vmapped)."""
        _, case = self._batch()
        candidates = np.asarray(case["candidates"]) > 0
        priorities = np.random.default_rng(0).uniform(size=(400,) + candidates.shape)
        draws = np.asarray(jax.jit(jax.vmap(
            lambda u: _covariance._top_ranked(u, jnp.asarray(candidates), 4)))(priorities))
        assert np.all(draws.sum(axis=(1, 2)) == 4) and not draws[:, ~candidates].any()
        share = draws[:, candidates].mean(axis=0)   # 4 of 8 candidates: 1/2 each
        assert np.all(np.abs(share - 0.5) < 0.12), share
        assert len({d.tobytes() for d in draws}) > 20


# --------------------------------------------------------------------------- contract

def _riding_on(x, lp):
    return x + (lp - jax.lax.stop_gradient(lp))


LOSSES = {
    "gmpo": lambda lp, old, adv, mask: gmpo_loss(lp, old, adv, mask),
    "dppo_tv": lambda lp, old, adv, mask: dppo_loss(lp, old, adv, mask),
    "dppo_kl": lambda lp, old, adv, mask: dppo_loss(lp, old, adv, mask, divergence="binary_kl"),
    "clip_cov": lambda lp, old, adv, mask: clip_cov_loss(lp, old, adv, mask,
                                                         key=jax.random.key(3), clip_fraction=0.2),
    "kl_cov": lambda lp, old, adv, mask: kl_cov_loss(lp, old, adv, mask, kl_fraction=0.2),
}


class TestGradientContract:

    @pytest.mark.parametrize("name", sorted(LOSSES))
    def test_old_logp_and_advantages_are_constants(self, name):
        """old_logp = the differentiated array (on-policy) gives the policy gradient -A on
        every valid token (Clip-Cov: but the drawn ones), the same as passing a copy."""
        loss_fn = LOSSES[name]
        logp, _, adv, mask = (jnp.asarray(x, jnp.float32) for x in
                              _random_batch(20, adv=[2.2, -1.8, 1.5, -2.4, 2.0, 0.5]))
        total = lambda lp, old, a: loss_fn(lp, old, a, mask)[0].sum()  # noqa: E731
        constant = jax.grad(lambda lp: total(lp, logp, adv))(logp)
        same_array = jax.grad(lambda lp: total(lp, lp, adv))(logp)
        riding = jax.grad(lambda lp: total(lp, lp, _riding_on(adv, lp.sum(-1))))(logp)
        np.testing.assert_array_equal(same_array, constant)
        np.testing.assert_allclose(riding, constant, rtol=1e-6)
        expected = np.where(np.asarray(mask) > 0, -np.asarray(adv)[:, None], 0.0)
        if name == "clip_cov":
            expected *= 1.0 - np.asarray(loss_fn(logp, logp, adv, mask)[1]["cov_detached"])
            assert np.asarray(loss_fn(logp, logp, adv, mask)[1]["cov_detached"]).sum() > 0
        np.testing.assert_allclose(constant, expected, rtol=1e-6, atol=1e-7)
        assert np.all(np.asarray(constant)[expected != 0] != 0)

    def test_m2po_mask_carries_no_gradient(self):
        logp, old, _, mask = (jnp.asarray(x, jnp.float32) for x in _random_batch(21))
        g = jax.grad(lambda lp: jnp.sum(m2po_mask(lp, old, mask) * lp))(logp)
        np.testing.assert_array_equal(g, m2po_mask(logp, old, mask))

    @pytest.mark.parametrize("name", sorted(LOSSES))
    def test_padding_never_reaches_the_loss_or_gradient(self, name):
        logp, old, adv, mask = (jnp.asarray(x, jnp.float32) for x in _random_batch(22))
        pad = jnp.asarray(mask) == 0
        bad_logp, bad_old = jnp.where(pad, -jnp.inf, logp), jnp.where(pad, jnp.nan, old)
        loss, diag = LOSSES[name](bad_logp, bad_old, adv, mask)
        grad = jax.grad(lambda lp: LOSSES[name](lp, bad_old, adv, mask)[0].sum())(bad_logp)
        clean, _ = LOSSES[name](logp, old, adv, mask)
        np.testing.assert_array_equal(loss, clean)
        assert np.all(np.asarray(grad)[np.asarray(pad)] == 0) and np.all(np.isfinite(grad))
        for key, value in diag.items():
            assert np.all(np.asarray(value)[np.asarray(pad)] == 0), key
        assert {"ratio", "kl_old"} <= set(diag)

    def test_m2po_mask_jits_and_ignores_padding(self):
        logp, old, _, mask = (jnp.asarray(x, jnp.float32) for x in _random_batch(23))
        pad = jnp.asarray(mask) == 0
        jitted = jax.jit(lambda lp, o, m: m2po_mask(lp, o, m, tau=0.04))
        np.testing.assert_array_equal(
            jitted(jnp.where(pad, -jnp.inf, logp), jnp.where(pad, jnp.nan, old), mask),
            m2po_mask(logp, old, mask, tau=0.04))
        assert np.all(np.asarray(jitted(logp, old, mask))[np.asarray(pad)] == 0)
        empty = m2po_mask(logp, old, jnp.zeros_like(mask))
        np.testing.assert_array_equal(empty, 0.0)


# --------------------------------------------------------------------------- errors

CALLS = {
    "gmpo_loss": lambda lp, old, adv, mask: gmpo_loss(lp, old, adv, mask),
    "dppo_loss": lambda lp, old, adv, mask: dppo_loss(lp, old, adv, mask),
    "clip_cov_loss": lambda lp, old, adv, mask: clip_cov_loss(lp, old, adv, mask,
                                                              key=jax.random.key(0)),
    "kl_cov_loss": lambda lp, old, adv, mask: kl_cov_loss(lp, old, adv, mask),
    "m2po_mask": lambda lp, old, adv, mask: m2po_mask(lp, old, mask),
}


class TestBadArguments:

    @pytest.mark.parametrize("name", sorted(CALLS))
    def test_shapes_and_dtypes_name_the_argument(self, name):
        call = CALLS[name]
        lp, adv, mask = jnp.zeros((4, 5)), jnp.zeros(4), jnp.ones((4, 5))
        with pytest.raises(ValueError, match=f"{name}: old_logp must be \\[B, T\\] = \\[4, 5\\]"):
            call(lp, jnp.zeros((4, 6)), adv, mask)
        with pytest.raises(ValueError, match=f"{name}: mask must be"):
            call(lp, lp, adv, jnp.ones((5, 4)))
        with pytest.raises(ValueError, match=f"{name}: logp must be \\[B, T\\]"):
            call(jnp.zeros(20), jnp.zeros(20), adv, jnp.ones(20))
        with pytest.raises(TypeError, match=f"{name}: logp must be a floating array"):
            call(jnp.zeros((4, 5), jnp.int32), lp, adv, mask)
        if name != "m2po_mask":
            with pytest.raises(ValueError, match=f"{name}: adv \\(advantages\\) must be \\[B\\], "
                                                 "\\[B, 1\\] or \\[B, T\\]"):
                call(lp, lp, jnp.zeros(5), mask)

    @pytest.mark.parametrize("call, message", [
        (lambda: gmpo_loss(*_ZEROS, eps_low=-0.1), "eps_low must be >= 0"),
        (lambda: dppo_loss(*_ZEROS, divergence="tv"), "divergence must be one of"),
        (lambda: dppo_loss(*_ZEROS, delta_high=-1.0), "delta_high must be >= 0"),
        (lambda: dppo_loss(*_ZEROS, ratio_cap=0.0), "ratio_cap must be > 0"),
        (lambda: m2po_mask(_ZEROS[0], _ZEROS[1], _ZEROS[3], tau=0.0), "tau must be > 0"),
        (lambda: clip_cov_loss(*_ZEROS, key=jax.random.key(0), clip_fraction=0.0),
         "clip_fraction must be > 0"),
        (lambda: kl_cov_loss(*_ZEROS, kl_fraction=-1.0), "kl_fraction must be > 0"),
        (lambda: kl_cov_loss(*_ZEROS, kl_coef=-1.0), "kl_coef must be >= 0"),
    ])
    def test_hyper_parameters(self, call, message):
        with pytest.raises(ValueError, match=message):
            call()


_ZEROS = (jnp.zeros((2, 3)), jnp.zeros((2, 3)), jnp.zeros(2), jnp.ones((2, 3)))


@pytest.mark.parametrize("module", [_trust_region, _covariance], ids=lambda m: m.__name__)
def test_docstring_examples(module):
    result = run_examples(module)
    assert result.attempted > 0 and result.failed == 0
