"""The README's commands and the objectives page's code examples are real."""

import pathlib
import re
import subprocess
import sys

import numpy as np

REPO = pathlib.Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text()
OBJECTIVES = (REPO / "docs" / "objectives.md").read_text()


def _block_after(marker, language, text=README):
    section = text[text.index(marker):]
    return re.search(rf"```{language}\n(.*?)```", section, re.S).group(1)


def test_objectives_example_runs_verbatim_and_is_right():
    namespace = {}
    exec(
        _block_after("# Use the objectives in your own JAX model", "python", OBJECTIVES), namespace
    )
    loss, grads, mask, rewards = (namespace[k] for k in ("loss", "grads", "mask", "rewards"))
    # At rollout time logp == old_logp, so every ratio is 1 and the DAPO loss is
    # -sum_i A_i n_i / sum_i n_i with GRPO advantages (population std, eps 1e-6).
    r = np.asarray(rewards, np.float64).reshape(2, 4)
    adv = ((r - r.mean(1, keepdims=True)) / (r.std(1, keepdims=True) + 1e-6)).reshape(-1)
    n = np.asarray(mask).sum(1)
    np.testing.assert_allclose(float(loss), -(adv * n).sum() / n.sum(), rtol=1e-5)
    assert all(np.all(np.isfinite(g)) and np.any(g != 0) for g in grads.values())


def test_preset_example_is_the_hand_composed_dapo():
    """The preset block, run after the first one, gives the same DAPO loss and gradient."""
    namespace = {}
    exec(
        _block_after("# Use the objectives in your own JAX model", "python", OBJECTIVES), namespace
    )
    by_hand_loss, by_hand_grads = namespace["loss"], namespace["grads"]
    exec(_block_after("Or take a method whole", "python", OBJECTIVES), namespace)
    np.testing.assert_allclose(float(namespace["loss"]), float(by_hand_loss), rtol=1e-6)
    for name, grad in namespace["grads"].items():
        np.testing.assert_allclose(grad, by_hand_grads[name], rtol=1e-5, atol=1e-7)


def test_ci_runs_both_readme_commands():
    ci = (pathlib.Path(__file__).resolve().parents[1] / ".ci" / "run").read_text()
    # .ci/run extracts each command from the block after its marker in the README.
    assert "readme_command test-command" in ci and "readme_command main-command" in ci
    for marker in ("<!-- test-command -->", "<!-- main-command -->"):
        assert _block_after(marker, "bash").startswith("python3 -m venv .venv && ")


def test_the_test_command_lints_before_it_tests():
    """`ruff check` (ruff.toml) runs in the test command, before pytest, and `.ci/run` requires
    its all-clear; the test extra installs it."""
    command = _block_after("<!-- test-command -->", "bash")
    assert " && ruff check && python -m pytest " in command
    assert "All checks passed!" in (REPO / ".ci" / "run").read_text()
    assert '"ruff>=' in (REPO / "setup.py").read_text()
    assert (REPO / "ruff.toml").is_file()


def test_objectives_main_prints_the_worked_examples():
    out = subprocess.run([sys.executable, "-m", "grpo_jax.objectives"], capture_output=True,
                         text=True, check=True, timeout=300).stdout
    for expected in ("right:wrong = 6.0 : 1   whole answers +0.50 / -0.50",
                     "right:wrong = 1.0 : 1", "right +0.378   wrong -2.646",
                     "right +0.354   wrong -2.475", "right +0.125   wrong -0.875",
                     "0.010 -> 0.012", "takes 13 batches at eps_high 0.2",
                     "takes 10 batches at eps_high 0.28", "18,000 tokens -> -0.5",
                     "21,000 tokens -> -1.0"):
        assert expected in out
