"""setup.py declares everything grpo_jax needs at run time.

The test command installs the `test` extra and torch, which pull in packages of their
own (jinja2 comes with torch, for one), so a run-time import that setup.py forgot passes
every other test and fails only for a user who installed `pip install -e .`. Two checks:
every third-party module the package imports belongs to a distribution setup.py names,
and every module imports (and a chat template renders) in an environment that holds
only the distributions `install_requires` reaches, built here from symlinks.
"""

import ast
import collections
import importlib.metadata as metadata
import os
import pathlib
import subprocess
import sys

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = pathlib.Path(__file__).resolve().parents[1]


def _install_requires():
    """The `install_requires` list of setup.py, read without running it."""
    tree = ast.parse((REPO / "setup.py").read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.keyword) and node.arg == "install_requires":
            return [Requirement(ast.literal_eval(item)) for item in node.value.elts]
    raise AssertionError("setup.py has no install_requires")


def _imported_top_level_modules():
    """Top-level names of every absolute import in grpo_jax (functions' imports included)."""
    names = set()
    for path in (REPO / "grpo_jax").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names.add(node.module.split(".")[0])
    return names - set(sys.stdlib_module_names) - {"grpo_jax"}


def test_every_third_party_import_is_a_declared_distribution():
    declared = {canonicalize_name(r.name) for r in _install_requires()}
    owners = metadata.packages_distributions()
    missing = {}
    for module in sorted(_imported_top_level_modules()):
        dists = {canonicalize_name(d) for d in owners.get(module, [])}
        assert dists, f"grpo_jax imports {module!r}, which no installed distribution provides"
        if not dists & declared:
            missing[module] = sorted(dists)
    assert not missing, f"imported but not in setup.py's install_requires: {missing}"


def _runtime_closure():
    """Canonical names of the distributions `pip install -e .` installs (no extras)."""
    seen, todo = set(), collections.deque(_install_requires())
    while todo:
        requirement = todo.popleft()
        name = canonicalize_name(requirement.name)
        if name in seen:
            continue
        seen.add(name)
        dist = metadata.distribution(name)
        for text in dist.requires or []:
            child = Requirement(text)
            wanted = requirement.extras or {""}
            if child.marker is None or any(child.marker.evaluate({"extra": e}) for e in wanted):
                todo.append(child)
    return seen


def _link_distributions(names, site):
    """Symlinks each distribution's top-level files (and its metadata) into `site`."""
    site.mkdir()
    for name in sorted(names):
        dist = metadata.distribution(name)
        root = pathlib.Path(dist.locate_file(""))
        tops = {pathlib.PurePath(f).parts[0] for f in dist.files or []}
        for top in tops - {"..", "__pycache__"}:
            if not (site / top).exists() and (root / top).exists():
                (site / top).symlink_to(root / top)


_IN_THE_BARE_ENVIRONMENT = r"""
import importlib, importlib.util, pkgutil, sys
for absent in ("torch", "pytest", "hypothesis"):   # the environment really is bare
    assert importlib.util.find_spec(absent) is None, absent
import grpo_jax
names = [m.name for m in pkgutil.walk_packages(grpo_jax.__path__, "grpo_jax.")
         if not m.name.endswith("__main__")]
for name in names:
    importlib.import_module(name)

from grpo_jax import data, rewards
from grpo_jax.training import tokenizer as tokenizer_lib
tok = tokenizer_lib.train_char_tokenizer(["What is 2+3? <>/|:user assistant system"])
tok.chat_template = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}"
                     "{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}")
prompt = data.format_prompt({"task": "gsm8k", "question": "What is 2+3?", "answer": "5",
                             "solution": "#### 5"}, tokenizer=tok)
assert prompt.startswith("<|user|>") and prompt.endswith("<|assistant|>"), prompt
score = rewards.get_reward("gsm8k").fn("", "2+3=5 #### 5", {"answer": "5"})
assert score == 1.0, score
print(f"imported {len(names)} modules; chat template and gsm8k grader ran")
"""


@pytest.mark.slow
def test_every_module_imports_with_only_the_declared_distributions(tmp_path):
    site = tmp_path / "site-packages"
    _link_distributions(_runtime_closure(), site)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(site)])
    result = subprocess.run([sys.executable, "-S", "-c", _IN_THE_BARE_ENVIRONMENT], env=env,
                            cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "chat template and gsm8k grader ran" in result.stdout
