"""With the core install alone (`pip install .`: jax and numpy), the modules that build
objectives from a recipe config (grpo_jax.config_lib, the "train" extra) are not collected;
every other objectives test runs. CI runs this folder that way in a fresh virtualenv."""

import importlib.util
import pathlib
import re

HAS_TRAIN_EXTRA = importlib.util.find_spec("ml_collections") is not None

collect_ignore = [] if HAS_TRAIN_EXTRA else sorted(
    path.name for path in pathlib.Path(__file__).parent.glob("test_*.py")
    if re.search(r"^from grpo_jax import config_lib", path.read_text(), re.M))
