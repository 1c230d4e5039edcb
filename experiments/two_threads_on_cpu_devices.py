"""Two threads running programs on the same CPU devices: why asynchronous RL takes turns.

One thread runs a program with an all-reduce over the devices in a loop (as the producer's
sampler does); the other copies a tree of sharded arrays in a loop (as the learner's step
does, among other programs). On a shared mesh of 8 CPU devices XLA's in-process all-reduce
can wait for a device that is running the other thread's program; after 40 s the runtime
aborts the process ("Termination timeout for `all reduce` ... Exiting to ensure a
consistent program state"). With `--turns` the threads take turns as
`grpo_jax.training.async_rl.DeviceTurns` makes them (a lock held until the program's
outputs are computed); with `--split` each thread has 4 devices of its own.

    python experiments/two_threads_on_cpu_devices.py --seconds 60            # aborts
    python experiments/two_threads_on_cpu_devices.py --seconds 60 --turns    # ok
    python experiments/two_threads_on_cpu_devices.py --seconds 60 --split    # ok

Seen on the 2-core machine (jax 0.10.2, `--seconds 30`, other tests running beside it):
without turns or a split it aborted (exit status 134) after the 40-s timeout; with
`--turns` 2,853 all-reduce programs and 13,173 copies; with `--split` 8,404 and 80,693.
"""

import argparse
import os
import threading
import time

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402  (after XLA_FLAGS)
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec as P  # noqa: E402

SHAPES = [(64, 32), (32, 64), (128,), (96, 32), (32,), (8, 16, 32)]


def sharded_tree(devices):
    """Arrays of `SHAPES` split over `devices` along their first axis where it divides."""
    mesh = Mesh(np.array(devices), ("fsdp",), axis_types=(AxisType.Auto,))
    return [jax.device_put(np.random.default_rng(0).random(shape, np.float32),
                           NamedSharding(mesh, P("fsdp") if shape[0] % len(devices) == 0 else P()))
            for shape in SHAPES]


@jax.jit
def reduce_program(tree, x):
    """A sum over every sharded array (an all-reduce over the devices), then some work."""
    for array in tree:
        x = x + jnp.sum(jnp.tanh(array)) * 1e-3
    return jnp.cumsum(jnp.broadcast_to(x, (64, 256)), axis=1)


copy_program = jax.jit(lambda tree: jax.tree.map(jnp.copy, tree))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--turns", action="store_true", help="one thread's programs at a time")
    parser.add_argument("--split", action="store_true", help="4 devices for each thread")
    args = parser.parse_args()
    devices = jax.devices()
    reducing = sharded_tree(devices[:4] if args.split else devices)
    copied = [sharded_tree(devices[4:] if args.split else devices)]
    lock = threading.Lock()

    def run(program, *inputs):
        if not args.turns:
            return program(*inputs)
        with lock:
            return jax.block_until_ready(program(*inputs))

    deadline = time.time() + args.seconds
    counts = {"all-reduce": 0, "copy": 0}

    def reduce_loop():
        x = jnp.zeros(())
        while time.time() < deadline:
            jax.device_get(run(reduce_program, reducing, x))
            counts["all-reduce"] += 1

    thread = threading.Thread(target=reduce_loop)
    thread.start()
    while time.time() < deadline:
        copied = copied[-2:] + [run(copy_program, copied[-1])]
        counts["copy"] += 1
    thread.join()
    print(f"ok: {counts['all-reduce']} all-reduce programs and {counts['copy']} copies in "
          f"{args.seconds:.0f} s ({'turns' if args.turns else 'no turns'}, "
          f"{'4 + 4 devices' if args.split else 'one mesh of 8 devices'})")


if __name__ == "__main__":
    main()
