"""How much host memory compiling a run's programs takes, said before compiling.

XLA compiles one copy of a layer's forward, backward and optimizer code per layer it sees:
unrolled, a 36-layer model is 36 bodies; with ``model.scan_layers`` a run of identical
layers is one. The compiler's peak host memory grows with those bodies, so an unrolled
large model can take more RAM than the host has (the kernel then kills the process with
no message). The estimate is linear in the number of compiled layer bodies, fitted to
peak resident memory measured while compiling the update (the largest program) for
v5p:2x2x2 with jax 0.10.2 and libtpu 0.0.42.1 (`experiments/results/aot_host_memory.txt`):
an estimate to plan by, not a bound.
"""

import dataclasses

GIB = 2**30
# Peak resident bytes = BASE + PER_BODY x compiled layer bodies (see the module docstring).
BASE_BYTES = int(1.9 * GIB)
PER_BODY_BYTES = int(0.28 * GIB)
# Below this an estimate is not worth a line.
QUIET_BYTES = 4 * GIB


@dataclasses.dataclass(frozen=True)
class HostMemory:
    """The estimate: `bytes` of peak host memory, `available` now (None where unknown),
    and `warning`, a line to print (None when there is nothing to say)."""

    bytes: int
    bodies: int
    available: int | None
    warning: str | None

    def to_json(self):
        return {"bytes": self.bytes, "layer_bodies": self.bodies, "available_bytes": self.available}


def layer_bodies(cfg):
    """Layer bodies the compiler sees: every layer unrolled, one per run when scanned."""
    return len(cfg.layer_runs()) if cfg.scan_layers else cfg.n_layers


def available_bytes():
    """The host's available memory (Linux's MemAvailable), or None elsewhere."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def compile_memory(cfg, available=None):
    """The estimated peak host memory of compiling `cfg`'s programs (a `ModelConfig`).

    Args:
      cfg: the model config (its ``scan_layers`` and layers decide).
      available: the host's available bytes; read from /proc/meminfo when None.
    """
    bodies = layer_bodies(cfg)
    estimate = BASE_BYTES + PER_BODY_BYTES * bodies
    available = available_bytes() if available is None else available
    warning = None
    if estimate > QUIET_BYTES or (available is not None and estimate > available):
        room = "" if available is None else f" (this host has {available / GIB:.1f} GiB available)"
        layout = (f"{cfg.n_layers} unrolled layers" if not cfg.scan_layers
                  else f"{cfg.n_layers} layers in {bodies} scanned run(s)")
        warning = (f"host memory: compiling {layout} needs about {estimate / GIB:.0f} GiB of "
                   f"RAM{room}")
        if not cfg.scan_layers:
            scanned = BASE_BYTES + PER_BODY_BYTES * len(cfg.layer_runs())
            warning += (f"; --config.model.scan_layers=True compiles one body per run of "
                        f"identical layers (about {scanned / GIB:.0f} GiB, same network, same "
                        "checkpoints)")
        if available is not None and estimate > available:
            warning = "WARNING: " + warning + "; the kernel may kill the compile without a message"
    return HostMemory(estimate, bodies, available, warning)
