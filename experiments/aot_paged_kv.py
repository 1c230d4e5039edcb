"""The fit table's Qwen3-8B GSPO row (v5p:2x2x2, fsdp, 8,192 tokens) with continuous batching:
decode KV bytes per chip and the slots that fit, contiguous vs paged (docs/tpu.md).

    pip install -e ".[train,tpu]"
    python experiments/aot_paged_kv.py      # three decode compiles, about 8 min on 2 cores

The cell is `experiments/aot_fit_table.py`'s (`gspo_qwen3_8b_fsdp_v5p_2x2x2`) with
``rollout.slots`` = 64 (half of the 128 rows) and only the decode program compiled: the
contiguous engine's step, then the paged engine's whole call (pages of 16 tokens) with its
pool sized at the 0.9 quantile of lognormal lengths of p99/mean 4 (p99 at the budget) and
at the budget. Each report also prints the KV table at the budget and the 0.5 and 0.9
quantiles. The printed reports, each with its command, go to
experiments/results/aot_paged_kv.md, with the commit and the versions they ran at.
"""

import pathlib
import re
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parent.parent
OUT = REPO / "experiments" / "results" / "aot_paged_kv.md"
CELL = ("--config configs/gspo.py --topology v5p:2x2x2 --prompt_len 1024 "
        "--config.model.name=qwen3_8b --config.model.rules=fsdp "
        "--config.mesh=data=1,fsdp=-1,tensor=1 --config.rollout.prompts_per_batch=8 "
        "--config.rollout.max_new_tokens=7168 --config.model.attention=splash "
        "--config.model.scan_layers=True --config.model.remat=full "
        "--config.model.dtype=bfloat16 --config.model.param_dtype=bfloat16 "
        "--programs decode --config.rollout.slots=64")
RUNS = {
    "contiguous": "--length_quantile 0.5,0.9",
    "paged, pool at q0.9": "--config.rollout.kv_page_size=16 --length_quantile 0.9,0.5",
    "paged, pool at the budget": "--config.rollout.kv_page_size=16 --length_quantile=",
}


def report_lines(stdout):
    """The report without libtpu's log lines."""
    return [line for line in stdout.splitlines() if not re.match(r"[IWEF]\d{4} ", line)]


def main():
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True, cwd=REPO, check=True).stdout.strip()
    lines = [f"# Qwen3-8B GSPO decode KV on v5p:2x2x2, contiguous vs paged (commit {commit})", "",
             "`python experiments/aot_paged_kv.py`: each section is one `python -m grpo_jax.aot` "
             "report, compiled on a shared 2-core CPU host (no TPU) with the `tpu` extra's libtpu.",
             ""]
    for name, flags in RUNS.items():
        command = f"python -m grpo_jax.aot {CELL} {flags}"
        print(f"== {name}: {command}", flush=True)
        done = subprocess.run([sys.executable, *command.split()[1:]], capture_output=True,
                              text=True, cwd=REPO)
        lines += [f"## {name}", "", f"`{command}` (exit {done.returncode})", "", "```text",
                  *report_lines(done.stdout), "```", ""]
        if done.returncode:
            lines += ["```text", *done.stderr.splitlines()[-20:], "```", ""]
    OUT.write_text("\n".join(lines))
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
