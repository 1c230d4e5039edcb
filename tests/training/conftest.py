"""Fixtures of the trainer tests."""

import pytest


@pytest.fixture(scope="session")
def data_dir(shared_tmp_dir):
    """The session's datasets and SFT warm starts, shared by every worker: each warm start
    (keyed by everything it depends on) is trained once per session."""
    return str(shared_tmp_dir("tfds"))
