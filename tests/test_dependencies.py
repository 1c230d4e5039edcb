"""setup.py declares everything grpo_jax needs at run time, in its two layers.

`pip install grpo_jax` (install_requires) is the objectives library: jax and numpy.
`pip install "grpo_jax[train]"` adds what the trainer, models, data, rewards, sampler and
tools import. The test command installs the `test` extra and torch, which pull in
packages of their own (jinja2 comes with torch, for one), so a run-time import that
setup.py forgot passes every other test and fails only for a user. The checks: every
third-party module the package imports belongs to a distribution the core or the train
extra names, and grpo_jax.objectives imports only the core's; every module imports (and a
chat template renders) in an environment that holds only the distributions the core and
the train extra reach; and with the core alone, the objectives import and work (their
worked examples, `python -m grpo_jax.objectives`, run) while the rest fails at once with
one line naming the extra. The environments are built here from symlinks.
"""

import ast
import collections
import importlib.metadata as metadata
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = pathlib.Path(__file__).resolve().parents[1]


def _setup_keyword(name):
    """A keyword argument of setup.py's `setup()` call, read without running it."""
    tree = ast.parse((REPO / "setup.py").read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.keyword) and node.arg == name:
            return ast.literal_eval(node.value)
    raise AssertionError(f"setup.py has no {name}")


def _install_requires(*extras):
    """The core's requirements, and those of `extras`."""
    texts = list(_setup_keyword("install_requires"))
    for extra in extras:
        texts += _setup_keyword("extras_require")[extra]
    return [Requirement(text) for text in texts]


def _imported_top_level_modules(folder="grpo_jax"):
    """Top-level names of every absolute import under `folder` (functions' imports included)."""
    names = set()
    for path in (REPO / folder).rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names.add(node.module.split(".")[0])
    return names - set(sys.stdlib_module_names) - {"grpo_jax"}


def _undeclared(folder, requirements):
    """`{module: its distributions}` for the modules `folder` imports that none of
    `requirements` provides."""
    declared = {canonicalize_name(r.name) for r in requirements}
    owners = metadata.packages_distributions()
    missing = {}
    for module in sorted(_imported_top_level_modules(folder)):
        dists = {canonicalize_name(d) for d in owners.get(module, [])}
        assert dists, f"{folder} imports {module!r}, which no installed distribution provides"
        if not dists & declared:
            missing[module] = sorted(dists)
    return missing


def test_every_third_party_import_is_a_declared_distribution():
    missing = _undeclared("grpo_jax", _install_requires("train"))
    assert not missing, f"imported but in neither install_requires nor the train extra: {missing}"


def test_the_objectives_import_only_the_core():
    missing = _undeclared("grpo_jax/objectives", _install_requires())
    assert not missing, f"grpo_jax.objectives imports beyond install_requires: {missing}"


def _runtime_closure(*extras):
    """Canonical names of the distributions `pip install -e ".[extras]"` installs."""
    seen, todo = set(), collections.deque(_install_requires(*extras))
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


def _run_bare(code, distributions, tmp_path):
    """Runs `code` in a Python that sees only grpo_jax and `distributions` (symlinked)."""
    site = tmp_path / "site-packages"
    _link_distributions(distributions, site)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(site)])
    return subprocess.run([sys.executable, "-S", "-c", code], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_every_module_imports_with_only_the_declared_distributions(tmp_path):
    result = _run_bare(_IN_THE_BARE_ENVIRONMENT, _runtime_closure("train"), tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "chat template and gsm8k grader ran" in result.stdout


_WITH_THE_CORE_ALONE = r"""
import importlib.util, pkgutil
for absent in ("flax", "optax", "ml_collections", "transformers"):   # really the core alone
    assert importlib.util.find_spec(absent) is None, absent
import jax.numpy as jnp
from grpo_jax import objectives
adv = objectives.group_advantages(jnp.array([1.0, 0.0, 0.0, 0.0]), group_size=4)
print("advantages", *[float(a) for a in adv])
import runpy
runpy.run_module("grpo_jax.objectives", run_name="__main__")   # python -m grpo_jax.objectives
import grpo_jax
for m in pkgutil.iter_modules(grpo_jax.__path__, "grpo_jax."):
    if m.name in ("grpo_jax._extras", "grpo_jax.objectives", "grpo_jax.paths",
                  "grpo_jax.parallel"):   # the last: numpy alone
        continue
    try:
        importlib.import_module(m.name)
    except ImportError as error:
        assert str(error).startswith(f"{m.name} needs the 'train' extra ("), str(error)
        assert 'pip install "grpo_jax[train]"' in str(error), str(error)
    else:
        raise AssertionError(f"{m.name} imported without the train extra")
print("each part beyond the objectives names the train extra")
"""


@pytest.mark.slow
def test_the_core_alone_gives_the_objectives_and_names_the_extra_for_the_rest(tmp_path):
    result = _run_bare(_WITH_THE_CORE_ALONE, _runtime_closure(), tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    # rewards 1, 0, 0, 0: mean 0.25, population std sqrt(3)/4, eps 1e-6
    line = next(line for line in result.stdout.splitlines() if line.startswith("advantages "))
    expected = (np.array([1.0, 0, 0, 0]) - 0.25) / (np.sqrt(3) / 4 + 1e-6)
    np.testing.assert_allclose([float(x) for x in line.split()[1:]], expected, rtol=1e-6)
    assert "18,000 tokens -> -0.5" in result.stdout   # the worked examples ran to the end
    assert "each part beyond the objectives names the train extra" in result.stdout
