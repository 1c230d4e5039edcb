"""Loading experiment configs: `path/to/recipe.py:key=value,...` -> ml_collections.

Every recipe in configs/ has `get_config(arg=None)`; `arg` is the text after the
colon, parsed by `parse_arg` against the recipe's declared arguments, the same
convention as ml_collections' `config_flags` and big_vision.

A run reads its config and never writes it: each entry point works on a `frozen` copy
(an assignment raises), and a change (resolved paths, a warm start's model) is a new
config (`replaced`), printed and saved with the run (`record`).
"""

import ast
import importlib.util
import json
import os
import pathlib
import types

from grpo_jax import _extras

_extras.require("grpo_jax.config_lib")   # before the imports it guards

import ml_collections

from grpo_jax import paths, run_files


def parse_arg(arg, **defaults):
    """Parses ``"runlocal=True,model=tiny"`` into a ConfigDict over `defaults`.

    Values are read as Python literals where they parse (``True``, ``3``, ``0.5``)
    and as strings otherwise. A key not among `defaults` raises ValueError listing
    the accepted ones. A bare key (``"runlocal"``) means True.
    """
    parsed = ml_collections.ConfigDict(defaults)
    for item in filter(None, (arg or "").split(",")):
        key, _, text = item.partition("=")
        key = key.strip()
        if key not in defaults:
            raise ValueError(f"unknown config argument {key!r}; this config accepts "
                             f"{', '.join(sorted(defaults)) or 'no arguments'}")
        parsed[key] = _literal(text.strip()) if _ else True
    return parsed


def _literal(text):
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def load_module(path):
    """Imports a Python file by path (configs/ is not a package)."""
    path = pathlib.Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"config file {str(path)!r} does not exist")
    spec = importlib.util.spec_from_file_location(f"_grpo_jax_config_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load_sibling(config_file, name):
    """Imports `name`.py from the directory of `config_file` (how recipes reach base.py)."""
    return load_module(pathlib.Path(config_file).with_name(f"{name}.py"))


def load_config(spec):
    """Loads ``"configs/dapo.py:runlocal=True"`` -> the recipe's ConfigDict."""
    path, _, arg = str(spec).partition(":")
    return load_module(path).get_config(arg or None)


def apply_overrides(config, overrides):
    """Applies ``{"dotted.field": value}`` overrides to `config` in place; returns it.

    This is what a sweep entry (a recipe's `get_sweep()`) does to a fresh config from
    `get_config`; field references stay linked (overriding rollout.max_new_tokens moves
    what is tied to it). An unknown field raises KeyError naming it.
    """
    for dotted, value in overrides.items():
        *parents, leaf = dotted.split(".")
        section = config
        for name in parents:
            section = section[name]
        if leaf not in section:
            raise KeyError(f"sweep override {dotted!r} names no config field")
        section[leaf] = value
    return config


def objective_section(spec):
    """An `ObjectiveSpec` -> the nested ``objective`` ConfigDict a recipe holds.

    Fields whose value is None become typed placeholders, so a command line can still set
    them (``--config.objective.loss.dual_clip=1.5``).
    """
    from grpo_jax.objectives import _spec
    types = _spec.field_types()
    section = ml_collections.ConfigDict()
    for path, value in spec.config_items():
        *parents, leaf = path.split(".")
        node = section
        for name in parents:
            if name not in node:
                node[name] = ml_collections.ConfigDict()
            node = node[name]
        node[leaf] = ml_collections.config_dict.placeholder(types[path]) if value is None else value
    return section


def set_objective(config, objective):
    """Writes a preset's frozen hyper-parameters into ``config.objective``, in place.

    `objective` is what a `grpo_jax.objectives.presets` function returns (or its
    ``.spec``). Every field but ``group_size`` is written (the regime sets G), so the
    recipe's objective is exactly the preset's; a recipe that ties a field to another
    (e.g. ``norm_len`` to the generation budget) does it after this call.
    """
    spec = getattr(objective, "spec", objective)
    if spec.group_size != config.objective.group_size:
        raise ValueError(f"the preset was built for group_size={spec.group_size} but "
                         f"config.objective.group_size is {config.objective.group_size}; "
                         "build it with group_size=config.objective.group_size")
    for path, value in spec.config_items():
        if path != "group_size":
            *parents, leaf = path.split(".")
            node = config.objective
            for name in parents:
                node = node[name]
            node[leaf] = value
    return config


def frozen(config):
    """A read-only copy of `config`, its field references resolved; `config` is left as is.

    An `ml_collections.FrozenConfigDict`: assigning a field raises. Its lists are tuples,
    and a dict inside one (a reward's options in ``reward.specs``) is a read-only mapping
    (FrozenConfigDict holds no dict inside a tuple).
    """
    copy = _thawed(config)
    _read_only_sequences(copy)
    return ml_collections.FrozenConfigDict(copy)


def _thawed(config):
    """A writable copy of `config` (a ConfigDict or a frozen one), references resolved."""
    if isinstance(config, ml_collections.FrozenConfigDict):
        config = config.as_configdict()
    return config.copy_and_resolve_references()


def _read_only_sequences(section):
    """Makes each dict inside a list or tuple of `section` a read-only mapping, in place."""
    for key, value in section.items():
        if isinstance(value, ml_collections.ConfigDict):
            _read_only_sequences(value)
        elif isinstance(value, (list, tuple)):
            section[key] = _read_only_items(value)


def _read_only_items(items):
    return tuple(types.MappingProxyType(dict(item)) if isinstance(item, dict)
                 else _read_only_items(item) if isinstance(item, (list, tuple)) else item
                 for item in items)


# The config fields that hold paths (a run's workdir is passed beside the config).
CONFIG_PATH_FIELDS = ("model.path", "critic.path", "task.data_dir", "task.manual_dir",
                      "distill.teacher_path", "eval.suite_dir")
# The task knobs that hold paths, where the task's builder takes them (``task.knobs``).
KNOB_PATH_FIELDS = ("benchmarks_dir",)


def resolve_paths(config):
    """A read-only copy of `config` (`frozen`) with its path fields (`CONFIG_PATH_FIELDS`,
    and the `KNOB_PATH_FIELDS` that ``task.knobs`` holds) absolute (`paths.resolve`);
    `config` is left as is. What a tool that reads a run's config without its workdir (a
    sweep's look at what a run builds, the fit report) starts with; calling it again on
    resolved paths changes nothing."""
    changes = {}
    for dotted in CONFIG_PATH_FIELDS:
        section, field = dotted.split(".")
        changes[dotted] = paths.resolve(config[section][field])
    for knob in KNOB_PATH_FIELDS:
        if knob in config.task.knobs:
            changes[f"task.knobs.{knob}"] = paths.resolve(config.task.knobs[knob])
    return replaced(config, changes)


def resolve_run_paths(config, workdir):
    """Returns `(config, workdir)`: `resolve_paths(config)` and `workdir` absolute.

    Every entry point of a run (train, sft, demo, eval) calls this first, and `record`s
    the config once its set-up is done; the code after it uses the paths as they are.
    Calling it again on resolved paths changes nothing.
    """
    if not os.fspath(workdir).strip():
        raise ValueError("--workdir is empty: name the directory the run writes to (and resumes "
                         "from), e.g. --workdir=/tmp/run")
    paths.check_reachable(workdir, "--workdir")
    return resolve_paths(config), paths.resolve(workdir)


def last_rl_step(config):
    """The last step of an RL run of `config`: the critic's pre-training steps come first
    (``critic.pretrain_steps``, VAPO's value pre-training), then ``train.steps``."""
    return config.critic.pretrain_steps + config.train.steps


def replaced(config, changes):
    """A `frozen` copy of `config` with ``{"section.field": value}`` changes (as
    `apply_overrides`); `config` is left as is."""
    return frozen(apply_overrides(_thawed(config), changes))


def to_json(config, **dumps):
    """`config` as JSON text (a reward's options as objects); `dumps`: json.dumps's options."""
    return json.dumps(config.to_dict(), sort_keys=True, default=dict, **dumps)


def record(config, workdir):
    """Prints `config` (a line per section) and writes it to ``workdir/config.json``.

    Every entry point calls it once at its start, on the main process; a resumed run
    writes the file again, so it holds the config of the latest start.
    """
    path = paths.join(workdir, run_files.CONFIG)
    paths.write_whole(path, to_json(config, indent=2) + "\n")
    sections = json.loads(to_json(config))
    lines = [f"  {name}: {json.dumps(value)}" for name, value in sections.items()]
    print("\n".join([f"config ({path}):", *lines]), flush=True)
