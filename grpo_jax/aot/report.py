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

import jax

from grpo_jax import parallel

# HBM per device that XLA:TPU reports available (its CompileTimeHbmOom message, libtpu
# 0.0.52 and 0.0.42.1): device_kind -> bytes.
GIB = 2**30
HBM_BYTES = {
    "TPU v4": int(15.25 * GIB),        # per TensorCore device of a v4 topology
    "TPU v5 lite": int(15.75 * GIB),   # v5e
    "TPU v5": int(95.73 * GIB),        # v5p
    "TPU v6 lite": int(31.24 * GIB),   # v6e (Trillium)
}
# XLA:TPU's two ways of refusing a program for memory (temporaries alone too large, or
# everything together): "... HLO temporaries (47.68G) exceeds available HBM (15.75G)" and
# "... Used 15.75G of 15.75G hbm. Exceeded hbm capacity by 6.90M."
_OOM = re.compile(r"CompileTimeHbmOom.*?(?:temporaries \((?P<temps>[\d.]+[KMGT]?)\)"
                  r"|of (?P<capacity>[\d.]+[KMGT]?) hbm\. Exceeded hbm capacity by (?P<over>[\d.]+[KMGT]?))",
                  re.S)
_UNITS = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def _bytes(text):
    """"47.68G" -> bytes (XLA's human-readable sizes are powers of 1024)."""
    return float(text.rstrip("KMGT")) * _UNITS.get(text[-1], 1)


def needed_bytes(message):
    """The bytes a program needs per device, from XLA:TPU's out-of-memory message, or None."""
    match = _OOM.search(message)
    if match is None:
        return None
    if match.group("temps"):
        return int(_bytes(match.group("temps")))
    return int(_bytes(match.group("capacity")) + _bytes(match.group("over")))

PROGRAMS = ("train", "logprob", "prefill", "decode", "critic_train", "values")


@dataclasses.dataclass
class Result:
    """The compiler's numbers for one program (bytes per device; None where unknown).

    `total` = argument + output - alias + temp + held. A program the compiler refused
    for lack of memory has `oom` set (the compiler's words in `message`) and `total` = the
    temporaries it said it needs + held: a lower bound.
    """

    name: str
    shape: str
    argument: int | None
    output: int | None
    alias: int | None
    temp: int | None
    held: int
    total: int
    flops: float | None
    estimated_s: float | None
    compile_s: float
    oom: bool = False
    message: str = ""

    def to_json(self):
        return {"bytes_per_device": self.total, "flops": self.flops, "estimated_s": self.estimated_s,
                "compile_s": self.compile_s, "argument_bytes": self.argument,
                "output_bytes": self.output, "alias_bytes": self.alias, "temp_bytes": self.temp,
                "held_bytes": self.held, "compiler_oom": self.oom, "compiler_message": self.message,
                "shape": self.shape}


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


def compile_program(program):
    """Compiles `program` (a `programs.Program`) and returns its `Result`."""
    begin = time.time()
    try:
        compiled = program.lowered.compile()
    except jax.errors.JaxRuntimeError as error:
        needed = needed_bytes(str(error))
        if needed is None:
            raise
        message = str(error).split("\n")[0][:300]
        return Result(program.name, program.shape, None, None, None, None, program.held,
                      needed + program.held, None, None, time.time() - begin, oom=True,
                      message=message)
    seconds = time.time() - begin
    memory = compiled.memory_analysis()
    flops, estimated = _cost(compiled)
    own = (memory.argument_size_in_bytes + memory.output_size_in_bytes
           - memory.alias_size_in_bytes + memory.temp_size_in_bytes)
    return Result(program.name, program.shape, memory.argument_size_in_bytes,
                  memory.output_size_in_bytes, memory.alias_size_in_bytes,
                  memory.temp_size_in_bytes, program.held, own + program.held, flops, estimated,
                  seconds)


def advice(result, hbm, config):
    """What to change when `result` does not fit in `hbm` bytes (a sentence)."""
    over = result.total - hbm
    head = f"{result.name} needs {_gib(result.total)} per device, {_gib(over)} over the {_gib(hbm)} HBM: "
    rules, tensor = config.model.rules, dict(parallel.parse_mesh(config.mesh)).get("tensor", 1)
    if result.name in ("train", "critic_train"):
        tips = []
        if config.model.remat in (False, "off"):
            tips.append("model.remat='full' (keeps one [rows, S, D] per layer)")
        tips.append(f"more train.micro_batches (now {config.train.micro_batches}) or train.minibatches")
        if result.temp is not None and result.temp < result.total / 2:
            tips.append("shard the weights and optimizer state further (more chips on the fsdp axis, "
                        "or model.rules='fsdp_tp' with a tensor axis)")
        if config.model.attention != "splash":
            tips.append("model.attention='splash' (no [S, S] scores)")
    elif result.name in ("logprob", "values"):
        tips = [f"more train.minibatches x train.micro_batches (the pass runs in that many pieces, "
                f"now {config.train.minibatches * config.train.micro_batches})"]
    else:
        tips = [f"fewer rollout.prompts_per_batch (now {config.rollout.prompts_per_batch}) or a "
                f"shorter rollout.max_new_tokens (the KV cache), or rollout.rules with a larger "
                f"tensor axis (now {tensor}) so each chip holds less of the weights"]
    if result.held > over and result.name not in ("train", "critic_train"):
        tips.append(f"{_gib(result.held)} of it is the run's state held meanwhile (weights in "
                    f"the {rules!r} layout, optimizer state, pi_ref, a critic): more chips on the fsdp axis")
    return head + "; ".join(tips)


def _gib(nbytes):
    return "?" if nbytes is None else f"{nbytes / GIB:.2f} GiB"


def format_table(results, hbm):
    """The report's table: one row per program, bytes per device in GiB."""
    header = ("| program | shape | argument | output | alias | temp | held | total | HBM | fits "
              "| TFLOP | est. time | compile |")
    lines = [header, "|" + "---|" * 13]
    for r in results:
        fits = "?" if hbm is None else ("yes" if r.total <= hbm else "NO")
        if r.oom:
            fits = "NO (compiler OOM)"
        flops = "?" if r.flops is None else f"{r.flops / 1e12:.2f}"
        estimated = "?" if r.estimated_s is None else f"{r.estimated_s * 1e3:.1f} ms"
        total = f"> {_gib(r.total)}" if r.oom else _gib(r.total)
        lines.append(f"| {r.name} | {r.shape} | {_gib(r.argument)} | {_gib(r.output)} | "
                     f"{_gib(r.alias)} | {_gib(r.temp)} | {_gib(r.held)} | {total} | "
                     f"{_gib(hbm)} | {fits} | {flops} | {estimated} | {r.compile_s:.1f} s |")
    return "\n".join(lines)
