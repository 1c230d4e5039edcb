"""M2PO, Clip-Cov and KL-Cov depend on the micro-batch (as in verl and AReaL): their mask
or token selection is a statistic of the batch passed in. Measured on a fixed batch split
in two, against an independent numpy computation of both losses (docs/objectives.md,
"Objectives that depend on the micro-batch", quotes these numbers)."""

import numpy as np
import jax.numpy as jnp
import pytest

from grpo_jax.objectives import presets

B, T, G = 8, 6, 4


def _batch():
    rng = np.random.default_rng(3)
    mask = (np.arange(T) < rng.integers(2, T + 1, B)[:, None]).astype(np.float32)
    old = rng.normal(-2.0, 1.5, (B, T)).astype(np.float32)
    logp = (old + rng.normal(0, 0.35, (B, T))).astype(np.float32)
    adv = np.repeat(np.array([1.5, -0.5, 0.5, -1.5, 1.0, -1.0, 0.2, -0.2], np.float32)[:, None],
                    T, axis=1)
    return logp, old, adv, mask


def _m2po_keep(logp, old, mask, tau=0.04):
    valid = np.flatnonzero(mask.reshape(-1) > 0)
    sq = ((logp - old).astype(np.float64).reshape(-1)[valid]) ** 2
    order = np.argsort(-sq, kind="stable")
    keep = np.zeros(mask.size)
    for k in range(len(order)):
        if sq[order[k:]].mean() < tau:
            keep[valid[order[k:]]] = 1
            break
    else:
        keep[valid[order[-1]]] = 1
    return keep.reshape(mask.shape)


def _cov(logp, adv, mask):
    v = mask > 0
    return np.where(v, (logp - logp[v].mean()) * (adv - adv[v].mean()), 0.0)


def _loss_sum(kind, logp, old, adv, mask):
    """The per-token losses' sum over `mask` (numpy, float64) on the rows given."""
    logp, old, adv = (x.astype(np.float64) for x in (logp, old, adv))
    ratio = np.exp(logp - old)
    v = mask > 0
    if kind == "m2po":
        per = -ratio * adv * _m2po_keep(logp, old, mask)
    elif kind == "kl_cov":
        count = max(int(np.floor(2e-1 * v.sum() * (1 + 1e-6))), 1)
        cov = np.where(v, _cov(logp, adv, mask), -np.inf).reshape(-1)
        top = np.argsort(-cov, kind="stable")[:count]
        penalised = np.zeros(mask.size)
        penalised[top] = 1
        per = -ratio * adv + penalised.reshape(mask.shape) * np.abs(logp - old)
    else:   # clip_cov with every candidate drawn (clip_fraction 1): deterministic
        clipped = np.clip(ratio, 0.0, 2.0)
        per = -np.minimum(ratio * adv, clipped * adv)
        bound = ((adv < 0) & (ratio < 0.0)) | ((adv > 0) & (ratio > 2.0))
        cov = _cov(logp, adv, mask)
        per = np.where(v & ~bound & (cov > 0.2) & (cov < 5.0), 0.0, per)
    return float(np.sum(np.where(v, per, 0.0)))


OBJECTIVES = {
    "m2po": lambda: presets.m2po(group_size=G),
    "kl_cov": lambda: presets.kl_cov(group_size=G, kl_fraction=0.2),
    "clip_cov": lambda: presets.clip_cov(group_size=G, clip_fraction=1.0, cov_low=0.2),
}
# |full-batch loss - sum of the two halves' losses| on this batch (float64 numpy).
MEASURED = {"m2po": 1.171e-2, "kl_cov": 9.035e-3, "clip_cov": 3.451e-2}


@pytest.mark.parametrize("kind", sorted(OBJECTIVES))
def test_two_way_split_changes_the_loss_by_the_measured_amount(kind):
    logp, old, adv, mask = _batch()
    objective = OBJECTIVES[kind]()
    n = float(mask.sum())

    def loss(rows):
        batch = {"old_logp": jnp.asarray(old[rows]), "mask": jnp.asarray(mask[rows]),
                 "advantages": jnp.asarray(adv[rows, 0]), "num_tokens": jnp.float32(n),
                 "loss_seed": jnp.zeros(len(rows), jnp.int32)}
        return float(objective(jnp.asarray(logp[rows]), batch)[0])

    halves = [np.arange(B // 2), np.arange(B // 2, B)]
    change = loss(np.arange(B)) - sum(loss(rows) for rows in halves)
    expected = (_loss_sum(kind, logp, old, adv, mask)
                - sum(_loss_sum(kind, logp[r], old[r], adv[r], mask[r]) for r in halves)) / n
    np.testing.assert_allclose(change, expected, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(abs(expected), MEASURED[kind], rtol=5e-3)
