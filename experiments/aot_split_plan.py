"""The split plans of docs/async.md, and the check of the plan's layer extrapolation.

    pip install -e ".[train,tpu]"
    python experiments/aot_split_plan.py             # the plans (about 1 h on 2 cores)
    python experiments/aot_split_plan.py --linearity # 1-4 layer variants of Qwen3-0.6B (~10 min)

Each plan is one `python -m grpo_jax.aot --plan_splits default` run in its own process,
one at a time (a compile of Qwen3-8B's update takes minutes and gigabytes); its printed
table goes to OUT/NAME.txt and its JSON to OUT/NAME.json, with the command and commit at
the top of the text; finished plans are skipped on a re-run. The model fields are the fit
table's (experiments/aot_fit_table.py: bf16, remat "full", splash attention, scanned
layers), GSPO (4 updates per batch, pi_old recomputed), 16 answers per prompt, prompt
1,024 tokens:

- v5p:2x2x2, the fit table's regime: 8 prompts, 7,168 new tokens, fsdp over the learner's
  chips, the sampler data parallel over its own;
- v5p:2x2x2 with 12 prompts and the learner's mesh data=-1,fsdp=2, so that the 2 + 6 and
  6 + 2 splits can run (8 prompts do not split over 6 chips, nor 4,096 over fsdp=6);
- v5e:4x8 at 3,072 new tokens: the weights split over a tensor axis of 4 on both sides
  (a v5e's 16 GB cannot hold Qwen3-8B's 16.4 GB whole), 8 prompts. At the fit table's
  regime (32 prompts x 16, 8,192 tokens) no split can fit: the KV cache alone is 618 GB,
  more than the 32 chips' 504 GB together.

``--linearity`` compiles the time variants of Qwen3-0.6B's programs (the fit table's GSPO
regime on v5p:2x2x2) with 1, 2, 3 and 4 layers and prints each program's modelled time
and the difference each added layer makes: the extrapolation assumes they are equal.
"""

import argparse
import os
import pathlib
import subprocess
import sys
import time

REPO = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "experiments"))
import aot_fit_table as fit   # noqa: E402  (the fit table's model fields and helpers)

PROMPT_LEN = fit.PROMPT_LEN
BASE = {"model.name": "qwen3_8b", **fit.MODEL_FIELDS}
PLANS = {
    "gspo_qwen3_8b_v5p_2x2x2": ("v5p:2x2x2", {
        "model.rules": "fsdp", "mesh": "data=1,fsdp=-1,tensor=1", "rollout.prompts_per_batch": 8,
        "rollout.max_new_tokens": fit.NEW_TOKENS}),
    "gspo_qwen3_8b_v5p_2x2x2_p12": ("v5p:2x2x2", {
        "model.rules": "fsdp", "mesh": "data=-1,fsdp=2,tensor=1", "rollout.prompts_per_batch": 12,
        "rollout.max_new_tokens": fit.NEW_TOKENS}),
    "gspo_qwen3_8b_v5e_4x8_n3072": ("v5e:4x8", {
        "model.rules": "fsdp_tp", "mesh": "data=1,fsdp=-1,tensor=4",
        "rollout.mesh": "data=-1,tensor=4", "rollout.prompts_per_batch": 8,
        "rollout.max_new_tokens": 3072}),
}


def command(topology, fields):
    flags = " ".join(f"--config.{k}={v}" for k, v in {**BASE, **fields}.items())
    return (f"python -m grpo_jax.aot --config configs/gspo.py --topology {topology} "
            f"--prompt_len {PROMPT_LEN} --plan_splits default {flags}")


def run_plan(out, name, topology, fields):
    """One plan in a subprocess, its peak host memory measured by /usr/bin/time when present."""
    line, at = command(topology, fields), fit.commit()   # the commit the run starts from
    args = [sys.executable, "-m", "grpo_jax.aot", "--config", "configs/gspo.py",
            "--topology", topology, "--prompt_len", str(PROMPT_LEN), "--plan_splits", "default",
            "--json", str(out / f"{name}.json"),
            *(f"--config.{k}={v}" for k, v in {**BASE, **fields}.items())]
    timer = ["/usr/bin/time", "-v"] if os.path.exists("/usr/bin/time") else []
    begin = time.time()
    env = {**os.environ, "PYTHONPATH": str(REPO), "ALLOW_MULTIPLE_LIBTPU_LOAD": "1"}
    done = subprocess.run(timer + args, cwd=REPO, capture_output=True, text=True, env=env)
    wall = time.time() - begin
    peak = [l.split(":")[-1].strip() for l in done.stderr.splitlines() if "Maximum resident" in l]
    keep = [l for l in done.stdout.splitlines() if l.strip()]
    head = [f"command: {line}", f"commit: {at}",
            f"exit {done.returncode} after {wall:.0f} s on a 2-core host"
            + (f", peak resident memory {int(peak[0]) / 2**20:.1f} GiB" if peak else "")]
    (out / f"{name}.txt").write_text("\n".join(head + [""] + keep) + "\n")
    print("\n".join(head + keep), flush=True)
    if done.returncode not in (0, 1):
        print(done.stderr[-3000:], flush=True)


def linearity():
    """Modelled seconds of Qwen3-0.6B's time variants at 1-4 layers, and the per-layer steps."""
    from grpo_jax import aot, config_lib
    from grpo_jax.aot import plan
    config = config_lib.load_config(str(REPO / "configs" / "gspo.py"))
    config_lib.apply_overrides(config, fit.overrides("qwen3_0_6b", "fsdp", 8))
    config = config_lib.replaced(config, {"model.scan_layers": False})
    devices = aot.topology_devices("v5p:2x2x2")
    mesh, _, _ = aot.meshes(config, devices)
    chip = plan.CHIPS[devices[0].device_kind]
    seconds = {}
    for layers in (1, 2, 3, 4):
        for program in aot.build(config, mesh, prompt_len=PROMPT_LEN, layers=layers):
            estimate = plan._estimate(program, plan.NO_OOM, chip)
            program.lowered = None
            seconds.setdefault(program.name, []).append(None if estimate is None else estimate[0])
        print(f"{layers} layer(s) compiled", flush=True)
    lines = ["command: python experiments/aot_split_plan.py --linearity", f"commit: {fit.commit()}",
             "Qwen3-0.6B, GSPO at the fit table's regime on v5p:2x2x2 (fsdp), layers unrolled, "
             "modelled seconds (the cost model's -1 s terms removed):", "",
             "| program | 1 layer | 2 | 3 | 4 | +2nd | +3rd | +4th |", "|" + "---|" * 8]
    for name, values in seconds.items():
        steps = [b - a for a, b in zip(values, values[1:])]
        lines.append(f"| {name} | " + " | ".join(f"{v * 1e3:.3f} ms" for v in values) + " | "
                     + " | ".join(f"{v * 1e3:.3f} ms" for v in steps) + " |")
    text = "\n".join(lines)
    (REPO / "experiments" / "results" / "aot_split_plan_linearity.txt").write_text(text + "\n")
    print(text)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(REPO / "experiments" / "results" / "aot_split_plan"))
    parser.add_argument("--only", default="", help="comma-separated plan names (default all)")
    parser.add_argument("--linearity", action="store_true", help="the layer check instead")
    parser.add_argument("--min_free_gib", type=float, default=8,
                        help="host memory to wait for before each plan")
    args = parser.parse_args()
    if args.linearity:
        return linearity()
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    only = {name for name in args.only.split(",") if name}
    for name, (topology, fields) in PLANS.items():
        if (out / f"{name}.txt").exists() or (only and name not in only):
            continue
        fit.wait_for_memory(args.min_free_gib)
        print(f"== {name}", flush=True)
        run_plan(out, name, topology, fields)


if __name__ == "__main__":
    main()
