"""Sampler/trainer mismatch corrections and decoupled PPO (grpo_jax.objectives._mismatch).

Three kinds of evidence, each independent of the others:

1. Peers' own code. tests/objectives/peer_outputs/*.json hold inputs and the outputs of
   verl's and AReaL's functions, recorded by experiments/peer_agreement/record_mismatch.py
   from pinned commits (each file names repo, path, commit and functions). The tests
   below reproduce them; where a peer's semantics differ on purpose, the test names the
   difference and checks both sides of it.
2. The papers' equations, transcribed in float64 numpy from probabilities (products and
   quotients, not log-space sums): TIS (Yao et al.), IcePop's M(k; alpha, beta)
   (arXiv:2510.18855), AReaL's decoupled objective (arXiv:2505.24298, eq. 5) and its
   gradient, and the KL / chi-square estimators.
3. The gradient contract and the argument checks.
"""

import json
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from grpo_jax.objectives import _mismatch
from grpo_jax.objectives._mismatch import decoupled_ppo_loss, mismatch_metrics, rollout_correction
from grpo_jax.objectives._policy_losses import ppo_clip_loss
from grpo_jax.objectives._shaping import importance_weights
from tests.doctest_numbers import run_examples

PEERS = pathlib.Path(__file__).parent / "peer_outputs"
RTOL, ATOL = 2e-6, 1e-6          # float32 against float32 (torch on CPU)
PAPER_RTOL, PAPER_ATOL = 1e-5, 1e-6   # float32 against a float64 transcription
EMPTY_ROW_CASES = {"moderate_ragged", "large_ragged"}   # a row without valid tokens
BEYOND_CLAMP = "beyond_clamp"    # token log-ratios of +25, -23 and +21
B, T = 6, 7                      # the recorded cases' shape; the other tests reuse it


def _load(name):
    document = json.loads((PEERS / f"{name}.json").read_text())
    cases = {case: {k: np.asarray(v, np.float32) for k, v in arrays.items()}
             for case, arrays in document["cases"].items()}
    return document, cases


def _calls(name, function):
    document, cases = _load(name)
    return [
        (call, cases[call["case"]]) for call in document["calls"] if call["function"] == function
    ]


def _close(ours, theirs, rtol=RTOL, atol=ATOL):
    np.testing.assert_allclose(np.asarray(ours, np.float64), np.asarray(theirs, np.float64),
                               rtol=rtol, atol=atol)


PEER_FILES = ("verl_rollout_corr_helper", "verl_mismatch_helper", "areal_ppo_actor_loss_fn",
              "areal_ppo_actor_loss_fn_behav_imp_weight_cap")


@pytest.mark.parametrize("name", PEER_FILES)
def test_peer_files_name_their_source(name):
    document, _ = _load(name)
    peer = document["peer"]
    assert set(peer) >= {"repo", "path", "commit", "functions"}, name
    assert len(peer["commit"]) == 40, name
    assert document["recorded_with"]["script"] == "experiments/peer_agreement/record_mismatch.py"


# --- 1. verl, rollout_corr_helper.py (current): truncated IS, rejection masks, metrics.

def test_verl_truncated_importance_weights():
    calls = _calls("verl_rollout_corr_helper", "compute_rollout_correction_weights")
    assert len(calls) == 20
    for call, x in calls:
        kw = call["kwargs"]
        weights, diag = rollout_correction(x["trainer_logp"], x["sampler_logp"], x["mask"],
                                           level=kw["rollout_is"], mode="truncate",
                                           high=kw["rollout_is_threshold"])
        _close(weights, call["outputs"]["weights"])
        if kw["rollout_is"] == "token":   # verl's sequence share counts rows, ours tokens
            _close(diag["truncated_fraction"], call["outputs"]["rollout_is_ratio_fraction_high"])


def _verl_k1_bounds(spec):
    """verl's "lower_upper" (or "upper": lower = 1/upper) ratio-bound spec."""
    lower, upper = spec.split("_") if "_" in spec else (1.0 / float(spec), spec)
    return float(lower), float(upper)


VERL_RS_LEVELS = {"token_k1": "token", "seq_sum_k1": "sequence", "seq_mean_k1": "geometric"}


def _per_token_clamped_keep(x, option, lower, upper):
    """verl's rejection rule as it is: each token's log-ratio clamped to +-20 first, and
    the bounds compared with -log-ratio, i.e. with pi_sampler / pi_trainer."""
    valid = x["mask"] > 0
    k1 = -np.clip(x["trainer_logp"].astype(np.float64) - x["sampler_logp"], -20, 20)
    k1 = np.where(valid, k1, 0.0)
    if option == "seq_sum_k1":
        k1 = np.broadcast_to(k1.sum(-1, keepdims=True), k1.shape)
    elif option == "seq_mean_k1":
        k1 = np.broadcast_to(
            k1.sum(-1, keepdims=True) / (valid.sum(-1, keepdims=True) + 1e-8), k1.shape
        )
    return valid & (k1 >= np.log(lower)) & (k1 <= np.log(upper))


def test_verl_rejection_masks():
    """verl's k1 bounds apply to pi_sampler / pi_trainer: its [lower, upper] is our
    [1/upper, 1/lower] on pi_trainer / pi_sampler (the same band when lower = 1/upper).

    One documented difference: verl's seq_sum_k1 / seq_mean_k1 clamp each token's
    log-ratio to +-20 before the sum / mean, our sequence and geometric weights clamp the
    sum / mean (as verl's own importance weights do). Row 1 of the beyond_clamp case holds
    +25 and -23: its product of ratios is exp(2 + noise), which verl's sum reads as
    exp(0 + noise) (geometric: exp((2 + noise) / 7) against exp(noise / 7))."""
    calls = _calls("verl_rollout_corr_helper", "compute_rollout_rejection_mask")
    assert len(calls) == 45
    differ = []
    for call, x in calls:
        option, spec = call["kwargs"]["rollout_rs"], call["kwargs"]["rollout_rs_threshold"]
        lower, upper = _verl_k1_bounds(spec)
        _, diag = rollout_correction(x["trainer_logp"], x["sampler_logp"], x["mask"],
                                     level=VERL_RS_LEVELS[option], mode="mask",
                                     low=1.0 / upper, high=1.0 / lower)
        ours = (x["mask"] > 0) & (np.asarray(diag["masked"]) == 0)
        theirs = np.asarray(call["outputs"]["modified_response_mask"]) > 0
        np.testing.assert_array_equal(theirs, _per_token_clamped_keep(x, option, lower, upper))
        if call["case"] == BEYOND_CLAMP and option != "token_k1":
            differ.append((option, spec, list(np.nonzero((ours != theirs).any(axis=-1))[0])))
            continue
        np.testing.assert_array_equal(ours, theirs, err_msg=str(call["kwargs"]))
        _close(diag["masked_fraction"], call["outputs"]["rollout_rs_masked_fraction"])
    # Only row 1 ever differs: where one band keeps a ratio near 1 and rejects exp(2)
    # (sequence), or keeps exp(noise / 7) and rejects exp(2 / 7) = 1.33 (geometric).
    assert differ == [("seq_sum_k1", "2.0", [1]), ("seq_sum_k1", "0.5_5.0", [1]),
                      ("seq_sum_k1", "0.8_1.5", [1]), ("seq_mean_k1", "2.0", []),
                      ("seq_mean_k1", "0.5_5.0", []), ("seq_mean_k1", "0.8_1.5", [1])], differ


def _row_counts(mask):
    rows = mask.sum(-1) > 0
    return rows.sum(), len(rows)


def test_verl_offpolicy_metrics():
    """Token-level metrics agree as they are. Row means: verl averages over all B rows,
    a row without tokens counting as difference 0, perplexity 1 and chi-square 0; ours
    over the n rows with tokens. verl's k3 does not clamp the log-ratio (exp(25) there)."""
    calls = _calls("verl_rollout_corr_helper", "compute_offpolicy_metrics")
    assert len(calls) == 5
    for call, x in calls:
        ours = mismatch_metrics(x["trainer_logp"], x["sampler_logp"], x["mask"])
        theirs = call["outputs"]
        n, b = _row_counts(x["mask"])
        _close(ours["kl"], theirs["kl"], rtol=1e-5)
        _close(ours["chi2_token"], theirs["chi2_token"], rtol=1e-5)
        if call["case"] != BEYOND_CLAMP:
            _close(ours["k3_kl"], theirs["k3_kl"], rtol=1e-5)
        else:
            assert theirs["k3_kl"] > 1e9 and ours["k3_kl"] < 1e8
        for key in ("log_ppl_diff", "log_ppl_abs_diff"):
            _close(ours[key] * n / b, theirs[key], rtol=1e-5)
        for key in ("training_ppl", "rollout_ppl"):
            _close((ours[key] * n + (b - n)) / b, theirs[key], rtol=1e-5)
        _close(((ours["chi2_seq"] + 1) * n + (b - n)) / b - 1, theirs["chi2_seq"], rtol=1e-5)
        assert (n < b) == (call["case"] in EMPTY_ROW_CASES)


# --- 1. verl, mismatch_helper.py (Oct 2025): token / sequence / geometric x truncate / mask.

def test_verl_three_levels_two_modes():
    calls = _calls("verl_mismatch_helper", "compute_rollout_importance_weights")
    assert len(calls) == 75
    for call, x in calls:
        kw = call["kwargs"]
        upper, lower = kw["rollout_is_threshold"], kw["rollout_is_threshold_lower"]
        if kw["rollout_is_mode"] == "mask":
            bounds = {"low": 1.0 / upper if lower is None else lower, "high": upper}
        else:
            bounds = {"high": upper}
        weights, diag = rollout_correction(x["trainer_logp"], x["sampler_logp"], x["mask"],
                                           level=kw["rollout_is_level"],
                                           mode=kw["rollout_is_mode"], **bounds)
        out = call["outputs"]
        _close(weights, out["weights"])
        if kw["rollout_is_mode"] == "mask":
            _close(diag["masked_fraction"], out["mismatch/rollout_is_masked_fraction"])
        metrics = mismatch_metrics(x["trainer_logp"], x["sampler_logp"], x["mask"])
        _close(metrics["kl"], out["mismatch/mismatch_kl"], rtol=1e-5)
        if call["case"] != BEYOND_CLAMP:
            _close(metrics["k3_kl"], out["mismatch/mismatch_k3_kl"], rtol=1e-5)


# --- 1. AReaL, ppo_actor_loss_fn: with behav_imp_weight_cap, and with rejection_sampling.

def _ours_like_areal(x, kw, *, cap, mode):
    eps_low = kw["eps_clip"]
    eps_high = kw.get("eps_clip_higher") or eps_low
    mask = x["mask"]

    def scalar(logp):
        loss, diag = decoupled_ppo_loss(logp, x["prox_logp"], x["behav_logp"], x["adv"], mask,
                                        eps_low=eps_low, eps_high=eps_high,
                                        dual_clip=kw.get("c_clip"), behav_weight_cap=cap,
                                        behav_weight_mode=mode)
        return jnp.sum(loss) / max(mask.sum(), 1), (loss, diag)

    (value, (loss, diag)), grad = jax.value_and_grad(scalar, has_aux=True)(x["logp"])
    return value, grad, loss, diag


def _check_areal_call(call, x, *, cap, mode, clip_counts_kept_only=False):
    """`clip_counts_kept_only`: AReaL's current code reports clip_mask and dual_clip_mask
    on the tokens rejection sampling kept; ours (and its earlier code) on every valid
    token: the loss and gradient agree either way, the masked tokens having weight 0."""
    value, grad, loss, diag = _ours_like_areal(x, call["kwargs"], cap=cap, mode=mode)
    out = call["outputs"]
    _close(loss, out["per_token_loss"])
    _close(value, out["loss"])
    _close(grad, out["grad_logprobs"])
    kept = (np.asarray(diag["behav_weight"]) > 0) & (x["mask"] > 0)
    np.testing.assert_array_equal(kept, np.asarray(out["behave_mask"]))
    _close(diag["behav_weight"], out["behave_imp_weight"])
    scope = kept if clip_counts_kept_only else x["mask"] > 0
    clipped = np.asarray(diag["clip_low"] + diag["clip_high"]) > 0
    np.testing.assert_array_equal(clipped & scope, np.asarray(out["clip_mask"]))
    if call["kwargs"].get("c_clip") is not None:
        np.testing.assert_array_equal((np.asarray(diag["clip_dual"]) > 0) & scope,
                                      np.asarray(out["dual_clip_mask"]))


def test_areal_behav_imp_weight_cap():
    """AReaL before 2026-03: the weight pi_prox / pi_behav always applies, and
    behav_imp_weight_cap zeroes tokens whose weight exceeds it (no lower bound)."""
    calls = _calls("areal_ppo_actor_loss_fn_behav_imp_weight_cap", "ppo_actor_loss_fn")
    assert len(calls) == 16
    for call, x in calls:
        _check_areal_call(call, x, cap=call["kwargs"]["behav_imp_weight_cap"], mode="mask")


def test_areal_rejection_sampling():
    """AReaL now: rejection_sampling {token, ratio, upper} with action 'mask' is the old
    cap, 'clamp' is our 'truncate'. Documented difference: with rejection_sampling=None
    AReaL applies no behaviour weight at all (plain PPO around pi_prox); eq. 5, and this
    package, keep the uncapped weight."""
    calls = _calls("areal_ppo_actor_loss_fn", "ppo_actor_loss_fn")
    assert len(calls) == 20
    for call, x in calls:
        rs = call["kwargs"]["rejection_sampling"]
        if rs is None:
            plain, _ = ppo_clip_loss(x["logp"], x["prox_logp"], x["adv"], x["mask"],
                                     eps_low=call["kwargs"]["eps_clip"],
                                     eps_high=call["kwargs"]["eps_clip"])
            _close(plain, call["outputs"]["per_token_loss"])
            weighted, _ = decoupled_ppo_loss(x["logp"], x["prox_logp"], x["behav_logp"], x["adv"],
                                             x["mask"], eps_low=0.2, eps_high=0.2)
            same = np.allclose(weighted, plain, rtol=RTOL, atol=ATOL)
            assert same == (call["case"] == "prox_is_behav"), call["case"]
            continue
        assert rs["level"] == "token" and rs["metric"] == "ratio" and rs.get("lower") is None
        mode = {"mask": "mask", "clamp": "truncate"}[rs["action"]]
        _check_areal_call(call, x, cap=rs["upper"], mode=mode,
                          clip_counts_kept_only=rs["action"] == "mask")


# --- 2. The papers' equations, in float64 numpy from probabilities.

def _probs(logp):
    return np.exp(np.asarray(logp, np.float64))


def paper_weights(trainer_logp, sampler_logp, mask, *, level, mode, low=None, high=None):
    """TIS min(rho, C) and IcePop's M(k) = k on [alpha, beta], 0 outside; sequence level
    is the product of the token ratios, geometric level its |y|-th root."""
    rho = _probs(trainer_logp) / _probs(sampler_logp)
    valid = np.asarray(mask) > 0
    out = np.zeros(rho.shape)
    for i in range(rho.shape[0]):
        ts = np.nonzero(valid[i])[0]
        for t in ts:
            if level == "token":
                k = rho[i, t]
            elif level == "sequence":
                k = np.prod(rho[i, ts])
            else:
                k = np.prod(rho[i, ts]) ** (1.0 / len(ts))
            if mode == "truncate":
                out[i, t] = min(k, high)
            else:
                out[i, t] = k if low <= k <= high else 0.0
    return out


def paper_decoupled(logp, prox_logp, behav_logp, adv, mask, *, eps_low, eps_high):
    """Eq. 5 of arXiv:2505.24298 per token, negated, and its derivative in log pi_theta:
    -w A u where the unclipped term is the min, 0 where the clipped one is."""
    u = _probs(logp) / _probs(prox_logp)
    w = _probs(prox_logp) / _probs(behav_logp)
    adv = np.asarray(adv, np.float64)
    unclipped, clipped = u * adv, np.clip(u, 1 - eps_low, 1 + eps_high) * adv
    valid = np.asarray(mask) > 0
    loss = np.where(valid, -w * np.minimum(unclipped, clipped), 0.0)
    grad = np.where(valid & (unclipped <= clipped), -w * adv * u, 0.0)
    return loss, grad


def paper_metrics(trainer_logp, sampler_logp, mask):
    """Samples from the sampler: k1 = log(p_s / p_t), k3 = rho - 1 - log rho with
    rho = p_t / p_s, chi2 = E rho^2 - 1 (token) and E (prod rho)^2 - 1 (rows)."""
    p_t, p_s = _probs(trainer_logp), _probs(sampler_logp)
    valid = np.asarray(mask) > 0
    rho = (p_t / p_s)[valid]
    rows = [np.prod((p_t / p_s)[i][valid[i]]) for i in range(len(valid)) if valid[i].any()]
    return {"kl": np.mean(np.log(p_s / p_t)[valid]), "k3_kl": np.mean(rho - 1 - np.log(rho)),
            "chi2_token": np.mean(rho ** 2) - 1, "chi2_seq": np.mean(np.square(rows)) - 1,
            "abs_diff_max": np.max(np.abs(np.log(p_s / p_t))[valid])}


PAPER_SETTINGS = [("token", "truncate", None, 2.0), ("token", "truncate", None, 1.2),
                  ("token", "mask", 0.5, 5.0), ("token", "mask", 0.8, 1.25),
                  ("sequence", "truncate", None, 2.0), ("sequence", "mask", 0.5, 5.0),
                  ("geometric", "truncate", None, 1.1), ("geometric", "mask", 0.5, 2.0)]


@pytest.mark.parametrize("setting", PAPER_SETTINGS, ids=lambda s: "-".join(map(str, s)))
def test_weights_follow_the_papers(setting):
    level, mode, low, high = setting
    _, cases = _load("verl_rollout_corr_helper")
    for name, x in cases.items():
        if name == BEYOND_CLAMP:   # the +-20 safety clamp is not in the papers
            continue
        ours, _ = rollout_correction(x["trainer_logp"], x["sampler_logp"], x["mask"],
                                     level=level, mode=mode, low=low, high=high)
        expected = paper_weights(x["trainer_logp"], x["sampler_logp"], x["mask"],
                                 level=level, mode=mode, low=low, high=high)
        _close(ours, expected, rtol=PAPER_RTOL, atol=PAPER_ATOL)


def test_paper_defaults():
    """None takes the papers' values: C = 2 (TIS), [alpha, beta] = [0.5, 5] (IcePop)."""
    rng = np.random.default_rng(5)
    sampler = -np.abs(rng.normal(0, 1, (B, T))).astype(np.float32) - 0.01
    trainer = (sampler + rng.normal(0, 1.5, (B, T))).astype(np.float32)
    mask = np.ones((B, T), np.float32)
    for mode, bounds in (("truncate", {"high": 2.0}), ("mask", {"low": 0.5, "high": 5.0})):
        ours, _ = rollout_correction(trainer, sampler, mask, mode=mode)
        _close(ours, paper_weights(trainer, sampler, mask, level="token", mode=mode, **bounds),
               rtol=PAPER_RTOL, atol=PAPER_ATOL)


def test_bounds_are_inclusive():
    equal = jnp.log(jnp.full((B, T), 0.3))
    for low, high in ((1.0, 2.0), (0.5, 1.0)):
        weights, diag = rollout_correction(equal, equal, jnp.ones((B, T)), mode="mask",
                                           low=low, high=high)
        np.testing.assert_array_equal(weights, 1.0)
        assert float(diag["masked_fraction"]) == 0.0
    weights, diag = rollout_correction(equal, equal, jnp.ones((B, T)), high=1.0)
    np.testing.assert_array_equal(weights, 1.0)
    assert float(diag["truncated_fraction"]) == 0.0   # w = C is not truncated


@pytest.mark.parametrize("case", ["moderate_ragged", "large_stale", "prox_is_behav", "small"])
def test_decoupled_follows_eq5(case):
    _, cases = _load("areal_ppo_actor_loss_fn")
    x = cases[case]
    for eps_low, eps_high in ((0.2, 0.2), (0.2, 0.28), (0.1, 0.5)):
        def total(logp):
            loss, _ = decoupled_ppo_loss(logp, x["prox_logp"], x["behav_logp"], x["adv"],
                                         x["mask"], eps_low=eps_low, eps_high=eps_high)
            return jnp.sum(loss), loss

        (_, loss), grad = jax.value_and_grad(total, has_aux=True)(x["logp"])
        expected, expected_grad = paper_decoupled(x["logp"], x["prox_logp"], x["behav_logp"],
                                                  x["adv"], x["mask"], eps_low=eps_low,
                                                  eps_high=eps_high)
        _close(loss, expected, rtol=PAPER_RTOL, atol=PAPER_ATOL)
        _close(grad, expected_grad, rtol=PAPER_RTOL, atol=PAPER_ATOL)


def test_metrics_follow_the_estimators():
    _, cases = _load("verl_rollout_corr_helper")
    for name, x in cases.items():
        if name == BEYOND_CLAMP:
            continue
        ours = mismatch_metrics(x["trainer_logp"], x["sampler_logp"], x["mask"])
        for key, value in paper_metrics(x["trainer_logp"], x["sampler_logp"], x["mask"]).items():
            _close(ours[key], value, rtol=1e-5, atol=1e-6)


def test_metrics_with_weights_and_under_jit():
    _, cases = _load("verl_rollout_corr_helper")
    x = cases["large_ragged"]
    weights, diag = rollout_correction(x["trainer_logp"], x["sampler_logp"], x["mask"], mode="mask")
    eager = mismatch_metrics(x["trainer_logp"], x["sampler_logp"], x["mask"], weights=weights)
    jitted = jax.jit(mismatch_metrics)(x["trainer_logp"], x["sampler_logp"], x["mask"],
                                       weights=weights)
    assert set(eager) == set(jitted)
    for key in eager:
        assert eager[key].shape == () and eager[key].dtype == jnp.float32
        _close(jitted[key], eager[key], rtol=1e-6)
    _close(eager["masked_fraction"], diag["masked_fraction"])
    valid = x["mask"] > 0
    _close(eager["weight_mean"], np.asarray(weights)[valid].mean(), rtol=1e-6)
    empty = mismatch_metrics(x["trainer_logp"], x["sampler_logp"], np.zeros_like(x["mask"]))
    assert all(np.isfinite(v) for v in empty.values())


# --- Relations to the existing functions.

@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize(
    "mode,cap", [("truncate", 2.0), ("truncate", 0.7), ("mask", 2.0), ("mask", 3.0)]
)
def test_importance_weights_is_a_special_case(level, mode, cap):
    """_shaping.importance_weights(cap) = rollout_correction with [1/cap, cap] (mask) or
    C = cap (truncate)."""
    _, cases = _load("verl_rollout_corr_helper")
    for x in cases.values():
        old = importance_weights(x["trainer_logp"], x["sampler_logp"], x["mask"], level=level,
                                 cap=cap, mode=mode)
        bounds = {"low": 1.0 / cap, "high": cap} if mode == "mask" else {"high": cap}
        new, _ = rollout_correction(x["trainer_logp"], x["sampler_logp"], x["mask"], level=level,
                                    mode=mode, **bounds)
        _close(new, old)


def test_decoupled_is_ppo_clip_times_the_correction():
    _, cases = _load("areal_ppo_actor_loss_fn")
    x = cases["large_stale"]
    for cap, mode in ((None, "mask"), (2.0, "mask"), (2.0, "truncate")):
        loss, diag = decoupled_ppo_loss(x["logp"], x["prox_logp"], x["behav_logp"], x["adv"],
                                        x["mask"], eps_low=0.2, eps_high=0.28, dual_clip=3.0,
                                        behav_weight_cap=cap, behav_weight_mode=mode)
        clipped, _ = ppo_clip_loss(x["logp"], x["prox_logp"], x["adv"], x["mask"], eps_low=0.2,
                                   eps_high=0.28, dual_clip=3.0)
        if cap is None:
            weight = np.where(x["mask"] > 0, np.exp(x["prox_logp"] - x["behav_logp"]), 0.0)
        else:
            bounds = {"low": 0.0, "high": cap} if mode == "mask" else {"high": cap}
            weight, _ = rollout_correction(x["prox_logp"], x["behav_logp"], x["mask"], mode=mode,
                                           **bounds)
        _close(loss, np.asarray(clipped) * np.asarray(weight), rtol=1e-6)
        _close(diag["behav_weight"], weight, rtol=1e-6)
        assert (np.asarray(diag["behav_capped"]).sum() > 0) == (cap is not None)


# --- 3. Gradient contract and argument checks.

def _nan_padded(seed=7, b=B, t=T):
    rng = np.random.default_rng(seed)
    mask = (np.arange(t)[None] < np.array([7, 3, 0, 5, 6, 1])[:, None]).astype(np.float32)
    behav = -np.abs(rng.normal(0, 1, (b, t))) - 0.05
    prox = behav + rng.normal(0, 1.0, (b, t))
    logp = prox + rng.normal(0, 0.3, (b, t))
    pad = lambda a, v: jnp.asarray(np.where(mask > 0, a, v), jnp.float32)
    return (pad(logp, np.nan), pad(prox, -np.inf), pad(behav, np.nan),
            jnp.asarray(rng.normal(0, 1, (b,)), jnp.float32), jnp.asarray(mask))


def test_only_logp_gets_a_gradient():
    logp, prox, behav, adv, mask = _nan_padded()

    def total(lp, px, bh):
        loss, _ = decoupled_ppo_loss(lp, px, bh, adv, mask, eps_low=0.2, eps_high=0.28,
                                     behav_weight_cap=3.0)
        return jnp.sum(loss)

    g_logp, g_prox, g_behav = jax.grad(total, argnums=(0, 1, 2))(logp, prox, behav)
    assert np.isfinite(total(logp, prox, behav))
    np.testing.assert_array_equal(g_prox, 0.0)
    np.testing.assert_array_equal(g_behav, 0.0)
    g_logp = np.asarray(g_logp)
    assert np.all(np.isfinite(g_logp))
    np.testing.assert_array_equal(g_logp[np.asarray(mask) == 0], 0.0)
    _, diag = decoupled_ppo_loss(logp, prox, behav, adv, mask, eps_low=0.2, eps_high=0.28,
                                 behav_weight_cap=3.0)
    capped = np.asarray(diag["behav_capped"]) > 0
    assert capped.any()
    np.testing.assert_array_equal(g_logp[capped], 0.0)   # masked by the cap: zero gradient
    assert np.any(g_logp[~capped & (np.asarray(mask) > 0)] != 0.0)

    g_trainer = jax.grad(lambda tr: jnp.sum(rollout_correction(tr, behav, mask, mode="mask")[0]))(
        prox
    )
    np.testing.assert_array_equal(g_trainer, 0.0)
    g_metrics = jax.grad(lambda tr: sum(mismatch_metrics(tr, behav, mask).values()))(prox)
    np.testing.assert_array_equal(g_metrics, 0.0)


def test_prox_logp_may_be_the_differentiated_array():
    """The package's contract: passing logp itself as prox_logp gives the policy
    gradient -w A grad log pi, not zero."""
    logp, _, behav, adv, mask = _nan_padded()
    grad = jax.grad(lambda lp: jnp.sum(decoupled_ppo_loss(lp, lp, behav, adv, mask)[0]))(logp)
    weight = np.where(np.asarray(mask) > 0, np.exp(np.asarray(logp) - np.asarray(behav)), 0.0)
    expected = -weight * np.asarray(adv)[:, None]
    _close(grad, np.nan_to_num(expected), rtol=1e-6)


def test_outputs_are_zero_and_float32_at_masked_positions():
    logp, prox, behav, adv, mask = _nan_padded()
    loss, diag = decoupled_ppo_loss(logp, prox, behav, adv, mask, behav_weight_cap=2.0)
    for name, value in {"loss": loss, **diag}.items():
        assert value.shape == mask.shape and value.dtype == jnp.float32, name
        np.testing.assert_array_equal(np.asarray(value)[np.asarray(mask) == 0], 0.0, err_msg=name)
    for level in _mismatch.MISMATCH_LEVELS:
        weights, diag = rollout_correction(prox, behav, mask, level=level)
        assert weights.dtype == jnp.float32 and np.all(np.isfinite(weights))
        np.testing.assert_array_equal(np.asarray(weights)[np.asarray(mask) == 0], 0.0)
        assert diag["masked_fraction"].shape == ()
    bf16 = rollout_correction(prox.astype(jnp.bfloat16), behav.astype(jnp.bfloat16), mask)[0]
    assert bf16.dtype == jnp.float32


def test_jit_with_static_options():
    logp, prox, behav, adv, mask = _nan_padded()
    fn = jax.jit(rollout_correction, static_argnames=("level", "mode", "low", "high"))
    eager = rollout_correction(prox, behav, mask, level="geometric", mode="mask", low=0.3, high=3.0)
    _close(fn(prox, behav, mask, level="geometric", mode="mask", low=0.3, high=3.0)[0], eager[0])
    loss_fn = jax.jit(decoupled_ppo_loss, static_argnames=("eps_low", "eps_high", "dual_clip",
                                                           "behav_weight_cap", "behav_weight_mode"))
    _close(loss_fn(logp, prox, behav, adv, mask, behav_weight_cap=2.0)[0],
           decoupled_ppo_loss(logp, prox, behav, adv, mask, behav_weight_cap=2.0)[0])


def test_bad_shapes_name_the_argument():
    x = jnp.zeros((3, 5))
    with pytest.raises(ValueError, match="sampler_logp must be"):
        rollout_correction(x, jnp.zeros((3, 6)), jnp.ones((3, 5)))
    with pytest.raises(ValueError, match="mask must be"):
        rollout_correction(x, x, jnp.ones((3,)))
    with pytest.raises(ValueError, match=r"trainer_logp must be \[B, T\]"):
        rollout_correction(jnp.zeros((15,)), jnp.zeros((15,)), jnp.ones((15,)))
    with pytest.raises(TypeError, match="trainer_logp must be a floating array"):
        rollout_correction(jnp.zeros((3, 5), jnp.int32), x, jnp.ones((3, 5)))
    with pytest.raises(ValueError, match="weights must be"):
        mismatch_metrics(x, x, jnp.ones((3, 5)), weights=jnp.ones((3, 4)))
    with pytest.raises(ValueError, match="behav_logp must be"):
        decoupled_ppo_loss(x, x, jnp.zeros((5, 3)), jnp.zeros(3), jnp.ones((3, 5)))
    with pytest.raises(ValueError, match="adv"):
        decoupled_ppo_loss(x, x, x, jnp.zeros((3, 6)), jnp.ones((3, 5)))
    with pytest.raises(ValueError, match="prox_logp must be"):
        decoupled_ppo_loss(x, jnp.zeros((3, 4)), x, jnp.zeros(3), jnp.ones((3, 5)))


def test_bad_options_are_refused():
    x, mask = jnp.zeros((2, 3)), jnp.ones((2, 3))
    with pytest.raises(ValueError, match="level must be one of"):
        rollout_correction(x, x, mask, level="geo")
    with pytest.raises(ValueError, match="mode must be one of"):
        rollout_correction(x, x, mask, mode="clip")
    with pytest.raises(ValueError, match="applies to mode='mask' only"):
        rollout_correction(x, x, mask, mode="truncate", low=0.5)
    with pytest.raises(ValueError, match="low must be < high"):
        rollout_correction(x, x, mask, mode="mask", low=2.0, high=2.0)
    with pytest.raises(ValueError, match="low must be >= 0"):
        rollout_correction(x, x, mask, mode="mask", low=-0.1)
    with pytest.raises(ValueError, match="high must be > 0"):
        rollout_correction(x, x, mask, high=0.0)
    with pytest.raises(ValueError, match="behav_weight_mode must be one of"):
        decoupled_ppo_loss(x, x, x, jnp.zeros(2), mask, behav_weight_mode="clamp")
    with pytest.raises(ValueError, match="behav_weight_cap must be > 0"):
        decoupled_ppo_loss(x, x, x, jnp.zeros(2), mask, behav_weight_cap=0.0)
    with pytest.raises(ValueError, match="dual_clip must be > 1"):
        decoupled_ppo_loss(x, x, x, jnp.zeros(2), mask, dual_clip=1.0)


def test_docstring_examples():
    result = run_examples(_mismatch)
    assert result.attempted > 0 and result.failed == 0
    for fn in (rollout_correction, mismatch_metrics, decoupled_ppo_loss):
        for section in ("Args:", "Returns:", "Example:", "References:", ".. math::", "["):
            assert section in fn.__doc__, (fn.__name__, section)
    for fn in (rollout_correction, decoupled_ppo_loss):
        assert "arXiv:" in fn.__doc__ and "eq." in fn.__doc__ or "M(k" in fn.__doc__
