"""Every public function checks its arrays' shapes and dtypes at entry (trace time).

A wrong shape is a ValueError of one form, "<function>: <argument> must be <shape> for
<sizes>; got <shape>", raised before any JAX op (so also under jax.jit, while tracing,
without compiling); an integer array where log-probs or values belong is a TypeError
naming the argument. Valid jnp, numpy and (where a function takes them) list inputs pass.
"""

import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from grpo_jax import objectives as obj
from grpo_jax.objectives import _checks

B, T = 8, 5
f = jnp.zeros((B, T))                 # [B, T] float: log-probs, values, a loss
m = np.ones((B, T), np.float32)       # [B, T] mask, numpy
r = jnp.arange(B, dtype=jnp.float32)  # [B] rewards / advantages
i = jnp.zeros((B, T), jnp.int32)      # [B, T] integers: not log-probs
wide, short, flat = jnp.zeros((B, T + 1)), jnp.zeros((2, 4)), jnp.zeros(B)
logits = jnp.zeros((2, 4, 3))
tok = jnp.zeros((2, 4), jnp.int32)

ADV = (r"adv \(advantages\) must be \[B\], \[B, 1\] or \[B, T\] for B = 8 rows, T = 5 tokens; "
       r"got \[2, 4\]$")
LIKE = lambda name, first, got: rf"{name} must be \[B, T\] = \[8, 5\] like {first}; got \[{got}\]$"
RANK = lambda name, got: rf"{name} must be \[B, T\] \(rows x response tokens\); got \[{got}\]$"
ROWS8 = lambda name, got: rf"{name} must be \[B\] for B = 8 rows; got \[{got}\]$"
FLOAT = lambda name: (rf"{name} must be a floating array; got dtype int32: cast it, "
                      rf"e\.g\. {name}\.astype\(jnp\.float32\)$")
LOSSES = [obj.pg_loss, obj.ppo_clip_loss, obj.gspo_loss,
          functools.partial(obj.cispo_loss, eps_low=0.2, eps_high=0.2), obj.sapo_loss]


def _name(fn):
    return getattr(fn, "__name__", None) or fn.func.__name__


def case(fn, args, match, error=ValueError, **kwargs):
    return pytest.param(fn, args, kwargs, error, f"^{_name(fn)}: {match}", id=_name(fn))


CASES = [case(fn, a, msg, err) for fn in LOSSES for a, msg, err in (
    ((f, f, short, m), ADV, ValueError),                               # wrong rows
    ((f, f, r, wide), LIKE("mask", "logp", "8, 6"), ValueError),       # wrong length
    ((f, wide, r, m), LIKE("old_logp", "logp", "8, 6"), ValueError),
    ((flat, f, r, m), RANK("logp", "8"), ValueError),                  # wrong rank
    ((i, f, r, m), FLOAT("logp"), TypeError),                          # dtype
)] + [
    case(obj.group_advantages, (jnp.zeros((B, 2)), 4),
         r"rewards must be \[B\]; got \[8, 2\]: one scalar per completion \(sum the reward "
         r"columns, or use gdpo_advantages for \[B, K\]\)$"),
    case(obj.group_advantages, (r, 3), r"group_size=3 does not divide the batch of 8 rows"),
    case(obj.rloo_advantages, (jnp.zeros(()), 2), r"rewards must be \[B\]; got \[\]$"),
    case(obj.rloo_advantages, (r.astype(jnp.complex64), 2),
         r"rewards must be a bool, integer or floating array; got dtype complex64$", TypeError),
    case(obj.gdpo_advantages, (r, 4), r"rewards must be \[B, K\]; got \[8\]: one column per "
         r"reward; \[B, 1\] for a single reward$"),
    case(obj.gdpo_advantages, (jnp.zeros((B, 2)), 4),
         r"weights must be \[K\] for K = 2 reward columns; got \[3\]$", weights=[1.0, 2, 3]),
    case(obj.gdpo_advantages, (jnp.zeros((B, 2)), 3), r"group_size=3 does not divide"),
    case(obj.masked_whiten, (f, wide), r"mask must be \[\.\.\.\] = \[8, 5\] like x; got \[8, 6\]$"),
    case(obj.outcome_token_rewards, (short[0], m), ROWS8("rewards", "4")),
    case(obj.outcome_token_rewards, (r, flat), RANK("mask", "8")),
    case(obj.reinforce_pp_advantages, (r[:4], m), ROWS8("rewards", "4")),
    case(obj.reinforce_pp_advantages, (r, m), LIKE("token_rewards", "mask", "8, 6"),
         token_rewards=wide),
    case(obj.gae, (f, wide, m), LIKE("values", "token_rewards", "8, 6"), gamma=1.0, lam=1.0),
    case(obj.gae, (f, f, m), r"lam must be \[\] \(a scalar\) or \[B\] for B = 8 rows; got \[4\]$",
         gamma=1.0, lam=jnp.ones(4)),
    case(obj.gae, (f, i, m), FLOAT("values"), TypeError, gamma=1.0, lam=1.0),
    case(obj.gae, (flat, f, m), RANK("token_rewards", "8"), gamma=1.0, lam=1.0),
    case(obj.length_adaptive_lambda, (f,), r"lengths must be \[B\]; got \[8, 5\]$"),
    case(obj.aggregate, (f, wide), LIKE("mask", "loss", "8, 6"), mode="token-mean"),
    case(obj.aggregate, (flat, m), RANK("loss", "8"), mode="token-mean"),
    case(obj.aggregate, (f, m), r"num_tokens must be \[\] \(a scalar\); got \[8\]$",
         mode="token-mean", num_tokens=r),
    case(obj.kl_penalty, (f, wide), LIKE("ref_logp", "logp", "8, 6")),
    case(obj.kl_penalty, (f, f), r"old_logp must be \[B, T\] = \[8, 5\] like logp; got \[2, 4\]$",
         old_logp=short, kind="k3_unbiased"),
    case(obj.kl_penalty, (f, i), FLOAT("ref_logp"), TypeError),
    case(obj.token_logprobs, (logits, tok[:, :3]),
         r"tokens must be \[\.\.\., T\] = \[2, 4\] for logits \[\.\.\., T, V\] = \[2, 4, 3\]; "
         r"got \[2, 3\]$"),
    case(obj.token_logprobs, (logits, tok.astype(jnp.float32)),
         r"tokens must be an integer array \(token ids\); got dtype float32: cast it, "
         r"e\.g\. tokens\.astype\(jnp\.int32\)$", TypeError),
    case(obj.token_logprobs, (tok, tok), FLOAT("logits"), TypeError),
    case(obj.token_logprobs, (jnp.zeros(()), tok[0, 0]),
         r"logits must be \[\.\.\., V\] \(a vocabulary axis last\); got \[\]$"),
    case(obj.completion_logprobs, (logits[:, :3], tok, 1, 2),
         r"logits must be \[B, L, V\] with \[B, L\] = tokens' \(2, 4\); got \[2, 3, 3\]$"),
    case(obj.completion_logprobs, (logits, tok[0], 1, 2),
         r"tokens must be \[B, L\] \(rows x prompt and completion positions\); got \[4\]$"),
    case(obj.completion_logprobs, (logits, tok, jnp.ones(3, jnp.int32), 2),
         r"prompt_lengths must be \[\] \(a scalar\) or \[B\] for B = 2 rows; got \[3\]$"),
    case(obj.entropy_from_logits, (jnp.zeros(()),),
         r"logits must be \[\.\.\., V\] \(a vocabulary axis last\); got \[\]$"),
    case(obj.entropy_from_logits, (tok,), FLOAT("logits"), TypeError),
    case(obj.overlong_penalty, (f,), r"lengths must be \[B\]; got \[8, 5\]$",
         max_len=4, cache_len=2),
    case(obj.truncated_mask, (m, jnp.zeros(4, bool)), ROWS8("truncated", "4")),
    case(obj.truncated_mask, (flat, r), RANK("mask", "8")),
    case(obj.group_has_signal, (f, 4), r"rewards must be \[B\]; got \[8, 5\]$"),
    case(obj.dynamic_sampling_signal, (r, jnp.zeros(4, bool), 4), ROWS8("correct", "4")),
    case(obj.dynamic_sampling_signal, (jnp.zeros((B, 2, 2)), jnp.zeros(B, bool), 4),
         r"rewards must be \[B\] or \[B, K\]; got \[8, 2, 2\]$"),
    case(obj.importance_weights, (f, wide, m), LIKE("behaviour_logp", "old_logp", "8, 6")),
    case(obj.importance_weights, (f, i, m), FLOAT("behaviour_logp"), TypeError),
    case(obj.importance_weights, (flat, f, m), RANK("old_logp", "8")),
    case(obj.offpolicy_sequence_mask, (f, f, short, m), ADV, delta=0.1),
    case(obj.offpolicy_sequence_mask, (f, f, r, wide), LIKE("mask", "logp", "8, 6"), delta=0.1),
    case(obj.offpolicy_sequence_mask, (f, i, r, m), FLOAT("old_logp"), TypeError, delta=0.1),
    case(obj.value_loss, (f, f, f, wide), LIKE("mask", "values", "8, 6")),
    case(obj.value_loss, (flat, f, f, m), RANK("values", "8")),
    case(obj.value_loss, (i, f, f, m), FLOAT("values"), TypeError),
    case(obj.explained_variance, (f, short, m), LIKE("returns", "values", "2, 4")),
    case(obj.explained_variance, (i, f, m), FLOAT("values"), TypeError),
    case(obj.explained_variance, (f[None], f, m), RANK("values", "1, 8, 5")),
    case(obj.reverse_kl_distill_loss, (f, wide, m), LIKE("teacher_logp", "logp", "8, 6")),
    case(obj.reverse_kl_distill_loss, (f, i, m), FLOAT("teacher_logp"), TypeError),
    case(obj.generalized_jsd, (logits, logits, jnp.ones((2, 5))),
         r"mask must be \[B, T\] = \[2, 4\] \(the logits' first two axes\); got \[2, 5\]$"),
]


@pytest.mark.parametrize("fn,args,kwargs,error,match", CASES)
def test_eager(fn, args, kwargs, error, match):
    with pytest.raises(error, match=match):
        fn(*args, **kwargs)


@pytest.mark.parametrize("fn,args,kwargs,error,match", CASES)
def test_under_jit_while_tracing(fn, args, kwargs, error, match):
    """The same error from jax.jit: shapes and dtypes are static, so the check runs while
    tracing (nothing is compiled); sizes (group_size, completion_len) stay static."""
    static = tuple(k for k, a in enumerate(args) if isinstance(a, int))
    # (?m): jax appends a note on its traceback filtering after the message's line.
    with pytest.raises(error, match="(?m)" + match):
        jax.jit(functools.partial(fn, **kwargs), static_argnums=static)(*args)


def test_every_public_function_has_a_case():
    public = {"group_advantages", "rloo_advantages", "masked_whiten", "outcome_token_rewards",
              "reinforce_pp_advantages", "gdpo_advantages", "gae", "length_adaptive_lambda",
              "aggregate", "kl_penalty", "token_logprobs", "completion_logprobs",
              "entropy_from_logits", "pg_loss", "ppo_clip_loss", "gspo_loss", "cispo_loss",
              "sapo_loss", "overlong_penalty", "truncated_mask", "group_has_signal",
              "dynamic_sampling_signal",
              "importance_weights", "offpolicy_sequence_mask", "value_loss",
              "explained_variance", "reverse_kl_distill_loss", "generalized_jsd"}
    assert public == {_name(c.values[0]) for c in CASES}


def test_traced_group_size_gets_the_static_hint():
    with pytest.raises(TypeError, match=r"^rloo_advantages: group_size is a traced value .*"
                       r"static_argnames='group_size'"):
        jax.jit(obj.rloo_advantages)(r, 4)


def _shape(fn, *args, **kwargs):
    """The output shape(s) of `fn`, traced (checks included) but neither compiled nor run."""
    out = jax.eval_shape(functools.partial(fn, **kwargs), *args)
    return jax.tree.map(lambda x: x.shape, out)


def test_valid_inputs_of_every_kind_pass():
    """jnp and numpy arrays, bool/int/float masks, int rewards, [B, 1] advantages, and the
    lists the functions took before the checks (traced lists too: measured, not converted)."""
    for mask in (m, m.astype(bool), jnp.asarray(m, jnp.int32)):
        for adv in (r, r[:, None], jnp.zeros((B, T)), np.arange(B, dtype=np.float32)):
            for fn in LOSSES:
                assert _shape(fn, f, np.zeros((B, T), np.float32), adv, mask)[0] == (B, T)
            assert _shape(obj.offpolicy_sequence_mask, f, f, adv, mask, delta=0.1) == (B,)
        assert _shape(obj.aggregate, f, mask, mode="token-mean", num_tokens=3, num_seqs=r[0]) == ()
        assert _shape(obj.truncated_mask, mask, [True] * 4 + [False] * 4) == (B, T)
        assert _shape(obj.importance_weights, f, np.zeros((B, T), np.float32), mask) == (B, T)
        assert _shape(obj.value_loss, f, f, i, mask)[0] == (B, T)
        assert _shape(obj.explained_variance, f, i, mask) == ()
        assert _shape(obj.outcome_token_rewards, jnp.arange(B), mask) == (B, T)
        assert _shape(obj.reinforce_pp_advantages, np.ones(B, np.int32), mask,
                      group_size=4) == (B, T)
        gae = lambda lam: obj.gae(i, f, mask, gamma=1.0, lam=lam)
        assert _shape(gae, [0.9] * B)[0] == (B, T)
        assert _shape(obj.masked_whiten, f, mask) == (B, T)
    assert _shape(obj.group_advantages, np.arange(B), group_size=4) == (B,)
    assert _shape(obj.rloo_advantages, jnp.arange(B), group_size=4) == (B,)
    assert _shape(obj.group_has_signal, jnp.arange(B), group_size=4) == (2,)
    assert _shape(obj.dynamic_sampling_signal, jnp.zeros((B, 3)), jnp.zeros(B, bool),
                  group_size=4, signal="reward") == (2,)
    gdpo = lambda weights: obj.gdpo_advantages(np.zeros((B, 2), np.int32), 4, weights=weights)
    assert _shape(gdpo, [1.0, jnp.float32(2)]) == (B,)
    assert _shape(obj.length_adaptive_lambda, [10, 100]) == (2,)
    assert _shape(obj.kl_penalty, jnp.zeros(3), np.zeros(3, np.float32)) == (3,)   # any shape
    assert _shape(obj.kl_penalty, f, f, kind="k3_unbiased",
                  old_logp=f.astype(jnp.bfloat16)) == (B, T)
    assert _shape(obj.token_logprobs, logits[:, 0], tok[:, 0]) == (2,)              # [B, V]
    assert _shape(obj.entropy_from_logits, logits.astype(jnp.bfloat16)) == (2, 4)
    assert _shape(obj.completion_logprobs, logits, np.zeros((2, 4), np.int64), [1, 2],
                  completion_len=2) == (2, 2)
    # A list of Python numbers closed over (not an argument) is measured on the host.
    assert _shape(lambda: obj.overlong_penalty([1, 20], max_len=10, cache_len=2)) == (2,)
    assert _shape(lambda: obj.length_adaptive_lambda([10, 100])) == (2,)
    assert _shape(lambda: obj.truncated_mask(f, [True, False] * 4)) == (B, T)
    assert _shape(lambda: obj.gdpo_advantages(jnp.ones((4, 2)), 2, weights=[1.0, 2.0])) == (4,)
    assert _shape(lambda: obj.gae(f, f, m, gamma=1.0, lam=[0.5] * B))[0] == (B, T)
    assert _shape(lambda: obj.completion_logprobs(logits, tok, [1, 2], 2)) == (2, 2)
    assert obj.length_adaptive_lambda([10, 100]).shape == (2,)   # and run: one cheap op


def test_vmap_sees_per_example_shapes():
    out, _ = _shape(jax.vmap(obj.ppo_clip_loss), jnp.zeros((3, B, T)), jnp.zeros((3, B, T)),
                    jnp.ones((3, B)), jnp.ones((3, B, T)))
    assert out == (3, B, T)
    with pytest.raises(ValueError, match=re.escape("ppo_clip_loss: adv (advantages) must be")):
        jax.vmap(obj.ppo_clip_loss)(jnp.zeros((3, B, T)), jnp.zeros((3, B, T)),
                                    jnp.ones((3, 2)), jnp.ones((3, B, T)))


def test_checks_add_nothing_to_the_program():
    """Every helper reads shapes and dtypes only: traced, they emit no operation."""

    def checks_only(logp, adv, mask, lengths, logits_, tokens):
        fn = "f"
        _checks.check_floating(fn, logp=logp, logits=logits_)
        _checks.check_real(fn, adv=adv, mask=mask, lengths=lengths)
        _checks.check_integer(fn, tokens=tokens)
        batch = _checks.check_token_arrays(fn, logp=logp, mask=mask)
        _checks.check_row_values(fn, "adv", adv, batch, per_token=True)
        _checks.check_like(fn, "[...]", logp=logp, mask=mask)
        _checks.check_rows(fn, "lengths", lengths, rows=B)
        _checks.check_scalar(fn, n=adv[0])
        _checks.check_scalar_or_rows(fn, "lam", lengths, B)
        _checks.check_last_axis(fn, "logits", logits_)
        _checks.check_group_size(4, B, fn=fn)
        return ()

    jaxpr = jax.make_jaxpr(checks_only)(f, r, m, r, logits, tok)
    # adv[0] (for check_scalar) is the only operation: the indexing the test itself does.
    assert [str(e.primitive) for e in jaxpr.jaxpr.eqns] in (["squeeze"], ["slice", "squeeze"])
