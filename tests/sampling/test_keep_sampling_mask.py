"""generate(record_support=True): the recorded supports are the cuts' kept sets, the sampler's
log-probs equal the support-renormalised log-probs recomputed from the same weights, and
with top_p = 1 no cut runs at all."""

import collections
import pathlib

import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import pytest
from tests.sampling.toy_models import lookup_model
from flax import nnx

from grpo_jax import models, sampling

V = 64
K = 8
# After an even token the next-token distribution is peaked (a 0.9 nucleus within K = 8
# tokens), after an odd one it is flat (a nucleus of most of the 64 tokens).
NEXT_LOGITS = np.random.default_rng(0).standard_normal((V, V)).astype(np.float32) * np.where(
    np.arange(V) % 2 == 0, 8.0, 0.3).astype(np.float32)[:, None]


def mixed_model():
    return lookup_model(NEXT_LOGITS)


def run(model, method, record_support=True, **kwargs):
    tokens, mask = sampling.pad_prompts([[1], [2, 3], [4], [7]], pad_id=0)
    args = dict(group_size=4, max_new_tokens=24, stop_tokens=[], pad_id=0) | kwargs
    return sampling.to_host(
        sampling.generate(
            *model, tokens, mask, rng=jax.random.key(0), method=method,
            record_support=record_support, **args,
        )
    )


def recomputed_logp(model, rollout, temperature):
    """The sampler's tokens' log-probs renormalised over the recorded supports, from one
    teacher-forced forward pass (hidden states and unembedding, no `[B, T, V]` logits)."""
    @jax.jit
    def forward(state, rollout):
        decoder = nnx.merge(model[0], state)
        s = rollout.prompt_tokens.shape[1]
        tokens = jnp.concatenate([rollout.prompt_tokens, rollout.tokens], axis=1)
        mask = jnp.concatenate([rollout.prompt_mask, rollout.mask], axis=1)
        hidden, _ = decoder.hidden_states(tokens, attention_mask=mask)
        return models.support_token_logprobs(
            hidden[:, s - 1 : -1], decoder.unembedding(), rollout.tokens, rollout.support_ids,
            temperature=temperature, chunk_size=64,
        )

    return np.asarray(forward(model[1], rollout))


class TestRecordedSupport:
    def test_off_by_default_and_nothing_recorded(self):
        r = run(mixed_model(), sampling.TopP(0.9, max_candidates=K), record_support=False)
        assert r.support_ids is None and r.support_size is None

    def test_supports_are_the_nucleus(self):
        """Each recorded support is exactly the float64 nucleus of the model's next-token
        distribution; positions whose nucleus exceeds K say so with size > K."""
        method = sampling.TopP(0.9, temperature=0.8, max_candidates=K)
        r = run(mixed_model(), method)
        assert r.support_ids.shape == (16, 32, K) and r.support_size.shape == (16, 32)
        live = r.mask == 1
        assert (r.support_size[~live] == 0).all() and (r.support_ids[~live] == -1).all()
        fits = live & (r.support_size <= K)
        assert fits.sum() > 50 and (live & ~fits).sum() > 50  # both kinds of position occur
        previous = np.concatenate([np.repeat([1, 3, 4, 7], 4)[:, None], r.tokens[:, :-1]], axis=1)
        for b, t in zip(*np.nonzero(live)):
            z = NEXT_LOGITS[previous[b, t]].astype(np.float64) / 0.8
            q = np.exp(z - z.max())
            q /= q.sum()
            order = np.argsort(-q)
            nucleus = order[(np.cumsum(q[order]) - q[order]) < 0.9]
            assert r.support_size[b, t] == len(nucleus)
            ids = r.support_ids[b, t]
            if fits[b, t]:
                assert sorted(ids[ids >= 0]) == sorted(nucleus) and r.tokens[b, t] in ids
            else:  # the K most likely tokens, all in the nucleus
                assert (ids >= 0).all() and set(ids) == set(order[:K])

    def test_sampler_logp_equals_the_renormalised_recomputation(self):
        method = sampling.TopP(0.9, temperature=0.8, max_candidates=K)
        model = mixed_model()
        r = run(model, method)
        fits = (r.mask == 1) & (r.support_size <= K)
        np.testing.assert_allclose(
            recomputed_logp(model, r, 0.8)[fits], r.sample_logp[fits], atol=1e-5
        )

    @pytest.mark.slow
    def test_on_a_transformer_with_every_support_recorded(self, tiny_model):
        """The named tiny model (V = 512) and K = V, so every nucleus fits."""
        method = sampling.TopP(0.9, temperature=0.7, max_candidates=512)
        r = run(tiny_model, method, stop_tokens=np.arange(0, 512, 16))
        live = r.mask == 1
        assert (r.support_size[live] <= 512).all() and (r.support_size[live] > 1).all()
        np.testing.assert_allclose(
            recomputed_logp(tiny_model, r, 0.7)[live], r.sample_logp[live], atol=1e-4
        )

    def test_temperature_and_greedy_supports(self):
        """Temperature keeps the whole vocabulary (nothing to record: K = 0, size V);
        greedy keeps the argmax (K = 1, size 1)."""
        model = mixed_model()
        r = run(model, sampling.Temperature(1.0))
        assert r.support_ids.shape == (16, 32, 0) and (r.support_size[r.mask == 1] == V).all()
        r = run(model, sampling.Greedy())
        live = r.mask == 1
        assert r.support_ids.shape == (16, 32, 1) and (r.support_size[live] == 1).all()
        np.testing.assert_array_equal(r.support_ids[..., 0][live], r.tokens[live])


def primitives(method, model):
    """How often each primitive occurs in the jaxpr of one `generate` call, nested ones included."""
    tokens, mask = sampling.pad_prompts([[1], [2]], pad_id=0)
    jaxpr = jax.make_jaxpr(lambda state, method: sampling.generate(
        model[0], state, tokens, mask, rng=jax.random.key(0), method=method, group_size=2,
        max_new_tokens=4, stop_tokens=[1], pad_id=0))(model[1], method)
    counts = collections.Counter()

    def visit(jaxpr):
        for eqn in jaxpr.eqns:
            counts[eqn.primitive.name] += 1
            for sub in jax.extend.core.jaxprs_in_params(eqn.params):
                visit(sub)

    visit(jaxpr.jaxpr)
    return counts


def test_top_p_one_runs_no_cut():
    """make_method(top_p=1.0) is plain Temperature: no top-k, sort or bisection loop in
    the sampler (while TopP(0.95) has them, so the check can fail)."""
    method = sampling.make_method(temperature=0.7, top_p=1.0)
    assert type(method) is sampling.Temperature
    model = mixed_model()
    plain = primitives(method, model)
    with_cut = primitives(sampling.make_method(temperature=0.7, top_p=0.95), model)
    assert plain["top_k"] == plain["sort"] == plain["approx_top_k"] == 0
    assert with_cut["top_k"] > 0 and with_cut["while"] > plain["while"]  # candidates, bisection


@pytest.mark.parametrize("recipe", ["grpo", "dapo", "deepseek_v32"])
def test_the_trainers_rollouts_cut_only_when_the_config_asks(recipe):
    """The trainer, evaluation and SFT build their method with `rollout.sampling_method`:
    each recipe's own rollout section, then top_p = 1.0 (no cut) and top_p = 0.95."""
    from grpo_jax import config_lib
    from grpo_jax.training import rollout

    configs = pathlib.Path(__file__).resolve().parents[2] / "configs"
    config = config_lib.load_config(f"{configs / recipe}.py:runlocal=True")
    r = config.rollout
    expected = sampling.TopP if r.top_p < 1 else sampling.Temperature
    assert type(rollout.sampling_method(config)) is expected
    config.rollout.top_p = 1.0
    method = rollout.sampling_method(config)
    assert type(method) is sampling.Temperature
    assert float(method.temperature) == float(r.temperature)
    config.rollout.top_p = 0.95
    assert type(rollout.sampling_method(config)) is sampling.TopP
