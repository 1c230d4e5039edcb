"""The run config's model section reaches the policy's network."""

import pathlib

import pytest
from absl import flags
from ml_collections import config_flags

from grpo_jax import config_lib
from grpo_jax.training import policy as policy_lib

GSPO = pathlib.Path(__file__).resolve().parents[2] / "configs" / "gspo.py"


def test_model_section_sets_layout_remat_and_attention():
    config = config_lib.load_config(f"{GSPO}:runlocal=True")
    config_lib.apply_overrides(config, {"model.scan_layers": True, "model.remat": "dots_saveable",
                                        "model.attention": "splash", "model.dtype": "bfloat16"})
    model, tokenizer = policy_lib.load_policy(config.model, None, tokenizer_texts=["12+34=46"])
    cfg = model.cfg
    assert (cfg.scan_layers, cfg.remat, cfg.attention_impl, cfg.dtype) == (
        True, "dots_saveable", "splash", "bfloat16")
    assert [stack.attn_norm.shape for stack in model.stacks] == [(cfg.n_layers, cfg.d_model)]
    assert cfg.eos_token_id == tokenizer.eos_token_id


@pytest.mark.parametrize("flag, policy", [("True", "full"), ("false", "off")])
def test_remat_as_a_bool_on_the_command_line_reads_as_a_policy(flag, policy):
    """`--config.model.remat=True` reaches the config as the string "True" (the field is a
    string): the policy reads it as the on/off flag."""
    argv = ["main", f"--config={GSPO}:runlocal=True", f"--config.model.remat={flag}"]
    flag_values = flags.FlagValues()
    config_flags.DEFINE_config_file("config", None, "", flag_values=flag_values, sys_argv=argv)
    flag_values(argv)
    assert flag_values.config.model.remat == flag
    model, _ = policy_lib.load_policy(flag_values.config.model, None, tokenizer_texts=["12+34=46"])
    assert model.cfg.remat == policy
