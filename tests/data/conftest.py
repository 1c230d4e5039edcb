"""Fixtures for the data tests: datasets are built into pytest tmp dirs, never ~/."""

import pathlib

import pytest
import tensorflow_datasets as tfds

from grpo_jax import data



@pytest.fixture(autouse=True, scope="session")
def _quiet_tfds():
    tfds.disable_progress_bar()


@pytest.fixture(scope="session")
def data_dir(shared_tmp_dir):
    """One data_dir shared by the session's workers, so each config is built once."""
    return str(shared_tmp_dir("data_tfds"))


@pytest.fixture(scope="session")
def arithmetic_config():
    return data.ArithmeticConfig(digits=3, num_train=300, num_test=60, seed=7,
                                 teacher_fraction=0.5)


@pytest.fixture(scope="session")
def fixtures_dir():
    """tests/data/fixtures: a few rows of GSM8K and MATH-500 in the official formats."""
    return pathlib.Path(__file__).parent / "fixtures"
