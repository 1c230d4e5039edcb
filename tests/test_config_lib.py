"""grpo_jax.config_lib: a run's config is read-only, a change is a new config, and the
config is printed and saved as it was read."""

import json
import pathlib

import ml_collections
import pytest

from grpo_jax import config_lib, rewards

REPO = pathlib.Path(__file__).resolve().parents[1]
RECIPES = sorted(p.name for p in (REPO / "configs").glob("*.py") if p.name != "base.py")


def _load(name, arg="runlocal=True"):
    return config_lib.load_config(f"{REPO / 'configs' / name}" + (f":{arg}" if arg else ""))


def _assignments(config):
    """Assigning a field at the top, in a section and in a nested section, and adding one."""
    yield lambda: setattr(config, "seed", 1)
    yield lambda: config.__setitem__("mode", "sft")
    yield lambda: setattr(config.model, "path", "/elsewhere")
    yield lambda: setattr(config.objective.loss, "eps_high", 0.3)
    yield lambda: setattr(config.train, "new_field", 1)


class TestFrozen:

    def test_every_assignment_raises_and_the_original_is_left_as_is(self):
        given = _load("dapo.py")
        before = given.to_dict()
        config = config_lib.frozen(given)
        for assign in _assignments(config):
            with pytest.raises(AttributeError, match="immutable"):
                assign()
        with pytest.raises(TypeError):   # a reward's options: read-only too
            config.reward.specs[-1][2]["cache_fraction"] = 0.5
        assert given.to_dict() == before
        given.seed = 7   # the copy is not a view of the original
        assert config.seed == before["seed"]

    @pytest.mark.parametrize("name", RECIPES)
    def test_every_recipe_freezes_with_the_same_values(self, name):
        given = _load("smollm2.py", None) if name == "smollm2.py" else _load(name)
        config = config_lib.frozen(given)
        assert isinstance(config, ml_collections.FrozenConfigDict)
        assert json.loads(config_lib.to_json(config)) == json.loads(given.to_json())
        assert rewards.as_specs(config.reward.specs) == rewards.as_specs(given.reward.specs)

    def test_a_frozen_configs_rewards_score_as_the_original_does(self):
        from grpo_jax.training import task
        given = _load("self_verify.py")   # rewards with options: {"grader": ...}
        row = (["2+3?"], ["#### 5 <verify>correct</verify>"], [{"answer": "5"}], [9])
        scores = []
        for config in (given, config_lib.frozen(given)):
            scorer = task.Scorer(config.reward, separate=True, max_new_tokens=64)
            try:
                scores.append(scorer(*row)[0].tolist())
            finally:
                scorer.close()
        assert scores[0] == scores[1] == [[1.0, 1.0]]


class TestReplaced:

    def test_a_new_frozen_config_with_the_changes_the_old_one_unchanged(self):
        config = config_lib.frozen(_load("vapo.py"))
        new = config_lib.replaced(config, {"model.path": "/ckpt", "model.name": ""})
        assert isinstance(new, ml_collections.FrozenConfigDict)
        assert (new.model.path, new.model.name) == ("/ckpt", "")
        assert (config.model.path, config.model.name) == ("", "tiny")
        assert new.reward.specs == config.reward.specs
        with pytest.raises(KeyError, match="model.pth"):
            config_lib.replaced(config, {"model.pth": "/ckpt"})

    def test_a_mutable_config_is_copied_not_changed(self):
        given = _load("dapo.py")
        new = config_lib.replaced(given, {"seed": 3})
        assert (new.seed, given.seed) == (3, 0)


def test_record_prints_a_line_per_section_and_saves_the_json(tmp_path, capsys):
    config = config_lib.frozen(_load("dapo.py"))
    config_lib.record(config, str(tmp_path / "run"))
    with open(tmp_path / "run" / "config.json") as f:
        saved = json.load(f)
    assert saved == json.loads(config_lib.to_json(config))
    assert saved["reward"]["specs"][-1] == ["overlong", 1.0, {"cache_fraction": 0.2}]
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"config ({tmp_path / 'run' / 'config.json'}):"
    assert [line.split(":")[0].strip() for line in lines[1:]] == sorted(saved)
