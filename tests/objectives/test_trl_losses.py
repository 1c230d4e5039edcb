"""TRL's losses: bnpo, LUSPO, VESPO, top-entropy token selection, adaptive entropy control.

Two independent checks for each:

1. TRL's own outputs, recorded by experiments/peer_agreement/record_trl.py from its
   unmodified ``GRPOTrainer._compute_loss`` (torch, float64) into
   peer_outputs/trl_grpo_losses.json: the loss and its gradient with respect to the
   policy's log-probs must match to 1e-6, computed here in float32 through the composer;
   the adaptive controller's coefficients step by step.
2. Small numpy computations written from the papers' formulas.
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
from grpo_jax.objectives import presets

PEER = pathlib.Path(__file__).parent / "peer_outputs" / "trl_grpo_losses.json"
ATOL = 1e-6
# TRL's loss_type -> (loss.kind, aggregation.mode) here.
TRL_LOSS_TYPES = {"bnpo": ("ppo_clip", "bnpo"), "dapo": ("ppo_clip", "token-mean"),
                  "grpo": ("ppo_clip", "seq-mean-token-mean"),
                  "luspo": ("luspo", "seq-mean-token-sum"), "vespo": ("vespo", "token-mean")}


@functools.lru_cache(maxsize=None)
def _peer():
    return json.loads(PEER.read_text())


def _section(config):
    """The objective section that is TRL's `config` (a recorded case's)."""
    kind, mode = TRL_LOSS_TYPES[config["loss_type"]]
    loss = {"kind": kind}
    if kind in ("ppo_clip", "luspo"):
        loss.update(eps_low=config["epsilon_low"], eps_high=config["epsilon_high"])
    if kind == "vespo":
        loss.update({k: config[f"vespo_{k}"] for k in ("k_pos", "lambda_pos", "k_neg",
                                                       "lambda_neg")})
    return {"group_size": 2, "loss": loss, "aggregation": {"mode": mode},
            "top_entropy_quantile": config["top_entropy_quantile"]}


def _run(section, inputs):
    arrays = {k: jnp.asarray(np.asarray(v), jnp.float32) for k, v in inputs.items()}
    batch = {"old_logp": arrays["old_logp"], "mask": arrays["mask"],
             "advantages": arrays["advantages"], "entropy": arrays["entropy"]}
    objective = objectives.policy_objective(section)
    (loss, metrics), grad = jax.jit(jax.value_and_grad(objective, has_aux=True))(
        arrays["logp"], batch)
    return loss, grad, metrics


class TestAgainstTrl:

    def test_recorded_with_a_named_trl(self):
        peer = _peer()["peer"]
        assert peer["repo"] == "huggingface/trl" and peer["version"] == "1.16.0"
        assert {c["config"]["loss_type"] for c in _peer()["cases"]} == set(TRL_LOSS_TYPES)

    @pytest.mark.parametrize("case", _peer()["cases"], ids=lambda c: c["name"])
    def test_loss_and_gradient(self, case):
        loss, grad, metrics = _run(_section(case["config"]), case["inputs"])
        np.testing.assert_allclose(loss, case["outputs"]["loss"], atol=ATOL, rtol=0)
        want = np.asarray(case["outputs"]["grad"])
        if case["config"]["loss_type"] == "luspo" and case["config"]["top_entropy_quantile"] < 1:
            # TRL's sequence ratio spreads the gradient over every token of the answer;
            # here only the selected tokens carry it (the value is the same).
            keep = objectives.top_entropy_mask(jnp.asarray(case["inputs"]["entropy"]),
                                               jnp.asarray(case["inputs"]["mask"]),
                                               quantile=case["config"]["top_entropy_quantile"])
            np.testing.assert_array_equal(np.asarray(grad)[np.asarray(keep) == 0], 0.0)
            assert np.abs(np.asarray(grad) - want).max() > 1e-3   # the difference is real
        else:
            np.testing.assert_allclose(grad, want, atol=ATOL, rtol=0)
        if case["config"]["top_entropy_quantile"] < 1:
            mask = np.asarray(case["inputs"]["mask"])
            kept = float(metrics["entropy_kept"]) * mask.sum()
            assert 1 <= round(kept) <= math.ceil(case["config"]["top_entropy_quantile"]
                                                 * mask.sum()) + 1

    def test_adaptive_entropy_controller(self):
        record = _peer()["adaptive_entropy"]
        config, mask = record["config"], np.asarray(record["mask"]) > 0
        coef, last = config["entropy_coef"], math.inf
        keywords = dict(target=config["entropy_target"], delta=config["entropy_coef_delta"],
                        low=config["entropy_coef_min"], high=config["entropy_coef_max"])
        for step in record["steps"]:
            applied = objectives.entropy_bonus_coef(coef, last, target=config["entropy_target"])
            entropy = np.asarray(step["entropy"])[mask].mean()
            coef = objectives.adaptive_entropy_coef(coef, entropy, **keywords)
            last = entropy
            np.testing.assert_allclose(applied, step["applied_coef"], atol=1e-7)
            np.testing.assert_allclose(coef, step["coef_after"], atol=1e-7)
        assert {s["applied_coef"] for s in record["steps"]} >= {0.0, 0.02, 0.05}


def _np_batch(seed, lengths=(4, 2, 3, 1), T=4):
    rng = np.random.default_rng(seed)
    old = np.log(rng.uniform(0.1, 0.9, (len(lengths), T)))
    logp = old + rng.normal(0, 0.2, old.shape)
    mask = (np.arange(T)[None] < np.asarray(lengths)[:, None]).astype(np.float64)
    return logp, old, mask


class TestBnpo:

    def test_local_token_mean_weighted_by_its_rows(self):
        loss = jnp.array([[1.0, 1, 0], [2, 0, 0]])
        mask = jnp.array([[1, 1, 0], [1, 0, 0]])
        agg = functools.partial(objectives.aggregate, loss, mask, mode="bnpo")
        np.testing.assert_allclose(agg(), 4 / 3, rtol=1e-6)   # no counts: the token mean
        np.testing.assert_allclose(agg(num_tokens=30.0), 4 / 3, rtol=1e-6)   # local n
        np.testing.assert_allclose(agg(num_seqs=4.0), 4 / 3 * 2 / 4, rtol=1e-6)
        np.testing.assert_allclose(agg(num_seqs=4.0, local_seqs=1.0), 4 / 3 / 4, rtol=1e-6)
        assert float(objectives.aggregate(loss, jnp.zeros((2, 3)), mode="bnpo")) == 0.0

    def test_micro_batches_sum_to_trls_accumulated_loss(self):
        """Two micro-batches: the mean of their token means (TRL divides each by the
        accumulation steps), not the full batch's token mean."""
        logp, old, mask = _np_batch(0)
        adv = np.array([1.0, -0.5, 0.3, -1.2])
        objective = objectives.policy_objective({"group_size": 2, "aggregation":
                                                 {"mode": "bnpo"}})
        batch = {"old_logp": old, "mask": mask, "advantages": adv, "num_seqs": 4.0}
        halves = [objective(jnp.asarray(logp[s]), {k: (v[s] if np.ndim(v) else v)
                                                   for k, v in batch.items()})[0]
                  for s in (slice(0, 2), slice(2, 4))]
        ratio = np.exp(logp - old)
        per_token = -np.minimum(ratio * adv[:, None], np.clip(ratio, 0.8, 1.2) * adv[:, None])
        means = [np.sum((per_token * mask)[s]) / np.sum(mask[s]) for s in (slice(0, 2),
                                                                             slice(2, 4))]
        np.testing.assert_allclose(float(sum(halves)), np.mean(means), rtol=1e-5)
        token_mean = np.sum(per_token * mask) / np.sum(mask)
        assert abs(np.mean(means) - token_mean) > 1e-3   # the split matters

    def test_padding_rows_do_not_count(self):
        """With row_valid, a micro-batch's weight is its real rows over num_seqs."""
        logp, old, mask = _np_batch(1)
        mask[1] = 0.0
        objective = objectives.policy_objective({"group_size": 2, "aggregation":
                                                 {"mode": "bnpo"}})
        batch = {"old_logp": old, "mask": mask, "advantages": np.array([1.0, 0, -1, 1]),
                 "row_valid": np.array([True, False, True, True]), "num_seqs": 6.0}
        loss = objective(jnp.asarray(logp), batch)[0]
        local = objective(jnp.asarray(logp), {k: v for k, v in batch.items()
                                              if k not in ("row_valid", "num_seqs")})[0]
        np.testing.assert_allclose(loss, local * 3 / 6, rtol=1e-6)


class TestLuspo:

    def test_on_policy_value_and_gradient(self):
        """s_i = 1: the loss is mean_i(-A_i |y_i|), the gradient -A_i / B on every token
        (GSPO's is -A_i / (B |y_i|))."""
        logp = jnp.log(jnp.array([[0.5, 0.4, 0.3], [0.2, 0.9, 0.6]]))
        mask = jnp.array([[1.0, 1, 0], [1, 0, 0]])
        batch = {"old_logp": logp, "mask": mask, "advantages": jnp.array([1.0, -1.0])}
        objective = presets.luspo(group_size=2)
        loss, grad = jax.value_and_grad(lambda lp: objective(lp, batch)[0])(logp)
        np.testing.assert_allclose(loss, -(1.0 * 2 - 1.0 * 1) / 2, rtol=1e-6)
        np.testing.assert_allclose(grad, [[-0.5, -0.5, 0], [0.5, 0, 0]], atol=1e-7)
        gspo = jax.grad(lambda lp: presets.gspo(group_size=2)(lp, batch)[0])(logp)
        np.testing.assert_allclose(gspo, [[-0.25, -0.25, 0], [0.5, 0, 0]], atol=1e-7)

    def test_clipped_sequence_has_no_gradient(self):
        logp = jnp.log(jnp.array([[0.6, 0.6], [0.5, 0.5]]))
        old = jnp.log(jnp.array([[0.5, 0.5], [0.5, 0.5]]))    # s_0 = 1.2 > 1 + 4e-4
        batch = {"old_logp": old, "mask": jnp.ones((2, 2)), "advantages": jnp.array([1.0, 1])}
        loss, grad = jax.value_and_grad(
            lambda lp: presets.luspo(group_size=2)(lp, batch)[0])(logp)
        np.testing.assert_allclose(loss, (-(1 + 4e-4) * 2 - 1.0 * 2) / 2, rtol=1e-6)
        np.testing.assert_allclose(grad[0], 0.0)


class TestVespo:

    @staticmethod
    def _phi(log_w, k, lam):
        return math.exp(lam + k * log_w - lam * math.exp(log_w))

    def test_kernel_by_hand(self):
        logp = np.log(np.array([[0.5, 0.6, 0.2], [0.3, 0.3, 0.3]]))
        old = np.log(np.array([[0.45, 0.5, 0.9], [0.5, 0.2, 0.3]]))
        mask = np.array([[1.0, 1, 0], [1, 1, 1]])
        adv = np.array([0.7, -1.5])
        loss, diag = objectives.vespo_loss(jnp.asarray(logp), jnp.asarray(old), adv, mask)
        log_w = [np.log(0.5 / 0.45) + np.log(0.6 / 0.5),
                 np.log(0.3 / 0.5) + np.log(0.3 / 0.2)]
        phi = [self._phi(log_w[0], 2.0, 3.0), self._phi(log_w[1], 3.0, 2.0)]
        want = -np.array(phi)[:, None] * adv[:, None] * logp * mask
        np.testing.assert_allclose(loss, want, rtol=1e-5)
        np.testing.assert_allclose(diag["vespo_weight"], np.array(phi)[:, None] * mask,
                                   rtol=1e-5)
        grad = jax.grad(lambda lp: jnp.sum(objectives.vespo_loss(lp, old, adv, mask)[0]))(
            jnp.asarray(logp, jnp.float32))
        np.testing.assert_allclose(grad, -np.array(phi)[:, None] * adv[:, None] * mask,
                                   rtol=1e-5)

    def test_kernel_is_one_at_one_and_peaks_at_k_over_lambda(self):
        mask = jnp.ones((3, 1))
        log_w = np.log([1.0, 2 / 3, 1.5])   # k / lambda = 2 / 3 for A >= 0
        old = jnp.zeros((3, 1))
        weights = objectives.vespo_loss(jnp.asarray(log_w[:, None], jnp.float32), old,
                                        jnp.ones(3), mask)[1]["vespo_weight"][:, 0]
        np.testing.assert_allclose(weights[0], 1.0, rtol=1e-6)
        assert weights[1] > weights[0] > weights[2]
        np.testing.assert_allclose(weights[1], self._phi(log_w[1], 2.0, 3.0), rtol=1e-6)

    def test_hostile_ratios_give_finite_weights(self):
        logp = jnp.array([[0.0, 0.0], [-80.0, -80.0]])
        old = jnp.array([[-80.0, -80.0], [0.0, 0.0]])
        loss, diag = objectives.vespo_loss(logp, old, jnp.array([1.0, -1.0]), jnp.ones((2, 2)))
        assert np.all(np.isfinite(np.asarray(loss)))
        np.testing.assert_allclose(diag["vespo_weight"], 0.0, atol=1e-6)


class TestTopEntropy:

    @pytest.mark.parametrize("quantile", [0.0, 0.2, 0.37, 0.5, 0.8, 1.0])
    def test_matches_numpy_quantile(self, quantile):
        rng = np.random.default_rng(int(quantile * 100))
        entropy = rng.uniform(0, 3, (5, 7))
        mask = (rng.uniform(size=(5, 7)) < 0.7).astype(np.float32)
        threshold = np.quantile(entropy[mask > 0], 1 - quantile)
        want = (entropy >= threshold) & (mask > 0)
        got = jax.jit(functools.partial(objectives.top_entropy_mask, quantile=quantile))(
            jnp.asarray(entropy, jnp.float32), mask)
        np.testing.assert_array_equal(np.asarray(got), want.astype(np.float32))

    def test_ends_and_an_empty_batch(self):
        entropy = jnp.array([[0.3, 2.0, 1.0], [5.0, 0.1, 0.2]])
        mask = jnp.array([[1, 1, 1], [0, 1, 1]])
        keep = functools.partial(objectives.top_entropy_mask, entropy, mask)
        np.testing.assert_array_equal(keep(quantile=1.0), mask)
        np.testing.assert_array_equal(keep(quantile=0.0), [[0, 1, 0], [0, 0, 0]])  # 5.0 masked
        np.testing.assert_array_equal(
            objectives.top_entropy_mask(entropy, jnp.zeros((2, 3)), quantile=0.2), 0.0)

    def test_composer_keeps_kl_on_every_token(self):
        """The selection zeroes the policy term only; KL and normalisation keep all tokens."""
        logp, old, mask = _np_batch(3)
        ref = old - 0.1
        entropy = np.random.default_rng(4).uniform(0, 2, mask.shape)
        adv = np.array([1.0, -0.5, 0.3, -1.2])
        section = {"group_size": 2, "top_entropy_quantile": 0.25, "kl": {"beta": 0.1}}
        batch = {"old_logp": old, "mask": mask, "advantages": adv, "entropy": entropy,
                 "ref_logp": ref}
        loss = objectives.policy_objective(section)(jnp.asarray(logp), batch)[0]
        keep = np.asarray(objectives.top_entropy_mask(jnp.asarray(entropy), mask,
                                                      quantile=0.25))
        ratio = np.exp(logp - old)
        pg = -np.minimum(ratio * adv[:, None], np.clip(ratio, 0.8, 1.2) * adv[:, None])
        kl = np.exp(ref - logp) - (ref - logp) - 1
        want = np.sum((pg * keep + 0.1 * kl) * mask) / np.sum(mask)
        np.testing.assert_allclose(loss, want, rtol=1e-5)
        assert 0 < keep.sum() < mask.sum()


class TestAdaptiveEntropy:

    def test_steps_by_hand(self):
        step = functools.partial(objectives.adaptive_entropy_coef, target=0.5, delta=0.02,
                                 low=0.0, high=0.05)
        np.testing.assert_allclose(step(0.01, 0.3), 0.03, rtol=1e-6)    # below target: up
        np.testing.assert_allclose(step(0.04, 0.5), 0.05, rtol=1e-6)    # capped at high
        np.testing.assert_allclose(step(0.01, 0.9), 0.0, atol=1e-9)     # above: down, floored
        assert float(objectives.entropy_bonus_coef(0.03, 0.6, target=0.5)) == 0.0
        np.testing.assert_allclose(objectives.entropy_bonus_coef(0.03, 0.5, target=0.5), 0.03)

    def test_bounds_are_checked(self):
        with pytest.raises(ValueError, match="low must be <= high, got 0.2 and 0.1"):
            objectives.adaptive_entropy_coef(0.1, 0.3, target=0.5, delta=0.01, low=0.2,
                                             high=0.1)
        with pytest.raises(ValueError, match="delta must be >= 0"):
            objectives.adaptive_entropy_coef(0.1, 0.3, target=0.5, delta=-1, low=0, high=1)


class TestMisuse:

    def test_luspo_keeps_its_aggregation(self):
        with pytest.raises(ValueError, match="defines with 'seq-mean-token-sum'"):
            presets.luspo(group_size=2, aggregation="token-mean")
        presets.luspo(group_size=2, aggregation="token-mean", allow_other_modes=True)

    def test_vespo_refuses_the_token_importance_weight(self):
        with pytest.raises(ValueError, match="importance.enabled=True with objective.loss.kind"):
            presets.vespo(group_size=2, importance=True)

    def test_unread_and_impossible_fields(self):
        with pytest.raises(ValueError, match="loss.eps_high=0.3 has no effect"):
            presets.vespo(group_size=2, eps_high=0.3)
        with pytest.raises(ValueError, match="loss.k_pos=1.0 has no effect"):
            presets.luspo(group_size=2, vespo_k_pos=1.0)
        with pytest.raises(ValueError, match="loss.lambda_neg must be > 0.0, got 0"):
            presets.vespo(group_size=2, lambda_neg=0)
        with pytest.raises(ValueError, match="top_entropy_quantile must be in"):
            presets.dapo(group_size=2, top_entropy_quantile=1.5)

    def test_top_entropy_needs_the_entropy(self):
        logp, old, mask = _np_batch(0)
        objective = presets.dapo(group_size=2, top_entropy_quantile=0.2)
        assert "entropy" in objective.batch_keys()["required"]
        with pytest.raises(KeyError, match="top_entropy_quantile < 1"):
            objective(jnp.asarray(logp), {"old_logp": old, "mask": mask,
                                          "advantages": np.ones(4)})

    def test_trl_names_point_to_the_fields(self):
        with pytest.raises(TypeError, match="'luspo' and 'vespo' are policy_loss"):
            presets.dapo(group_size=2, loss_type="luspo")
        with pytest.raises(TypeError, match="adaptive_entropy_coef"):
            presets.dapo(group_size=2, use_adaptive_entropy=True)


class TestStepCoefficient:

    def test_batch_entropy_coef_replaces_the_field(self):
        """An adaptive controller's coefficient rides in the batch: no rebuild per step."""
        logp, old, mask = _np_batch(5)
        entropy = np.random.default_rng(6).uniform(0, 2, mask.shape)
        batch = {"old_logp": old, "mask": mask, "advantages": np.array([1.0, -1, 0.5, 0]),
                 "entropy": entropy}
        base = objectives.policy_objective({"group_size": 2})
        fixed = objectives.policy_objective({"group_size": 2, "entropy_coef": 0.03})
        stepped = base(jnp.asarray(logp), {**batch, "entropy_coef": jnp.float32(0.03)})[0]
        np.testing.assert_allclose(stepped, fixed(jnp.asarray(logp), batch)[0], rtol=1e-6)
        plain = base(jnp.asarray(logp), batch)[0]
        bonus = 0.03 * np.sum(entropy * mask) / np.sum(mask)
        np.testing.assert_allclose(float(plain) - float(stepped), bonus, rtol=1e-5)
        with pytest.raises(KeyError, match="batch\\['entropy_coef'\\]"):
            base(jnp.asarray(logp), {k: v for k, v in {**batch, "entropy_coef": 0.1}.items()
                                     if k != "entropy"})
