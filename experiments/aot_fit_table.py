"""The README's fit table: `grpo_jax.aot` reports for Qwen3 models on TPU topologies.

    /work/venvs/tpu/bin/python experiments/aot_fit_table.py --out experiments/results/aot

Each cell (model x recipe x rule set x topology) is one `grpo_jax.aot.report`, run in its
own process, one at a time (a compile of qwen3_8b's update takes minutes and gigabytes),
written to OUT/CELL.json; finished cells are skipped on a re-run. The table and the
command of every cell go to experiments/results/aot_fit_table.md.

Regime (the same for every cell): G = 16 answers to each of P = (number of chips) prompts,
so 16 rows per chip; prompt 1,024 + completion 7,168 = 8,192 tokens; bf16 weights, compute
and AdamW moments; remat "full"; splash attention; scanned layers; the recipe's minibatches
(GRPO 16, GSPO 4), one micro-batch. The sampler's programs do not depend on the recipe
(same P, G, lengths, mesh and sampling rules): they are compiled once, with GSPO, and
GRPO's rows add what GRPO holds beside them (pi_ref and its log-probs).
"""

import argparse
import json
import os
import pathlib
import subprocess
import sys
import time

REPO = pathlib.Path(__file__).resolve().parent.parent
MESHES = {
    "fsdp": "data=1,fsdp=-1,tensor=1",
    "fsdp_tp": "data=1,fsdp=-1,tensor=4",
    "fsdp_expert": "data=1,fsdp=-1,expert=8,tensor=1",
}
# (model, rule set) in the order they run: the likeliest runs first.
MODELS_RULES = (("qwen3_0_6b", "fsdp"), ("qwen3_8b", "fsdp"), ("qwen3_30b_a3b", "fsdp_expert"),
                ("qwen3_8b", "fsdp_tp"), ("qwen3_30b_a3b", "fsdp_tp"), ("qwen3_0_6b", "fsdp_tp"),
                ("qwen3_30b_a3b", "fsdp"))
TOPOLOGIES = {"v5p:2x2x2": 8, "v5e:4x8": 32}
PROMPT_LEN, NEW_TOKENS = 1024, 7168
# The fields the lead adds to configs/base.py; set here explicitly for every cell.
MODEL_FIELDS = {"model.attention": "splash", "model.scan_layers": True, "model.remat": "full",
                "model.dtype": "bfloat16", "model.param_dtype": "bfloat16"}


def overrides(model, rules, chips, extra=()):
    return {"model.name": model, "model.rules": rules, "mesh": MESHES[rules],
            "rollout.prompts_per_batch": chips, "rollout.max_new_tokens": NEW_TOKENS,
            **MODEL_FIELDS, **dict(extra)}


def command(recipe, topology, fields, programs):
    """The `python -m grpo_jax.aot` command of a cell."""
    flags = " ".join(f"--config.{k}={v}" for k, v in fields.items())
    return (f"python -m grpo_jax.aot --config configs/{recipe}.py --topology {topology} "
            f"--prompt_len {PROMPT_LEN} --programs {','.join(programs)} {flags}")


def set_field(config, dotted, value):
    *parents, leaf = dotted.split(".")
    section = config
    for name in parents:
        section = section[name]
    if leaf in section and type(section[leaf]) is not type(value):
        del section[leaf]   # configs/base.py's model.remat is a bool until "off"/"full" land
    section[leaf] = value


def run_cell(spec):
    """One report in this process: `spec` = {recipe, topology, fields, programs, out}."""
    from grpo_jax import aot, config_lib
    config = config_lib.load_config(str(REPO / "configs" / f"{spec['recipe']}.py"))
    for dotted, value in spec["fields"].items():
        set_field(config, dotted, value)
    begin = time.time()
    result = aot.report(config, spec["topology"], prompt_len=PROMPT_LEN,
                        programs=tuple(spec["programs"]))
    result.update(wall_s=time.time() - begin, command=command(
        spec["recipe"], spec["topology"], spec["fields"], spec["programs"]))
    if "grpo" == spec["recipe"]:   # what GRPO holds beside the sampler (see module docstring)
        from grpo_jax.aot import programs as programs_lib
        from grpo_jax import parallel
        mesh = parallel.make_mesh(config.mesh, devices=aot.topology_devices(spec["topology"]))
        built = programs_lib.build(config, mesh, prompt_len=PROMPT_LEN)
        result["sampler_held"] = {p.name: p.held for p in built if p.name in ("prefill", "decode")}
    print(result["table"], flush=True)
    if spec.get("merge"):   # a refresh: these programs replace the cell's earlier ones
        merged = json.loads(pathlib.Path(spec["merge"]).read_text())
        merged["programs"].update(result["programs"])
        over = [p for p, r in merged["programs"].items()
                if r["compiler_oom"] or r["bytes_per_device"] > merged["hbm_bytes_per_device"]]
        result = {**merged, "fits": not over, "refreshed": spec["programs"]}
    with open(spec["out"], "w") as f:
        json.dump(result, f, indent=1)


def cells(topologies, recipes=("gspo", "grpo")):
    """`(name, spec)` of every cell; GRPO compiles only its update (its log-prob pass is
    GSPO's in 16 pieces instead of 4, its sampler GSPO's)."""
    for recipe in recipes:
        for topology in topologies:
            for model, rules in MODELS_RULES:
                name = f"{recipe}_{model}_{rules}_{topology.replace(':', '_')}"
                programs = ["train", "logprob", "prefill", "decode"] if recipe == "gspo" else ["train"]
                yield name, dict(recipe=recipe, topology=topology, programs=programs,
                                 fields=overrides(model, rules, TOPOLOGIES[topology]))


def gib(nbytes):
    return f"{nbytes / 2**30:.1f}"


def table(out):
    """The markdown table of every finished cell in `out`."""
    lines = ["| model | recipe | rules | topology | train | logprob | prefill | decode | HBM | fits | "
             "compile (s) |", "|" + "---|" * 11]
    commands = []
    for name, spec in cells(TOPOLOGIES):
        path = out / f"{name}.json"
        if not path.exists():
            continue
        result = json.loads(path.read_text())
        programs = dict(result["programs"])
        if spec["recipe"] == "grpo":   # the sampler's programs from the GSPO cell, GRPO's held
            gspo = out / f"gspo{name[4:]}.json"
            if not gspo.exists():
                continue
            for program, compiled in json.loads(gspo.read_text())["programs"].items():
                if program in ("prefill", "decode"):
                    extra = result["sampler_held"][program] - compiled["held_bytes"]
                    programs[program] = {**compiled, "bytes_per_device": compiled["bytes_per_device"] + extra}
        hbm = result["hbm_bytes_per_device"]
        over = [p for p, r in programs.items() if r["bytes_per_device"] > hbm or r["compiler_oom"]]
        cell = lambda p: (f"{'> ' if programs[p]['compiler_oom'] else ''}"
                          f"{gib(programs[p]['bytes_per_device'])}") if p in programs else "-"
        fits = "yes" if not over else "no: " + ", ".join(over)
        model, rules = spec["fields"]["model.name"], spec["fields"]["model.rules"]
        seconds = sum(r["compile_s"] for r in result["programs"].values())
        lines.append(f"| {model} | {spec['recipe']} | {rules} | {spec['topology']} | {cell('train')} | "
                     f"{cell('logprob')} | {cell('prefill')} | {cell('decode')} | {gib(hbm)} | {fits} | "
                     f"{seconds:.0f} |")
        commands.append(f"- `{name}`: `{result['command']}`")
    return "\n".join(lines + ["", "Commands (each cell's own; GRPO's sampler columns come from the "
                              "GSPO cell of the same row, with GRPO's held state):", ""] + commands)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(REPO / "experiments" / "results" / "aot"))
    parser.add_argument("--topologies", default=",".join(TOPOLOGIES))
    parser.add_argument("--recipes", default="gspo,grpo")
    parser.add_argument("--refresh", default="", help="recompile these programs of finished cells")
    parser.add_argument("--cell", help=argparse.SUPPRESS)   # JSON spec: run one cell here
    args = parser.parse_args()
    if args.cell:
        return run_cell(json.loads(args.cell))
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    refresh = [p for p in args.refresh.split(",") if p]
    for name, spec in cells(args.topologies.split(","), args.recipes.split(",")):
        path = out / f"{name}.json"
        if path.exists() and not refresh:
            continue
        if refresh:
            if not path.exists():
                continue
            spec = {**spec, "programs": [p for p in spec["programs"] if p in refresh],
                    "merge": str(path)}
            if not spec["programs"]:
                continue
        print(f"== {name}", flush=True)
        begin = time.time()
        done = subprocess.run([sys.executable, __file__, "--cell", json.dumps({**spec, "out": str(path)})],
                              cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
        print(f"== {name}: exit {done.returncode} after {time.time() - begin:.0f} s", flush=True)
        (REPO / "experiments" / "results" / "aot_fit_table.md").write_text(table(out) + "\n")


if __name__ == "__main__":
    main()
