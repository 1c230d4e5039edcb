"""On-policy distillation (Agarwal et al., arXiv:2306.13649) against numpy and against TRL's
own code: the reverse KL on sampled tokens, GKD's generalized JSD over the vocabulary, and
the preset.

TRL's outputs are recorded by experiments/peer_agreement/record_trl_distill.py (torch,
float64, TRL 1.16.0's ``GKDTrainer.generalized_jsd_loss`` and
``compute_sampled_token_self_distillation_loss``, unmodified) into
peer_outputs/trl_distill.json; computed here in float32 they must match to 1e-6.
"""

import functools
import json
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from grpo_jax import objectives
from grpo_jax.objectives import presets

PEER = pathlib.Path(__file__).parent / "peer_outputs" / "trl_distill.json"
ATOL = 1e-6


@functools.lru_cache(maxsize=None)
def _peer():
    return json.loads(PEER.read_text())


def _arrays(case):
    inputs = case["inputs"]
    return (jnp.asarray(np.asarray(inputs["student_logits"]), jnp.float32),
            jnp.asarray(np.asarray(inputs["teacher_logits"]), jnp.float32),
            jnp.asarray(np.asarray(inputs["tokens"]), jnp.int32),
            jnp.asarray(np.asarray(inputs["mask"]), jnp.float32))


def _logps(b=4, t=5, seed=0):
    rng = np.random.default_rng(seed)
    mask = (np.arange(t) < rng.integers(1, t + 1, b)[:, None]).astype(np.float32)
    student = rng.normal(-1.5, 0.6, (b, t)).astype(np.float32)
    teacher = (student + rng.normal(0, 0.5, (b, t))).astype(np.float32)
    return student, teacher, mask


def _log_softmax(z):
    z = z - z.max(-1, keepdims=True)
    return z - np.log(np.exp(z).sum(-1, keepdims=True))


def _jsd_numpy(student_logits, teacher_logits, beta, temperature=1.0):
    q = np.exp(_log_softmax(student_logits.astype(np.float64) / temperature))
    p = np.exp(_log_softmax(teacher_logits.astype(np.float64) / temperature))
    kl = lambda a, b: np.sum(a * np.log(a / b), axis=-1)
    if beta == 0:
        return kl(p, q)
    if beta == 1:
        return kl(q, p)
    m = beta * p + (1 - beta) * q
    return beta * kl(p, m) + (1 - beta) * kl(q, m)


def test_reverse_kl_value_and_gradient():
    student, teacher, mask = _logps()
    loss_fn = lambda lp: objectives.aggregate(
        objectives.reverse_kl_distill_loss(lp, jnp.asarray(teacher), jnp.asarray(mask))[0],
        jnp.asarray(mask), mode="token-mean")
    value, grad = jax.value_and_grad(loss_fn)(jnp.asarray(student))
    k = np.where(mask > 0, student.astype(np.float64) - teacher, 0.0)
    np.testing.assert_allclose(value, k.sum() / mask.sum(), rtol=1e-6)
    np.testing.assert_allclose(grad, k / mask.sum(), rtol=1e-5, atol=1e-8)   # k grad logp


def test_reverse_kl_estimates_the_kl_under_the_student():
    """Enumerated over a categorical: E_{y~q}[k] = KL(q || p) exactly."""
    q = np.array([0.5, 0.3, 0.2])
    p = np.array([0.2, 0.2, 0.6])
    per = np.asarray(objectives.reverse_kl_distill_loss(
        jnp.log(jnp.asarray(q, jnp.float32))[None], jnp.log(jnp.asarray(p, jnp.float32))[None],
        jnp.ones((1, 3)))[0])[0]
    np.testing.assert_allclose(np.sum(q * per), np.sum(q * np.log(q / p)), rtol=1e-6)


@pytest.mark.parametrize("beta", [0.0, 0.1, 0.5, 0.9, 1.0])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_generalized_jsd_matches_numpy(beta, temperature):
    rng = np.random.default_rng(1)
    s = rng.normal(0, 2, (3, 4, 7)).astype(np.float32)
    t = rng.normal(0, 2, (3, 4, 7)).astype(np.float32)
    mask = np.array([[1, 1, 1, 0], [1, 0, 0, 0], [1, 1, 1, 1]], np.float32)
    got, _ = objectives.generalized_jsd(jnp.asarray(s), jnp.asarray(t), jnp.asarray(mask),
                                        beta=beta, temperature=temperature)
    np.testing.assert_allclose(got, np.where(mask > 0, _jsd_numpy(s, t, beta, temperature), 0),
                               rtol=2e-5, atol=1e-6)


def test_generalized_jsd_gradient_is_the_student_only():
    """d/dz_student of the masked sum: central differences in float64 numpy."""
    rng = np.random.default_rng(2)
    s = rng.normal(0, 1, (1, 2, 4)).astype(np.float32)
    t = rng.normal(0, 1, (1, 2, 4)).astype(np.float32)
    mask = jnp.ones((1, 2))
    grad_s, grad_t = jax.grad(lambda a, b: jnp.sum(objectives.generalized_jsd(
        a, b, mask, beta=0.3)[0]), argnums=(0, 1))(jnp.asarray(s), jnp.asarray(t))
    assert np.all(np.asarray(grad_t) == 0)
    numeric = np.zeros_like(s, np.float64)
    for idx in np.ndindex(s.shape):
        up, down = s.astype(np.float64).copy(), s.astype(np.float64).copy()
        up[idx] += 1e-5
        down[idx] -= 1e-5
        numeric[idx] = (_jsd_numpy(up, t, 0.3).sum() - _jsd_numpy(down, t, 0.3).sum()) / 2e-5
    np.testing.assert_allclose(grad_s, numeric, rtol=1e-3, atol=1e-6)


def test_bad_beta_and_mask_shape_raise():
    z = jnp.zeros((1, 2, 3))
    with pytest.raises(ValueError, match=r"beta must be in \[0, 1\], got 1.5"):
        objectives.generalized_jsd(z, z, jnp.ones((1, 2)), beta=1.5)
    with pytest.raises(ValueError, match=r"mask must be \[B, T\] = \[1, 2\]"):
        objectives.generalized_jsd(z, z, jnp.ones((1, 3)))


def test_preset_is_the_reverse_kl_policy_gradient():
    student, teacher, mask = _logps(seed=3)
    objective = presets.distill()
    assert objective.batch_keys()["required"] == ("old_logp", "mask", "teacher_logp")
    batch = {"mask": jnp.asarray(mask), "teacher_logp": jnp.asarray(teacher)}

    def loss(lp):   # on-policy: old_logp is the differentiated array
        return objective(lp, {**batch, "old_logp": lp})[0]

    value, grad = jax.value_and_grad(loss)(jnp.asarray(student))
    k = np.where(mask > 0, student.astype(np.float64) - teacher, 0.0)
    np.testing.assert_allclose(value, k.sum() / mask.sum(), rtol=1e-6)
    np.testing.assert_allclose(grad, k / mask.sum(), rtol=1e-5, atol=1e-8)
    adv = objective.advantages({**batch, "old_logp": jnp.asarray(student)})
    np.testing.assert_allclose(adv, -k, rtol=1e-6)


def test_preset_needs_the_teachers_logprobs():
    student, _, mask = _logps()
    with pytest.raises(KeyError, match=r"batch\['teacher_logp'\] is required by "
                                       r"advantage.estimator='reverse_kl'"):
        presets.distill()(jnp.asarray(student), {"old_logp": jnp.asarray(student),
                                                 "mask": jnp.asarray(mask)})


class TestAgainstTrl:

    def test_recorded_with_a_named_trl(self):
        peer = _peer()["peer"]
        assert peer["repo"] == "huggingface/trl" and peer["version"] == "1.16.0"
        configs = {(c["config"]["beta"], c["config"]["temperature"]) for c in _peer()["jsd"]}
        assert {0.0, 0.5, 1.0} <= {beta for beta, _ in configs}
        assert {1.0, 0.7} == {temperature for _, temperature in configs}
        masks = [np.asarray(c["inputs"]["mask"]) for c in _peer()["jsd"]]
        assert any((m.sum(1) == 0).any() for m in masks)   # a fully masked row is recorded

    @pytest.mark.parametrize("case", _peer()["jsd"], ids=lambda c: c["name"])
    def test_generalized_jsd(self, case):
        """Per position, GKD's masked "batchmean" loss (our token mean) and its gradient
        with respect to the student's logits."""
        student, teacher, _, mask = _arrays(case)
        beta, temperature = case["config"]["beta"], case["config"]["temperature"]
        per_position, _ = objectives.generalized_jsd(student, teacher, mask, beta=beta,
                                                     temperature=temperature)
        want = np.asarray(case["outputs"]["per_position"]) * np.asarray(mask)
        np.testing.assert_allclose(per_position, want, atol=ATOL, rtol=0)

        def loss(z):
            return objectives.aggregate(objectives.generalized_jsd(
                z, teacher, mask, beta=beta, temperature=temperature)[0], mask,
                mode="token-mean")

        value, grad = jax.jit(jax.value_and_grad(loss))(student)
        np.testing.assert_allclose(value, case["outputs"]["batchmean"], atol=ATOL, rtol=0)
        np.testing.assert_allclose(grad, case["outputs"]["grad_student_logits"], atol=ATOL,
                                   rtol=0)

    @pytest.mark.parametrize("case", _peer()["sampled_reverse_kl"], ids=lambda c: c["name"])
    def test_sampled_reverse_kl(self, case):
        """TRL's per-token loss is sg(k) log pi_s: its value is k times the student's
        log-prob, its gradient k grad log pi_s, which is ours (whose value is k)."""
        student, teacher, tokens, mask = _arrays(case)
        teacher_logp = objectives.token_logprobs(teacher, tokens)

        def loss(z):
            per_token, diagnostics = objectives.reverse_kl_distill_loss(
                objectives.token_logprobs(z, tokens), teacher_logp, mask)
            return jnp.sum(per_token), (per_token, diagnostics["reverse_kl"])

        (_, (per_token, k)), grad = jax.jit(jax.value_and_grad(loss, has_aux=True))(student)
        np.testing.assert_array_equal(per_token, k)
        # TRL's k: its per-token value over the student's log-prob (numpy, float64)
        logits = np.asarray(case["inputs"]["student_logits"])
        student_logp = np.take_along_axis(
            _log_softmax(logits), np.asarray(case["inputs"]["tokens"])[..., None], -1)[..., 0]
        trl_k = np.asarray(case["outputs"]["per_token"]) / student_logp
        np.testing.assert_allclose(k, trl_k * np.asarray(mask), atol=ATOL, rtol=0)
        np.testing.assert_allclose(grad, case["outputs"]["grad_student_logits"], atol=ATOL,
                                   rtol=0)

    def test_reverse_kl_expected_under_the_student_is_gkds_beta_one(self):
        """Averaged over the student's own tokens, our sampled reverse KL is GKD's
        beta = 1 divergence at each position (TRL's, recorded)."""
        case = next(c for c in _peer()["jsd"]
                    if c["config"] == {"beta": 1.0, "temperature": 1.0})
        student, teacher, _, mask = _arrays(case)
        b, t, v = student.shape
        every = jnp.broadcast_to(jnp.arange(v), (b, t, v)).transpose(2, 0, 1)   # [V, B, T]
        per_token = jax.vmap(lambda y: objectives.reverse_kl_distill_loss(
            objectives.token_logprobs(student, y), objectives.token_logprobs(teacher, y),
            jnp.ones((b, t)))[0])(every)
        q = np.exp(np.asarray(jax.nn.log_softmax(student, -1))).transpose(2, 0, 1)
        expected = np.sum(q * np.asarray(per_token), axis=0)
        np.testing.assert_allclose(expected * np.asarray(mask),
                                   np.asarray(case["outputs"]["per_position"]) * np.asarray(mask),
                                   atol=ATOL, rtol=0)
