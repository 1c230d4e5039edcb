"""The trainer's ``environment`` section: what it refuses, each error naming the field."""

import pytest

from grpo_jax import config_lib
from grpo_jax.training import rollout
from tests.training.training_setups import REPO


@pytest.mark.parametrize("overrides, error", [
    ({"environment.name": "calc"}, r"environment.name='calc' is not one of"),
    ({"environment.max_calls": -1}, r"environment.max_calls must be >= 0, got -1"),
    ({"environment.max_append": 0}, r"environment.max_append must be >= 1"),
    ({"environment.turn_budget": -2}, r"environment.turn_budget must be >= 0"),
    ({"environment.timeout_s": 0.0}, r"environment.timeout_s must be > 0"),
    ({"critic.enabled": True}, r"environment.name with critic.enabled"),
    ({"environment.chat_role": "tool"},
     r"environment.chat_role='tool' puts the replies in chat turns, but the prompts are plain "
     r"text \(task.chat_template=False\); set task.chat_template=True"),
])
def test_environment_settings_that_cannot_run_are_named(overrides, error):
    config = config_lib.load_config(f"{REPO / 'configs' / 'tool_calculator.py'}")
    with pytest.raises(ValueError, match=error):
        rollout.check_environment_config(config_lib.apply_overrides(config, overrides))


def test_no_environment_is_single_turn_and_checks_nothing():
    config = config_lib.load_config(f"{REPO / 'configs' / 'base.py'}:runlocal=True")
    config = config_lib.apply_overrides(config, {"environment.max_append": 0})
    rollout.check_environment_config(config)   # environment.name "": the section is unused
    assert rollout.Episodic.of(config, tokenizer=None) is None


def test_a_multi_process_run_is_accepted(monkeypatch):
    """Each process steps the environment for its own rows (tests/training/test_multihost.py)."""
    config = config_lib.load_config(f"{REPO / 'configs' / 'tool_calculator.py'}")
    monkeypatch.setattr(rollout.jax, "process_count", lambda: 2)
    rollout.check_environment_config(config)
