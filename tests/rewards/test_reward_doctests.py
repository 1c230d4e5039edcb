"""The examples in the rewards docstrings run and give what they show."""

import doctest
import importlib

import pytest
from tests.doctest_numbers import run_examples

MODULES = [
    "_answers", "_code", "_countdown", "_format", "_limits", "_math", "_normalise", "_pool", "_rpt",
    "_self_verify", "_units",
]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    module = importlib.import_module(f"grpo_jax.rewards.{name}")
    result = run_examples(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0
