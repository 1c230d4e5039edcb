"""Process set-up: parallel.use_cpu_cores (one XLA CPU device per core, unless a count was
already chosen) and maybe_initialize_distributed (once per process).

use_cpu_cores cases run in a fresh interpreter: the device count is fixed once JAX
starts, and the test process itself already runs on 8 forced devices (conftest.py).
"""

import os
import subprocess
import sys

import jax
import pytest

from grpo_jax.parallel import mesh as mesh_lib

PROBE = """
from grpo_jax import parallel
import jax
set_to = parallel.use_cpu_cores({max_devices})
print(set_to, jax.device_count(), parallel.use_cpu_cores())
"""


def probe(max_devices=8, xla_flags=None):
    """(what use_cpu_cores returned, the device count, what a second call returned)."""
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env["JAX_PLATFORMS"] = "cpu"
    if xla_flags is not None:
        env["XLA_FLAGS"] = xla_flags
    out = subprocess.run([sys.executable, "-c", PROBE.format(max_devices=max_devices)], env=env,
                         capture_output=True, text=True, check=True).stdout.split()
    return tuple(None if x == "None" else int(x) for x in out)


def largest_power_of_two_up_to(n):
    power = 1
    while power * 2 <= n:
        power *= 2
    return power


@pytest.mark.slow
def test_one_device_per_core_as_a_power_of_two():
    expected = largest_power_of_two_up_to(min(mesh_lib.cpu_cores(), 8))
    assert probe() == (expected, expected, None)   # a second call, after JAX started, changes nothing


@pytest.mark.slow
def test_max_devices_caps_the_count():
    assert probe(max_devices=1) == (1, 1, None)


@pytest.mark.slow
def test_a_count_in_xla_flags_wins():
    assert probe(xla_flags="--xla_force_host_platform_device_count=3") == (None, 3, None)



@pytest.mark.parametrize("already, calls", [(False, 1), (True, 0)])
def test_distributed_start_up_happens_once(monkeypatch, already, calls):
    started = []
    monkeypatch.setattr(jax.distributed, "is_initialized", lambda: already or bool(started))
    monkeypatch.setattr(jax.distributed, "initialize", lambda: started.append(1))
    assert mesh_lib.maybe_initialize_distributed(True) is True
    assert mesh_lib.maybe_initialize_distributed(True) is True   # the demo's second stage
    assert len(started) == calls


def test_distributed_start_up_is_off_by_default(monkeypatch):
    monkeypatch.delenv("GRPO_JAX_DISTRIBUTED", raising=False)
    monkeypatch.setattr(jax.distributed, "initialize", lambda: pytest.fail("started jax.distributed"))
    assert mesh_lib.maybe_initialize_distributed() is False
