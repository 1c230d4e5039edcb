"""Meshes from configs and multi-host start-up (TPU pods, multi-GPU)."""

from grpo_jax.parallel.mesh import batch_ways
from grpo_jax.parallel.mesh import make_mesh
from grpo_jax.parallel.mesh import maybe_initialize_distributed
from grpo_jax.parallel.mesh import use_cpu_cores
