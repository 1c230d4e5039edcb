"""The fit report (and the split plan) from the command line.

    python -m grpo_jax.aot --config configs/gspo.py --topology v5p:2x2x2 \\
        [--config.field=value ...] [--prompt_len 1024] [--json FILE]
        [--plan_splits default|2,4,6 [--plan_bandwidth GB/s]] [--plan_cost]
        [--length_quantile 0.5,0.9 [--length_p99_over_mean 4] [--kv_budget_gib G]]

Prints one table row per program (per-device argument, output, aliased, temporary, held
and total bytes against the chip's HBM, TFLOPs, the compiler's estimated time, compile
time), whether the run fits and, if not, what to change. Exits 0 when the run fits (or
cannot be checked: CPU devices), 1 when a program does not fit or does not compile (the
report and its advice printed all the same), and 1 with one line on bad input. With
``rollout.slots`` > 0 it then prints the decode KV table (`grpo_jax.aot.kv`): KV bytes per
chip and the slots that fit, contiguous vs paged.

With ``--plan_splits`` it prints the split plan instead (`grpo_jax.aot.plan`): for one mesh
and for each split of the chips between the sampler and the learner, what each side needs
against the HBM and the estimated step time, synchronous on one mesh and asynchronous
split, the fastest that fits marked; exit 1 when nothing fits.

With ``--plan_cost`` it prints the run's estimated cost instead (`grpo_jax.aot.cost`):
seconds per step, tokens per second, ``train.steps`` and chip-hours on the topology, and the
smallest listed topology where the run fits; exit 1 when it does not fit the topology.
"""

import json
import os
import sys

from absl import app, flags
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file("config", None, "Run config: path/to/config.py[:args].")
_TOPOLOGY = flags.DEFINE_string(
    "topology", None, "TPU topology (v5e:2x4, v5p:2x2x2, ...) or 'cpu'."
)
_PROMPT_LEN = flags.DEFINE_integer("prompt_len", 1024, "S, the prompt bucket the rollouts use.")
_PROGRAMS = flags.DEFINE_list(
    "programs", None,
    "Programs to compile (default: all the run has: "
    "train, logprob, prefill, decode; critic_train, values with a critic).",
)
_JSON = flags.DEFINE_string("json", None, "Also write the report as JSON to this file.")
_PLAN = flags.DEFINE_list("plan_splits", None, "The split plan instead of the report: rollout "
                          "chip counts to try (e.g. 2,4,6), or 'default' (a quarter, half and "
                          "three quarters of the chips).")
_BANDWIDTH = flags.DEFINE_float("plan_bandwidth", None, "GB/s into one chip for the split plan's "
                                "per-step copies (default: one ICI port of the chip, one way).")
_COST = flags.DEFINE_bool("plan_cost", False, "The run's estimated cost instead of the report: "
                          "seconds per step, tokens per second, train.steps and chip-hours on "
                          "--topology, and the smallest listed topology where it fits "
                          "(grpo_jax/aot/cost.py).")
_COST_TOPOLOGIES = flags.DEFINE_list("plan_cost_topologies", None, "With --plan_cost: the "
                                     "topologies to find the smallest fit among (default: "
                                     "the chip family's list in grpo_jax/aot/cost.py).")
_QUANTILES = flags.DEFINE_list(
    "length_quantile", [], "With rollout.slots > 0: quantiles (e.g. 0.5,0.9) of a lognormal "
    "completion-length distribution (p99 at rollout.max_new_tokens, p99/mean "
    "--length_p99_over_mean) to size the paged KV pool at in the KV table; with "
    "rollout.kv_page_size > 0 and rollout.kv_pages=0 the first also sizes the compiled decode "
    "program's pool (grpo_jax/aot/kv.py).")
_P99_OVER_MEAN = flags.DEFINE_float("length_p99_over_mean", 4.0, "The lognormal length "
                                    "distribution's p99 / mean (--length_quantile).")
_KV_BUDGET = flags.DEFINE_float("kv_budget_gib", None, "Per-chip GiB for the KV cache when "
                                "counting the slots that fit (default: the HBM less what the "
                                "compiled decode program holds beside its cache).")
flags.mark_flags_as_required(["config", "topology"])


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments {argv[1:]}")
    from grpo_jax import aot, config_lib   # jax starts here, after flag parsing
    config = config_lib.resolve_paths(_CONFIG.value)   # as a run does first
    if _COST.value:
        return _cost(config)
    if _PLAN.value is not None:
        return _plan(config)
    try:
        quantiles = [float(q) for q in _QUANTILES.value]
    except ValueError:
        sys.exit(f"error: --length_quantile {','.join(_QUANTILES.value)}: give numbers in (0, 1)")
    budget = None if _KV_BUDGET.value is None else int(_KV_BUDGET.value * 2**30)
    try:
        result = aot.compile_run(config, _TOPOLOGY.value, prompt_len=_PROMPT_LEN.value,
                                 programs=tuple(_PROGRAMS.value or aot.PROGRAMS),
                                 length_quantiles=quantiles,
                                 p99_over_mean=_P99_OVER_MEAN.value, kv_budget=budget)
    except ValueError as error:   # bad input: the message names the flag or field and the fix
        sys.exit(f"error: {error}")
    versions = ", ".join(f"{name} {version}" for name, version in result["versions"].items())
    print(f"\n{result['topology']}: {result['devices']} x {result['device_kind']}, "
          f"mesh {result['mesh']} ({versions})\n")
    print(result["table"])
    print("\nTFLOP and est. time: XLA's cost model, which counts a loop body (a scanned run of "
          "layers, a micro-batch, a log-prob piece) once: lower bounds.")
    if result["fits"] is None:
        print("\nfits: unknown (no HBM size for these devices)")
    else:
        print(f"\nfits: {'yes' if result['fits'] else 'NO'}")
    for line in result["advice"]:
        print(f"- {line}")
    if result["kv"] is not None:
        print(f"\nDecode KV cache, contiguous vs paged ({config.rollout.slots} slots):\n")
        print(result["kv"]["table"])
    _write_json(result)
    if result["fits"] is False:
        sys.exit(1)


def _plan(config):
    from grpo_jax.aot import plan
    splits = None if _PLAN.value == ["default"] else _PLAN.value
    try:
        if splits and not all(chips.isdigit() for chips in splits):
            raise ValueError(f"--plan_splits {','.join(splits)}: give rollout chip counts "
                             "(e.g. 2,4,6) or 'default'")
        splits = splits and [int(chips) for chips in splits]
        bandwidth = _BANDWIDTH.value and _BANDWIDTH.value * 1e9
        result = plan.plan(config, _TOPOLOGY.value, prompt_len=_PROMPT_LEN.value,
                           splits=splits, bandwidth=bandwidth)
    except ValueError as error:   # bad input: the message names the flag or field and the fix
        sys.exit(f"error: {error}")
    print(f"\n{result['topology']}: {result['devices']} x {result['device_kind']}; copies at "
          f"{result['bandwidth'] / 1e9:.0f} GB/s into a chip\n")
    print(result["table"])
    print("\nStep times: the compiler's cost model from 1- and 2-layer variants, plus splash "
          "attention and the LM head at the chip's peak FLOP/s (grpo_jax/aot/plan.py): "
          "estimates to compare splits, not measurements.")
    for row in result["rows"]:
        for line in row.get("advice", []):
            print(f"- {row['rollout_chips']} rollout chip(s): {line}")
    _write_json(result)
    if result["best"] is None:
        sys.exit(1)


def _cost(config):
    from grpo_jax.aot import cost
    try:
        result = cost.cost(config, _TOPOLOGY.value, prompt_len=_PROMPT_LEN.value,
                           topologies=_COST_TOPOLOGIES.value)
    except ValueError as error:   # bad input: the message names the flag or field and the fix
        sys.exit(f"error: {error}")
    print(f"\n{result['topology']}: {result['devices']} x {result['device_kind']}, one mesh "
          f"(synchronous); {result['steps']:,} steps (train.steps)\n")
    print(result["table"])
    print("\nCompiler estimates, not measurements (grpo_jax/aot/cost.py): XLA's cost model of "
          "one step (rollout to the full budget, then the update); sampling, host work and "
          "extra dynamic-sampling draws are left out. chip-hours = steps x step (s) x chips / "
          "3600.")
    _write_json(result)
    if result["fits"] is False:
        sys.exit(1)


def _write_json(result):
    """`result` but its printed table, as JSON to the ``--json`` file when given."""
    if _JSON.value:
        os.makedirs(os.path.dirname(os.path.abspath(_JSON.value)), exist_ok=True)
        with open(_JSON.value, "w") as f:
            json.dump({k: v for k, v in result.items() if k != "table"}, f, indent=2)


if __name__ == "__main__":
    app.run(main)
