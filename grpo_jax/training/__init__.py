"""Training loops: supervised warm start (sft), RL (rl) and the CPU demo pipeline (demo)."""

from grpo_jax import _extras

_extras.require("grpo_jax.training")   # before the imports it guards

