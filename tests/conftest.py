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

# JAX's persistent compilation cache, shared by the pytest-xdist workers and by the
# command-line runs the tests start (they inherit this environment): the suite compiles
# the same tiny models' update steps, samplers and log-prob functions in many tests and
# processes, and a program compiled once is read back from disk after that. It lives in
# the checkout (.jax_cache/, ignored by git), so a fresh clone starts cold and a re-run
# on the same checkout is warm; JAX_COMPILATION_CACHE_DIR= (empty) turns it off.
_CACHE_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                          ".jax_cache")
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", _CACHE_DIR)
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.2")
