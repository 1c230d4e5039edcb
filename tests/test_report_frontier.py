"""grpo_jax.report.frontier: when a run collapsed, and the frontier's tables and heat maps
from hand-built runs whose collapses are known."""

import json
import re

import pytest

from grpo_jax import report, run_files, sweep
from grpo_jax.report import frontier as report_frontier

COLLAPSE = report_frontier.Collapse("eval_accuracy", 0.5, 2)


@pytest.mark.parametrize("values, expected", [
    ([0.6, 0.2, 0.7, 0.1, 0.0], 9),    # one value under 0.3, a recovery, then two: from 9
    ([0.6, 0.2, 0.1, 0.0, 0.0], 3),    # the first of the streak, not where it reaches 2
    ([0.6, 0.2, 0.7, 0.1, 0.5], None),   # never two in a row
    ([0.6, 0.3, 0.3, 0.3, 0.3], None),   # at the threshold is not below it
    ([0.0, 0.0, 0.0, 0.0, 0.0], None),   # a start at 0 cannot fall below half of itself
])
def test_collapse_is_a_streak_below_a_fraction_of_the_start(values, expected):
    assert report_frontier.collapse_step([0, 3, 6, 9, 12], values, COLLAPSE) == expected


def test_one_evaluation_below_is_enough_when_asked():
    one = report_frontier.Collapse("eval_accuracy", 0.5, 1)
    assert report_frontier.collapse_step([0, 3, 6], [0.6, 0.35, 0.25], one) == 6


def test_collapse_needs_the_starting_evaluation():
    with pytest.raises(ValueError, match="train.eval_at_start=True"):
        report_frontier.collapse_step([3, 6], [0.6, 0.1], COLLAPSE)


RECIPE = '''"""Toy frontier: two losses x two learning rates, with and without warm-up."""


def get_sweep():
    return [{"objective.loss.kind": kind, "optimizer.learning_rate": lr,
             "optimizer.warmup_steps": warmup}
            for kind in ("pg", "cispo") for lr in (0.1, 0.3) for warmup in (0, 5)]


def get_report():
    return {"table": (("eval_accuracy", "final"),), "plots": (), "paired": (),
            "frontier": {"collapse": {"metric": "eval_accuracy", "below": 0.5,
                                      "evaluations": 2},
                         "rows": "optimizer.learning_rate", "columns": "optimizer.warmup_steps",
                         "panels": "objective.loss.kind"}}
'''
STEPS = (0, 2, 4, 6)
START = 0.6


def _curve(kind, lr, warmup, seed):
    """Held-out accuracy at STEPS: every run starts at 0.6; at lr 0.3 without warm-up
    cispo collapses in every seed (from step 2) and pg in seed 1 only (from step 4); cispo
    at lr 0.3 with warm-up dips once (not a collapse); the rest climb."""
    if lr == 0.3 and warmup == 0 and (kind == "cispo" or seed == 1):
        return [START, 0.1, 0.0, 0.0] if kind == "cispo" else [START, 0.5, 0.2, 0.1]
    if kind == "cispo" and lr == 0.3:
        return [START, 0.2, 0.7, 0.8]
    return [START, 0.7, 0.8, 0.8 + 0.05 * seed]


def _write_sweep(tmp_path, recipe=RECIPE):
    spec = tmp_path / "frontier.py"
    spec.write_text(recipe)
    root = tmp_path / "runs"
    namespace = {}
    exec(recipe, namespace)
    for entry, overrides in enumerate(namespace["get_sweep"]()):
        name = sweep.entry_name(entry, overrides)
        for seed in (0, 1, 2):
            workdir = root / name / f"seed-{seed}"
            workdir.mkdir(parents=True)
            record = {"sweep_config": str(spec), "entry": entry, "entry_name": name,
                      "overrides": overrides, "seed": seed, "command": [],
                      "starts": [{"commit": "abc1234", "machine": "Test CPU"}],
                      "config": {"mode": "rl", "train": {"steps": 6}, "sft": {"steps": 9}}}
            (workdir / sweep.RUN_RECORD).write_text(json.dumps(record))
            curve = _curve(overrides["objective.loss.kind"], overrides["optimizer.learning_rate"],
                           overrides["optimizer.warmup_steps"], seed)
            rows = [{"step": step, "eval_accuracy": value} for step, value in zip(STEPS, curve)]
            (workdir / run_files.METRICS).write_text("".join(json.dumps(r) + "\n" for r in rows))
    return root


def test_the_frontier_counts_collapsed_seeds_per_cell(tmp_path):
    root = _write_sweep(tmp_path)
    text = report.write_report(root).read_text()
    section = text[text.index("## Stability frontier"):]
    # pg: at lr 0.3 without warm-up seed 1 collapsed from step 4, finals 0.8, 0.1, 0.9.
    assert "| learning_rate \\ warmup_steps | 0 | 5 |" in section
    assert "| 0.1 | 0/3 · 0.85 | 0/3 · 0.85 |" in section   # finals 0.8, 0.85, 0.9
    pg = section[section.index("### `kind` = `pg`"):section.index("### `kind` = `cispo`")]
    assert "| 0.3 | 1/3 · 0.60 (step 4) | 0/3 · 0.85 |" in pg
    cispo = section[section.index("### `kind` = `cispo`"):]
    assert "| 0.3 | 3/3 · 0.00 (step 2) | 0/3 · 0.80 |" in cispo
    # pg: 1 of its 12 runs collapsed, 3 of 4 cells clean; cispo: 3 runs, in one cell.
    # Paired with pg by cell and seed (12 pairs): only cispo collapsed at (0.3, 0) in seeds
    # 0 and 2, both in seed 1: exact McNemar 2 P(Bin(2, 1/2) = 0) = 0.5. Seed-clustered:
    # per-seed means over 4 cells 1/4, 0, 1/4: |sum| >= 0.5 in 4 of 8 flips, p 0.5 (Holm
    # over one row: 0.5).
    assert "| `pg` | 1/12 | 3/4 | – | – | – | – |" in section
    assert "| `cispo` | 3/12 | 3/4 | 2 / 0 of 12 | 0.500 | 0.500 | 0.500 |" in section
    # Time to collapse, censored at step 6: pg S(4) = 11/12, restricted mean 4 + 2 x 11/12
    # = 5.83; cispo S(2) = 9/12, 2 + 4 x 0.75 = 5.0; neither median reached. Area under
    # the curve (trapezoid mean over steps 0-6): a climbing run (4.4 + 0.05 seed) / 6, pg's
    # collapse 2.1 / 6, cispo's 0.8 / 6, its dip 3.2 / 6; cispo - pg per seed, mean over
    # the 4 cells (two differ): seed 0 (-3.6 - 1.2) / 24 = -0.2, seed 1 (-1.3 - 1.25) / 24
    # = -0.10625, seed 2 (-3.7 - 1.3) / 24 = -0.20833: mean -0.172, one sign: p 2/8.
    assert "| `pg` | not reached | 5.8 | – | – |" in section
    assert "| `cispo` | not reached | 5.0 | -0.172 over 3 seeds | 0.250 |" in section
    for kind in ("pg", "cispo"):
        png = root / f"frontier_{kind}.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert f"![`kind` = `{kind}`](frontier_{kind}.png)" in section
    # The same runs give the same bytes.
    first = {p.name: p.read_bytes() for p in root.glob("*.png")} | {
        "report.md": (root / "report.md").read_bytes()}
    report.write_report(root)
    assert first == {p.name: p.read_bytes() for p in root.glob("*.png")} | {
        "report.md": (root / "report.md").read_bytes()}


def test_cells_hold_each_seed_once_with_its_collapse_step(tmp_path):
    runs = report.load_runs(_write_sweep(tmp_path))
    spec = report_frontier.parse({"collapse": {"metric": "eval_accuracy", "below": 0.5,
                                               "evaluations": 2},
                                  "rows": "optimizer.learning_rate",
                                  "columns": "optimizer.warmup_steps",
                                  "panels": ("objective.loss.kind",)})
    grid, values = report_frontier.cells(report.entries_of(runs), spec)
    assert values == {"objective.loss.kind": ["pg", "cispo"],
                      "optimizer.learning_rate": [0.1, 0.3], "optimizer.warmup_steps": [0, 5]}
    outcomes = grid[("pg", 0.3, 0)].outcomes
    assert [(o.seed, o.collapse_step, o.final, o.last_step) for o in outcomes] == [
        (0, None, 0.8, 6), (1, 4, 0.1, 6), (2, None, 0.9, 6)]
    # Trapezoid means over steps 0-6 of [0.6, 0.7, 0.8, 0.8], [0.6, 0.5, 0.2, 0.1] and
    # [0.6, 0.7, 0.8, 0.9].
    assert [o.auc for o in outcomes] == pytest.approx([4.4 / 6, 2.1 / 6, 4.5 / 6])
    assert grid[("cispo", 0.3, 0)].share == 1.0 and grid[("cispo", 0.3, 5)].share == 0.0


@pytest.mark.parametrize("frontier, message", [
    ({"collapse": {"metric": "eval_accuracy", "below": 0.5, "evaluations": 2},
      "rows": "optimizer.learning_rate", "columns": "train.minibatches",
      "panels": "objective.loss.kind"}, "names ['train.minibatches'], which entry"),
    ({"collapse": {"metric": "eval_accuracy", "below": 1.5, "evaluations": 2},
      "rows": "a", "columns": "b", "panels": "c"}, "frontier.collapse.below=1.5"),
    ({"collapse": {"metric": "eval_accuracy", "below": 0.5, "evaluations": 0},
      "rows": "a", "columns": "b", "panels": "c"}, "frontier.collapse.evaluations=0"),
    ({"rows": "a", "columns": "b", "panels": "c"}, "keys collapse, rows, columns and panels"),
])
def test_a_bad_frontier_names_the_problem(tmp_path, frontier, message):
    root = _write_sweep(tmp_path)
    spec = tmp_path / "frontier.py"
    spec.write_text(RECIPE.replace("def get_report():", "def get_report_unused():")
                    + f"\n\ndef get_report():\n    return {{'frontier': {frontier!r}}}\n")
    with pytest.raises(ValueError, match=re.escape(message)):
        report.write_report(root)


# Two cispo panels told apart by their clip: the loss and eps_high as one compound panel.
COMPOUND = RECIPE.replace(
    'for kind in ("pg", "cispo") for lr',
    'for kind in ("pg", "cispo", "cispo wide") for lr').replace(
    '"panels": "objective.loss.kind"',
    '"panels": (("objective.loss.kind", "objective.loss.eps_high"),)')


def test_a_compound_panel_pairs_each_loss_and_clip_with_the_first(tmp_path):
    """cispo at eps_high 0.2 and 0.5 (the same curves here) are two panels, each paired with
    pg's runs of the same cell and seed: 2 discordant pairs each, as cispo alone had."""
    recipe = COMPOUND.replace('{"objective.loss.kind": kind,',
                              '{"objective.loss.kind": kind.split()[0], '
                              '"objective.loss.eps_high": 0.5 if "wide" in kind else 0.2,')
    assert recipe.count("eps_high") == 2
    section = report.write_report(_write_sweep(tmp_path, recipe)).read_text()
    assert "| kind, eps_high | runs collapsed |" in section
    assert "| `pg, 0.2` | 1/12 | 3/4 | – | – | – | –" in section
    for panel in ("cispo, 0.2", "cispo, 0.5"):
        assert f"| `{panel}` | 3/12 | 3/4 | 2 / 0 of 12 | 0.500 | 0.500 |" in section
        assert (tmp_path / "runs" / f"frontier_{panel.replace(', ', '-')}.png").exists()
