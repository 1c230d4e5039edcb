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


@pytest.fixture(scope="module")
def out(tmp_path_factory):
    """A module's own data_dir for the builders of published files (each module's samples
    build apart from the session's shared data)."""
    return str(tmp_path_factory.mktemp("tfds"))


def read_built(name, split, out, manual_dir, config=None):
    """The decoded examples of `name`'s `split`, built into `out` from `manual_dir`."""
    source = data.data_source(name, split=split, data_dir=out, manual_dir=str(manual_dir),
                              config=config)
    return [data.decode_example(r) for r in source]
