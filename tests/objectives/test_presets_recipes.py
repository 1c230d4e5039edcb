"""The recipes in configs/ build exactly the presets' objectives (spec, loss and gradient),
and their sections stay frozen once built."""

import jax
import numpy as np
import pytest

from grpo_jax import config_lib
from grpo_jax import objectives
from grpo_jax.objectives import presets
from tests.objectives.preset_batches import batch

# recipe argument string -> the preset call it must equal (G from the recipe's regime)
RECIPES = {
    "grpo": lambda c: presets.grpo(group_size=16),
    "dr_grpo": lambda c: presets.dr_grpo(group_size=8, norm_len=3000),
    "dapo": lambda c: presets.dapo(group_size=16),
    "gspo": lambda c: presets.gspo(group_size=16),
    "cispo": lambda c: presets.cispo(group_size=16),
    "sapo": lambda c: presets.sapo(group_size=16),
    "rloo": lambda c: presets.rloo(group_size=4),
    "reinforce_pp": lambda c: presets.reinforce_pp(group_size=4),
    "reinforce_pp:kl_in_reward=True,baseline=True":
        lambda c: presets.reinforce_pp(group_size=4, kl_in_reward=True, baseline=True),
    "gdpo": lambda c: presets.gdpo(group_size=16, reward_weights=(1.0, 1.0)),
    "ppo": lambda c: presets.ppo(group_size=1),
    "vapo": lambda c: presets.vapo(group_size=16, lam_alpha=0.05),
}


def recipe_objective(arg):
    name, _, rest = arg.partition(":")
    config = config_lib.load_config(f"configs/{name}.py" + (f":{rest}" if rest else ""))
    weights = tuple(spec[1] for spec in config.reward.specs) if name == "gdpo" else None
    return config, objectives.policy_objective(config.objective, reward_weights=weights)


@pytest.mark.parametrize("arg", sorted(RECIPES))
def test_recipe_is_its_preset(arg):
    config, from_recipe = recipe_objective(arg)
    preset = RECIPES[arg](config)
    assert from_recipe.spec == preset.spec
    logp, b = batch(5, rows=16)   # 16 rows: whole groups for every recipe's G
    if preset.spec.estimator == "gdpo":
        b["rewards"] = np.stack([b["rewards"], 1.0 - b["correct"]], axis=1)
    loss, grad = jax.value_and_grad(lambda lp: from_recipe(lp, b)[0])(logp)
    want, want_grad = jax.value_and_grad(lambda lp: preset(lp, b)[0])(logp)
    np.testing.assert_array_equal(loss, want)
    np.testing.assert_array_equal(grad, want_grad)


def test_runlocal_scales_only_the_regime():
    config, objective = recipe_objective("dapo:runlocal=True")
    assert objective.spec == presets.dapo(group_size=4).spec


def test_dr_grpo_constant_follows_the_budget():
    config = config_lib.load_config("configs/dr_grpo.py")
    config.rollout.max_new_tokens = 512
    assert objectives.policy_objective(config.objective).spec.norm_len == 512


def test_changing_the_section_after_building_changes_nothing():
    config, objective = recipe_objective("dapo")
    logp, b = batch(6, rows=16)
    before = objective(logp, b)[0]
    config.objective.loss.eps_high = 0.0
    config.objective.aggregation.mode = "seq-mean-token-sum"
    np.testing.assert_array_equal(objective(logp, b)[0], before)
    assert objective.spec.eps_high == 0.28


def test_a_typo_in_a_recipe_section_is_named():
    config = config_lib.load_config("configs/dapo.py")
    config.objective.loss.eps_hgh = 0.3     # ConfigDict accepts new keys; the build does not
    with pytest.raises(ValueError, match=r"objective.loss.eps_hgh is not an objective field; "
                                         r"did you mean objective.loss.eps_high\?"):
        objectives.policy_objective(config.objective)


def test_set_objective_refuses_another_group_size():
    config = config_lib.load_config("configs/base.py")
    with pytest.raises(ValueError, match=r"built for group_size=4 but config.objective."
                                         r"group_size is 8"):
        config_lib.set_objective(config, presets.dapo(group_size=4))
