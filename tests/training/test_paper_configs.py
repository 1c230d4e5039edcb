"""configs/paper: each runlocal variant trains its 2 steps end to end on the tiny model."""

import pathlib

import numpy as np
import pytest

from grpo_jax import config_lib
from grpo_jax.training import rl
from tests.training.training_setups import read_metrics, tiny_config

REPO = pathlib.Path(__file__).resolve().parents[2]
PAPER = sorted(p.stem for p in (REPO / "configs" / "paper").glob("[!_]*.py"))


@pytest.mark.slow
@pytest.mark.parametrize("name", PAPER)
def test_runlocal_variant_runs_its_two_steps(name, data_dir, tmp_path):
    """The variant as loaded says 2 steps; run (the trainer tests' smaller task and warm
    start, 4 prompts x 4 answers) it takes both, with finite metrics and a gradient."""
    assert config_lib.load_config(f"{REPO / 'configs' / 'paper' / name}.py:runlocal=True"
                                  ).train.steps == 2
    config = tiny_config(f"paper/{name}", data_dir)
    assert rl.train(config, str(tmp_path)) == 2
    rows = read_metrics(tmp_path)
    assert [r["step"] for r in rows] == [1, 2]
    for row in rows:
        assert all(np.isfinite(v) for v in row.values()), row
        assert row["grad_norm"] > 0, row
