"""grpo_jax: GRPO-family reinforcement learning of language models in JAX."""

__version__ = "0.1.0"
