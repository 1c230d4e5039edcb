"""Fixtures of the trainer tests."""

import pytest


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("tfds"))
