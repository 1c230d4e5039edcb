"""Every config and every sweep entry loads and builds its objective."""

import glob
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from grpo_jax import config_lib, data, objectives, rewards

REPO = pathlib.Path(__file__).resolve().parents[1]
CONFIGS = sorted(pathlib.Path(p).name for p in glob.glob(str(REPO / "configs" / "*.py")))
RECIPES = (
    "grpo", "dr_grpo", "dapo", "gspo", "cispo", "sapo", "rloo", "reinforce_pp", "gdpo", "olmo3",
    "ppo", "vapo",
)


def _load(name, arg=None):
    return config_lib.load_config(f"{REPO / 'configs' / name}" + (f":{arg}" if arg else ""))


ABLATIONS = sorted(f"ablations/{p.name}" for p in (REPO / "configs" / "ablations").glob("[!_]*.py"))


def _tiny_batch(config):
    G = config.objective.group_size
    B, T = 2 * G, 5
    rng = np.random.default_rng(0)
    K = len(config.reward.specs)
    rewards = rng.integers(0, 2, (B, K) if config.objective.advantage.estimator == "gdpo" else B)
    old = np.log(rng.uniform(0.1, 0.9, (B, T)))
    return jnp.asarray(old + 0.1, jnp.float32), {
        "old_logp": jnp.asarray(old, jnp.float32), "ref_logp": jnp.asarray(old - 0.1, jnp.float32),
        "behaviour_logp": jnp.asarray(old, jnp.float32), "mask": jnp.ones((B, T)),
        "rewards": jnp.asarray(rewards, jnp.float32), "lengths": jnp.full(B, T),
        "truncated": jnp.zeros(B, bool),
        "values": jnp.asarray(rng.uniform(0, 1, (B, T)), jnp.float32),
        "correct": jnp.asarray(rewards > 0),
    }


def _objective(config):
    weights = rewards.spec_weights(rewards.as_specs(config.reward.specs))
    return objectives.policy_objective(config.objective, reward_weights=weights)


def test_every_recipe_of_the_design_table_has_a_config():
    assert set(RECIPES) <= {name[:-3] for name in CONFIGS}


# smollm2 is sized for a CPU already and has no runlocal scaling; its tool variant is loaded too
@pytest.mark.parametrize(
    "name,arg",
    [
        (name, arg)
        for name in CONFIGS
        for arg in (None, "runlocal=True")
        if not (name == "smollm2.py" and arg)
    ]
    + [("smollm2.py", "tool=True")],
)
def test_config_builds_its_objective_and_runs(name, arg):
    config = _load(name, arg)
    module = config_lib.load_module(REPO / "configs" / name)
    assert module.__doc__ and len(module.__doc__.strip().splitlines()) >= 3, "header docstring"
    objective = _objective(config)
    logp, batch = _tiny_batch(config)
    loss, metrics = jax.jit(objective)(logp, batch)
    assert np.isfinite(float(loss)) and all(np.isfinite(float(v)) for v in metrics.values())


@pytest.mark.parametrize("name", [c for c in CONFIGS if hasattr(
    config_lib.load_module(REPO / "configs" / c), "get_sweep")])
def test_every_sweep_entry_builds(name):
    sweep = config_lib.load_module(REPO / "configs" / name).get_sweep()
    assert len(sweep) >= 2
    for overrides in sweep:
        config = config_lib.apply_overrides(_load(name, "runlocal=True"), overrides)
        for dotted, value in overrides.items():
            section = config
            for part in dotted.split("."):
                section = section[part]
            assert section == value
        _objective(config)


def test_runlocal_shrinks_and_references_follow():
    big, small = _load("dapo.py"), _load("dapo.py", "runlocal=True")
    assert small.rollout.max_new_tokens < big.rollout.max_new_tokens
    # The soft length penalty is a reward whose zone is a fraction of whatever budget the
    # run has (the trainer passes rollout.max_new_tokens), so it follows an override.
    assert ("overlong", 1.0, {"cache_fraction": 0.2}) in big.reward.specs
    dr = _load("dr_grpo.py")
    assert dr.objective.aggregation.norm_len == dr.rollout.max_new_tokens
    dr.rollout.max_new_tokens = 77
    assert dr.objective.aggregation.norm_len == 77


# The papers' regimes: prompts x G per rollout, optimizer updates per rollout, budget.
REGIMES = {
    "grpo": (512, 16, 16, 32768), "dr_grpo": (128, 8, 8, 3000), "dapo": (512, 16, 16, 20480),
    "gspo": (512, 16, 4, 8192), "cispo": (512, 16, 16, 20480), "sapo": (512, 16, 4, 8192),
    "rloo": (128, 4, 1, 1024), "reinforce_pp": (256, 4, 8, 1024), "gdpo": (512, 16, 16, 8000),
    "olmo3": (64, 8, 1, 32768), "deepseek_v32": (512, 16, 16, 32768),
    "self_verify": (512, 16, 16, 32768), "rpt": (256, 8, 1, 8192),
    "ppo": (8192, 1, 16, 20480), "vapo": (512, 16, 16, 20480),
}


@pytest.mark.parametrize("name", sorted(REGIMES))
def test_recipes_run_in_their_papers_regime_and_runlocal_scales_it(name):
    def regime(c):
        return (c.rollout.prompts_per_batch, c.objective.group_size,
                c.train.epochs * c.train.minibatches, c.rollout.max_new_tokens)

    prompts, group, updates, budget = REGIMES[name]
    assert regime(_load(f"{name}.py")) == REGIMES[name]
    # runlocal: 16 prompts x min(G, 4), min(updates, 4) updates, 48 tokens (64 with a verdict);
    # one answer per prompt: 64 prompts, the rows of the others.
    tokens = 64 if name == "self_verify" else 48
    prompts = 64 if group == 1 else 16
    assert regime(_load(f"{name}.py", "runlocal=True")) == (prompts, min(group, 4), min(updates, 4),
                                                           tokens)


def test_recipes_differ_from_base_as_the_design_table_says():
    expect = {
        "grpo": ("group", "group", "ppo_clip", "seq-mean-token-mean", 0.2, 0.2, 0.001),
        "dr_grpo": ("group", "none", "ppo_clip", "seq-mean-token-sum-norm", 0.2, 0.2, 0.0),
        "dapo": ("group", "group", "ppo_clip", "token-mean", 0.2, 0.28, 0.0),
        "gspo": ("group", "group", "gspo", "seq-mean-token-mean", 3e-4, 4e-4, 0.0),
        "sapo": ("group", "group", "sapo", "seq-mean-token-mean", 0.2, 0.2, 0.0),
        "rloo": ("rloo", "group", "pg", "token-mean", 0.2, 0.2, 0.0),
        "reinforce_pp": ("reinforce_pp", "group", "ppo_clip", "token-mean", 0.2, 0.2, 0.0),
        "gdpo": ("gdpo", "group", "ppo_clip", "token-mean", 0.2, 0.28, 0.0),
        "olmo3": ("group", "none", "ppo_clip", "token-mean", 0.2, 0.272, 0.0),
        "ppo": ("gae", "group", "ppo_clip", "seq-mean-token-mean", 0.2, 0.2, 0.0),
        "vapo": ("gae", "group", "ppo_clip", "token-mean", 0.2, 0.28, 0.0),
    }
    for name, row in expect.items():
        o = _load(f"{name}.py").objective
        got = (o.advantage.estimator, o.advantage.scale, o.loss.kind, o.aggregation.mode,
               o.loss.eps_low, o.loss.eps_high, o.kl.beta)
        assert got == row, name
    assert (
        _load("dapo.py").filtering.dynamic_sampling and _load("olmo3.py").filtering.dynamic_sampling
    )
    assert [s[0] for s in _load("dapo.py").reward.specs] == ["gsm8k", "overlong"]
    assert [s[0] for s in _load("gdpo.py").reward.specs] == ["gsm8k", "length_budget"]
    assert _load("cispo.py").objective.loss.kind == "cispo"
    assert _load("olmo3.py").rollout.policy_lag == 8
    assert _load("grpo.py").train.ref_reset_every == 400


def test_ppo_and_vapo_differ_in_the_pieces_vapo_adds():
    """PPO: one lambda (0.95) for policy and critic, no pre-training, no LM loss. VAPO:
    decoupled (critic 1.0) and length-adaptive (alpha 0.05) GAE, 50 pre-training steps,
    mu = 0.1; both critics at twice the policy's learning rate."""
    def pieces(c):
        a = c.objective.advantage
        return (c.critic.enabled, a.gamma, a.lam, a.lam_alpha, a.whiten, c.critic.lam,
                c.critic.pretrain_steps, c.critic.value_clip, c.objective.positive_nll_weight,
                c.critic.optimizer.learning_rate / c.optimizer.learning_rate)

    ppo, vapo = _load("ppo.py"), _load("vapo.py")
    assert pieces(ppo) == (True, 1.0, 0.95, 0.0, True, 0.95, 0, 0.2, 0.0, 2.0)
    assert pieces(vapo) == (True, 1.0, 0.95, 0.05, True, 1.0, 50, 0.2, 0.1, 2.0)
    assert _load("vapo.py", "runlocal=True").critic.pretrain_steps == 5
    ppo.objective.advantage.lam = 0.9   # ppo ties the critic's lambda to the policy's
    assert ppo.critic.lam == 0.9
    vapo.objective.advantage.lam = 0.9   # vapo decouples them
    assert vapo.critic.lam == 1.0


def test_unknown_config_argument_is_named():
    with pytest.raises(
        ValueError, match=r"unknown config argument 'runlocl'; this config accepts runlocal"
    ):
        _load("dapo.py", "runlocl=True")


def test_missing_config_file_is_named():
    with pytest.raises(FileNotFoundError, match=r"configs/nope.py"):
        config_lib.load_config("configs/nope.py")


# Held-out sizes known without building a dataset: a generated task's num_<split> knob, the
# official files' counts for the fixed ones (GSM8K, Cobbe et al., arXiv:2110.14168; MATH-500,
# Lightman et al., arXiv:2305.20050; HumanEval, Chen et al., arXiv:2107.03374). RPT's test
# split depends on its corpus: not checked.
FIXED_SPLITS = {("gsm8k", "train"): 7473, ("gsm8k", "test"): 1319, ("math500", "test"): 500,
                ("humaneval", "test"): 164}


def _held_out_size(task):
    if task.name == "rpt":
        return None
    knobs = data.builder_config(task.name, task.knobs.to_dict())
    if knobs is None:
        return FIXED_SPLITS[(task.name, task.eval_split)]
    return getattr(knobs, f"num_{task.eval_split}")


def _shipped_configs():
    """`(label, config)` of every config as it ships: each recipe and its runlocal scale,
    each ablation, and every sweep entry at the scale the sweep runs it."""
    for name, arg in ([(n, None) for n in CONFIGS + ABLATIONS]
                      + [(n, "runlocal=True") for n in CONFIGS if n != "smollm2.py"]):
        config = _load(name, arg)
        yield f"{name}:{arg}", config
        module = config_lib.load_module(REPO / "configs" / name)
        if hasattr(module, "get_sweep") and (arg or name in ABLATIONS):
            for overrides in module.get_sweep():
                yield f"{name}:{arg} {overrides}", config_lib.apply_overrides(_load(name, arg),
                                                                              overrides)


def test_no_shipped_config_evaluates_more_prompts_than_its_held_out_split_has():
    checked = 0
    for label, config in _shipped_configs():
        size = _held_out_size(config.task)
        if size is not None:
            assert config.eval.num_prompts <= size, (label, config.eval.num_prompts, size)
            checked += 1
    assert checked >= 2 * len(CONFIGS)
    # The ablations evaluate the whole runlocal test split.
    assert {_held_out_size(_load(n).task) for n in ABLATIONS} == {500}
