"""Every docstring example in grpo_jax.objectives runs and prints what it says, each number
to the precision it is written in (tests/doctest_numbers.py)."""

import doctest

import pytest

from grpo_jax.objectives import (_advantages, _aggregation, _covariance, _distill, _kl,
                                 _logits, _mismatch, _policy_losses, _shaping, _trust_region,
                                 _value)
from tests.doctest_numbers import WrittenPrecisionChecker, numbers_agree, run_examples


@pytest.mark.parametrize("module", [_advantages, _aggregation, _covariance, _distill, _kl,
                                    _logits, _mismatch, _policy_losses, _shaping, _trust_region,
                                    _value],
                         ids=lambda m: m.__name__)
def test_examples(module):
    result = run_examples(module)
    assert result.attempted > 0 and result.failed == 0


def _completion_logprobs_example(want: str) -> doctest.TestResults:
    """`completion_logprobs`'s own docstring example, run with its printed result replaced
    by `want` (the value computed is log 0.9, log 0.3 = -0.1053605157, -1.2039728043)."""
    [test] = doctest.DocTestFinder().find(_logits.completion_logprobs, "example",
                                          globs=vars(_logits))
    test.examples[-1].want = want + "\n"
    runner = doctest.DocTestRunner(checker=WrittenPrecisionChecker(),
                                   optionflags=doctest.NORMALIZE_WHITESPACE)
    runner.run(test, out=lambda _: None)
    return runner.summarize(verbose=False)


@pytest.mark.parametrize("want, passes", [
    ("Array([[-0.10536057, -1.2039728 ]], dtype=float32)", True),   # as printed by jax 0.12.0
    ("Array([[-0.10536056, -1.2039728 ]], dtype=float32)", True),   # as printed by jax 0.12.1
    ("Array([[-0.1053606, -1.2039728]], dtype=float32)", True),     # fewer digits written
    ("Array([[-0.10636057, -1.2039728 ]], dtype=float32)", False),  # off by 1e-3
    ("Array([[-0.10536057, -1.2029728 ]], dtype=float32)", False),  # off by 1e-3
    ("Array([[-0.10536157, -1.2039728 ]], dtype=float32)", False),  # off by 1e-6
    ("Array([[-0.10536057, -1.2039728 ]], dtype=float64)", False),  # the text differs
    ("Array([[-0.10536057]], dtype=float32)", False),               # a number missing
])
def test_examples_compare_numbers_to_their_written_precision(want, passes):
    """A one-ulp move of a printed float32 passes; a wrong value or other text fails."""
    failed, attempted = _completion_logprobs_example(want)
    assert attempted == 2 and failed == (0 if passes else 1)


@pytest.mark.parametrize("want, got, agree", [
    ("3", "3", True), ("3", "4", False), ("0.38", "0.384", True), ("0.38", "0.386", False),
    ("1.5e-07", "1.54e-07", True), ("1.5e-07", "1.56e-07", False),
    ("nan", "nan", True), ("nan", "0.0", False), ("-inf", "-inf", True), ("inf", "-inf", False),
])
def test_numbers_agree_to_half_a_unit_of_the_last_written_digit(want, got, agree):
    assert numbers_agree(want, got) == agree


def test_every_public_function_documents_shapes_example_and_paper():
    from grpo_jax import objectives
    for name in ("group_advantages", "rloo_advantages", "reinforce_pp_advantages",
                 "gdpo_advantages", "gae", "length_adaptive_lambda", "masked_whiten",
                 "outcome_token_rewards", "value_loss", "explained_variance",
                 "overlong_penalty", "truncated_mask", "group_has_signal", "importance_weights",
                 "dynamic_sampling_signal", "offpolicy_sequence_mask", "pg_loss",
                 "ppo_clip_loss", "gspo_loss", "cispo_loss",
                 "sapo_loss", "kl_penalty", "aggregate", "rollout_correction",
                 "mismatch_metrics", "decoupled_ppo_loss", "gmpo_loss", "dppo_loss",
                 "m2po_mask", "clip_cov_loss", "kl_cov_loss", "token_covariance",
                 "binary_divergence", "reverse_kl_distill_loss", "generalized_jsd"):
        doc = getattr(objectives, name).__doc__
        for section in ("Args:", "Returns:", "Example:", "References:", "["):
            assert section in doc, f"{name} docstring lacks {section!r}"
