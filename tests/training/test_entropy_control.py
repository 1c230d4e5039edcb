"""Adaptive entropy control in the RL loop (Skywork-OR1, arXiv:2505.22312): the refusals,
the batch's column, the logged coefficients against the pure controller applied by hand
to the logged entropies, the bonus in the loss, and a resume that continues the sequence."""

import numpy as np
import pytest

from grpo_jax import config_lib, models, objectives
from grpo_jax.training import entropy_control, programs, rl, rl_checks
from tests import readme_metrics
from tests.training.training_setups import comparable, read_metrics, tiny_config

# The tiny model's mean token entropy is 0.1515 nats at step 1 and 0.1549 at step 2 (both
# steps' bonus is fixed before the target matters: none at step 1, then 0.014): a target of
# 0.153 raises the coefficient after step 1, then lowers it and gates the bonus off at
# step 3 (both branches of the controller act).
ADAPTIVE = {"adaptive_entropy.enabled": True, "adaptive_entropy.target": 0.153,
            "adaptive_entropy.delta": 0.004, "adaptive_entropy.low": 0.002,
            "adaptive_entropy.high": 0.02, "objective.entropy_coef": 0.01}
RUN = {"train.steps": 4, "train.eval_every": 100, "train.checkpoint_every": 1,
       "train.export": False}


def _config(**overrides):
    return config_lib.apply_overrides(config_lib.load_config("configs/dapo.py:runlocal=True"),
                                      overrides)


@pytest.mark.parametrize("overrides, message", [
    ({"adaptive_entropy.delta": -0.1}, r"adaptive_entropy.delta and .low must be >= 0"),
    ({"adaptive_entropy.low": 0.5, "adaptive_entropy.high": 0.1},
     r"adaptive_entropy.low must be <= adaptive_entropy.high, got 0.5 and 0.1"),
    ({"adaptive_entropy.target": float("nan")}, r"adaptive_entropy.target must be a finite"),
])
def test_impossible_settings_name_the_field(overrides, message):
    with pytest.raises(ValueError, match=message):
        rl_checks.check_settings(_config(**{"adaptive_entropy.enabled": True, **overrides}))
    rl_checks.check_settings(_config(**ADAPTIVE))


@pytest.mark.parametrize("field, value", [("target", 0.3), ("delta", 0.01), ("low", 0.001),
                                          ("high", 0.5)])
def test_a_field_set_while_disabled_names_it_and_the_fix(field, value):
    with pytest.raises(ValueError, match=rf"adaptive_entropy.{field}={value} has no effect while "
                                         r"adaptive_entropy.enabled is False: set adaptive_"
                                         r"entropy.enabled=True"):
        rl_checks.check_settings(_config(**{f"adaptive_entropy.{field}": value}))
    rl_checks.check_settings(_config(**{"adaptive_entropy.enabled": True,
                                        f"adaptive_entropy.{field}": value}))


def test_defaults_are_the_base_configs():
    section = config_lib.load_config("configs/base.py").adaptive_entropy
    assert entropy_control.DEFAULTS == {field: section[field] for field in section
                                        if field != "enabled"}
    rl_checks.check_settings(_config())   # the disabled defaults pass


def test_the_layout_carries_one_coefficient_per_row():
    model_cfg = models.get_model_config("tiny", vocab_size=32)
    layout = programs.batch_layout(_config(**ADAPTIVE), model_cfg, prompt_len=5)
    assert layout["entropy_coef"] == ((16 * 4,), np.float32)
    assert "entropy_coef" not in programs.batch_layout(_config(), model_cfg, prompt_len=5)
    micro = {"entropy_coef": np.full(4, 0.25, np.float32), "mask": np.ones((4, 2))}
    assert entropy_control.step_coef(micro)["entropy_coef"] == 0.25   # the scalar it reads


@pytest.fixture(scope="module")
def adaptive_run(data_dir, tmp_path_factory):
    """A 4-step tiny DAPO run (2 updates per step) under adaptive entropy control,
    checkpointed every step: `(config, workdir)`."""
    workdir = tmp_path_factory.mktemp("adaptive_entropy")
    config = tiny_config("dapo", data_dir, **RUN, **ADAPTIVE)
    rl.train(config, str(workdir))
    return config, workdir


def _by_hand(rows, config):
    """The coefficients the pure controller gives from the logged entropies: per step,
    (applied, next)."""
    section = config.adaptive_entropy
    coef, last, out = config.objective.entropy_coef, np.inf, []
    for row in rows:
        applied = objectives.entropy_bonus_coef(coef, last, target=section.target)
        coef = objectives.adaptive_entropy_coef(coef, row["entropy"], target=section.target,
                                                delta=section.delta, low=section.low,
                                                high=section.high)
        last = row["entropy"]
        out.append((float(applied), float(coef)))
    return out


@pytest.mark.slow
def test_logged_coefficients_are_the_controller_on_the_logged_entropies(adaptive_run):
    config, workdir = adaptive_run
    rows = read_metrics(workdir)
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert readme_metrics.undocumented(set().union(*rows)) == []
    want = _by_hand(rows, config)
    got = [(r["entropy_coef"], r["entropy_coef_next"]) for r in rows]
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-9)
    assert got[0][0] == 0.0   # no previous entropy: the first step applies no bonus
    # The bonus is in the loss: DAPO's token mean of (policy term - c x entropy), and c is
    # constant over the step's updates, so the means over the updates keep the relation.
    for row in rows:
        np.testing.assert_allclose(row["loss"], row["policy_loss"]
                                   - row["entropy_coef"] * row["entropy"], rtol=1e-5, atol=1e-7)
    coefs = [config.objective.entropy_coef] + [r["entropy_coef_next"] for r in rows]
    steps = np.diff(coefs)
    assert (steps > 0).any() and (steps < 0).any()   # both branches acted
    applied = [r["entropy_coef"] for r in rows]
    assert max(applied) > 0 and 0.0 in applied[1:]   # the bonus applied, and gated off


@pytest.mark.slow
def test_a_resume_continues_the_coefficient_sequence(adaptive_run, tmp_path):
    config, workdir = adaptive_run
    cut = tmp_path / "cut"
    rl.train(config_lib.replaced(config, {"train.steps": 2}), str(cut))
    rl.train(config, str(cut))   # resumes from step 2: the controller's state restored
    whole, resumed = read_metrics(workdir), read_metrics(cut)
    assert [r["step"] for r in resumed] == [1, 2, 3, 4]
    for got, want in zip(resumed, whole):
        for key, value in comparable(want).items():
            np.testing.assert_allclose(got[key], value, rtol=1e-5, atol=1e-7, err_msg=key)
