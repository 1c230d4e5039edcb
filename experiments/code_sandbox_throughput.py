"""Programs per second of the code reward: HumanEval's 164 canonical solutions scored by
`code_tests` in a grader pool, per sandbox backend.

  python experiments/code_sandbox_throughput.py [--workers 2] [--repeats 2]

Prints, per backend, the seconds and programs per second of each pass over the 164
programs, the passes' pass count (164 expected) and the 1-minute load average before and
after, since the machine may be shared.
"""

import argparse
import os
import tempfile
import time

from grpo_jax import data
from grpo_jax import rewards


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as data_dir:
        source = data.data_source("humaneval", split="test", data_dir=data_dir)
        examples = [data.decode_example(record) for record in source]
    calls = [("p", example["solution"], example) for example in examples]
    backends = ["subprocess"] + (["bwrap"] if rewards.bwrap_works() else [])
    with rewards.GraderPool(args.workers, timeout_s=30.0) as pool:
        for backend in backends:
            print(rewards.describe_sandbox(rewards.get_sandbox(backend)))
            for _ in range(args.repeats):
                load = os.getloadavg()[0]
                start = time.monotonic()
                outcomes = pool.map(rewards.code_tests_reward, calls, {"backend": backend})
                seconds = time.monotonic() - start
                passed = sum(outcome.value for outcome in outcomes)
                print(f"{backend}: {len(calls)} programs in {seconds:.1f} s = "
                      f"{len(calls) / seconds:.1f} programs/s, {passed:.0f} passed, "
                      f"{args.workers} workers, load {load:.1f} -> {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
