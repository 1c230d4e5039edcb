"""The run config's model section reaches the policy's network."""

import pathlib

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
