"""Off-policy, the policy losses are different algorithms; on-policy they coincide.

One batch whose behaviour log-probs come from a perturbed policy, so the token ratios
pi_theta / pi_old spread over [0.5, 2] (several optimizer steps per rollout batch, as the
papers run). Every loss is aggregated the same way (seq-mean-token-mean, GSPO's and
SAPO's definition) so that only the loss differs.
"""

import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from grpo_jax import objectives

B, T, G = 16, 12, 4
LOSSES = {
    "gspo": functools.partial(objectives.gspo_loss, eps_low=3e-4, eps_high=4e-4),
    "cispo": functools.partial(objectives.cispo_loss, eps_low=1.0, eps_high=0.28),
    "sapo": functools.partial(objectives.sapo_loss, tau_pos=1.0, tau_neg=1.05),
    "ppo_0.2/0.2": functools.partial(objectives.ppo_clip_loss, eps_low=0.2, eps_high=0.2),
    "ppo_0.2/0.28": functools.partial(objectives.ppo_clip_loss, eps_low=0.2, eps_high=0.28),
    "pg": objectives.pg_loss,
}


def _batch(seed=0):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(4, T + 1, B)
    mask = (np.arange(T)[None] < lengths[:, None]).astype(np.float32)
    logp = np.log(rng.uniform(0.05, 0.95, (B, T)))
    old = logp - rng.uniform(np.log(0.5), np.log(2.0), (B, T))   # ratio in [0.5, 2]
    rewards = rng.integers(0, 2, B).astype(np.float32)
    rewards[:G] = [1, 0, 0, 1]   # at least one group with signal
    adv = objectives.group_advantages(jnp.asarray(rewards), G)
    return (jnp.asarray(logp, jnp.float32), jnp.asarray(old, jnp.float32), adv,
            jnp.asarray(mask))


def _value_grad_diag(loss_fn, logp, old, adv, mask):
    def objective(lp):
        loss, diag = loss_fn(lp, old, adv, mask)
        return objectives.aggregate(loss, mask, mode="seq-mean-token-mean"), diag

    (_, diag), grad = jax.jit(jax.value_and_grad(objective, has_aux=True))(logp)
    return np.asarray(grad), {k: np.asarray(v) for k, v in diag.items()}


@pytest.fixture(scope="module")
def off_policy():
    logp, old, adv, mask = _batch()
    ratios = np.exp(np.asarray(logp - old))[np.asarray(mask) > 0]
    assert ratios.min() < 0.55 and ratios.max() > 1.9   # the spread the test is about
    return {name: _value_grad_diag(fn, logp, old, adv, mask) for name, fn in LOSSES.items()}


def _relative_difference(a, b):
    return np.linalg.norm(a - b) / max(np.linalg.norm(a), np.linalg.norm(b))


@pytest.mark.parametrize("first, second", list(itertools.combinations(LOSSES, 2)))
def test_gradients_differ_pairwise(off_policy, first, second):
    assert np.linalg.norm(off_policy[first][0]) > 0
    assert _relative_difference(off_policy[first][0], off_policy[second][0]) > 1e-3


def test_each_reports_its_activity(off_policy):
    ppo, higher = off_policy["ppo_0.2/0.2"][1], off_policy["ppo_0.2/0.28"][1]
    assert ppo["clip_low"].sum() > 0 and ppo["clip_high"].sum() > 0
    assert 0 < higher["clip_high"].sum() < ppo["clip_high"].sum()   # clip-higher clips fewer
    gspo = off_policy["gspo"][1]
    clipped_rows = (gspo["clip_low"] + gspo["clip_high"]).max(axis=1) > 0
    assert 0 < clipped_rows.sum() < B   # some sequences clipped, not all
    cispo = off_policy["cispo"][1]
    assert cispo["clip_high"].sum() > 0
    valid = np.asarray(_batch()[3]) > 0
    gate = off_policy["sapo"][1]["gate_scale"][valid]
    assert np.max(np.abs(gate - 1.0)) > 0.05


def test_on_policy_they_coincide():
    """The control: at pi_old = pi_theta every ratio is 1 and all six take the same step."""
    logp, _, adv, mask = _batch()
    grads = {name: _value_grad_diag(fn, logp, logp, adv, mask)[0] for name, fn in LOSSES.items()}
    reference = grads.pop("pg")
    assert np.linalg.norm(reference) > 0
    for name, grad in grads.items():
        np.testing.assert_allclose(grad, reference, rtol=1e-5, atol=1e-8, err_msg=name)
