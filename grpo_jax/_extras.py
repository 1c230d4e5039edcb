"""Which install extra a part of grpo_jax needs, checked when that part is imported.

`pip install grpo_jax` installs the objectives (`grpo_jax.objectives`: jax and numpy); the
trainer, models, data, rewards, sampler and tools need the "train" extra
(`pip install "grpo_jax[train]"`). Importing one of those without it fails at once with
one line naming the extra, not deep inside a third-party import.
"""

import importlib.util

# Every module the "train" extra brings that some part of grpo_jax imports at its top.
TRAIN_MODULES = ("flax", "optax", "orbax.checkpoint", "ml_collections", "transformers",
                 "tokenizers", "safetensors", "gguf", "tensorflow_datasets", "etils", "grain",
                 "absl", "tensorboardX", "matplotlib", "math_verify", "sympy", "reasoning_gym")


def _installed(module):
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:   # a dotted name whose parent is missing
        return False


def require(part, extra="train", modules=TRAIN_MODULES):
    """Raises ImportError naming `extra` when a module of `modules` is not installed.

    Args:
      part: what is being imported, for the message (e.g. "grpo_jax.training").
      extra: the install extra that brings `modules`.
      modules: top-level module names to look for (no import is run).
    """
    missing = [module for module in modules if not _installed(module)]
    if missing:
        raise ImportError(f"{part} needs the {extra!r} extra ({', '.join(missing)} not "
                          f"installed): pip install \"grpo_jax[{extra}]\" (or pip install -e "
                          f"\".[{extra}]\" in a checkout); grpo_jax.objectives needs only jax")
