"""On-policy distillation (Agarwal et al., arXiv:2306.13649) against numpy: the reverse KL
on sampled tokens, GKD's generalized JSD over the vocabulary, and the preset."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from grpo_jax import objectives
from grpo_jax.objectives import presets


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
