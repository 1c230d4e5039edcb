"""Packed against padded forward passes on a long-tailed length distribution.

    python experiments/bench_packing.py                 # V = 151,936 (Qwen3's), budgets 64..512
    python experiments/bench_packing.py --quick         # V = 4,096, budgets 64 and 256, 1 repeat

The trainer's own programs (`training.programs.policy_programs`, DAPO's objective) on the
named "tiny" model (qwen3, D = 128, 3 layers, float32) with Qwen3's vocabulary, randomly
initialised. One RL batch of P prompts of 32 tokens x G completions whose lengths are drawn
as in experiments/bench_engine.py (lognormal, sigma 0.8, p99 at the budget: p99 / mean ~
4.7). For each budget: one optimizer update on the whole batch (`Programs.update`) and
pi_old's forward (`Programs.forward`), padded (`train.packing="off"`) and packed ("on");
the best of --repeats after a compiling call, seconds per call, and how many rows the
packed pieces have per padded row (`pack_rows_fraction`). The packed update's loss is
checked against the padded one's (the same batch: equal up to float reordering).
"""

import argparse
import platform
import time

import jax
import numpy as np
from flax import nnx

from grpo_jax import config_lib, models, parallel
from grpo_jax.training import packing, programs

parallel.use_cpu_cores()   # before JAX runs anything; a no-op when XLA_FLAGS sets the count

from bench_engine import lognormal_lengths  # noqa: E402  (the same distribution)
from _bench_common import table  # noqa: E402

PROMPT_LEN = 32


def rl_rows(config, cfg, lengths, rng):
    """A batch in the trainer's layout (`programs.batch_layout`) with completions of `lengths`."""
    layout = programs.batch_layout(config, cfg, PROMPT_LEN)
    n = config.rollout.max_new_tokens
    rows = {}
    for key, (shape, dtype) in layout.items():
        if np.issubdtype(dtype, np.integer):
            rows[key] = rng.integers(1, cfg.vocab_size, shape).astype(dtype)
        elif np.issubdtype(dtype, np.bool_):
            rows[key] = np.ones(shape, bool)
        else:
            rows[key] = rng.normal(-2.0, 0.5, shape).astype(dtype)
    rows["prompt_mask"] = np.ones_like(rows["prompt_mask"])
    rows["mask"] = (np.arange(n)[None] < lengths[:, None]).astype(np.int32)
    rows["lengths"], rows["truncated"] = lengths.astype(np.int32), lengths >= n
    rows["advantages"] = rng.normal(size=rows["advantages"].shape).astype(np.float32)
    return rows


def best_of(repeats, call):
    """(seconds of the fastest of `repeats` calls after a first, compiling one, its result)."""
    result = jax.block_until_ready(call())
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        result = jax.block_until_ready(call())
        times.append(time.perf_counter() - start)
    return min(times), result


def measure(config, mesh, graphdef, params, rows, repeats):
    """Per mode ("off", "on"): (update s, forward s, loss, rows fraction)."""
    objective = programs.rl_objective(config)
    run = programs.policy_programs(config, mesh, graphdef, params, objective)
    opt_state = jax.jit(run.tx.init)(params)
    batch = parallel.global_rows(mesh, rows)
    b = rows["mask"].shape[0]
    index = np.arange(b, dtype=np.int32)
    results = {}
    for mode in ("off", "on"):
        plan = update_plan = None
        if mode == "on":
            planner = packing.Planner.of(batch, mesh)
            plan, stats = planner.chunks(run.pieces)
            update_plan = planner.pieces(index.reshape(-1, config.train.micro_batches).T)
        state = {"params": params, "opt": opt_state}

        def update():
            copy = jax.tree.map(lambda x: x.copy(), state)  # the update donates its inputs
            return run.update(copy["params"], copy["opt"], batch, index, plan=update_plan)[2][
                "loss"
            ]

        update_s, loss = best_of(repeats, update)
        forward_s, _ = best_of(repeats, lambda: run.forward(params, batch, plan))
        fraction = 1.0 if plan is None else stats["pack_rows_fraction"]
        results[mode] = (update_s, forward_s, float(loss), fraction)
    return results


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick", action="store_true", help="V = 4,096, budgets 64 and 256, 1 repeat"
    )
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--group_size", type=int, default=8)
    parser.add_argument("--budgets", default="64,128,256,512")
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args(argv)
    vocab, budgets = (
        (4096, (64, 256)) if args.quick else (151_936, tuple(map(int, args.budgets.split(","))))
    )
    repeats = 1 if args.quick else args.repeats
    mesh = parallel.make_mesh(f"data={len(jax.devices())},fsdp=1,tensor=1")
    cfg = models.get_model_config("tiny", vocab_size=vocab)
    graphdef, params = nnx.split(models.init_model(cfg, seed=0, mesh=mesh))
    print(f"# {platform.node()} {platform.processor() or platform.machine()}, "
          f"{len(jax.devices())} {jax.devices()[0].platform} devices, jax {jax.__version__}; "
          f"P={args.prompts} x G={args.group_size} rows, prompts of {PROMPT_LEN} tokens, V={vocab}")
    table_rows = []
    for budget in budgets:
        config = config_lib.apply_overrides(config_lib.load_config("configs/dapo.py"), {
            "rollout.max_new_tokens": budget, "rollout.prompts_per_batch": args.prompts,
            "objective.group_size": args.group_size})
        lengths = lognormal_lengths(
            args.prompts * args.group_size, budget, np.random.default_rng(budget)
        )
        rows = rl_rows(config, cfg, lengths, np.random.default_rng(0))
        result = measure(config, mesh, graphdef, params, rows, repeats)
        (pad_u, pad_f, pad_loss, _), (pack_u, pack_f, pack_loss, fraction) = (
            result["off"], result["on"],
        )
        assert abs(pack_loss - pad_loss) <= 1e-5 * max(1.0, abs(pad_loss)), (pack_loss, pad_loss)
        print(f"budget {budget}: update {pad_u:.3f} s padded, {pack_u:.3f} s packed; forward "
              f"{pad_f:.3f} / {pack_f:.3f} s", flush=True)
        table_rows.append(
            [
                budget, f"{lengths.mean():.0f}", f"{lengths.mean() / budget:.2f}",
                f"{fraction:.3f}", f"{pad_u:.3f}", f"{pack_u:.3f}", f"{pad_u / pack_u:.2f}x",
                f"{pad_f:.3f}", f"{pack_f:.3f}", f"{pad_f / pack_f:.2f}x",
            ]
        )
    table("update (fwd + bwd + AdamW) and pi_old's forward, seconds per call, best of "
          f"{repeats}", ["budget", "mean len", "mean/budget", "packed rows", "update padded",
                         "packed", "speed-up", "forward padded", "packed", "speed-up"], table_rows)


if __name__ == "__main__":
    main()
