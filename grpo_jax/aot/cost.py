"""A run's cost before it starts: time per step, tokens per second, chip-hours, the fit.

    python -m grpo_jax.aot --config configs/paper/dapo_qwen25_32b.py --topology v5p:4x4x4 \\
        --plan_cost [--plan_cost_topologies v5p:2x2x2,v5p:2x4x4]

For one mesh over every chip of `topology` (the synchronous loop), the split plan's
machinery (`plan.configuration`) compiles the run's programs, checks them against the HBM
and estimates one RL step from the compiler's cost model: the rollout (prefill, then one
decode step per token of the budget) plus the update (the log-prob passes and every
optimizer update). From it:

- tokens per second: the step's generated tokens, P prompts x G answers x the budget
  (the estimate decodes every row to the budget, as its longest row does), over the step;
- chip-hours: ``train.steps`` (the paper's) x seconds per step x chips / 3600;
- the smallest listed topology where the run fits: the chip family's `TOPOLOGIES` (or the
  ones given), smallest first, each compiled for memory until one fits; a topology whose
  chips cannot hold the weights, gradients and optimizer state even fully sharded
  (`footprint.replicated_state_bytes` / chips > HBM) is passed over uncompiled.

These are compiler estimates, not measurements: the cost model leaves out sampling, host
work, launch overheads and, with dynamic sampling, the extra draws (``gen_batches``), so a
real step is slower (grpo_jax/aot/plan.py says what each estimate holds).

A config whose ``model.name`` names its architecture is costed at that shape with
``model.path`` unread (the configs in configs/paper set both): the checkpoint need not be
reachable from the host that compiles.
"""

import math

from grpo_jax import aot, config_lib
from grpo_jax.aot import plan
from grpo_jax.training import footprint

# Slices of each chip family, smallest first (Cloud TPU's v5p and v5e topologies).
TOPOLOGIES = {
    "TPU v5": ("v5p:2x2x1", "v5p:2x2x2", "v5p:2x2x4", "v5p:2x4x4", "v5p:4x4x4", "v5p:4x4x8",
               "v5p:4x8x8", "v5p:8x8x8", "v5p:8x8x16"),
    "TPU v5 lite": ("v5e:2x2", "v5e:2x4", "v5e:4x4", "v5e:4x8", "v5e:8x8", "v5e:8x16",
                    "v5e:16x16"),
}


def generated_tokens(config) -> int:
    """Tokens one step generates at most: P prompts x G answers x the budget."""
    return (config.rollout.prompts_per_batch * config.objective.group_size
            * config.rollout.max_new_tokens)


def chip_hours(steps: int, step_s: float, chips: int) -> float:
    """`steps` steps of `step_s` seconds on `chips` chips, in chip-hours."""
    return steps * step_s * chips / 3600


def costed_config(config):
    """`config` with ``model.path`` cleared when ``model.name`` names its shape (module doc)."""
    if config.model.name and config.model.path:
        return config_lib.replaced(config, {"model.path": ""})
    return config


def _chips(topology: str) -> tuple[int, str]:
    """Sort key: the chips a topology name spells ("v5p:2x4x4": 32), then the name."""
    return math.prod(int(n) for n in topology.partition(":")[2].split("x")), topology


def _state_too_large(config, devices) -> bool:
    """Whether the weights, gradients and optimizer state exceed the chips' HBM even
    sharded over every chip (a lower bound on any layout's need)."""
    hbm = aot.HBM_BYTES.get(devices[0].device_kind)
    return hbm is not None and footprint.replicated_state_bytes(config) / len(devices) > hbm


def smallest_fit(config, topologies, *, prompt_len, known=None, log=print):
    """`(topology or None, [(topology, verdict), ...])`: the first of `topologies` (chips
    ascending) where every program of the run fits, and what each one tried said.
    `known`: `{topology: fits}` already compiled (the costed topology)."""
    tried = []
    for name in topologies:
        devices = aot.topology_devices(name)
        if name in (known or {}):
            fits = known[name]
        elif _state_too_large(config, devices):
            tried.append((name, "no: the state alone is over the HBM fully sharded"))
            continue
        else:
            log(f"== fit on {name}")
            try:
                fits = aot.compile_run(config, name, prompt_len=prompt_len,
                                       programs=plan.SAMPLER + plan.LEARNER, log=log)["fits"]
            except ValueError as error:   # the run cannot be laid out there (rows, mesh)
                tried.append((name, f"cannot run: {error}"))
                continue
        tried.append((name, {True: "yes", False: "no", None: "unknown"}[fits]))
        if fits:
            return name, tried
    return None, tried


def cost(config, topology, *, prompt_len, topologies=None, log=print) -> dict:
    """The run's estimated cost on `topology` (module docstring).

    Args:
      config: a run config (``rollout.mesh`` is ignored: one mesh over every chip).
      topology: a TPU topology name (`aot.topology_devices`), or "cpu" (no time model).
      prompt_len: S, the prompt bucket.
      topologies: where to look for the smallest fit (default: `topology`'s family in
        `TOPOLOGIES`; none for CPU devices).
      log: called with a line as each program compiles.

    Returns:
      `{"topology", "devices", "device_kind", "fits", "rollout_s", "update_s", "step_s",
      "generated_tokens", "tokens_per_s", "steps", "chip_hours", "smallest_fit", "tried",
      "row", "table"}`; a time, rate or chip-hours is None where the compiler gave no
      estimate.
    """
    config = costed_config(config_lib.replaced(config, {"rollout.mesh": ""}))
    plan.check_config(config)
    devices = aot.topology_devices(topology)
    kind = devices[0].device_kind
    chip = plan.CHIPS.get(kind)
    log("== one mesh over every chip")
    row = plan.configuration(config, topology, devices, prompt_len=prompt_len, bandwidth=None,
                             chip=chip, log=log)
    if "invalid" in row:
        raise ValueError(f"{topology}: {row['invalid']}")
    step_s, tokens = row["step_s"], generated_tokens(config)
    if topologies is None:
        topologies = TOPOLOGIES.get(kind, ())
    order = sorted({*topologies, topology} if topologies else (), key=_chips)
    smallest, tried = smallest_fit(config, order, prompt_len=prompt_len,
                                   known={topology: row["fits"]}, log=log)
    result = {
        "topology": topology, "devices": len(devices), "device_kind": kind,
        "fits": row["fits"], "rollout_s": row["rollout_s"], "update_s": row["update_s"],
        "step_s": step_s, "generated_tokens": tokens,
        "tokens_per_s": None if not step_s else tokens / step_s,
        "steps": config.train.steps,
        "chip_hours": None if step_s is None else chip_hours(config.train.steps, step_s,
                                                             len(devices)),
        "smallest_fit": smallest, "tried": tried,
        "row": {k: v for k, v in row.items() if k != "programs"},
    }
    result["table"] = format_cost(result)
    return result


def _number(value, spec):
    return "?" if value is None else format(value, spec)


def format_cost(result) -> str:
    """The cost as a markdown table, then the smallest fit and what was tried."""
    fits = {True: "yes", False: "NO", None: "?"}[result["fits"]]
    lines = [
        "| topology | chips | fits | rollout (s) | update (s) | step (s) | generated tokens "
        "| tokens/s | steps | chip-hours |",
        "|" + "---|" * 10,
        f"| {result['topology']} | {result['devices']} | {fits} | "
        f"{_number(result['rollout_s'], '.4g')} | {_number(result['update_s'], '.4g')} | "
        f"{_number(result['step_s'], '.4g')} | {result['generated_tokens']:,} | "
        f"{_number(result['tokens_per_s'], ',.0f')} | {result['steps']:,} | "
        f"{_number(result['chip_hours'], ',.1f')} |",
        "",
        f"smallest listed topology where it fits: {result['smallest_fit'] or 'none listed'}",
    ]
    lines += [f"- {name}: {verdict}" for name, verdict in result["tried"]]
    return "\n".join(lines)
