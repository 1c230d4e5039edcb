"""Process set-up: parallel.use_cpu_cores (one XLA CPU device per core, unless a count was
already chosen), parallel.initialize (jax.distributed, once per process), the mesh spec,
and rows moving between a process and the mesh.

use_cpu_cores cases run in a fresh interpreter: the device count is fixed once JAX
starts, and the test process itself already runs on 8 forced devices (conftest.py).
"""

import os
import pathlib
import subprocess
import sys
import types

import jax
import numpy as np
import pytest

from grpo_jax import config_lib
from grpo_jax.parallel import hosts, mesh as mesh_lib

REPO = pathlib.Path(__file__).resolve().parents[1]

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
    # a second call, after JAX started, changes nothing
    assert probe() == (expected, expected, None)


@pytest.mark.slow
def test_max_devices_caps_the_count():
    assert probe(max_devices=1) == (1, 1, None)


@pytest.mark.slow
def test_a_count_in_xla_flags_wins():
    assert probe(xla_flags="--xla_force_host_platform_device_count=3") == (None, 3, None)



def _distributed(**fields):
    config = config_lib.load_config(str(REPO / "configs" / "base.py"))
    return config_lib.apply_overrides(config.distributed, fields)


@pytest.mark.parametrize("already, calls", [(False, 1), (True, 0)])
def test_distributed_start_up_happens_once(monkeypatch, already, calls):
    started = []
    monkeypatch.setattr(jax.distributed, "is_initialized", lambda: already or bool(started))
    monkeypatch.setattr(jax.distributed, "initialize", lambda **kw: started.append(kw))
    assert hosts.initialize(_distributed(enabled=True)) is True
    assert hosts.initialize(_distributed(enabled=True)) is True   # the demo's second stage
    assert started == [{}] * calls   # nothing explicit: JAX detects the cluster


def test_explicit_addresses_start_it_and_must_come_together(monkeypatch):
    started = []
    monkeypatch.setattr(jax.distributed, "is_initialized", lambda: bool(started))
    monkeypatch.setattr(jax.distributed, "initialize", lambda **kw: started.append(kw))
    fields = dict(coordinator_address="127.0.0.1:1234", num_processes=2, process_id=1)
    assert hosts.initialize(_distributed(**fields)) is True
    assert started == [fields]
    with pytest.raises(ValueError, match=r"set distributed.process_id too"):
        hosts.initialize(_distributed(coordinator_address="h:1", num_processes=2))


def test_distributed_start_up_is_off_by_default(monkeypatch):
    monkeypatch.delenv("GRPO_JAX_DISTRIBUTED", raising=False)
    monkeypatch.setattr(
        jax.distributed, "initialize", lambda **kw: pytest.fail("started jax.distributed")
    )
    assert hosts.initialize(_distributed()) is False


@pytest.mark.parametrize("spec, axes", [
    ("data=-1,fsdp=2,tensor=1", (("data", -1), ("fsdp", 2), ("tensor", 1))),
    (" data = 8 ", (("data", 8),)),
    ((("data", -1), ("tensor", 2)), (("data", -1), ("tensor", 2))),
])
def test_mesh_spec_parses(spec, axes):
    assert mesh_lib.parse_mesh(spec) == axes


@pytest.mark.parametrize("spec", ["data:8", "data=x", "", "=4"])
def test_a_bad_mesh_spec_names_the_form(spec):
    with pytest.raises(ValueError, match="name=size|names no axis"):
        mesh_lib.parse_mesh(spec)


def test_rows_split_over_every_axis_but_tensor():
    mesh = mesh_lib.make_mesh("data=2,fsdp=2,tensor=2")
    assert mesh_lib.row_axes(mesh) == ("data", "fsdp") and mesh_lib.row_ways(mesh) == 4


def test_rows_that_divide_the_row_ways_split_and_others_are_replicated():
    mesh = mesh_lib.make_mesh("data=2,fsdp=2,tensor=2")   # 4 row ways
    assert [mesh_lib.rows_divide(rows, 4) for rows in (0, 4, 6, 8, 12, 2)] == [
        True, True, False, True, True, False]
    assert mesh_lib.rows_sharding(mesh, 8).spec == jax.P(("data", "fsdp"))
    assert mesh_lib.rows_sharding(mesh, 6).spec == jax.P()


def test_global_rows_and_local_rows_round_trip_on_one_process():
    mesh = mesh_lib.make_mesh("data=-1,tensor=1")
    rows = {"x": np.arange(32).reshape(16, 2), "y": np.arange(16) % 3 == 0}
    placed = hosts.global_rows(mesh, rows)
    assert len({s.index[0].start for s in placed["x"].addressable_shards}) == 8
    for key in rows:
        np.testing.assert_array_equal(hosts.local_rows(placed[key]), rows[key])
    odd = hosts.global_rows(mesh, {"x": np.arange(6)})["x"]   # 6 rows do not split 8 ways
    np.testing.assert_array_equal(hosts.local_rows(odd), np.arange(6))
    assert hosts.allgather_json({"a": [1, 2]}) == [{"a": [1, 2]}] and hosts.agree_max(7) == 7


def test_a_process_reads_the_rows_it_holds_from_its_own_devices():
    """`held_rows` are the rows `local_rows` reads (every row on one process); `read_rows`
    gives any of them, in the order asked, under a mesh or not; `whole_on_host` the whole."""
    mesh = mesh_lib.make_mesh("data=-1,tensor=1")
    x = hosts.global_rows(mesh, {"x": np.arange(48).reshape(16, 3)})["x"]
    np.testing.assert_array_equal(hosts.held_rows(x.sharding, 16), np.arange(16))
    with jax.set_mesh(mesh):   # as the engine reads them, inside its mesh
        np.testing.assert_array_equal(hosts.read_rows(x, [13, 2, 7]),
                                      [[39, 40, 41], [6, 7, 8], [21, 22, 23]])
    assert hosts.read_rows(x, []).shape == (0, 3)
    whole, scalar = hosts.whole_on_host((x, jax.numpy.int32(5)))
    np.testing.assert_array_equal(whole, np.arange(48).reshape(16, 3))
    assert scalar == 5


def test_auto_mesh_shards_the_weights_when_the_state_would_crowd_a_device(monkeypatch, capsys):
    """On an accelerator with 16 GiB, a 9 GiB replicated state gets the fully sharded mesh
    (and one line saying why); 8 GiB stays data parallel; CPU devices report no memory."""
    config = config_lib.load_config(str(REPO / "configs" / "base.py"))
    assert config.mesh == "auto"
    assert dict(hosts.setup_mesh(config, lambda: 9 * 2**30).shape) == {
        "data": 8, "fsdp": 1, "tensor": 1,
    }
    monkeypatch.setattr(hosts, "device_memory", lambda device: 16 * 2**30)
    assert dict(hosts.setup_mesh(config, lambda: 8 * 2**30).shape) == {
        "data": 8, "fsdp": 1, "tensor": 1,
    }
    monkeypatch.setattr(hosts, "_ANNOUNCED_MESHES", set())
    mesh = hosts.setup_mesh(config, lambda: 9 * 2**30)
    assert dict(mesh.shape) == {"data": 1, "fsdp": 8, "tensor": 1}
    assert (
        "mesh 'auto': the weights, gradients and optimizer state would take 9.0 GiB"
        in capsys.readouterr().out
    )


def test_a_rollout_mesh_takes_the_last_devices_and_the_training_mesh_the_rest():
    devices = jax.devices()
    train, sample = mesh_lib.split_devices("data=2,tensor=1", devices)
    assert train == devices[:6] and sample == devices[6:]
    assert mesh_lib.with_standard_axes("data=2") == (("data", 2), ("fsdp", 1), ("tensor", 1))
    for spec, message in [("data=8", "takes 8 of the 8 devices, leaving none to train on"),
                          ("data=-1", "give every axis a size >= 1")]:
        with pytest.raises(ValueError, match=message):
            mesh_lib.split_devices(spec, devices)


def test_a_config_with_a_rollout_mesh_gets_two_meshes_of_disjoint_devices(capsys, monkeypatch):
    monkeypatch.setattr(hosts, "_ANNOUNCED_MESHES", set())   # printed once per process
    config = config_lib.load_config(f"{REPO / 'configs' / 'dapo.py'}:runlocal=True")
    config.rollout.mesh = "data=4"
    train, sample = hosts.setup_meshes(config)
    assert dict(train.shape) == {"data": 4, "fsdp": 1, "tensor": 1} == dict(sample.shape)
    assert not set(train.devices.flat) & set(sample.devices.flat)
    out = capsys.readouterr().out
    assert "training mesh {'data': 4, 'fsdp': 1, 'tensor': 1} over 4 cpu" in out
    assert "rollout mesh {'data': 4, 'fsdp': 1, 'tensor': 1} over 4 cpu" in out
    config.rollout.mesh = ""
    one, same = hosts.setup_meshes(config)
    assert one is same and one.size == 8


def _processes(count, per_process):
    """Stand-ins for `count` processes' devices, `per_process` each, in process order."""
    return [types.SimpleNamespace(id=i, process_index=i // per_process)
            for i in range(count * per_process)]


@pytest.mark.parametrize("processes, spec, message", [
    (2, "data=2", r"rollout.mesh='data=2' takes the last 2 devices, which splits process 1's 4 "
                  r"devices between the training and the rollout mesh.*a multiple of the devices "
                  r"per process \(4\), or rollout.mesh=''"),
    (4, "data=4", r"rollout.mesh='data=4' takes 4 devices and leaves 12 to train: .*as many "
                  r"devices each.*make rollout.mesh's size 8, or rollout.mesh=''"),
    (3, "data=4", r"takes 4 devices and leaves 8 to train: .*run an even number of processes"),
])
def test_a_rollout_mesh_on_several_processes_must_take_half_of_them_whole(processes, spec, message):
    devices = _processes(processes, 4)
    with pytest.raises(ValueError, match=message):
        mesh_lib.check_process_split(spec, *mesh_lib.split_devices(spec, devices))
    train, sample = mesh_lib.split_devices("data=8", _processes(4, 4))   # processes 2, 3 sample
    mesh_lib.check_process_split("data=8", train, sample)
    assert {d.process_index for d in sample} == {2, 3}


def test_a_process_group_counts_and_gathers_among_its_processes(monkeypatch):
    """Within a role's group the data split counts its processes only (process 2 of 0..3
    is the first of the group (2, 3)); a group of one gathers nothing from the others."""
    monkeypatch.setattr(hosts.jax, "process_count", lambda: 4)
    monkeypatch.setattr(hosts.jax, "process_index", lambda: 2)
    assert (hosts.process_count(), hosts.process_index()) == (4, 2)
    with hosts.process_group([3, 2]):
        assert hosts.acting_processes() == (2, 3)
        assert (hosts.process_count(), hosts.process_index()) == (2, 0)
    with hosts.process_group([2]):
        assert hosts.allgather_json({"a": 1}) == [{"a": 1}] and hosts.agree_max(5) == 5
    assert hosts.acting_processes() == (0, 1, 2, 3)


def test_on_mesh_keeps_each_spec_where_it_divides_and_replicates_elsewhere():
    eight = mesh_lib.make_mesh("data=8,fsdp=1,tensor=1")
    three = mesh_lib.make_mesh("data=1,fsdp=1,tensor=3", devices=jax.devices()[5:])
    rows = jax.device_put(np.arange(16.0).reshape(8, 2), mesh_lib.row_sharding(eight))
    weights = jax.device_put(np.ones((4, 6)), jax.NamedSharding(eight, jax.P(None, "tensor")))
    moved = mesh_lib.on_mesh({"rows": rows, "weights": weights}, three)
    assert moved["rows"].sharding.spec == mesh_lib.row_sharding(eight).spec   # 8 rows / 1 way
    assert moved["weights"].sharding.spec == jax.P(None, "tensor")            # 6 / 3
    assert set(moved["rows"].devices()) == set(jax.devices()[5:])
    odd = jax.device_put(np.ones((4, 4)), jax.NamedSharding(eight, jax.P(None, "tensor")))
    assert mesh_lib.on_mesh(odd, three).sharding.spec == jax.P()   # 4 does not split 3 ways
    np.testing.assert_array_equal(moved["rows"], np.arange(16.0).reshape(8, 2))
