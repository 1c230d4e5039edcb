"""Meshes from configs, how rows split over them, multi-process start-up (TPU pods, multi-GPU),
and arrays between the processes of split meshes (`transfer`)."""

from grpo_jax.parallel.hosts import agree_max
from grpo_jax.parallel.hosts import allgather_json
from grpo_jax.parallel.hosts import device_memory
from grpo_jax.parallel.hosts import enable_transfers
from grpo_jax.parallel.hosts import global_rows
from grpo_jax.parallel.hosts import held_rows
from grpo_jax.parallel.hosts import initialize
from grpo_jax.parallel.hosts import is_main
from grpo_jax.parallel.hosts import local_rows
from grpo_jax.parallel.hosts import mesh_processes
from grpo_jax.parallel.hosts import process_count
from grpo_jax.parallel.hosts import process_group
from grpo_jax.parallel.hosts import process_index
from grpo_jax.parallel.hosts import read_rows
from grpo_jax.parallel.hosts import setup_mesh
from grpo_jax.parallel.hosts import setup_meshes
from grpo_jax.parallel.hosts import sync
from grpo_jax.parallel.hosts import whole_on_host
from grpo_jax.parallel.mesh import AUTO
from grpo_jax.parallel.mesh import DATA_PARALLEL
from grpo_jax.parallel.mesh import FULLY_SHARDED
from grpo_jax.parallel.mesh import check_process_split
from grpo_jax.parallel.mesh import choose_mesh
from grpo_jax.parallel.mesh import make_mesh
from grpo_jax.parallel.mesh import on_mesh
from grpo_jax.parallel.mesh import parse_mesh
from grpo_jax.parallel.mesh import row_axes
from grpo_jax.parallel.mesh import row_sharding
from grpo_jax.parallel.mesh import row_ways
from grpo_jax.parallel.mesh import rows_sharding
from grpo_jax.parallel.mesh import sharding_on
from grpo_jax.parallel.mesh import split_devices
from grpo_jax.parallel.mesh import tree_shardings
from grpo_jax.parallel.mesh import with_standard_axes
from grpo_jax.parallel.mesh import use_cpu_cores
