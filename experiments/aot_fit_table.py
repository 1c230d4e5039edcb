"""The fit table of docs/tpu.md: `grpo_jax.aot` reports for Qwen3 models on TPU topologies.

    pip install -e ".[train,tpu]"
    python experiments/aot_fit_table.py             # the fit table (about 70 min on 2 cores)
    python experiments/aot_fit_table.py --compare   # the comparisons (about 30 min)
    python experiments/aot_fit_table.py --lora      # LoRA / QLoRA on v5p:2x2x1 and v5e:2x4

Each cell (model x recipe x rule set x topology) is one `grpo_jax.aot.compile_run`, run in its
own process, one at a time (a compile of qwen3_8b's update takes minutes and gigabytes),
written to OUT/CELL.json with the commit it ran at; finished cells are skipped on a re-run.
The tables and the command of every cell go to OUT/../aot_fit_table.md.

Regime (the same for every cell): G = 16 answers to each of P = (number of chips) prompts,
so 16 rows per chip; prompt 1,024 + completion 7,168 = 8,192 tokens; bf16 weights, compute
and AdamW moments; remat "full"; splash attention; scanned layers; the recipe's minibatches
(GRPO 16, GSPO 4), one micro-batch. The sampler's programs do not depend on the recipe
(same P, G, lengths, mesh and sampling rules): they are compiled once, with GSPO, and
GRPO's rows add what GRPO holds beside them (pi_ref and its log-probs).

The comparisons (``--compare``) change one setting of a GSPO cell on v5p:2x2x2 with the
"fsdp" rules: unrolled layers, each remat policy (with 1 and 4 micro-batches), XLA attention.
The LoRA cells (``--lora``) run GSPO's cell of Qwen3-8B (fsdp) on the smaller slices
v5p:2x2x1 (4 chips) and v5e:2x4 (8 chips; also at a shorter regime, `SHORT`) and of
Qwen3-30B-A3B (fsdp_expert) on v5p:2x2x1, every weight trained, rank-16 adapters on every
projection, and the same on an int8 base. (On v5e-8 the sampler's layout, the weights
whole on each chip, cannot hold Qwen3-30B-A3B's 61 GB, nor its 30 GB in int8.)
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
MODEL_FIELDS = {"model.attention": "splash", "model.scan_layers": True, "model.remat": "full",
                "model.dtype": "bfloat16", "model.param_dtype": "bfloat16"}
SAMPLER = ("prefill", "decode")
ALL_PROGRAMS = ("train", "logprob", *SAMPLER)   # what a run without a critic compiles
REMAT_POLICIES = ("full", "off", "dots_saveable", "dots_with_no_batch_dims_saveable")
# name -> (model, programs, the changed fields) of a GSPO fsdp cell on v5p:2x2x2.
COMPARE_TOPOLOGY = "v5p:2x2x2"
COMPARISONS = {
    "qwen3_8b_unrolled": ("qwen3_8b", ("train", *SAMPLER), {"model.scan_layers": False}),
    "qwen3_30b_a3b_unrolled": ("qwen3_30b_a3b", ("train", *SAMPLER), {"model.scan_layers": False}),
    **{f"qwen3_8b_remat_{policy}": ("qwen3_8b", ("train",), {"model.remat": policy})
       for policy in REMAT_POLICIES[1:]},
    **{f"qwen3_8b_remat_{policy}_micro4": ("qwen3_8b", ("train",), {
        "model.remat": policy, "train.micro_batches": 4}) for policy in REMAT_POLICIES},
    **{f"{model}_xla_attention": (model, ("train", "prefill"), {"model.attention": "xla"})
       for model in ("qwen3_0_6b", "qwen3_8b")},
}


# LoRA and QLoRA on smaller slices (``--lora``): rank 16 on every projection (the experts'
# too), the base in bfloat16 or int8; the full-parameter run beside them on the same slice.
# A slice runs the regime above, or "short": 4 prompts x 16 answers (8 rows per v5e chip),
# 1,024 + 3,072 tokens. (model, rules) -> its slices (topology, chips, regime name).
SHORT = {"rollout.prompts_per_batch": 4, "rollout.max_new_tokens": 3072}
LORA_SLICES = {
    ("qwen3_8b", "fsdp"): (("v5p:2x2x1", 4, ""), ("v5e:2x4", 8, ""), ("v5e:2x4", 8, "short")),
    ("qwen3_30b_a3b", "fsdp_expert"): (("v5p:2x2x1", 4, ""),),
}
LORA_VARIANTS = {"full": {}, "lora": {"model.lora.rank": 16},
                 "qlora_int8": {"model.lora.rank": 16, "model.lora.quantize": "int8"}}


def overrides(model, rules, chips, extra=()):
    return {"model.name": model, "model.rules": rules, "mesh": MESHES[rules],
            "rollout.prompts_per_batch": chips, "rollout.max_new_tokens": NEW_TOKENS,
            **MODEL_FIELDS, **dict(extra)}


def command(recipe, topology, fields, programs):
    """The `python -m grpo_jax.aot` command of a cell (``--programs`` only when it compiles
    fewer than a run without a critic has: docs/tpu.md quotes a whole cell's command)."""
    flags = " ".join(f"--config.{k}={v}" for k, v in fields.items())
    chosen = "" if tuple(programs) == ALL_PROGRAMS else f" --programs {','.join(programs)}"
    return (f"python -m grpo_jax.aot --config configs/{recipe}.py --topology {topology} "
            f"--prompt_len {PROMPT_LEN}{chosen} {flags}")


def commit():
    """The checkout's commit, with "+changes" when tracked files differ from it."""
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                          text=True).stdout.strip()
    dirty = subprocess.run(["git", "diff", "--quiet", "HEAD", "--", "grpo_jax", "configs"],
                           cwd=REPO).returncode
    return head + ("+changes" if dirty else "")


def run_cell(spec):
    """One report in this process: `spec` = {recipe, topology, fields, programs, out}."""
    from grpo_jax import aot, config_lib
    config = config_lib.load_config(str(REPO / "configs" / f"{spec['recipe']}.py"))
    config_lib.apply_overrides(config, spec["fields"])
    begin = time.time()
    result = aot.compile_run(config, spec["topology"], prompt_len=PROMPT_LEN,
                             programs=tuple(spec["programs"]))
    result.update(wall_s=time.time() - begin, commit=commit(), command=command(
        spec["recipe"], spec["topology"], spec["fields"], spec["programs"]))
    if "grpo" == spec["recipe"]:   # what GRPO holds beside the sampler (see module docstring)
        from grpo_jax.aot import programs as programs_lib
        from grpo_jax import parallel
        mesh = parallel.make_mesh(config.mesh, devices=aot.topology_devices(spec["topology"]))
        built = programs_lib.build(config, mesh, prompt_len=PROMPT_LEN)
        result["sampler_held"] = {p.name: p.held for p in built if p.name in SAMPLER}
    print(result["table"], flush=True)
    with open(spec["out"], "w") as f:
        json.dump(result, f, indent=1)


def cells(topologies, recipes=("gspo", "grpo")):
    """`(name, spec)` of every cell; GRPO compiles its update and log-prob pass (its
    sampler is GSPO's)."""
    for recipe in recipes:
        for topology in topologies:
            for model, rules in MODELS_RULES:
                name = f"{recipe}_{model}_{rules}_{topology.replace(':', '_')}"
                programs = list(ALL_PROGRAMS) if recipe == "gspo" else ["train", "logprob"]
                yield name, dict(recipe=recipe, topology=topology, programs=programs,
                                 fields=overrides(model, rules, TOPOLOGIES[topology]))


def comparison_cells():
    """`(name, spec)` of every comparison cell (see `COMPARISONS`)."""
    for name, (model, programs, changes) in COMPARISONS.items():
        yield f"compare_{name}", dict(
            recipe="gspo", topology=COMPARE_TOPOLOGY, programs=list(programs),
            fields=overrides(model, "fsdp", TOPOLOGIES[COMPARE_TOPOLOGY], changes))


def lora_cells():
    """`(name, spec)` of every LoRA cell (GSPO, every program): model x slice x variant."""
    for (model, rules), slices in LORA_SLICES.items():
        for topology, chips, regime in slices:
            for variant, fields in LORA_VARIANTS.items():
                suffix = f"_{regime}" if regime else ""
                regime_fields = {**fields, **(SHORT if regime == "short" else {})}
                if rules == "fsdp_expert" and chips < 8:   # the experts split over every chip
                    regime_fields["mesh"] = f"data=1,fsdp=-1,expert={chips},tensor=1"
                yield (f"lora_{variant}_{model}_{rules}_{topology.replace(':', '_')}{suffix}",
                       dict(recipe="gspo", topology=topology, programs=list(ALL_PROGRAMS),
                            regime=regime or "8,192", fields=overrides(model, rules, chips,
                                                                       regime_fields)))


def lora_table(out):
    """The markdown table of the LoRA cells, their commands and commits."""
    lines = ["", "LoRA and QLoRA on smaller slices (GSPO, rank 16 on every projection; QLoRA: the "
             "base's projections in int8; tokens 8,192: the regime above, 16 rows per chip; short: "
             "4 prompts x 16 answers, 1,024 + 3,072 tokens):", "",
             "| model | weights | rules | topology | tokens | train | logprob | prefill | decode "
             "| HBM | fits | compile (s) |", "|" + "---|" * 12]
    commands, commits = [], set()
    for name, spec in lora_cells():
        variant = name.split("_qwen3")[0][len("lora_"):]
        model, rules = spec["fields"]["model.name"], spec["fields"]["model.rules"]
        path = out / f"{name}.json"
        head = f"| {model} | {variant} | {rules} | {spec['topology']} | {spec['regime']} |"
        if not path.exists():
            lines.append(f"{head} not compiled | | | | | | |")
            continue
        result = json.loads(path.read_text())
        commands.append(f"- `{name}`: `{result['command']}`")
        commits.add(_provenance(result))
        if "timed_out_s" in result:
            lines.append(
                f"{head} not compiled (stopped after {result['timed_out_s']:.0f} s) | | | | | | |"
            )
            continue
        programs, hbm = result["programs"], result["hbm_bytes_per_device"]
        over = [p for p, r in programs.items()
                if r.get("compile_failed") or r["compiler_oom"] or r["bytes_per_device"] > hbm]
        seconds = sum(r["compile_s"] for r in programs.values())
        cells = " | ".join(total(programs[p]) if p in programs else "-" for p in ALL_PROGRAMS)
        lines.append(f"{head} {cells} | {gib(hbm)} | {'no: ' + ', '.join(over) if over else 'yes'} "
                     f"| {seconds:.0f} |")
    if commits:
        lines += ["", f"LoRA cells compiled at: {'; '.join(sorted(commits))}."]
    return lines, commands


def wait_for_memory(gib_needed, poll_s=30):
    """Blocks until the host has `gib_needed` GiB available (a large compile takes ~11 GB)."""
    while True:
        with open("/proc/meminfo") as f:
            available = next(int(line.split()[1]) for line in f if line.startswith("MemAvailable"))
        if available >= gib_needed * 2**20:
            return
        print(f"   waiting: {available / 2**20:.1f} GiB available, {gib_needed} needed", flush=True)
        time.sleep(poll_s)


def gib(nbytes):
    return f"{nbytes / 2**30:.1f}"


def cell_programs(out, name, spec):
    """The cell's programs from OUT/name.json (a GRPO cell with GSPO's sampler programs plus
    what GRPO holds meanwhile), or None if it has not run."""
    path = out / f"{name}.json"
    if not path.exists():
        return None
    result = json.loads(path.read_text())
    if "timed_out_s" in result:
        return result, None
    programs = dict(result["programs"])
    if spec["recipe"] == "grpo":
        gspo = out / f"gspo{name[4:]}.json"
        sampler = json.loads(gspo.read_text()).get("programs", {}) if gspo.exists() else {}
        if sampler:
            for program, compiled in sampler.items():
                if program in SAMPLER:
                    extra = result["sampler_held"][program] - compiled["held_bytes"]
                    programs[program] = {
                        **compiled, "bytes_per_device": compiled["bytes_per_device"] + extra,
                    }
    return result, programs


def total(program):
    """A program's per-device bytes in GiB; "> X" when the compiler refused it for memory
    (a lower bound), "fails" when it refused it for another reason."""
    if program.get("compile_failed"):
        return "fails"
    return f"{'> ' if program['compiler_oom'] else ''}{gib(program['bytes_per_device'])}"


def fit_table(out):
    """The markdown fit table of every cell, the commands, and the commits they ran at."""
    lines = [
        "| model | recipe | rules | topology | train | logprob | prefill | decode | HBM | fits | "
        "compile (s) |", "|" + "---|" * 11,
    ]
    commands, commits = [], set()
    for name, spec in cells(TOPOLOGIES):
        model, rules = spec["fields"]["model.name"], spec["fields"]["model.rules"]
        found = cell_programs(out, name, spec)
        if found is None:
            lines.append(f"| {model} | {spec['recipe']} | {rules} | {spec['topology']} | "
                         "not compiled | | | | | | |")
            continue
        result, programs = found
        commands.append(f"- `{name}`: `{result['command']}`")
        commits.add(_provenance(result))
        if programs is None:
            lines.append(
                f"| {model} | {spec['recipe']} | {rules} | {spec['topology']} | not compiled "
                f"(stopped after {result['timed_out_s']:.0f} s) | | | | | | |"
            )
            continue
        hbm = result["hbm_bytes_per_device"]
        over = [p for p, r in programs.items()
                if r.get("compile_failed") or r["compiler_oom"] or r["bytes_per_device"] > hbm]
        cell = lambda p: total(programs[p]) if p in programs else "-"
        missing = [p for p in ("train", "logprob", *SAMPLER) if p not in programs]
        fits = ("no: " + ", ".join(over) if over else
                f"unknown: {', '.join(missing)} not compiled" if missing else "yes")
        seconds = sum(r["compile_s"] for r in result["programs"].values())
        lines.append(
            f"| {model} | {spec['recipe']} | {rules} | {spec['topology']} | {cell('train')} | "
            f"{cell('logprob')} | {cell('prefill')} | {cell('decode')} | {gib(hbm)} | {fits} | "
            f"{seconds:.0f} |"
        )
    return lines, commands, commits


def comparison_tables(out):
    """Markdown tables of the comparisons against their fit-table cells."""
    def row(model, program, setting, name):
        path = out / f"{name}.json"
        if not path.exists():
            return f"| {model} | {program} | {setting} | not compiled | | |"
        result = json.loads(path.read_text())
        if "timed_out_s" in result:
            return f"| {model} | {program} | {setting} | not compiled (stopped after " \
                   f"{result['timed_out_s']:.0f} s) | | |"
        compiled = result["programs"].get(program)
        if compiled is None:
            return f"| {model} | {program} | {setting} | - | - | - |"
        temp = "?" if compiled["temp_bytes"] is None else gib(compiled["temp_bytes"])
        return (f"| {model} | {program} | {setting} | {total(compiled)} | {temp} | "
                f"{compiled['compile_s']:.0f} |")

    base = lambda model: f"gspo_{model}_fsdp_{COMPARE_TOPOLOGY.replace(':', '_')}"
    head = lambda what: [f"| model | program | {what} | total (GiB) | temp (GiB) | compile (s) |",
                         "|" + "---|" * 6]
    lines = ["", "Scanned vs unrolled layers (GSPO, fsdp, v5p:2x2x2):", ""] + head("layers")
    for model in ("qwen3_8b", "qwen3_30b_a3b"):
        for program in ("train", *SAMPLER):
            lines += [row(model, program, "scanned", base(model)),
                      row(model, program, "unrolled", f"compare_{model}_unrolled")]
    lines += ["", "Remat policies (GSPO, fsdp, v5p:2x2x2, the update of 32 rows in 1 or 4 "
              "micro-batches):", ""] + head("remat, micro-batches")
    for policy in REMAT_POLICIES:
        one = base("qwen3_8b") if policy == "full" else f"compare_qwen3_8b_remat_{policy}"
        lines += [
            row("qwen3_8b", "train", f"{policy}, 1", one),
            row("qwen3_8b", "train", f"{policy}, 4", f"compare_qwen3_8b_remat_{policy}_micro4"),
        ]
    lines += ["", "Splash vs XLA attention at 8,192 tokens (GSPO, fsdp, v5p:2x2x2):", ""]
    lines += head("attention")
    for model in ("qwen3_0_6b", "qwen3_8b"):
        for program in ("train", "prefill"):
            lines += [row(model, program, "splash", base(model)),
                      row(model, program, "xla", f"compare_{model}_xla_attention")]
    commands = [
        f"- `{name}`: "
        f"`{command(spec['recipe'], spec['topology'], spec['fields'], spec['programs'])}`"
        for name, spec in comparison_cells()
    ]
    ran = sorted({_provenance(json.loads((out / f"{name}.json").read_text()))
                  for name, _ in comparison_cells() if (out / f"{name}.json").exists()})
    lines += ["", f"Comparison cells compiled at: {'; '.join(ran) or 'none yet'}."]
    return lines, commands


def _provenance(result):
    """"commit (jax X, libtpu Y)" of a cell's JSON; older JSONs did not record versions."""
    versions = result.get("versions")
    if not versions:
        return f"{result.get('commit', '?')} (compiler versions not recorded)"
    return f"{result['commit']} (" + ", ".join(f"{k} {v}" for k, v in versions.items()) + ")"


def write_tables(out):
    lines, commands, commits = fit_table(out)
    compare_lines, compare_commands = comparison_tables(out)
    lora_lines, lora_commands = lora_table(out)
    text = "\n".join(
        lines + ["", "Per-device GiB of each program (\"> X\": the compiler refused it, needing at "
                 f"least X). Commits: {', '.join(sorted(commits))}."] + compare_lines + lora_lines
        + ["", "Commands (each cell's own; GRPO's sampler columns come from the GSPO cell of the "
           "same row, with GRPO's held state):", ""] + commands + compare_commands + lora_commands)
    (out.parent / "aot_fit_table.md").write_text(text + "\n")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(REPO / "experiments" / "results" / "aot"))
    parser.add_argument("--topologies", default=",".join(TOPOLOGIES))
    parser.add_argument("--recipes", default="gspo,grpo")
    parser.add_argument("--compare", action="store_true", help="run the comparison cells instead")
    parser.add_argument("--lora", action="store_true", help="run the LoRA / QLoRA cells instead")
    parser.add_argument(
        "--only", default="", help="comma-separated cell names to run (default all)"
    )
    parser.add_argument("--timeout_s", type=float, default=900, help="a cell's compile time limit")
    parser.add_argument("--min_free_gib", type=float, default=13,
                        help="host memory to wait for before a cell of a model larger than 0.6B")
    parser.add_argument("--tables_only", action="store_true",
                        help="only rewrite aot_fit_table.md from the JSONs in --out")
    parser.add_argument("--cell", help=argparse.SUPPRESS)   # JSON spec: run one cell here
    args = parser.parse_args()
    if args.cell:
        return run_cell(json.loads(args.cell))
    out = pathlib.Path(args.out)
    if args.tables_only:
        return write_tables(out)
    out.mkdir(parents=True, exist_ok=True)
    todo = (comparison_cells() if args.compare else lora_cells() if args.lora
            else cells(args.topologies.split(","), args.recipes.split(",")))
    only = {name for name in args.only.split(",") if name}
    for name, spec in todo:
        path = out / f"{name}.json"
        if path.exists() or (only and name not in only):
            continue
        if spec["fields"]["model.name"] != "qwen3_0_6b":
            wait_for_memory(args.min_free_gib)
        print(f"== {name}", flush=True)
        begin = time.time()
        try:
            done = subprocess.run(
                [sys.executable, __file__, "--cell", json.dumps({**spec, "out": str(path)})],
                cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=args.timeout_s)
            status = f"exit {done.returncode}"
        except subprocess.TimeoutExpired:  # the table says so; a re-run skips the cell
            path.write_text(
                json.dumps(
                    {
                        "timed_out_s": args.timeout_s, "commit": commit(),
                        "command": command(
                            spec["recipe"], spec["topology"], spec["fields"], spec["programs"]
                        ),
                    }
                )
            )
            status = "stopped at the time limit"
        print(f"== {name}: {status} after {time.time() - begin:.0f} s", flush=True)
        write_tables(out)
    write_tables(out)


if __name__ == "__main__":
    main()
