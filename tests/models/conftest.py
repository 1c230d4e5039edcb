"""Fixtures of the model tests: each family in turn, and tiny HF checkpoints built once."""

import pytest

from tests.models.checkpoints import FAMILIES, make_hf_checkpoint


@pytest.fixture(scope="module", params=FAMILIES)
def family(request):
    """Each model family in turn."""
    return request.param


@pytest.fixture(scope="session")
def hf_checkpoint(tmp_path_factory):
    """`hf_checkpoint(family)` -> (directory, torch model); built once per session."""
    cache = {}

    def get(family):
        if family not in cache:
            path = tmp_path_factory.mktemp(family)
            cache[family] = (str(path), make_hf_checkpoint(family, path))
        return cache[family]

    return get
