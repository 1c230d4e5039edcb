"""One builder of a run's programs: the batch the RL update reads is listed once, the
trainer checks each batch against it, and the fit report lowers with the same list."""

import jax
import pytest

from grpo_jax import config_lib, models, parallel
from grpo_jax.aot import programs as aot_programs
from grpo_jax.training import programs

SAMPLED = {"prompt_tokens", "prompt_mask", "tokens", "mask", "behaviour_logp", "lengths",
           "truncated", "correct", "rewards", "row_valid"}


def _layout(recipe, **overrides):
    config = config_lib.apply_overrides(
        config_lib.load_config(f"configs/{recipe}.py:runlocal=True"), overrides
    )
    return config, programs.batch_layout(config, models.get_model_config("tiny", vocab_size=32),
                                         prompt_len=5)


def test_the_layout_is_what_the_sampler_returns_plus_what_the_loop_adds():
    config, layout = _layout("dapo")
    b, n = 16 * 4, config.rollout.max_new_tokens
    assert set(layout) == SAMPLED | {"old_logp", "advantages"}
    assert layout["mask"][0] == (b, n) and layout["prompt_tokens"][0] == (b, 5)
    assert layout["advantages"][0] == (b,) and layout["rewards"][0] == (b,)


@pytest.mark.parametrize("recipe, overrides, added", [
    ("grpo", {}, {"ref_logp"}),                                   # kl.beta > 0
    ("vapo", {}, {"values", "returns"}),                          # the critic's
    ("dapo", {"objective.loss.kind": "clip_cov"}, {"loss_seed"}),  # its random draw
])
def test_options_add_their_keys(recipe, overrides, added):
    _, layout = _layout(recipe, **overrides)
    assert set(layout) == SAMPLED | {"old_logp", "advantages"} | added


def test_gdpo_keeps_a_column_per_reward():
    config, layout = _layout("gdpo")
    assert layout["rewards"][0] == (64, len(config.reward.specs))


def test_check_batch_names_extra_and_missing_keys():
    _, layout = _layout("dapo")
    batch = dict.fromkeys(layout)
    programs.check_batch(batch, layout, pretraining=False)
    with pytest.raises(
        AssertionError, match=r"has keys \['surprise'\] .* and lacks \['old_logp'\]"
    ):
        programs.check_batch({**{k: 0 for k in batch if k != "old_logp"}, "surprise": 0}, layout,
                             pretraining=False)
    sampled_only = {k: 0 for k in batch if k not in ("old_logp", "advantages")}
    programs.check_batch(sampled_only, layout, pretraining=True)   # value pre-training


def test_the_fit_report_lowers_with_the_trainers_layout():
    config, layout = _layout("vapo")
    mesh = parallel.make_mesh("data=-1,fsdp=1,tensor=1")
    rows = aot_programs.batch_rows(config, models.get_model_config("tiny", vocab_size=32), mesh, 5)
    assert {k: (v.shape, v.dtype) for k, v in rows.items()} == {
        k: (shape, jax.numpy.dtype(dtype)) for k, (shape, dtype) in layout.items()}
    assert all(v.sharding == parallel.row_sharding(mesh) for v in rows.values())
