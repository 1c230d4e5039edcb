"""The split plan: how many chips of a slice should sample and how many should learn.

    python -m grpo_jax.aot --config configs/gspo.py --topology v5p:2x2x2 --plan_splits default

For each split (r chips sample, the other t learn; `default_splits`) and for one mesh over
every chip, it compiles the run's real programs (`aot.compile_run`: scanned layers, splash
attention, as the run compiles them), checks each side against the HBM, and estimates one
RL step's time from the compiler's cost model:

- synchronous, one mesh: the rollout on every chip, then the update on every chip;
- asynchronous, split: max(rollout on r + the weights' copy to it, update on t + the
  batch's copy back) (`step_seconds`; the two meshes work at once, docs/async.md).

One step's work (`rollout_seconds`, `update_seconds`): prefill of the P prompts plus N
decode steps (N = rollout.max_new_tokens, the budget: the batch decodes until its longest
row stops), then pi_old's and pi_ref's log-prob passes (`logprob_passes`) and
epochs x minibatches optimizer updates (each over its micro-batches).

**Why not the real programs' estimates.** XLA's cost model counts a loop body once,
whatever its trip count (a scanned run of layers counts as one layer; the log-prob pieces,
the micro-batches and the LM head's chunks as one each), gives a Pallas kernel (splash
attention) no time, and adds -1 s for each custom call it cannot model (libtpu 0.0.42.1:
e.g. a `ConcatBitcast` per layer in a decode step over a data axis, the async-call pair of
a packed update), so a scanned update reports a negative time. The plan therefore
compiles, per program, variants with the first 1 and 2 layers unrolled (the run's
attention, the run's shapes; `xla_tpu_no_crash_on_oom` lets them compile whatever their
memory, which the real programs check), removes the -1 s terms from each (`modelled`:
the fewest whole seconds that lift it to its roofline floor) and takes:

- decoder layers: L x (t2 - t1) (the difference cancels everything outside the layers),
  times the loop the layers run in (micro-batches, log-prob pieces);
- prefill and decode (no loop at all when unrolled): t1 + (L - 1)(t2 - t1) whole;
- what the cost model cannot see, from FLOPs at the chip's peak (`CHIPS`; lower bounds):
  splash attention, causal (`attention_flops`: fwd + remat fwd + 2.5x for the backward in
  the update), and the LM head and log-softmax of the update and log-prob passes
  (`head_flops`), whose chunk loop the cost model counts once.

Left out: the embedding and the optimizer outside the layers (the layers' own optimizer
step is in their difference), sampling (top-p, the random draw), host work (tokenizing,
rewards, dispatch), launch overheads and host syncs between decode steps, which a real
step has. No TPU measured any of it: the numbers compare splits, they do not predict a
wall clock (docs/async.md).
"""

import dataclasses
import math

from flax import nnx

from grpo_jax import aot, config_lib, models, parallel
from grpo_jax.aot import programs as programs_lib
from grpo_jax.models import sharding as sharding_lib
from grpo_jax.training import distill, footprint, programs as training_programs

GB = 1e9


@dataclasses.dataclass(frozen=True)
class Chip:
    """Published figures of one chip (Cloud TPU's system architecture pages): bf16 peak
    FLOP/s, HBM bytes/s, and one ICI port's bytes/s in one direction (the bidirectional
    per-chip ICI bandwidth / ports / 2), the default bandwidth of the weights' copy."""

    peak_flops: float
    hbm_bandwidth: float
    link_bandwidth: float


CHIPS = {
    "TPU v5 lite": Chip(197e12, 819 * GB, 400 * GB / 4 / 2),    # v5e: 400 GB/s ICI, 4 ports
    "TPU v5": Chip(459e12, 2765 * GB, 1200 * GB / 6 / 2),       # v5p: 1,200 GB/s ICI, 6 ports
}
SAMPLER = ("prefill", "decode")
LEARNER = ("train", "logprob")
NO_OOM = {"xla_tpu_no_crash_on_oom": True}   # time variants: compile whatever their memory


def default_splits(devices):
    """Rollout chip counts to try on `devices` chips: a quarter, half and three quarters
    (one for two chips)."""
    return sorted({max(1, devices * k // 4) for k in (1, 2, 3)} - {devices})


def extrapolate(t1, t2, layers):
    """t(L) = t1 + (L - 1)(t2 - t1): a program's value at `layers` layers from its 1- and
    2-layer variants (linear in the layers: each adds the same body)."""
    return t1 + (layers - 1) * (t2 - t1)


def attention_flops(tokens, cfg):
    """FLOPs of one causal attention forward over a sequence of `tokens`, one layer:
    Q K^T and P V, 2 x 2 H D T^2 / 2 (a causal kernel skips the masked half)."""
    return 2 * cfg.n_heads * cfg.head_dim * tokens ** 2


def head_flops(tokens, cfg):
    """FLOPs of the LM head's forward over `tokens` positions: 2 T D V."""
    return 2 * tokens * cfg.d_model * cfg.vocab_size


def rollout_seconds(prefill_s, decode_s, new_tokens):
    """One rollout: prefill, then `new_tokens` decode steps."""
    return prefill_s + new_tokens * decode_s


def update_seconds(train_s, logprob_s, *, updates, logprob_passes):
    """The learner's share of a step: `logprob_passes` log-prob passes over the batch and
    `updates` optimizer updates (each `train_s`, its micro-batches included)."""
    return logprob_passes * logprob_s + updates * train_s


def step_seconds(rollout_s, update_s, *, weights_s=0.0, batch_s=0.0, split):
    """One RL step: synchronous on one mesh (`split` False) rollout + update; split and
    asynchronous, the slower of the sampler (its weights' copy, then the rollout) and the
    learner (the update, then the batch's copy back)."""
    if not split:
        return rollout_s + update_s
    return max(rollout_s + weights_s, update_s + batch_s)


def logprob_passes(config):
    """Log-prob passes over the batch a step runs: pi_old recomputed, pi_ref (kl.beta > 0),
    the distillation teacher's (``distill.teacher_path``; timed as the policy's)."""
    return (int(config.train.old_logp == "recompute") + int(config.objective.kl.beta > 0)
            + int(distill.enabled(config)))


def rollout_spec(template, chips):
    """The rollout mesh of `chips` chips from ``rollout.mesh`` (name=size pairs, one size
    may be -1: "data=-1,tensor=4"; "" is "data=-1")."""
    axes = parallel.parse_mesh(template or "data=-1")
    known = math.prod(size for _, size in axes if size != -1)
    if chips % known or (-1 not in dict(axes).values() and known != chips):
        raise ValueError(f"rollout.mesh {template!r} does not make a mesh of {chips} chips; "
                         "give one axis -1 and fixed sizes that divide every split")
    return ",".join(f"{name}={chips // known if size == -1 else size}" for name, size in axes)


def check_config(config):
    """Raises ValueError naming the field for runs the plan does not model."""
    if config.critic.enabled:
        raise ValueError("the split plan does not model the critic's programs yet "
                         "(critic.enabled); the fit report (without --plan_splits) checks them")
    if config.rollout.slots:
        raise ValueError("the split plan models the static batch's N decode steps; set "
                         "rollout.slots=0 (continuous batching decodes a different number)")


def _check_sampler_rows(config, rollout_mesh):
    ways, p = parallel.row_ways(rollout_mesh), config.rollout.prompts_per_batch
    if p % ways:
        raise ValueError(f"the {p} prompts do not split over the {ways} row ways of rollout mesh "
                         f"{dict(rollout_mesh.shape)} (the sampler would copy them to every "
                         "chip); change rollout.prompts_per_batch or the split")


def modelled(seconds, flops, nbytes, chip):
    """The cost model's estimate without its -1 s terms: `seconds` plus the fewest whole
    seconds k >= 0 that bring it to at least the roofline floor max(flops / peak, bytes /
    HBM bandwidth), which no per-operation sum can be under. Exact while the estimate is
    less than a second above its floor (the 1- and 2-layer variants); `seconds` as it is
    without a `chip`."""
    if chip is None:
        return seconds
    floor = max(flops / chip.peak_flops, nbytes / chip.hbm_bandwidth)
    return seconds + max(0, math.ceil(floor - seconds - 1e-9 * (1 + floor)))


def _estimate(program, options, chip):
    """`(seconds, bytes accessed)` of a time variant (`modelled`), None if it does not
    compile or its cost model gives no time."""
    try:
        compiled = program.lowered.compile(compiler_options=options)
    except Exception:   # XLA raises JaxRuntimeError, and others; no time for this variant
        return None
    cost = compiled.cost_analysis()
    cost = (cost[0] if isinstance(cost, (list, tuple)) else cost) or {}
    seconds, flops, nbytes = (cost.get(k) for k in ("optimal_seconds", "flops", "bytes accessed"))
    if seconds is None or flops is None or nbytes is None:
        return None
    return modelled(seconds, flops, nbytes, chip), nbytes


def variant_estimates(config, mesh, rollout_mesh, *, prompt_len, chip, log=print):
    """`{program: [(seconds, bytes) or None at 1 layer, ... at 2 layers]}`: the run's
    programs with their first 1 and 2 layers unrolled (`programs.build(layers=...)`)."""
    variant = config_lib.replaced(config, {"model.scan_layers": False})
    tpu = mesh.devices.flat[0].platform == "tpu"
    estimates = {}
    for layers in (1, 2):
        for program in programs_lib.build(variant, mesh, prompt_len=prompt_len,
                                          rollout_mesh=rollout_mesh, layers=layers):
            estimates.setdefault(program.name, []).append(
                _estimate(program, NO_OOM if tpu else None, chip))
            program.lowered = None
        log(f"  time variants at {layers} layer(s) compiled")
    return estimates


def program_seconds(config, cfg, estimates, meshes, *, prompt_len, chip):
    """`{program: seconds of one call at the run's shape}` (None where unknown) from the
    1- and 2-layer `estimates`, with what the cost model cannot see added at the chip's
    peak (module docstring). `meshes`: each program's mesh; `cfg`: the model config."""
    layers, packed = cfg.n_layers, training_programs.packs(config)
    p, g = config.rollout.prompts_per_batch, config.objective.group_size
    s, n = prompt_len, config.rollout.max_new_tokens
    width = s + n - 1 if packed else s + n   # the update's rows: every one full (its largest plan)
    splash = cfg.attention_impl == "splash"
    recompute = config.model.remat != "off"
    minibatch_rows = p * g // config.train.minibatches
    kernel = {   # FLOPs the cost model does not count: splash attention, the LM head's chunks
        "train": minibatch_rows * (splash * layers * (3.5 + recompute) * attention_flops(width, cfg)
                                   + 4 * head_flops(width if packed else n, cfg)),
        "logprob": p * g * (splash * layers * attention_flops(width, cfg)
                            + head_flops(width if packed else n, cfg)),
        "prefill": p * splash * layers * attention_flops(s, cfg),
        "decode": 0,
    }
    loops = {"train": config.train.micro_batches,
             "logprob": config.train.minibatches * config.train.micro_batches}
    seconds = {}
    for name, (one, two) in estimates.items():
        if name not in kernel or one is None or two is None or (kernel[name] and chip is None):
            seconds[name] = None
            continue
        if name in loops:   # layers only: the rest is counted once per loop, or -1 s
            body = layers * (two[0] - one[0]) * loops[name]
        else:
            body = extrapolate(one[0], two[0], layers)
        added = kernel[name] / (meshes[name].size * chip.peak_flops) if kernel[name] else 0.0
        seconds[name] = body + added if body >= 0 else None
    return seconds


def copy_bytes(config, cfg, mesh, rollout_mesh, prompt_len):
    """`(weights, batch)`: per-chip bytes a split step copies, the trained part of the
    sampler's weights into each rollout chip (a LoRA run's adapters: its base is copied
    once) and the batch into each training chip."""
    graphdef, state = models.abstract_model(cfg)
    shardings = sharding_lib.state_shardings(state, rollout_mesh, config.rollout.rules)
    params = models.quantize_base(programs_lib.abstract(state, shardings), cfg.lora)
    trained = nnx.filter_state(params, training_programs.trained_filter(config))
    rows = programs_lib.batch_rows(config, cfg, mesh, prompt_len)
    return programs_lib.device_bytes(trained), programs_lib.device_bytes(rows)


def _side(programs, names, hbm):
    """`(GiB text of the side's largest program, fits)` (fits None without an HBM)."""
    side = [programs[n] for n in names if n in programs]
    refused = [r for r in side if r["compile_failed"] or r["compiler_oom"]]
    if any(r["compile_failed"] for r in side):
        return "fails", False
    largest = max(side, key=lambda r: r["bytes_per_device"])
    text = f"{'> ' if refused else ''}{largest['bytes_per_device'] / 2**30:.1f}"
    if hbm is None:
        return text, None
    return text, not refused and all(r["bytes_per_device"] <= hbm for r in side)


def configuration(config, topology, devices, *, prompt_len, bandwidth, chip, log=print):
    """One row of the plan: `config` (its ``rollout.mesh`` "" for one mesh, or a split)
    compiled for `devices`; its memory, fit and step time. A split the run cannot take
    (rows or weights that do not divide over a side) is a row with ``invalid``."""
    split = bool(config.rollout.mesh)
    try:
        mesh, rollout_mesh, _ = aot.meshes(config, devices)
        if split:
            _check_sampler_rows(config, rollout_mesh)
        result = aot.compile_run(config, topology, prompt_len=prompt_len,
                                 programs=SAMPLER + LEARNER, log=log)
    except ValueError as error:   # the split cannot run this config: said, not raised
        chips = (math.prod(size for _, size in parallel.parse_mesh(config.rollout.mesh))
                 if split else len(devices))
        return {"rollout_chips": chips, "split": split, "invalid": str(error)}
    sampler_mesh = rollout_mesh if split else mesh
    row = {"split": split, "rollout_chips": sampler_mesh.size, "train_chips": mesh.size,
           "rollout_mesh": dict(sampler_mesh.shape), "train_mesh": dict(mesh.shape),
           "hbm_bytes_per_device": result["hbm_bytes_per_device"], "programs": result["programs"],
           "advice": result["advice"], "versions": result["versions"]}
    hbm = result["hbm_bytes_per_device"]
    (row["rollout_gib"], rollout_fits), (row["train_gib"], train_fits) = (
        _side(result["programs"], SAMPLER, hbm), _side(result["programs"], LEARNER, hbm))
    row["fits"] = None if None in (rollout_fits, train_fits) else rollout_fits and train_fits
    cfg = footprint.model_config(config, mesh)
    seconds = dict.fromkeys(SAMPLER + LEARNER)
    if chip is not None:   # else no time model (CPU devices): no variants to compile
        estimates = variant_estimates(config, mesh, rollout_mesh, prompt_len=prompt_len,
                                      chip=chip, log=log)
        meshes = {"train": mesh, "logprob": mesh, "prefill": sampler_mesh, "decode": sampler_mesh}
        seconds = program_seconds(config, cfg, estimates, meshes, prompt_len=prompt_len, chip=chip)
        if None not in estimates["decode"]:
            row["decode_bytes"] = extrapolate(estimates["decode"][0][1],
                                              estimates["decode"][1][1], cfg.n_layers)
    row["seconds"] = seconds
    weights, batch = copy_bytes(config, cfg, mesh, sampler_mesh, prompt_len) if split else (0, 0)
    row["copy_bytes"] = {"weights": weights, "batch": batch}
    row["rollout_s"] = row["update_s"] = row["step_s"] = None
    if None not in (seconds["prefill"], seconds["decode"]):
        row["rollout_s"] = rollout_seconds(seconds["prefill"], seconds["decode"],
                                           config.rollout.max_new_tokens)
    if None not in (seconds["train"], seconds["logprob"]):
        row["update_s"] = update_seconds(seconds["train"], seconds["logprob"],
                                         updates=training_programs.updates_per_step(config),
                                         logprob_passes=logprob_passes(config))
    row["weights_s"] = weights / bandwidth if split else 0.0
    row["batch_s"] = batch / bandwidth if split else 0.0
    if row["rollout_s"] is not None and row["update_s"] is not None:
        row["step_s"] = step_seconds(row["rollout_s"], row["update_s"], weights_s=row["weights_s"],
                                     batch_s=row["batch_s"], split=split)
    return row


def plan(config, topology, *, prompt_len, splits=None, bandwidth=None, log=print):
    """The split plan of `config` on `topology`: one mesh, then each split.

    Args:
      config: a run config; its ``mesh`` is the training mesh of every row (one size -1:
        it takes the learner's chips), its ``rollout.mesh`` the sampler's ("" = "data=-1";
        one size -1: it takes the split's rollout chips).
      topology: a TPU topology name (`aot.topology_devices`).
      prompt_len: S, the prompt bucket.
      splits: rollout chip counts (default `default_splits`).
      bandwidth: bytes/s into one chip for the per-step copies (default the chip's
        `Chip.link_bandwidth`).
      log: called with a line as each program compiles.

    Returns:
      `{"topology", "devices", "device_kind", "chip", "bandwidth", "rows": [...], "best",
      "table"}`; ``best`` is the index of the fastest row that fits (None if none does).
    """
    check_config(config)
    devices = aot.topology_devices(topology)
    chip = CHIPS.get(devices[0].device_kind)
    bandwidth = bandwidth or (chip.link_bandwidth if chip else None)
    if bandwidth is None:
        raise ValueError(f"no default copy bandwidth for {devices[0].device_kind!r} devices "
                         f"(known: {sorted(CHIPS)}); pass --plan_bandwidth in GB/s")
    splits = default_splits(len(devices)) if splits is None else list(splits)
    bad = [r for r in splits if not 0 < r < len(devices)]
    if bad:
        raise ValueError(f"--plan_splits {bad}: a split's rollout chips must be between 1 and "
                         f"{len(devices) - 1} of the {len(devices)} devices")
    rows = []
    for chips in [None, *splits]:
        spec = "" if chips is None else rollout_spec(config.rollout.mesh, chips)
        log(f"== {'one mesh' if chips is None else f'split: rollout.mesh={spec}'}")
        rows.append(configuration(config_lib.replaced(config, {"rollout.mesh": spec}), topology,
                                  devices, prompt_len=prompt_len, bandwidth=bandwidth, chip=chip,
                                  log=log))
    result = {"topology": topology, "devices": len(devices),
              "device_kind": devices[0].device_kind,
              "chip": None if chip is None else dataclasses.asdict(chip), "bandwidth": bandwidth,
              "rows": rows, "best": best_row(rows)}
    result["table"] = format_plan(result, config.rollout.max_new_tokens)
    return result


def best_row(rows):
    """Index of the fastest row that fits (fits True, a step time), or None."""
    timed = [(row["step_s"], i) for i, row in enumerate(rows)
             if row.get("fits") and row.get("step_s") is not None]
    return min(timed)[1] if timed else None


def _s(seconds):
    return "?" if seconds is None else f"{seconds:.3g}"


def format_plan(result, new_tokens):
    """The plan's markdown table, then one line per row on the decode step's estimate
    against its bytes at the HBM's bandwidth."""
    lines = ["| rollout + train chips | rollout mesh | train mesh | rollout GiB | train GiB | fits "
             "| rollout (s) | update (s) | copies (s) | step (s) | vs one mesh |",
             "|" + "---|" * 11]
    one_mesh = result["rows"][0].get("step_s")
    for i, row in enumerate(result["rows"]):
        chips = (f"{row['rollout_chips']} + {result['devices'] - row['rollout_chips']}"
                 if row["split"] else f"{result['devices']}, one mesh (sync)")
        if "invalid" in row:
            lines.append(f"| {chips} | cannot run: {row['invalid']} | | | | | | | | | |")
            continue
        fits = {True: "yes", False: "NO", None: "?"}[row["fits"]]
        mark = " **best**" if i == result["best"] else ""
        ratio = ("-" if not row["split"] else "?" if None in (one_mesh, row["step_s"])
                 else f"{one_mesh / row['step_s']:.2f}x")
        copies = f"{row['weights_s']:.2f} + {row['batch_s']:.3f}" if row["split"] else "-"
        mesh = lambda shape: ",".join(f"{k}={v}" for k, v in shape.items() if v > 1) or "1 chip"
        lines.append(f"| {chips} | {mesh(row['rollout_mesh'])} | {mesh(row['train_mesh'])} | "
                     f"{row['rollout_gib']} | {row['train_gib']} | {fits} | "
                     f"{_s(row['rollout_s'])} | "
                     f"{_s(row['update_s'])} | {copies} | {_s(row['step_s'])}{mark} | {ratio} |")
    chip = result["chip"]
    for row in result["rows"]:
        decode, nbytes = row.get("seconds", {}).get("decode"), row.get("decode_bytes")
        if chip and decode is not None and nbytes is not None:
            lines.append(f"- decode step on {row['rollout_chips']} chip(s): {decode * 1e3:.2f} ms "
                         f"estimated; {nbytes / 1e9:.2f} GB accessed per chip / "
                         f"{chip['hbm_bandwidth'] / 1e9:.0f} GB/s = "
                         f"{nbytes / chip['hbm_bandwidth'] * 1e3:.2f} ms; x {new_tokens} steps")
    return "\n".join(lines)
