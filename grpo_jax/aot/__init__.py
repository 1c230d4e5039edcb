"""Ahead-of-time fit report: compile a run's programs for a TPU topology without TPUs.

    python -m grpo_jax.aot --config configs/gspo.py --topology v5p:2x2x2 \\
        --config.model.name=qwen3_8b --json fit.json

With libtpu installed (``pip install -e ".[train,tpu]"``), XLA:TPU compiles for a named topology's
abstract devices (`jax.experimental.topologies`); the topology "cpu" compiles for this
host's CPU devices instead (no HBM to check against: a smoke test of the same path).
`compile_run` lowers the run's programs (`programs.build`), compiles them one at a time and
returns the per-device bytes, FLOPs and estimated times, and whether the run fits.
"""

import time

from grpo_jax import _extras

_extras.require("grpo_jax.aot")   # before the imports it guards

import jax

from grpo_jax import config_lib, parallel
from grpo_jax.aot import compiler as compiler_lib
from grpo_jax.aot import host as host_lib
from grpo_jax.aot import kv as kv_lib
from grpo_jax.aot import programs as programs_lib
from grpo_jax.aot.programs import build
from grpo_jax.aot.compiler import HBM_BYTES
from grpo_jax.aot.compiler import PROGRAMS
from grpo_jax.training import footprint


def topology_devices(topology):
    """The devices of `topology`: "cpu" (this host's CPU devices) or a TPU topology name
    such as "v5e:2x4" or "v5p:2x2x2" (abstract devices; needs libtpu)."""
    if topology == "cpu":
        return jax.devices("cpu")
    from jax.experimental import topologies
    try:
        return topologies.get_topology_desc(platform="tpu", topology_name=topology).devices
    except Exception as error:   # no libtpu, or a name libtpu does not know
        if "libtpu_lockfile" in str(error):   # libtpu admits one process per host
            raise ValueError(
                f"--topology {topology!r}: another process on this host is using libtpu (a "
                "compile or a test in progress: `pgrep -af grpo_jax`). Wait for it to end, or "
                "compile beside it with ALLOW_MULTIPLE_LIBTPU_LOAD=1 in the environment (a "
                "topology compile opens no TPU); remove /tmp/libtpu_lockfile only if no such "
                "process is left") from error
        raise ValueError(
            f"--topology {topology!r}: could not build the TPU topology ({error}). It needs "
            "libtpu (pip install -e '.[train,tpu]') and a name such as v5e:2x4, v5p:2x2x2, v6e:2x2"
        ) from error


def compiler_versions(topology):
    """`{"jax": ..., "libtpu": ...}`: the versions that decide the compiler's numbers (the
    same program can need different memory under two libtpu releases)."""
    from importlib import metadata
    versions = {"jax": jax.__version__}
    if topology != "cpu":
        try:
            versions["libtpu"] = metadata.version("libtpu")
        except metadata.PackageNotFoundError:   # libtpu-nightly, or a libtpu from elsewhere
            versions["libtpu"] = None
    return versions


def meshes(config, devices):
    """`(training mesh, rollout mesh or None, reason)` of the run on `devices`, as the
    trainer builds them (`parallel.setup_meshes`): "auto" chosen against the devices' HBM
    (`reason`: its one line, or None), and with ``rollout.mesh`` the last devices for the
    sampler's mesh."""
    spec, reason = parallel.choose_mesh(
        config.mesh, state_bytes=lambda: footprint.replicated_state_bytes(config),
        device_memory=compiler_lib.hbm_bytes(devices[0]))
    rollout_mesh = None
    if config.rollout.mesh:   # split meshes: the sampler's programs on the last devices
        devices, rollout_devices = parallel.split_devices(config.rollout.mesh, devices)
        rollout_mesh = parallel.make_mesh(parallel.with_standard_axes(config.rollout.mesh),
                                          devices=rollout_devices)
    return parallel.make_mesh(spec, devices=devices), rollout_mesh, reason


def compile_run(config, topology, *, prompt_len, programs=PROGRAMS, log=print,
                length_quantiles=(), p99_over_mean=4.0, kv_budget=None):
    """Compiles the run's `programs` for `topology`; returns the fit report as a dict.

    A program the compiler refuses (for memory or any other reason) is a row of the
    report and a line of advice, never an exception. The mesh "auto" is chosen as the
    trainer chooses it (`parallel.choose_mesh`) against the topology's HBM.

    Args:
      config: a run config (its overrides applied).
      topology: "cpu" or a TPU topology name (see `topology_devices`).
      prompt_len: S, the prompt bucket the run samples with.
      programs: which of `PROGRAMS` to compile (of those the run has: the critic's only
        with ``critic.enabled``).
      log: called with a line as each program compiles.
      length_quantiles: with ``rollout.slots`` > 0, quantiles of a lognormal length
        distribution to size the paged engine's pool at (`kv.lognormal_length`); with
        ``rollout.kv_page_size`` > 0 and ``rollout.kv_pages`` = 0, the first also sizes the
        pool of the compiled decode program (else the budget does).
      p99_over_mean: the lognormal's p99 / mean ratio.
      kv_budget: per-chip bytes for the KV cache when counting the slots that fit (None:
        the HBM less what the compiled decode program holds beside its cache).

    Returns:
      `{"topology", "devices", "device_kind", "versions", "mesh", "mesh_choice",
      "hbm_bytes_per_device", "host_memory_estimate", "fits", "programs": {name:
      Result.to_json()}, "table", "advice", "kv"}`; ``fits`` is None without a known HBM (CPU
      devices) unless a program does not compile; ``kv`` (with ``rollout.slots`` > 0, else
      None) is `kv.report`'s arithmetic.
    """
    unknown = sorted(set(programs) - set(PROGRAMS))
    if unknown:
        raise ValueError(f"unknown programs {unknown}; choose from {PROGRAMS}")
    devices = topology_devices(topology)
    hbm = compiler_lib.hbm_bytes(devices[0])
    mesh, rollout_mesh, reason = meshes(config, devices)
    if reason:
        log(reason)
    devices = list(mesh.devices.flat)
    host = host_lib.compile_memory(footprint.model_config(config))
    if host.warning:
        log(host.warning)
    r = config.rollout
    if r.slots and r.kv_page_size and not r.kv_pages and length_quantiles:
        length = kv_lib.lognormal_length(length_quantiles[0], r.max_new_tokens, p99_over_mean)
        pages = kv_lib.pool_pages(min(r.slots, r.prompts_per_batch * config.objective.group_size),
                                  length, r.max_new_tokens, r.kv_page_size)
        log(f"paged pool sized at quantile {length_quantiles[0]:g} of the lognormal lengths "
            f"(p99/mean {p99_over_mean:g}): {length} tokens a row, rollout.kv_pages={pages}")
        config = config_lib.replaced(config, {"rollout.kv_pages": pages})
    begin = time.time()
    lowered = [p for p in programs_lib.build(config, mesh, prompt_len=prompt_len,
                                             rollout_mesh=rollout_mesh) if p.name in programs]
    on = "" if rollout_mesh is None else (
        f" (the sampler's on rollout mesh {dict(rollout_mesh.shape)} of {rollout_mesh.size} more)")
    log(f"lowered {len(lowered)} programs in {time.time() - begin:.1f} s on mesh "
        f"{dict(mesh.shape)} of {len(devices)} x {devices[0].device_kind}{on}")
    results = []
    for program in lowered:
        results.append(compiler_lib.compile_program(program))
        program.lowered = None   # the lowered module can be large: drop it once compiled
        refused = " (refused)" if results[-1].oom or results[-1].failed else ""
        log(f"  {program.name}: compiled in {results[-1].compile_s:.1f} s{refused}")
    too_big = [r for r in results if compiler_lib.does_not_fit(r, hbm)]
    kv = None
    if config.rollout.slots:
        decode = next((r for r in results if r.name == "decode" and r.total is not None), None)
        if kv_budget is None and hbm is not None and decode is not None:
            kv_budget = hbm - (decode.total - decode.parts["cache"])
        kv = kv_lib.report(config, footprint.model_config(config, mesh), rollout_mesh or mesh,
                           prompt_len=prompt_len, budget=kv_budget,
                           quantiles=tuple(length_quantiles), p99_over_mean=p99_over_mean)
    return {
        "topology": topology, "devices": len(devices), "device_kind": devices[0].device_kind,
        "versions": compiler_versions(topology), "mesh": dict(mesh.shape),
        "rollout_mesh": None if rollout_mesh is None else dict(rollout_mesh.shape),
        "mesh_choice": reason, "hbm_bytes_per_device": hbm,
        "host_memory_estimate": host.to_json(),
        "fits": False if too_big else (None if hbm is None else True),
        "programs": {r.name: r.to_json() for r in results},
        "table": compiler_lib.format_table(results, hbm),
        "advice": [compiler_lib.advice(r, hbm, config, mesh) for r in too_big], "kv": kv,
    }
