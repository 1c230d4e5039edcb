"""Multi-turn episodes (a tool's calls and replies) on two processes against one.

    python experiments/bench_tool_turns.py [--repeats 3] [--prompts 8] [--group 4]

Runs `sampling.Engine` episodes of the tiny random model (Qwen3-shaped, V = 512) over one
8-device CPU mesh, first as one process with 8 devices, then as two processes with 4 each
(gloo collectives over localhost): rows pause on 1 token in 16 (a "tool call"), each
process answers the pauses of the rows it holds with a few tokens (its "tool's reply"),
and a row is ended at its third pause. Prints, per layout, the seconds of one rollout of
all the episodes (the median of `--repeats` after a compiling one), the `run` calls, the
pauses answered, process 0's `process_allgather` calls during one rollout, and where its
time went (`finished`, `run`, `turn_tokens`, `answer`; a call's wait for the decode
program it dispatched shows in the first call that reads its output), and checks that
both layouts sampled the same rows token for token.
"""

import argparse
import json
import os
import pathlib
import socket
import subprocess
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
STOP_EVERY, PAUSE_EVERY = 32, 16   # 1 token in 32 stops a row, 1 in 16 pauses it


def reply(row, turn):
    """The "tool's" answer to row's turn-th pause: a few tokens that depend on both."""
    return [300 + row % 100, 301 + turn, 302][: 1 + (row + turn) % 3]


def episodes(engine, timers, turns=2):
    """Runs `engine` to the end, answering this process's paused rows (`reply` for the
    first `turns` pauses, ended at the next). Returns (run calls, pauses answered)."""
    import numpy as np

    seen, calls, pauses = {}, 0, 0

    def timed(name, fn, *args):
        start = time.perf_counter()
        out = fn(*args)
        timers[name] = timers.get(name, 0.0) + time.perf_counter() - start
        return out

    while not timed("finished", lambda: engine.finished):
        paused = [int(r) for r in timed("run", engine.run)]
        calls += 1
        pauses += len(paused)
        timed("turn_tokens", engine.turn_tokens, paused)
        for r in paused:
            seen[r] = seen.get(r, 0) + 1
        replies = {r: reply(r, seen[r]) for r in paused if seen[r] <= turns}
        timed("answer", lambda: engine.answer(replies, end=[r for r in paused
                                                             if seen[r] > turns]))
    assert np.isin(list(seen), engine.own_rows).all()
    return calls, pauses


def rollouts(processes, index, *, prompts, group, max_new_tokens, repeats):
    """This process's rows of the episodes, run `repeats` + 1 times (the first compiles)
    on an 8-device mesh over `processes` processes (joined already): a dict of its rows'
    tokens, lengths and appended flags, the timed repeats, and `gathers`, the host's
    `process_allgather` calls while the episodes ran (the last repeat)."""
    import jax
    import numpy as np
    from flax import nnx
    from jax.experimental import multihost_utils

    from grpo_jax import models, parallel, sampling

    mesh = parallel.make_mesh("data=8,fsdp=1,tensor=1")
    graphdef, state = nnx.split(models.init_model(models.get_model_config("tiny"), seed=0,
                                                  mesh=mesh))
    ids = np.random.default_rng(0).integers(3, 512, size=(prompts, 12)).astype(np.int32)
    mine = np.array_split(np.arange(prompts), processes)[index]
    vocab = np.arange(512)
    stops, pauses = vocab[1::STOP_EVERY], vocab[2::PAUSE_EVERY]
    gather, gathers, times = multihost_utils.process_allgather, [], []

    def counted(*args, **kwargs):
        gathers.append(1)
        return gather(*args, **kwargs)

    with jax.set_mesh(mesh):
        placed = parallel.global_rows(mesh, {"tokens": ids[mine], "mask": np.ones_like(ids[mine])})
        for repeat in range(repeats + 1):
            timers = {}
            start = time.perf_counter()
            engine = sampling.Engine(
                graphdef, state, placed["tokens"], placed["mask"], rng=jax.random.key(7),
                method=sampling.TopP(0.95, temperature=1.0), group_size=group,
                max_new_tokens=max_new_tokens, stop_tokens=stops, pad_id=0,
                slots=prompts * group, pause_tokens=pauses, max_append=4)
            gathers.clear()
            multihost_utils.process_allgather = counted
            try:
                calls, answered = episodes(engine, timers)
            finally:
                multihost_utils.process_allgather = gather
            rollout, own = engine.rollout(), engine.own_rows
            tokens = parallel.read_rows(rollout.tokens, own)
            seconds = time.perf_counter() - start
            if repeat:
                times.append({"seconds": seconds, **timers})
        return {"rows": own.tolist(), "tokens": tokens.tolist(),
                "lengths": parallel.read_rows(rollout.lengths, own).tolist(),
                "appended": parallel.read_rows(rollout.appended, own).astype(int).tolist(),
                "times": times, "run_calls": calls, "pauses": answered,
                "gathers": len(gathers)}


def child(args):
    """One process of a layout: its `rollouts` into `args.out` as JSON."""
    import jax

    if args.processes > 1:
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        jax.distributed.initialize(f"127.0.0.1:{args.port}", num_processes=args.processes,
                                   process_id=args.index)
    out = rollouts(args.processes, args.index, prompts=args.prompts, group=args.group,
                   max_new_tokens=args.max_new_tokens, repeats=args.repeats)
    pathlib.Path(args.out).write_text(json.dumps(out))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def layout(args, processes, scratch):
    """Runs one layout's processes; returns their outputs in process order."""
    port, commands = free_port(), []
    for index in range(processes):
        out = scratch / f"p{processes}_{index}.json"
        env = {**os.environ, "PYTHONPATH": str(REPO), "JAX_PLATFORMS": "cpu",
               "XLA_FLAGS": f"--xla_force_host_platform_device_count={8 // processes}"}
        command = [sys.executable, __file__, "--child", str(index), "--processes",
                   str(processes), "--port", str(port), "--out", str(out),
                   "--repeats", str(args.repeats), "--prompts", str(args.prompts),
                   "--group", str(args.group), "--max_new_tokens", str(args.max_new_tokens)]
        commands.append((subprocess.Popen(command, env=env, cwd=REPO), out))
    for process, _ in commands:
        if process.wait(timeout=1200):
            raise RuntimeError(f"a process of the {processes}-process layout failed")
    return [json.loads(out.read_text()) for _, out in commands]


def merged(parts, key):
    """A per-row field of every process's rows, in row order."""
    rows = [r for part in parts for r in part["rows"]]
    values = [v for part in parts for v in part[key]]
    return [v for _, v in sorted(zip(rows, values))]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--group", type=int, default=4)
    parser.add_argument("--max_new_tokens", type=int, default=64)
    parser.add_argument("--child", type=int, default=None, dest="index")
    parser.add_argument("--processes", type=int, default=1)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    if args.index is not None:
        return child(args)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO,
                            capture_output=True, text=True).stdout.strip()
    print(f"commit {commit}; {args.prompts} prompts x {args.group}, {args.max_new_tokens} new "
          f"tokens, load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    results = {}
    with tempfile.TemporaryDirectory() as scratch:
        for processes in (1, 2):
            results[processes] = layout(args, processes, pathlib.Path(scratch))
    for key in ("tokens", "lengths", "appended"):
        assert merged(results[1], key) == merged(results[2], key), f"{key} differ"
    print("the same rows token for token on 1 and 2 processes "
          f"(load average now {os.getloadavg()[0]:.1f})")
    header = ("processes", "s / rollout", "run calls", "pauses", "host gathers", "finished s",
              "run s", "turn_tokens s", "answer s")
    print(" | ".join(header))
    medians = {}
    for processes, parts in results.items():
        times = parts[0]["times"]   # process 0's
        median = lambda k: sorted(t[k] for t in times)[len(times) // 2]
        medians[processes] = median("seconds")
        print(" | ".join([str(processes), f"{medians[processes]:.2f}",
                          str(parts[0]["run_calls"]), str(sum(p["pauses"] for p in parts)),
                          str(parts[0]["gathers"]),
                          *(f"{median(name.split()[0]):.2f}" for name in header[5:])]))
    print(f"2 processes / 1 process: {medians[2] / medians[1]:.2f}x")


if __name__ == "__main__":
    main()
