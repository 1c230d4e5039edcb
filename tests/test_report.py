"""grpo_jax.report: report.md and the PNGs from hand-built runs with known means and spreads,
byte for byte, and the committed ablation reports regenerated from their committed runs."""

import json
import pathlib
import re
import shutil

import numpy as np
import pytest

from grpo_jax import report, run_files, sweep

REPO = pathlib.Path(__file__).resolve().parents[1]

RECIPE = '''"""Toy sweep: two learning rates.

A higher rate learns faster.
"""


def get_sweep():
    return [{"optimizer.learning_rate": 0.1}, {"optimizer.learning_rate": 0.2}]


def get_report():
    return {"table": (("eval_accuracy", "final"), ("loss", "mean"), ("loss", "late")),
            "plots": ("eval_accuracy", ("loss", "generated_tokens")),
            "labels": ("slow", "fast")}
'''

# Per entry: the final held-out accuracy of seeds 0, 1, 2 (0.3 and 0.1 at step 2), and
# the loss factor and the tokens generated per step.
FINAL_ACCURACY = {0: (0.5, 0.6, 0.7), 1: (0.2, 0.2, 0.5)}
HALFWAY_ACCURACY = {0: 0.3, 1: 0.1}
LOSS_FACTOR = {0: 1.0, 1: 2.0}
TOKENS = {0: 100.0, 1: 50.0}


def _write_run(root, spec, entry, seed, steps, commits=("abc1234",)):
    name = f"{entry:02d}_learning_rate-{0.1 * (entry + 1):g}"
    workdir = root / name / f"seed-{seed}"
    workdir.mkdir(parents=True)
    record = {"sweep_config": spec, "entry": entry, "entry_name": name,
              "overrides": {"optimizer.learning_rate": round(0.1 * (entry + 1), 1)},
              "seed": seed, "command": ["python", "-m", "grpo_jax.main"],
              "starts": [{"commit": c, "machine": "Test CPU, 2 cores, 1 per run"} for c in commits],
              "config": {"mode": "rl", "train": {"steps": 4}, "sft": {"steps": 9}}}
    (workdir / sweep.RUN_RECORD).write_text(json.dumps(record))
    rows = []
    for step in steps:
        row = {"step": step, "time": 1e9 + step, "loss": LOSS_FACTOR[entry] * (step + seed),
               "generated_tokens": TOKENS[entry]}
        if step == 2:
            row["eval_accuracy"] = HALFWAY_ACCURACY[entry]
        if step == 4:
            row["eval_accuracy"] = FINAL_ACCURACY[entry][seed]
        rows.append(json.dumps(row) + "\n")
    (workdir / run_files.METRICS).write_text("".join(rows))


@pytest.fixture
def sweep_root(tmp_path):
    """Entries 0 and 1 with seeds 0, 1, 2 finished, and entry 1 seed 3 stopped at step 2."""
    spec = str(tmp_path / "recipe.py")
    (tmp_path / "recipe.py").write_text(RECIPE)
    root = tmp_path / "runs"
    for entry in (0, 1):
        for seed in (0, 1, 2):
            _write_run(root, spec, entry, seed, range(1, 5),
                       commits=("abc1234", "def5678") if (entry, seed) == (1, 2) else ("abc1234",))
    _write_run(root, spec, 1, 3, range(1, 3))
    return root, spec


def _expected(spec):
    # eval_accuracy final: entry 0 (0.5, 0.6, 0.7) -> 0.600 ± 0.10; entry 1 (0.2, 0.2, 0.5)
    # -> 0.300 ± sqrt(0.03) = 0.17. The mean of the last 3 (here both) evaluations is
    # (0.4, 0.45, 0.5) slow and (0.15, 0.15, 0.3) fast, means 0.45 and 0.2; 3 seeds are
    # fewer than 5, so the column gives their range, not a confidence interval.
    # Loss = factor x (step + seed): the mean over steps 1-4 is factor x (2.5 + seed), the
    # last fifth (one step) factor x (4 + seed).
    return f"""# Sweep: `{spec}`

Toy sweep: two learning rates.

A higher rate learns faster.

## Runs

```bash
python -m grpo_jax.sweep --config {spec} --workdir_root DIR --seeds 0,1,2,3
python -m grpo_jax.report DIR
```

Commits: abc1234, def5678. Machines: Test CPU, 2 cores, 1 per run.

Primary outcome (the sweep config's get_report()): eval_accuracy (last 3), paired by seed.

| variant | learning_rate | seeds | eval_accuracy (final) | eval_accuracy (mean of last 3 evals; t-CI, or range under 5 seeds) | loss (mean) | loss (late) |
|---|---|---|---|---|---|---|
| slow | `0.1` | 3 | 0.600 ± 0.10 | 0.450 (range [0.400, 0.500] over 3 seeds) | 3.50 ± 1.0 | 5.00 ± 1.0 |
| fast | `0.2` | 3 | 0.300 ± 0.17 | 0.200 (range [0.150, 0.300] over 3 seeds) | 7.00 ± 2.0 | 10.0 ± 2.0 |

Mean over the finished seeds ± their sample standard deviation (ddof=1). A measure reduces each run's metric over the steps that logged it: final = the last value; early, late = the mean of the first, last fifth of the values; last 3 = the mean of the last 3 values; auc = the trapezoid mean over the logged steps; mean; sum; std = the population std over steps; cv = that std divided by the mean over steps. A mean of last 3 column: each seed's mean of its last 3 values (the per-seed value the paired comparisons take), then the mean over seeds with its 95% t-interval over seeds when 5 or more finished, else the seeds' range (an interval over fewer seeds is not a confidence interval).

Not finished, left out: 01_learning_rate-0.2/seed-3 (at step 2 of 4).

## Plots

Lines: the mean over seeds; bands: the lowest to the highest seed.

![eval_accuracy against step](eval_accuracy.png)

![loss against generated_tokens](loss_vs_generated_tokens.png)
"""  # noqa: E501 (report.md byte for byte: its table rows and notes are single lines)


def test_report_md_has_the_hand_computed_means_and_spreads(sweep_root):
    root, spec = sweep_root
    path = report.write_report(root)
    assert path == root / "report.md"
    text = path.read_text()
    start, stop = text.index("## Paired comparisons"), text.index("Not finished")
    assert text[:start] + text[stop:] == _expected(spec)
    # Paired, per seed: the mean of the two evaluations (steps 2 and 4) is (0.4, 0.45, 0.5)
    # slow, (0.15, 0.15, 0.3) fast: differences -0.25, -0.30, -0.20 (the trapezoid mean of
    # two points is the same). 3 seeds: the range, and the exact sign-flip p of three
    # differences of one sign, 2/8 = 0.25 (Holm over the one primary row: 0.25). The
    # differences' sd is 0.05 (one row per measure: pooled sd 0.05, df 2); a paired t-test
    # with power 0.8 for a 0.05 gap at sd 0.05 needs 10 seeds (scipy's noncentral t, in
    # test_report_stats), and with 3 seeds its power is 0.18. The runs' config has no
    # eval.num_prompts: no SE.
    assert ("| fast − slow | eval_accuracy (last 3) (primary) | 0, 1, 2 | -0.250, -0.300, "
            "-0.200 | -0.250 | range [-0.300, -0.200] over 3 seeds | 0.250 | 0.250 | 10 (gap "
            "0.05, pooled sd 0.050, df 2) | no difference detected at 3 seeds; power for a 0.05 "
            "gap 0.18 |") in text
    assert ("| fast − slow | eval_accuracy (auc) | 0, 1, 2 | -0.250, -0.300, -0.200 | -0.250 | "
            "range [-0.300, -0.200] over 3 seeds | 0.250 | secondary | 10 (gap 0.05, pooled sd "
            "0.050, df 2) | secondary: no difference detected at 3 seeds; power for a 0.05 gap "
            "0.18 |") in text
    assert "| slow | – | 0.600 | 0.100 | 0.050 | – |" in text
    assert "| fast | – | 0.300 | 0.173 | 0.087 | – |" in text


def test_rerunning_gives_the_same_bytes_and_the_pngs_carry_no_software_or_time(
    sweep_root, tmp_path
):
    root, _ = sweep_root
    report.write_report(root, tmp_path / "first")
    report.write_report(root, tmp_path / "second")
    files = sorted(p.name for p in (tmp_path / "first").iterdir())
    assert files == ["eval_accuracy.png", "loss_vs_generated_tokens.png", "report.md"]
    for name in files:
        first, second = ((tmp_path / d / name).read_bytes() for d in ("first", "second"))
        assert first == second, name
    for name in files[:2]:
        png = (tmp_path / "first" / name).read_bytes()
        assert png.startswith(b"\x89PNG\r\n\x1a\n")
        assert b"Software" not in png and b"atplotlib" not in png and b"tIME" not in png


def test_collected_copies_give_the_same_report(sweep_root, tmp_path, capsys):
    root, _ = sweep_root
    report.write_report(root)
    assert report.main([str(root), "--collect_into", str(tmp_path / "kept")]) == 0
    kept = tmp_path / "kept"
    assert sorted(str(p.relative_to(kept)) for p in kept.rglob("*") if p.is_file()) == sorted(
        [f"{run}/{name}" for run in ("00_learning_rate-0.1/seed-0", "00_learning_rate-0.1/seed-1",
                                     "00_learning_rate-0.1/seed-2", "01_learning_rate-0.2/seed-0",
                                     "01_learning_rate-0.2/seed-1", "01_learning_rate-0.2/seed-2",
                                     "01_learning_rate-0.2/seed-3")
         for name in (run_files.RUN_RECORD, run_files.METRICS_GZ)]
        + ["report.md", "eval_accuracy.png", "loss_vs_generated_tokens.png"])
    for name in ("report.md", "eval_accuracy.png", "loss_vs_generated_tokens.png"):
        assert (kept / name).read_bytes() == (root / name).read_bytes(), name
    gz = (kept / "00_learning_rate-0.1" / "seed-0" / run_files.METRICS_GZ).read_bytes()
    report.collect_runs(root, tmp_path / "again")   # the same rows, the same bytes
    again = tmp_path / "again" / "00_learning_rate-0.1" / "seed-0" / run_files.METRICS_GZ
    assert again.read_bytes() == gz


def test_the_bands_are_the_seeds_mean_lowest_and_highest_at_their_common_steps(sweep_root):
    root, _ = sweep_root
    runs = report.load_runs(root)
    fast = [r for r in runs if r.record["entry"] == 1 and r.finished]
    xs, mean, low, high = report.seed_band(fast, "eval_accuracy", "step")
    np.testing.assert_allclose(xs, [2, 4])
    np.testing.assert_allclose(mean, [0.1, 0.3])
    np.testing.assert_allclose(low, [0.1, 0.2])
    np.testing.assert_allclose(high, [0.1, 0.5])
    xs, mean, _, _ = report.seed_band(fast, "loss", "generated_tokens")   # 50 tokens a step
    np.testing.assert_allclose(xs, [50, 100, 150, 200])
    np.testing.assert_allclose(mean, [2 * (s + 1) for s in range(1, 5)])   # 2 x (step + mean seed)
    # A seed without step 2's value: only step 4 is common to all.
    rows = tuple(r for r in fast[0].rows if r["step"] != 2)
    gappy = [report.RunData(fast[0].path, fast[0].record, rows)] + fast[1:]
    xs, mean, _, _ = report.seed_band(gappy, "eval_accuracy", "step")
    np.testing.assert_allclose(xs, [4])
    np.testing.assert_allclose(mean, [0.3])


def _eval_run(seed, accuracies):
    """A finished run of 5 steps whose eval_accuracy at steps 1-5 is `accuracies`."""
    rows = tuple({"step": step, "eval_accuracy": a} for step, a in enumerate(accuracies, 1))
    record = {"entry": 0, "entry_name": "00_x", "overrides": {}, "seed": seed,
              "config": {"mode": "rl", "train": {"steps": 5}}}
    return report.RunData(f"00_x/seed-{seed}", record, rows)


def test_the_summary_column_is_the_seeds_mean_of_the_last_k_evals_with_its_range():
    curves = {0: [0.1, 0.2, 0.4, 0.5, 0.6], 1: [0.3, 0.3, 0.6, 0.6, 0.9],
              2: [0.0, 0.9, 0.2, 0.2, 0.2]}
    runs = [_eval_run(seed, c) for seed, c in curves.items()]
    spec = report.ReportSpec(report.with_summary([("eval_accuracy", "final")]), [], None,
                             [], 3, {})
    assert spec.table == [("eval_accuracy", "final"), ("eval_accuracy", "last_k")]
    header, _, row = report.table_lines([(0, "00_x", {}, runs)], spec)
    assert header == ("| seeds | eval_accuracy (final) | "
                      "eval_accuracy (mean of last 3 evals; t-CI, or range under 5 seeds) |")
    per_seed = np.array([np.mean(c[-3:]) for c in curves.values()])   # 0.5, 0.7, 0.2
    np.testing.assert_allclose(per_seed, [0.5, 0.7, 0.2])
    # 3 seeds: their range, never called a CI.
    assert row == "| 3 | 0.567 ± 0.35 | 0.467 (range [0.200, 0.700] over 3 seeds) |"
    # One seed: its mean alone, no interval.
    assert report.table_lines([(0, "00_x", {}, runs[:1])], spec)[2] == "| 1 | 0.600 | 0.500 |"


def _tuned_run(entry, seed, rewards, accuracies):
    """A finished 2-step run of `entry`: reward_mean `rewards`, eval_accuracy `accuracies`."""
    rows = tuple({"step": step, "reward_mean": r, "eval_accuracy": a}
                 for step, (r, a) in enumerate(zip(rewards, accuracies), 1))
    record = {"entry": entry, "entry_name": f"{entry:02d}", "overrides": {}, "seed": seed,
              "config": {"mode": "rl", "train": {"steps": 2}}}
    return report.RunData(f"{entry:02d}/seed-{seed}", record, rows)


def test_methods_are_compared_at_the_setting_their_training_reward_picks():
    # Entries 0, 1 = method A at two rates, 2, 3 = method B. Late reward_mean (the last
    # fifth of 2 steps = step 2), mean over seeds 0, 1: A 0.5 / 0.7 -> entry 1; B 0.6 / 0.6
    # -> a tie, the first (entry 2). Entry 3 has the best held-out accuracy and is not picked.
    runs = {0: [(0.0, 0.5), (0.0, 0.5)], 1: [(0.0, 0.7), (0.0, 0.7)],
            2: [(0.0, 0.6), (0.0, 0.6)], 3: [(0.0, 0.6), (0.0, 0.6)]}
    accuracy = {0: (0.9, 0.9), 1: (0.4, 0.6), 2: (0.5, 0.8), 3: (0.99, 0.99)}
    entries = [(i, f"{i:02d}", {}, [_tuned_run(i, seed, runs[i][seed], (0.0, accuracy[i][seed]))
                                    for seed in (0, 1)]) for i in range(4)]
    spec = report.report_spec(type("M", (), {"get_report": staticmethod(lambda: {
        "paired": (("eval_accuracy", "final"),),
        "tuned": {"by": ("reward_mean", "late"), "methods": (("A", (0, 1)), ("B", (2, 3)))},
    })}), 4)
    names = ["A lo", "A hi", "B lo", "B hi"]
    lines = report.tuned_lines(entries, names, spec)
    assert lines[2:6] == ["| A | A lo | 0.5000 |  |", "| A | A hi | 0.7000 | yes |",
                          "| B | B lo | 0.6000 | yes |", "| B | B hi | 0.6000 |  |"]
    # B lo - A hi per seed: 0.5 - 0.4 = +0.1, 0.8 - 0.6 = +0.2: the range of 2 seeds, the
    # sign-flip p 2/4 = 0.5 (the primary outcome, the first paired measure when get_report()
    # names none; Holm over one row: 0.5); sd 0.0707, the t-test's seeds for a 0.05 gap 18,
    # its power at 2 seeds 0.07.
    row = next(line for line in lines if line.startswith("| B (B lo) − A (A hi)"))
    assert row == ("| B (B lo) − A (A hi) | eval_accuracy (final) (primary) | 0, 1 | +0.100, "
                   "+0.200 | +0.150 | range [0.100, 0.200] over 2 seeds | 0.500 | 0.500 | 18 "
                   "(gap 0.05, pooled sd 0.071, df 1) | no difference detected at 2 seeds; "
                   "power for a 0.05 gap 0.07 |")


@pytest.mark.parametrize("tuned, message", [
    ({"by": ("eval_accuracy", "last_k"), "methods": (("A", (0,)), ("B", (1,)))},
     "not by the held-out evaluation"),
    ({"by": ("reward_mean", "late"), "methods": (("A", (0, 1)), ("B", (1,)))},
     "belongs to one method"),
    ({"by": ("reward_mean", "late"), "methods": (("A", (0,)),)}, "at least two methods"),
    ({"methods": ()}, "give {'by'"),
])
def test_a_bad_tuned_spec_names_the_problem(tuned, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        report.parse_tuned(tuned, 2)


def test_a_nan_step_counts_as_not_logged():
    # explained_variance is NaN where the batch's returns are all equal: the late mean of
    # steps 1-5 is the last fifth of the defined values (steps 1, 2, 4, 5 -> step 5 alone).
    rows = tuple({"step": s, "explained_variance": v}
                 for s, v in enumerate([0.1, 0.2, float("nan"), 0.3, 0.5], 1))
    run = report.RunData("00_x/seed-0", {"config": {"mode": "rl", "train": {"steps": 5}}}, rows)
    assert run.values("explained_variance") == ([1, 2, 4, 5], [0.1, 0.2, 0.3, 0.5])
    assert report.reduce_run(run, "explained_variance", "late") == 0.5
    assert report.reduce_run(run, "explained_variance", "mean") == pytest.approx(0.275)


def test_the_summary_column_is_added_once_beside_the_final_accuracy():
    final, last = ("eval_accuracy", "final"), ("eval_accuracy", "last_k")
    loss = ("loss", "mean")
    assert report.with_summary([loss, final, loss]) == [loss, final, last, loss]
    assert report.with_summary([last, loss, final]) == [last, loss, final]
    assert report.with_summary([loss]) == [loss]


def test_reductions():
    values = np.arange(1.0, 11.0)
    assert [report.REDUCTIONS[k](values) for k in ("final", "early", "late", "mean", "sum")] == [
        10.0, 1.5, 9.5, 5.5, 55.0]
    assert report.REDUCTIONS["std"](values) == pytest.approx(np.sqrt(99 / 12))
    assert report.REDUCTIONS["early"](np.array([4.0, 8.0])) == 4.0   # a fifth of 2, rounded up
    assert report.format_cell([0.25]) == "0.250" and report.format_cell([]) == "–"


@pytest.mark.parametrize("get_report, message", [
    ({"table": (("loss", "median"),)}, "the reduction must be one of"),
    ({"labels": ("only one",)}, "gives 1 labels for 2 sweep entries"),
    ({"plot": ()}, "unknown keys ['plot']"),
])
def test_a_bad_get_report_names_the_problem(sweep_root, get_report, message):
    root, spec = sweep_root
    pathlib.Path(spec).write_text(f"def get_report():\n    return {get_report!r}\n")
    with pytest.raises(ValueError, match=re.escape(message)):
        report.write_report(root)


def test_without_get_report_the_defaults_are_used(sweep_root):
    root, spec = sweep_root
    pathlib.Path(spec).write_text('"""No report spec."""\n')
    text = report.write_report(root).read_text()
    assert (
        "| learning_rate | seeds | eval_accuracy (final) | eval_accuracy (mean of last 3 "
        "evals; t-CI, or range under 5 seeds) | accuracy (final) | reward_mean (mean) |"
    ) in text
    assert ("| `0.1` | 3 | 0.600 ± 0.10 | 0.450 (range [0.400, 0.500] over 3 seeds) | – | – |"
            in text)
    assert "No finished run logged `reward_mean`: no plot." in text


def test_runs_of_two_sweeps_or_none_are_refused(sweep_root, tmp_path):
    root, spec = sweep_root
    with pytest.raises(FileNotFoundError, match="no sweep_run.json under"):
        report.load_runs(tmp_path / "empty")
    _write_run(root / "other", spec + "x", 0, 0, range(1, 5))
    with pytest.raises(ValueError, match="runs of several sweep configs"):
        report.load_runs(root)


COMMITTED = sorted(p.parent for p in (REPO / "experiments" / "ablations").glob("*/report.md"))


@pytest.mark.parametrize("directory", COMMITTED, ids=[p.name for p in COMMITTED])
def test_committed_ablation_reports_are_regenerated_byte_for_byte(directory, tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)
    copy = tmp_path / directory.name
    shutil.copytree(directory, copy, ignore=shutil.ignore_patterns("*.png", "report.md"))
    report.write_report(copy)
    assert (copy / "report.md").read_bytes() == (directory / "report.md").read_bytes()


def _comparison(name, differences, metric="eval_accuracy", how="last_k"):
    return report.Comparison(name, "A", metric, how, tuple(range(len(differences))),
                             np.asarray(differences, np.float64))


def test_primary_rows_are_holm_adjusted_and_read_from_the_adjusted_p():
    # Two primary rows over 6 seeds and one secondary. B: six positive differences, exact
    # sign-flip p 2/64 = 0.03125; C sums to 0, so every flip's |sum| is at least its own: p 1.
    b = [0.05, 0.06, 0.04, 0.07, 0.05, 0.06]
    c = [0.01, -0.01, 0.01, -0.01, 0.01, -0.01]
    spec = report.ReportSpec([], [], None, [("eval_accuracy", "last_k"),
                                            ("eval_accuracy", "auc")], 3,
                             {"eval_accuracy": 0.05})
    lines = report.comparison_lines(
        [_comparison("B", b), _comparison("C", c), _comparison("B", b, how="auc")], spec)
    rows = [line.split(" | ") for line in lines[2:]]
    # Holm: 2 x 0.03125 = 0.0625 for B (not below 0.05: no difference read), 1 for C.
    assert [r[6] for r in rows] == ["0.031", "1.000", "0.031"]
    assert [r[7] for r in rows] == ["0.062", "1.000", "secondary"]
    assert rows[0][9].startswith("no difference detected at 6 seeds")
    # The secondary row reads its own p: B higher than A by 0.055.
    assert rows[2][9] == "secondary: B higher than A by 0.0550 (p 0.031) |"
    # 6 seeds: a t-interval, mean 0.055, sd 0.01049 (ddof 1), t_{0.975,5} 2.5706.
    half = 2.570581836 * np.std(b, ddof=1) / np.sqrt(6)
    assert rows[0][5] == f"95% t-CI [{0.055 - half:.4f}, {0.055 + half:.4f}]"
    # Pooled over the two primary rows: sd sqrt((5 s_b^2 + 5 s_c^2) / 10), df 10.
    pooled = np.sqrt((np.var(b, ddof=1) + np.var(c, ddof=1)) / 2)
    assert f"pooled sd {pooled:.4f}, df 10" in rows[0][8]


@pytest.mark.parametrize("primary, message", [
    (("loss", "mean"), "is not one of the paired measures"),
    ("collapse", "needs a 'frontier' entry"),
    ("eval_accuracy", "give one (metric, how) pair"),
])
def test_a_bad_primary_outcome_names_the_problem(primary, message):
    module = type("M", (), {"get_report": staticmethod(lambda: {"primary": primary})})
    with pytest.raises(ValueError, match=re.escape(message)):
        report.report_spec(module, 2)


def test_every_committed_ablation_names_its_primary_outcome():
    from grpo_jax import config_lib
    for path in sorted((REPO / "configs" / "ablations").glob("[!_]*.py")):
        module = config_lib.load_module(path)
        assert "primary" in module.get_report(), f"{path.name}: get_report() names no primary"


def test_the_mechanism_table_averages_each_window_then_the_seeds():
    # Steps 1-5, windows of 2: (1-2), (3-4), (5). Seed s logs a = step + s and b = 1 at
    # every step, c at odd steps only; "a - b" is a - 1.
    def run(seed):
        rows = tuple(
            {"step": t, "a": float(t + seed), "b": 1.0, **({"c": 10.0 * t} if t % 2 else {})}
            for t in range(1, 6)
        )
        return report.RunData(f"00/seed-{seed}", {"seed": seed, "config": {
            "mode": "rl", "train": {"steps": 5}}}, rows)
    windows = report.parse_windows({"size": 2, "measures": ("a", "a - b", "c")})
    lines = report.window_lines([(0, "00", {}, [run(0), run(1)])], ["x"], windows)
    # a over 1-2: seed 0 1.5, seed 1 2.5 -> 2.00; c over 1-2: step 1 only, 10.
    assert lines[2:5] == ["| x | 1-2 | 2.00 | 1.00 | 10.0 |", "| x | 3-4 | 4.00 | 3.00 | 30.0 |",
                          "| x | 5-5 | 5.50 | 4.50 | 50.0 |"]
    with pytest.raises(ValueError, match="give the steps per window"):
        report.parse_windows({"size": 0, "measures": ("a",)})
