"""configs/paper: every file loads at the paper's scale and at runlocal, names its paper and
architecture, and the named shapes have the published parameter counts' structure."""

import math
import pathlib
import re

import jax
import pytest

from grpo_jax import config_lib, models, rewards
from grpo_jax.objectives import policy_objective
from grpo_jax.training import suites

REPO = pathlib.Path(__file__).resolve().parents[1]
PAPER = sorted(p.stem for p in (REPO / "configs" / "paper").glob("[!_]*.py"))
# name: (model.name, task.name, train.steps, eval.suite, prompts, G, updates, budget)
EXPECTED = {
    "dapo_qwen25_32b": ("qwen2_5_32b", "dapo_math_17k", 5000, "dapo_aime24", 512, 16, 16, 20480),
    "dr_grpo_qwen25_math_7b": ("qwen2_5_math_7b", "math", 500, "oat_zero", 128, 8, 8, 3000),
    "gspo_qwen3_30b_a3b": ("qwen3_30b_a3b", "dapo_math_17k", 1000, "dapo_aime24", 512, 16, 4,
                           8192),
    "simplerl_qwen25_0_5b": ("qwen2_5_0_5b", "gsm8k", 100, "", 1024, 8, 4, 8192),
}


def _load(name, arg=""):
    return config_lib.load_config(f"{REPO / 'configs' / 'paper' / name}.py" + (f":{arg}" if arg
                                                                                else ""))


def _objective(config):
    weights = rewards.spec_weights(rewards.as_specs(config.reward.specs))
    return policy_objective(config.objective, reward_weights=weights)


def test_every_paper_config_is_checked():
    assert PAPER == sorted(EXPECTED)


@pytest.mark.parametrize("name", PAPER)
def test_paper_scale(name):
    config = _load(name)
    doc = config_lib.load_module(REPO / "configs" / "paper" / f"{name}.py").__doc__
    assert re.search(r"arXiv:\d{4}\.\d{5}", doc) and "Departures" in doc
    model, task, steps, suite, prompts, group, updates, budget = EXPECTED[name]
    assert (config.model.name, config.task.name, config.train.steps, config.eval.suite) == (
        model, task, steps, suite)
    assert (config.rollout.prompts_per_batch, config.objective.group_size,
            config.train.minibatches * config.train.epochs, config.rollout.max_new_tokens) == (
        prompts, group, updates, budget)
    assert model in models.NAMED_CONFIGS
    assert config.model.path.startswith("gs://YOUR-BUCKET/checkpoints/")
    assert _load(name, "path=/ckpt/x").model.path == "/ckpt/x"
    assert config.model.dtype == "bfloat16" and config.model.scan_layers
    if suite:
        suites.get_suite(suite)
    _objective(config)


@pytest.mark.parametrize("name", PAPER)
def test_runlocal_is_the_tiny_model_on_bundled_data_for_two_steps(name):
    config = _load(name, "runlocal=True")
    assert config.model.name in ("tiny", "tiny_moe") and config.model.path == ""
    assert config.task.name == "arithmetic" and config.train.steps == 2
    assert config.eval.suite == ""
    _objective(config)


def test_dapo_sweep_is_table_1_adding_one_technique_a_row():
    rows = config_lib.load_module(REPO / "configs" / "paper" / "dapo_qwen25_32b.py").get_sweep()
    got = [(r["objective.overlong.mode"], r["objective.loss.eps_high"],
            r["objective.aggregation.mode"], r["filtering.dynamic_sampling"],
            len(r["reward.specs"]) == 2) for r in rows]
    assert got == [
        ("none", 0.2, "seq-mean-token-mean", False, False),   # naive GRPO: 30
        ("mask", 0.2, "seq-mean-token-mean", False, False),   # + overlong filtering: 36
        ("mask", 0.28, "seq-mean-token-mean", False, False),  # + clip-higher: 38
        ("none", 0.28, "seq-mean-token-mean", False, True),   # + soft punishment: 41
        ("none", 0.28, "token-mean", False, True),            # + token-level loss: 42
        ("none", 0.28, "token-mean", True, True),             # + dynamic sampling: 50
    ]
    final = config_lib.apply_overrides(_load("dapo_qwen25_32b"), rows[-1])
    assert final.to_dict() == _load("dapo_qwen25_32b").to_dict()   # the last row is DAPO


def _parameters(name):
    """The named shape's parameters, by the Qwen2 formula: embeddings (and an untied head),
    per layer q/k/v with biases, o, the SwiGLU MLP and two norms, and the final norm."""
    c = models.get_model_config(name)
    q, kv = c.n_heads * c.head_dim, c.n_kv_heads * c.head_dim
    layer = (c.d_model * q + q + 2 * (c.d_model * kv + kv) + q * c.d_model
             + 3 * c.d_model * c.d_ff + 2 * c.d_model)
    embeddings = c.vocab_size * c.d_model * (1 if c.tie_embeddings else 2)
    return embeddings + c.n_layers * layer + c.d_model


@pytest.mark.parametrize("name,published", [
    # the model cards' parameter counts (Qwen/Qwen2.5-0.5B: 0.49B; Qwen2.5-Math-7B's base
    # Qwen2.5-7B: 7.61B; Qwen/Qwen2.5-32B: 32.5B), within 1%
    ("qwen2_5_0_5b", 0.49e9), ("qwen2_5_math_7b", 7.61e9), ("qwen2_5_32b", 32.5e9)])
def test_named_qwen25_shapes(name, published):
    _, state = models.abstract_model(models.get_model_config(name))
    count = sum(math.prod(x.shape) for x in jax.tree.leaves(state))
    assert count == _parameters(name)
    assert abs(count - published) / published < 0.01
