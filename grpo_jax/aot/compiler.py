"""Compiling the programs and reading the compiler's numbers: bytes per device, FLOPs, time.

Per device, a program needs its arguments, its outputs (less the donated arguments they
reuse) and its temporaries (`compiled.memory_analysis()`), plus the run's state that stays
in memory while it runs without being its argument (`Program.held`). That total is held
against the chip's HBM. XLA:TPU refuses a program that cannot fit at compile time
(`CompileTimeHbmOom`); such a program is reported with the bytes the compiler said it
needs.

The estimated time and FLOPs are XLA's cost model of the HLO it compiled, which counts a
loop body once, whatever its trip count: with scanned layers, a run of layers counts as one
layer, and the log-prob pass's pieces, the micro-batches and the log-prob chunks as one
each. Nor does it look into a Pallas kernel (splash attention), a custom call: programs
using it report their FLOPs and time without attention's (or no time at all). The bytes
are exact; the FLOPs and times are lower bounds, to compare between runs of one layout.
"""

import dataclasses
import re
import time

from grpo_jax import parallel
from grpo_jax.models.config import as_remat_policy

# HBM per device that XLA:TPU reports available (its CompileTimeHbmOom message, libtpu
# 0.0.52 and 0.0.42.1): device_kind -> bytes.
GIB = 2**30
HBM_BYTES = {
    "TPU v4": int(15.25 * GIB),        # per TensorCore device of a v4 topology
    "TPU v5 lite": int(15.75 * GIB),   # v5e
    "TPU v5": int(95.73 * GIB),        # v5p
    "TPU v6 lite": int(31.24 * GIB),   # v6e (Trillium)
}
# XLA:TPU's ways of refusing a program for memory (temporaries alone too large, or
# everything together), as libtpu 0.0.42 and 0.0.52 word them, with or without the
# "CompileTimeHbmOom" tag: "... the total memory required for HLO temporaries (47.68G)
# exceeds available HBM (15.75G)" and "... Used 15.75G of 15.75G hbm. Exceeded hbm
# capacity by 6.90M."
_SIZE = r"[\d.]+[KMGT]?"
_TEMPS = re.compile(rf"HLO temporaries \((?P<temps>{_SIZE})\)")
_TOTAL = re.compile(rf"of (?P<capacity>{_SIZE}) hbm\. Exceeded hbm capacity by (?P<over>{_SIZE})")
_UNITS = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def _bytes(text):
    """"47.68G" -> bytes (XLA's human-readable sizes are powers of 1024)."""
    return float(text.rstrip("KMGT")) * _UNITS.get(text[-1], 1)


def needed_bytes(message):
    """`(bytes, kind)` a program needs per device from XLA's out-of-memory message, kind
    "temp" (the temporaries alone) or "total" (arguments, outputs and temporaries); None
    when the message is not an out-of-memory refusal."""
    if "RESOURCE_EXHAUSTED" not in message and "CompileTimeHbmOom" not in message:
        return None
    match = _TEMPS.search(message)
    if match:
        return int(_bytes(match.group("temps"))), "temp"
    match = _TOTAL.search(message)
    if match:
        return int(_bytes(match.group("capacity")) + _bytes(match.group("over"))), "total"
    return None

PROGRAMS = ("train", "logprob", "prefill", "decode", "critic_train", "values")
# XLA:TPU's refusal (libtpu 0.0.42.1) of a program on part of a v5e slice's devices.
WHOLE_SLICE = "device assignment should include all slice devices"


@dataclasses.dataclass
class Result:
    """The compiler's numbers for one program (bytes per device; None where unknown).

    `total` = argument + output - alias + temp + held. A program the compiler refused
    for lack of memory has `oom` set (the compiler's words in `message`) and `total` = what
    it said it needs, plus the program's own state arguments (`Program.parts`) when it named
    only the temporaries, plus held: a lower bound. A program the compiler refused for any
    other reason has `failed` set, its words in `message`, and no bytes.
    """

    name: str
    shape: str
    argument: int | None
    output: int | None
    alias: int | None
    temp: int | None
    held: int
    total: int | None
    flops: float | None
    estimated_s: float | None
    compile_s: float
    oom: bool = False
    failed: bool = False
    message: str = ""
    parts: dict = dataclasses.field(default_factory=dict)
    held_state: int = 0

    def to_json(self):
        return {
            "bytes_per_device": self.total, "flops": self.flops, "estimated_s": self.estimated_s,
            "compile_s": self.compile_s, "argument_bytes": self.argument,
            "output_bytes": self.output, "alias_bytes": self.alias, "temp_bytes": self.temp,
            "held_bytes": self.held, "compiler_oom": self.oom, "compile_failed": self.failed,
            "compiler_message": self.message, "state_bytes": self.parts,
            "held_state_bytes": self.held_state, "shape": self.shape,
        }


def hbm_bytes(device):
    """HBM of one device of the topology, or None for devices without a known HBM (CPU)."""
    return HBM_BYTES.get(device.device_kind)


def _cost(compiled):
    cost = compiled.cost_analysis()
    if isinstance(cost, (list, tuple)):   # older jax: one dict per computation
        cost = cost[0] if cost else {}
    cost = cost or {}
    estimated = cost.get("optimal_seconds")
    # XLA:TPU says -1 when it cannot model a custom call (the splash kernel), and models
    # none of a Pallas kernel's own cost anyway: see the module docstring.
    return cost.get("flops"), estimated if estimated is not None and estimated >= 0 else None


def _first_line(error):
    lines = [line for line in str(error).splitlines() if line.strip()]
    return (lines[0] if lines else type(error).__name__)[:300]


def compile_program(program):
    """Compiles `program` (a `programs.Program`) and returns its `Result`; a program the
    compiler refuses, for memory or anything else, is a `Result` too, never an exception."""
    begin = time.time()
    try:
        compiled = program.lowered.compile()
    except Exception as error:   # XLA raises JaxRuntimeError, and others for other causes
        seconds, message = time.time() - begin, _first_line(error)
        needed = needed_bytes(str(error))
        if needed is None:
            return Result(program.name, program.shape, None, None, None, None, program.held,
                          None, None, None, seconds, failed=True, message=message,
                          parts=program.parts, held_state=program.held_state)
        nbytes, kind = needed
        temp = nbytes if kind == "temp" else None
        total = nbytes + (sum(program.parts.values()) if kind == "temp" else 0) + program.held
        return Result(program.name, program.shape, None, None, None, temp, program.held, total,
                      None, None, seconds, oom=True, message=message, parts=program.parts,
                      held_state=program.held_state)
    seconds = time.time() - begin
    memory = compiled.memory_analysis()
    flops, estimated = _cost(compiled)
    own = (memory.argument_size_in_bytes + memory.output_size_in_bytes
           - memory.alias_size_in_bytes + memory.temp_size_in_bytes)
    return Result(program.name, program.shape, memory.argument_size_in_bytes,
                  memory.output_size_in_bytes, memory.alias_size_in_bytes,
                  memory.temp_size_in_bytes, program.held, own + program.held, flops, estimated,
                  seconds, parts=program.parts, held_state=program.held_state)


def does_not_fit(result, hbm):
    """True when the compiler refused `result`'s program or it needs more than `hbm`."""
    return result.failed or result.oom or (hbm is not None and result.total > hbm)


# ----- advice: what to change, by cause, with the flags to add ---------------------------

def _gib(nbytes):
    return "?" if nbytes is None else f"{nbytes / GIB:.2f} GiB"


def _weights_replicated(mesh):
    """True when no mesh axis splits the weights (every axis but data is of size 1)."""
    return mesh.size > 1 and all(size == 1 for axis, size in mesh.shape.items() if axis != "data")


def _divisor_at_least(rows, smallest, ways):
    """The smallest m >= `smallest` that splits `rows` into m pieces whose rows still split
    `ways` ways, or None."""
    for m in range(max(1, smallest), rows + 1):
        if rows % m == 0 and (rows // m) % ways == 0:
            return m
    return None


SAMPLER_PROGRAMS = ("prefill", "decode")


def _shard_weights_fix(result, config, mesh):
    """Training weights and optimizer state copied on every device: shard them. (The
    sampler's own weights follow ``rollout.rules``, whole on each chip but for a tensor
    axis: `_sampler_weights_fix`.)"""
    state = result.parts.get("optimizer", 0) + result.held_state
    if result.name not in SAMPLER_PROGRAMS:
        state += result.parts.get("weights", 0)
    if not _weights_replicated(mesh) or not state:
        return None
    flags = "--config.mesh=data=1,fsdp=-1,tensor=1"
    if config.model.rules not in ("fsdp", "fsdp_tp", "fsdp_expert"):
        flags += " --config.model.rules=fsdp"
    saved = state * (1 - 1 / mesh.size)
    held = " (held while it runs)" if result.name in SAMPLER_PROGRAMS else ""
    return saved, (f"training weights and optimizer state{held} ({_gib(state)} per device) are "
                   f"replicated over the {mesh.size}-way data axis: shard them over every chip "
                   f"with `{flags}` (saves about {_gib(saved)} per device)")


def _sampler_weights_fix(result, hbm, mesh):
    """The sampling layout keeps the weights whole on each chip unless the mesh has a
    tensor axis; worth saying when they are a large share of the chip."""
    weights = result.parts.get("weights", 0)
    tensor_split = mesh.shape.get("tensor", 1) > 1
    if result.name not in SAMPLER_PROGRAMS or weights < hbm / 4 or tensor_split:
        return None
    return weights * 3 // 4, (f"the sampler's weights ({_gib(weights)}, whole on each chip in "
                              f"the sampling layout) split over a tensor axis: e.g. "
                              f"`--config.mesh=data=1,fsdp=-1,tensor=4 "
                              f"--config.model.rules=fsdp_tp` (a quarter each)")


def _activation_fixes(result, hbm, config, mesh):
    """The update's or a pass's temporaries: remat, micro-batches, splash attention."""
    if result.temp is None:
        return []
    fixes = []
    rows = (
        config.rollout.prompts_per_batch * config.objective.group_size // config.train.minibatches
    )
    micro = config.train.micro_batches
    if result.name in ("train", "critic_train") and as_remat_policy(config.model.remat) == "off":
        fixes.append((result.temp, "activations: keep one layer input per layer instead of every "
                                   "intermediate with `--config.model.remat=full`"))
    rest = result.total - result.temp
    room = hbm - rest
    if room <= 0:
        fixes.append((result.temp, f"activations ({_gib(result.temp)}): even with none, the rest "
                                   f"({_gib(rest)}) does not fit; fix that first"))
    else:
        factor = -(-result.temp // room)   # temporaries scale with the rows of one piece
        target = _divisor_at_least(rows, micro * factor, parallel.row_ways(mesh))
        pieces = "micro-batch" if result.name in ("train", "critic_train") else "log-prob piece"
        if target is None:
            fixes.append(
                (
                    result.temp,
                    f"activations ({_gib(result.temp)} of temporaries): even one "
                    f"row per chip in each {pieces} would not fit; shorten "
                    f"rollout.max_new_tokens or add chips",
                )
            )
        else:
            fixes.append((result.temp, f"activations ({_gib(result.temp)} of temporaries for one "
                                       f"{pieces}'s rows): split each minibatch into more "
                                       f"micro-batches with "
                                       f"`--config.train.micro_batches={target}` "
                                       f"(now {micro}; temporaries scale with rows, so about "
                                       f"{_gib(result.temp * micro // target)})"))
    if config.model.attention != "splash" and result.name != "decode":
        fixes.append((result.temp // 2, "attention: no [S, S] scores with "
                                        "`--config.model.attention=splash` (TPU)"))
    return fixes


def _prompts_that_split(most, config, mesh):
    """The largest P <= `most` whose P G rows split into the update's pieces and over the
    mesh's row ways (what the trainer's config check asks), or None."""
    g, pieces = config.objective.group_size, config.train.minibatches * config.train.micro_batches
    ways = parallel.row_ways(mesh)
    for p in range(most, 0, -1):
        if (p * g) % pieces == 0 and (p * g // pieces) % ways == 0:
            return p
    return None


def _cache_fixes(result, hbm, config, mesh):
    """The sampler's KV cache and temporaries grow with the rows decoded together (P G) and
    the slots per row (S + N)."""
    p, n = config.rollout.prompts_per_batch, config.rollout.max_new_tokens
    scaling = result.parts.get("cache", 0) + (result.temp or 0)
    fixed = result.total - scaling
    if fixed >= hbm or not scaling:
        return []
    share = (hbm - fixed) / scaling
    fewer = _prompts_that_split(int(p * share), config, mesh)
    fixes = []
    if fewer:
        fixes.append((scaling, f"KV cache and decode buffers ({_gib(scaling)} for {p} "
                               f"prompts x {config.objective.group_size} answers): decode "
                               f"fewer rows at once with "
                               f"`--config.rollout.prompts_per_batch={fewer}` (now {p}; the "
                               f"largest that fits and splits over the mesh)"))
    shorter = int(n * share) - 1
    if shorter >= 1:
        fixes.append((scaling, f"or a shorter budget `--config.rollout.max_new_tokens={shorter}` "
                               f"(now {n})"))
    return fixes


def advice(result, hbm, config, mesh):
    """What to change when `result` does not fit in `hbm` bytes: one line naming the
    program, by how much, and each cause with the flags that fix it (largest first)."""
    if result.failed and WHOLE_SLICE in result.message:
        return (f"{result.name} does not compile on part of the slice: this chip's "
                "compiler (limited ICI routing: v5e) assigns a program to a whole slice only, "
                "so the slice cannot be split between sampler and learner (a v5p slice can); "
                "set rollout.mesh=''")
    if result.failed:
        return (f"{result.name} does not compile, for a reason other than memory: "
                f"{result.message}. Check the config's model and sharding fields; if they are "
                "right, this is a bug to report with the command")
    over = result.total - hbm
    needs = f">= {_gib(result.total)}" if result.oom else _gib(result.total)
    head = (f"{result.name} does not fit: needs {needs} per device, {_gib(over)} over the "
            f"{_gib(hbm)} HBM. ")
    fixes = [_shard_weights_fix(result, config, mesh)]
    if result.name in SAMPLER_PROGRAMS:
        fixes += [_sampler_weights_fix(result, hbm, mesh), *_cache_fixes(result, hbm, config, mesh)]
    else:
        fixes += _activation_fixes(result, hbm, config, mesh)
    fixes = [text for _, text in sorted(filter(None, fixes), key=lambda fix: -fix[0])]
    return head + "Causes, largest first: " + "; ".join(fixes) if fixes else head + (
        "More chips, or model.rules='fsdp_tp' with a tensor axis so each chip holds less")


def format_table(results, hbm):
    """The fit report's table: one row per program, bytes per device in GiB."""
    header = ("| program | shape | argument | output | alias | temp | held | total | HBM | fits "
              "| TFLOP | est. time | compile |")
    lines = [header, "|" + "---|" * 13]
    for r in results:
        if r.failed:
            fits = "NO: does not compile"
        elif r.oom:
            fits = f"NO: needs >= {_gib(r.total)}"
        else:
            fits = "?" if hbm is None else ("yes" if r.total <= hbm else "NO")
        flops = "?" if r.flops is None else f"{r.flops / 1e12:.2f}"
        estimated = "?" if r.estimated_s is None else f"{r.estimated_s * 1e3:.1f} ms"
        total = f"> {_gib(r.total)}" if r.oom else _gib(r.total)
        lines.append(f"| {r.name} | {r.shape} | {_gib(r.argument)} | {_gib(r.output)} | "
                     f"{_gib(r.alias)} | {_gib(r.temp)} | {_gib(r.held)} | {total} | "
                     f"{_gib(hbm)} | {fits} | {flops} | {estimated} | {r.compile_s:.1f} s |")
    return "\n".join(lines)
