"""Prints the worked examples of docs/semantics.md, each computed by grpo_jax.objectives.

    python -m grpo_jax.objectives

A two-second tour of what the objectives do: loss aggregation (seq-mean vs token-mean),
advantage normalisation (GRPO vs Dr. GRPO), clip-higher, and DAPO's overlong penalty.
It needs the core install alone (jax and numpy); importing the package runs nothing.
"""

import functools
import math

import jax
import jax.numpy as jnp

from grpo_jax import objectives


def aggregation_push(mode, lengths=(200, 1200), adv=(1.0, -1.0)):
    """Per-token and whole-answer push (minus the loss gradient) on each answer at r = 1."""
    T = max(lengths)
    mask = (jnp.arange(T)[None] < jnp.array(lengths)[:, None]).astype(jnp.float32)
    old = jnp.zeros((len(lengths), T))

    def loss(logp):
        per_token, _ = objectives.ppo_clip_loss(logp, old, jnp.array(adv), mask)
        return objectives.aggregate(per_token, mask, mode=mode)

    push = -jax.grad(loss)(old)
    return push[:, 0], jnp.sum(push * mask, axis=1)


@functools.partial(jax.jit, static_argnames="eps_high")
def _clip_ceiling(p_old, eps_high):
    """Highest probability a token can reach in one batch before PPO's clip zeroes it.

    Found on the loss itself: the largest ratio whose gradient is still nonzero,
    by bisection over r in [1, 2].
    """
    def grad_at(r):
        return jax.grad(lambda lp: objectives.ppo_clip_loss(
            lp, jnp.zeros((1, 1)), jnp.ones(1), jnp.ones((1, 1)), eps_high=eps_high)[0].sum())(
                jnp.log(r).reshape(1, 1))[0, 0]

    def bisect(_, bounds):
        lo, hi = bounds
        mid = (lo + hi) / 2
        return jnp.where(grad_at(mid) != 0, mid, lo), jnp.where(grad_at(mid) != 0, hi, mid)

    lo, _ = jax.lax.fori_loop(0, 40, bisect, (jnp.float32(1.0), jnp.float32(2.0)))
    return p_old * lo


def batches_to_grow(p_from, p_to, eps_high):
    p, batches = p_from, 0
    while p < p_to * (1 - 1e-5):
        p, batches = float(_clip_ceiling(p, eps_high)), batches + 1
    return batches


def main():
    print("1. Loss aggregation: answers of 200 (right, A=+1) and 1,200 tokens (wrong, A=-1)")
    for mode in ("seq-mean-token-mean", "token-mean"):
        per_token, whole = aggregation_push(mode)
        print(f"   {mode:20s} per-token push right:wrong = {per_token[0] / -per_token[1]:.1f} : 1"
              f"   whole answers {whole[0]:+.2f} / {whole[1]:+.2f}")

    print("\n2. Advantages for rewards (1,1,1,1,1,1,1,0)")
    rewards = jnp.array([1.0, 1, 1, 1, 1, 1, 1, 0])
    for label, kwargs in (("GRPO, divide by std (ddof=0)", dict(scale="group")),
                          ("GRPO, divide by std (ddof=1)", dict(scale="group", ddof=1)),
                          ("Dr. GRPO, no division", dict(scale="none"))):
        adv = objectives.group_advantages(rewards, 8, **kwargs)
        print(f"   {label:30s} right {adv[0]:+.3f}   wrong {adv[7]:+.3f}")

    print("\n3. Clip higher than lower: highest probability after one batch (eps_high 0.2)")
    for p in (0.600, 0.200, 0.050, 0.010):
        print(f"   {p:.3f} -> {float(_clip_ceiling(p, 0.2)):.3f}")
    for eps_high in (0.2, 0.28):
        print(
            f"   1% -> 10% takes {batches_to_grow(0.01, 0.10, eps_high)} batches at "
            f"eps_high {eps_high} (closed form {math.ceil(math.log(10) / math.log(1 + eps_high))})"
        )

    print("\n4. DAPO overlong penalty, max 20,000 tokens, 4,000-token zone")
    lengths = jnp.array([15_000, 16_000, 18_000, 20_000, 21_000])
    penalty = objectives.overlong_penalty(lengths, max_len=20_000, cache_len=4_000)
    for length, value in zip(lengths.tolist(), penalty.tolist()):
        print(f"   {length:6,d} tokens -> {value:+.1f}")


if __name__ == "__main__":
    main()
