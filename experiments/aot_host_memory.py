"""Peak host memory of compiling the update for a TPU topology, scanned vs unrolled layers.

    python experiments/aot_host_memory.py [--models qwen3_0_6b,qwen3_8b] \\
        > experiments/results/aot_host_memory.txt

Each row runs one `python -m grpo_jax.aot ... --programs train` (GSPO, v5p:2x2x2, the fit
table's regime; ``--programs`` to compile others in the same process) in a child process
and reads its peak resident memory (the kernel's ru_maxrss, what `/usr/bin/time -v`
prints as "Maximum resident set size"). The linear fit
of peak memory against the layer bodies the compiler sees is `grpo_jax.aot.host`'s
estimate. One compile at a time (libtpu admits one process per host; an unrolled 8B
update takes over 10 GiB).
"""

import argparse
import os
import pathlib
import subprocess
import sys
import time

REPO = pathlib.Path(__file__).resolve().parent.parent
FIELDS = ("--config.model.rules=fsdp --config.mesh=data=1,fsdp=-1,tensor=1 "
          "--config.rollout.prompts_per_batch=8 --config.rollout.max_new_tokens=7168 "
          "--config.model.attention=splash --config.model.remat=full "
          "--config.model.dtype=bfloat16 --config.model.param_dtype=bfloat16")


def command(model, scan, programs):
    return (f"python -m grpo_jax.aot --config configs/gspo.py --topology v5p:2x2x2 "
            f"--prompt_len 1024 --programs {programs} --config.model.name={model} "
            f"--config.model.scan_layers={scan} {FIELDS}")


def peak_rss_gib(cmd):
    """Runs `cmd` (a `python -m` command) with this interpreter; its own peak RSS in GiB
    (`os.wait4`'s rusage of that child alone) and wall seconds."""
    begin = time.time()
    child = subprocess.Popen([sys.executable, *cmd.split()[1:]], cwd=REPO,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, _, usage = os.wait4(child.pid, 0)
    return usage.ru_maxrss / 2**20, time.time() - begin


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="qwen3_0_6b,qwen3_8b")
    parser.add_argument(
        "--programs", default="train", help="programs each compile runs, in one process"
    )
    args = parser.parse_args()
    from grpo_jax import models
    from grpo_jax.aot import host
    print("| model | layers | scan_layers | layer bodies | peak RSS (GiB) | estimate (GiB) "
          "| wall (s) |")
    print("|---|---|---|---|---|---|---|")
    for scan in (True, False):
        for name in args.models.split(","):
            cfg = models.get_model_config(name, scan_layers=scan)
            rss, seconds = peak_rss_gib(command(name, scan, args.programs))
            estimate = host.compile_memory(cfg, available=0).bytes / 2**30
            print(f"| {name} | {cfg.n_layers} | {scan} | {host.layer_bodies(cfg)} | {rss:.2f} | "
                  f"{estimate:.1f} | {seconds:.0f} |", flush=True)


if __name__ == "__main__":
    main()
