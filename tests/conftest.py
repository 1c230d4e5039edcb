"""Test session setup: 8 CPU devices so sharding runs on a real mesh.

XLA reads XLA_FLAGS once, when jax first initialises its backend, so this has to
happen before any test module imports jax.
"""

import os

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# libtpu admits one process per host unless told otherwise; the AOT tests compile for TPU
# topologies (no TPU used) in the test process and in the CLI processes it starts.
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
