"""docs/metrics.md names every metric the code reports.

The trainers' own metrics.jsonl files are checked where the trainer tests run them
(tests/training/test_rl.py, test_demo.py, test_steps.py); here: the parser, and the
metric-producing functions of the objectives, the rollout statistics and the critic,
called directly on tiny arrays with every option that adds a metric switched on.
"""

import jax.numpy as jnp
import numpy as np
import pytest

from grpo_jax import config_lib, objectives
from grpo_jax.training import critic as critic_lib, metrics as metrics_lib, rollout
from tests import readme_metrics
from tests.training.training_setups import REPO

MADE_UP = """# Metrics

Intro naming `prose_key` outside any table.

```bash
# a comment in a code block, not a heading
```

| key | what it is |
|---|---|
| `plain`, `second` | mentions `described_key` in its description, a \\| b |

## A subsection

| key | what it is |
|---|---|
| `adv_q1..q3` | a range |
| `rewards/<name>` | one per reward |

# Performance

| `elsewhere` | another section's table |
"""


def test_the_parser_reads_first_cells_of_the_metrics_tables_and_expands_patterns():
    assert readme_metrics.documented_names(MADE_UP) == [
        "plain", "second", "adv_q1..q3", "rewards/<name>"]
    keys = ["plain", "second", "adv_q1", "adv_q2", "adv_q3", "rewards/math", "rewards/overlong"]
    assert readme_metrics.undocumented(keys, MADE_UP) == []


@pytest.mark.parametrize("key", [
    "made_up_metric", "prose_key", "described_key", "elsewhere", "adv_q0", "adv_q4", "adv_q",
    "rewards/", "rewards/a/b", "plain_suffix", "xplain"])
def test_the_parser_reports_a_key_the_section_does_not_name(key):
    assert readme_metrics.undocumented(["plain", key], MADE_UP) == [key]


def test_a_page_without_the_section_is_an_error():
    with pytest.raises(ValueError, match="no '# Metrics' section"):
        readme_metrics.undocumented(["loss"], "# Performance\n\n## Metrics\n")


def test_the_page_is_the_section_holding_every_table_and_names_the_console_and_watched_metrics():
    text = readme_metrics.METRICS_PAGE.read_text(encoding="utf-8")
    lines = text.splitlines()
    assert lines[0] == "# Metrics"   # the section starts the page ...
    # ... and runs to its end: every table row of the page is read
    assert readme_metrics.documented_names(text) == readme_metrics.first_cell_names(lines)
    named = [name for name, _, _ in metrics_lib.CONSOLE] + list(metrics_lib.WATCHED)
    assert readme_metrics.undocumented(named) == []


def _objective_metrics(kind):
    """The objective's metrics for loss `kind` with every metric-adding option on."""
    cfg = config_lib.load_config(str(REPO / "configs" / "base.py")).objective
    cfg.group_size = 2
    cfg.loss.kind = kind
    if kind == "ppo_clip":
        cfg.loss.dual_clip = 3.0
    if kind in ("gspo", "sapo", "gmpo"):   # defined per answer
        cfg.aggregation.mode = "seq-mean-token-mean"
    if kind == "luspo":
        cfg.aggregation.mode = "seq-mean-token-sum"
    cfg.kl.beta, cfg.entropy_coef, cfg.positive_nll_weight = 0.1, 0.01, 0.1
    cfg.top_entropy_quantile = 0.5
    cfg.importance.enabled = cfg.offpolicy_mask.enabled = cfg.m2po.enabled = True
    cfg.importance.enabled = kind != "vespo"   # VESPO refuses the token correction
    rng = np.random.default_rng(0)
    logp = lambda: jnp.asarray(rng.normal(-2.0, 0.5, (4, 3)), jnp.float32)
    batch = {"old_logp": logp(), "behaviour_logp": logp(), "ref_logp": logp(),
             "entropy": jnp.ones((4, 3)), "mask": jnp.ones((4, 3)),
             "rewards": jnp.array([1.0, 0.0, 0.0, 1.0]),
             "correct": jnp.array([1.0, 0.0, 0.0, 1.0]), "loss_seed": jnp.arange(4)}
    _, metrics = objectives.policy_objective(cfg)(logp(), batch)
    return metrics


@pytest.mark.parametrize("kind", ["pg", "ppo_clip", "gspo", "cispo", "sapo", "gmpo", "dppo",
                                  "clip_cov", "kl_cov", "luspo", "vespo"])
def test_every_objective_metric_is_documented(kind):
    metrics = _objective_metrics(kind)
    options = {"kl_ref", "entropy", "offpolicy_masked", "positive_nll", "m2po_masked",
               "entropy_kept"}
    if kind != "vespo":
        options |= {"importance_weight", "importance_truncated"}
    clips = {"clip_low", "clip_high"}
    activity = {
        "ppo_clip": clips | {"clip_dual"}, "gspo": clips, "cispo": clips, "sapo": {"gate_scale"},
        "pg": set(), "gmpo": clips, "dppo": clips | {"divergence", "ratio_capped"},
        "clip_cov": clips | {"cov_detached"}, "kl_cov": {"cov_penalized"}, "luspo": clips,
        "vespo": {"vespo_weight"},
    }[kind]
    assert {"loss", "policy_loss", "ratio", "kl_old"} | options | activity <= set(metrics)
    assert readme_metrics.undocumented(metrics) == []


def test_every_rollout_advantage_and_critic_statistic_is_documented():
    draw = {"rewards": jnp.array([[1.0, 0.5], [0.0, 0.5]]), "correct": jnp.array([True, False]),
            "lengths": jnp.array([3, 5]), "truncated": jnp.array([False, True])}
    keys = set(rollout.rollout_statistics((draw,), jnp.array([1.0, 0.5]), group_size=2,
                                         signal="correct"))
    mask = jnp.ones((4, 8))
    keys |= set(metrics_lib.advantage_statistics(
        jnp.ones((4, 8)), jnp.array([True, True, True, False]), jnp.ones(4, bool), mask,
        group_size=4))
    keys |= set(critic_lib.batch_statistics(
        {"values": jnp.zeros((4, 8)), "returns": jnp.ones((4, 8)), "advantages": jnp.ones((4, 8)),
         "mask": mask}))
    keys |= set(critic_lib.update_metrics(
        dict.fromkeys(("grad_norm", "grad_norm_std", "update_norm", "value_loss",
                       "value_clip_fraction"), 0.0)))
    assert {"advantage_mean_q4", "advantage_std_q1", "critic_grad_norm", "reward_mean"} <= keys
    assert readme_metrics.undocumented(keys) == []


def test_sampler_trainer_mismatch_metrics_are_documented():
    """The trainer logs objectives.mismatch_metrics under mismatch/, and the importance
    correction reports the share its mask zeroes (mask mode) or its cap lowers (truncate)."""
    f = jnp.asarray(np.random.default_rng(0).normal(-2.0, 0.5, (4, 3)), jnp.float32)
    keys = {f"mismatch/{k}" for k in objectives.mismatch_metrics(f, f + 0.1, jnp.ones((4, 3)))}
    assert {"mismatch/abs_diff_mean", "mismatch/abs_diff_max", "mismatch/kl"} <= keys
    batch = {"old_logp": f, "behaviour_logp": f - 1.0, "mask": jnp.ones((4, 3)),
             "rewards": jnp.array([1.0, 0.0, 0.0, 1.0])}
    for mode, key in (("mask", "importance_masked"), ("truncate", "importance_truncated")):
        metrics = objectives.presets.dapo(group_size=2, importance=True,
                                          importance_mode=mode)(f, batch)[1]
        assert key in metrics
        keys |= set(metrics)
    assert readme_metrics.undocumented(keys) == []
