"""Sampling methods: each maps next-token logits to the distribution a token is drawn from.

A method is a frozen pytree dataclass whose parameters are leaves, so `jax.jit` traces
them: a new temperature, k or p reuses the compiled sampler; only a new *kind* of method
compiles. Each has `log_probs(logits_bv) -> [B, V]` float32 log-probabilities of its
sampling distribution (-inf on the tokens it excludes), the definition that tests and
teacher-forced checks use; `sample` draws from any.

The order is transformers' (logits processors): divide by the temperature, then cut the
tempered distribution (top-k, top-p, min-p), then renormalise. Every cut keeps the
tokens whose tempered probability q_v is at least a per-row floor; a method other than
`Greedy` says how it finds that floor with `cut(q_bv) -> (floor [B], candidates [B, K])`,
where candidates are the K most likely token ids (K the method's candidate bound, 0 for
`Temperature`), from which `sample` records the kept support.
"""

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from grpo_jax.sampling._nucleus import nucleus_floor


def _scalar(method, name, dtype, valid, rule):
    """Checks and canonicalises a Python number field to a numpy scalar of `dtype`.

    Python ints and floats would enter `jax.jit` as weakly typed values of different
    dtypes (`Temperature(1)` vs `Temperature(1.0)`), so they are converted once here;
    arrays and tracers pass through untouched.
    """
    value = getattr(method, name)
    if isinstance(value, (int, float, np.number)) and not isinstance(value, bool):
        if not valid(value):
            raise ValueError(f"{type(method).__name__}.{name} must be {rule}, got {value!r}")
        object.__setattr__(method, name, np.asarray(value, dtype))


def _check_temperature(method):
    _scalar(method, "temperature", np.float32, lambda t: t > 0, "> 0 (use Greedy() for 0)")


def _check_bound(method, name):
    bound = getattr(method, name)
    if not isinstance(bound, int) or bound < 1:
        raise ValueError(f"{type(method).__name__}.{name} must be a positive int, got {bound!r}")


def tempered_log_probs(logits_bv, temperature):
    """`[B, V]` logits -> `[B, V]` float32 log-softmax(logits / temperature)."""
    return jax.nn.log_softmax(logits_bv.astype(jnp.float32) / temperature, axis=-1)


def _cut_log_probs(method, logits_bv):
    """The tempered log-probs renormalised over the tokens `method.cut` keeps."""
    logp_bv = tempered_log_probs(logits_bv, method.temperature)
    q_bv = jnp.exp(logp_bv)
    floor_b, _ = method.cut(q_bv)
    return jax.nn.log_softmax(jnp.where(q_bv >= floor_b[:, None], logp_bv, -jnp.inf), axis=-1)


@struct.dataclass
class Greedy:
    """The most likely token (the lowest id among ties), as transformers' `do_sample=False`."""

    def log_probs(self, logits_bv):
        """`[B, V]` logits -> `[B, V]`: 0 on the argmax, -inf elsewhere."""
        best_b = jnp.argmax(logits_bv, axis=-1)
        vocab = jnp.arange(logits_bv.shape[-1])
        return jnp.where(vocab == best_b[:, None], 0.0, -jnp.inf).astype(jnp.float32)


@struct.dataclass
class Temperature:
    """Ancestral sampling from softmax(logits / temperature): no cut."""

    temperature: float | jax.Array = 1.0

    def __post_init__(self):
        _check_temperature(self)

    def log_probs(self, logits_bv):
        """`[B, V]` logits -> `[B, V]` log-softmax(logits / temperature)."""
        return tempered_log_probs(logits_bv, self.temperature)

    def cut(self, q_bv):
        """Floor 0 (every token kept) and no candidates: no sort, top-k or search runs."""
        b = q_bv.shape[0]
        return jnp.zeros((b,), q_bv.dtype), jnp.zeros((b, 0), jnp.int32)


@struct.dataclass
class TopK:
    """The k most likely tokens of the tempered distribution (Fan et al. 2018), renormalised.

    Tokens tied with the k-th largest probability are all kept (as transformers does). `k`
    is traced; `max_k` is static and bounds it (one `lax.top_k` of `max_k` per step
    instead of a full sort of the vocabulary); a `k` above `max_k` needs a larger `max_k`.
    """

    k: int | jax.Array
    temperature: float | jax.Array = 1.0
    max_k: int = struct.field(pytree_node=False, default=64)

    def __post_init__(self):
        _check_bound(self, "max_k")
        _scalar(self, "k", np.int32, lambda k: 1 <= k <= self.max_k,
                f"in [1, max_k={self.max_k}] (raise TopK.max_k for a larger k)")
        _check_temperature(self)

    def log_probs(self, logits_bv):
        """`[B, V]` logits -> `[B, V]` log-probs, -inf below the k-th largest probability."""
        return _cut_log_probs(self, logits_bv)

    def cut(self, q_bv):
        """The k-th largest probability; the `max_k` most likely tokens as candidates."""
        top_bk, ids_bk = jax.lax.top_k(q_bv, min(self.max_k, q_bv.shape[-1]))
        # The smallest of the first k, as a reduction over all max_k: a constant k would
        # turn an indexed read into a slice, and XLA:CPU sorts the whole row for a top-k
        # whose values are sliced.
        first_k_bk = jnp.arange(top_bk.shape[-1]) < self.k
        return jnp.min(jnp.where(first_k_bk, top_bk, jnp.inf), axis=-1), ids_bk


@struct.dataclass
class TopP:
    """Nucleus sampling (Holtzman et al. 2020): the smallest set of most likely tokens
    whose tempered probability reaches `p`, renormalised.

    A token is kept when the probability of the tokens strictly more likely than it is
    below p, so the most likely token is always kept, tokens tied at the floor are all
    kept, and p = 1 keeps everything. No full sort: the floor comes from the
    `max_candidates` most likely tokens, or from an exact bisection in rows whose nucleus
    is larger (`nucleus_floor`, which says when it equals a full sort's).
    """

    p: float | jax.Array
    temperature: float | jax.Array = 1.0
    max_candidates: int = struct.field(pytree_node=False, default=64)

    def __post_init__(self):
        _check_bound(self, "max_candidates")
        _scalar(self, "p", np.float32, lambda p: 0 < p <= 1, "in (0, 1]")
        _check_temperature(self)

    def log_probs(self, logits_bv):
        """`[B, V]` logits -> `[B, V]` log-probs, -inf outside the nucleus."""
        return _cut_log_probs(self, logits_bv)

    def cut(self, q_bv):
        """The nucleus floor; the `max_candidates` most likely tokens as candidates."""
        return nucleus_floor(q_bv, self.p, self.max_candidates)


@struct.dataclass
class MinP:
    """Min-p sampling (Nguyen et al. 2024): tokens whose tempered probability is at least
    `p` times the most likely token's, renormalised. p = 0 keeps everything.

    `max_candidates` (static) only bounds the support `generate` records."""

    p: float | jax.Array
    temperature: float | jax.Array = 1.0
    max_candidates: int = struct.field(pytree_node=False, default=64)

    def __post_init__(self):
        _check_bound(self, "max_candidates")
        _scalar(self, "p", np.float32, lambda p: 0 <= p <= 1, "in [0, 1]")
        _check_temperature(self)

    def log_probs(self, logits_bv):
        """`[B, V]` logits -> `[B, V]` log-probs, -inf below p * max probability."""
        return _cut_log_probs(self, logits_bv)

    def cut(self, q_bv):
        """p times the largest probability; the `max_candidates` most likely tokens (not
        computed unless the support is recorded: unused outputs are dropped by XLA)."""
        _, ids_bk = jax.lax.top_k(q_bv, min(self.max_candidates, q_bv.shape[-1]))
        return self.p * jnp.max(q_bv, axis=-1), ids_bk


def make_method(*, temperature=1.0, top_p=1.0, top_k=0, min_p=0.0, max_candidates=64):
    """The cheapest method that samples exactly what the knobs describe (one cut at most).

    temperature 0 is `Greedy()`; otherwise `top_k > 0`, `top_p < 1` or `min_p > 0` picks
    `TopK`, `TopP` or `MinP` at that temperature, and none of them plain `Temperature`,
    which runs no cut at all (no top-k, sort or search): top_p = 1, top_k = 0 and
    min_p = 0 keep the whole vocabulary, so a cut would only cost time.

    Args:
      temperature, top_p, top_k, min_p: as in transformers' `generate`.
      max_candidates: the candidate bound of `TopP` and `MinP` (and the least `max_k` of
        `TopK`): the support size `generate(record_support=True)` can record.

    Example:
      >>> make_method(temperature=0.7, top_p=0.95)
      TopP(p=array(0.95, dtype=float32), temperature=array(0.7, dtype=float32), max_candidates=64)
      >>> make_method(temperature=0.7, top_p=1.0)
      Temperature(temperature=array(0.7, dtype=float32))
    """
    cuts = {"top_k": top_k > 0, "top_p": top_p < 1, "min_p": min_p > 0}
    if sum(cuts.values()) > 1:
        raise ValueError(
            f"set at most one of top_k, top_p, min_p; got {[k for k, on in cuts.items() if on]}"
        )
    if temperature == 0:
        return Greedy()
    if cuts["top_k"]:
        return TopK(top_k, temperature=temperature, max_k=max(max_candidates, top_k))
    if cuts["top_p"]:
        return TopP(top_p, temperature=temperature, max_candidates=max_candidates)
    if cuts["min_p"]:
        return MinP(min_p, temperature=temperature, max_candidates=max_candidates)
    return Temperature(temperature)
