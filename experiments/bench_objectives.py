"""Throughput of grpo_jax.objectives on CPU, beside eager PyTorch and the bandwidth limit.

    python experiments/bench_objectives.py            # B=256, T=1024, 15 repeats
    python experiments/bench_objectives.py --quick    # tiny shapes: a smoke run

Tables: (1) tokens/s of jit(value_and_grad) w.r.t. logp of every policy loss under every
aggregation mode; (2) rows/s of the advantage estimators at 4,096 rows; (3) the composed
DAPO objective (presets.dapo, which configs/dapo.py builds; loss and metrics) against a
plain eager PyTorch DAPO loss on the same data, values checked to agree; (4) its
memory-bandwidth limit: the bytes it must read and write once over measured copy bandwidth,
and the bytes its compiled HLO moves; (5) where its time goes, variants timed round by
round.

Timings are medians over --repeats rounds (each averages enough calls to last ~50 ms),
compilation and warm-up excluded, results block_until_ready. Each table times its rows
round by round, so load from other processes falls on all rows alike and the ratios
hold on a shared machine. Tokens are B*T positions, padding included; masks are ragged
(lengths uniform in [1, T]).
"""

import argparse
import os
import pathlib
import platform
import re
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from grpo_jax import objectives as objs  # noqa: E402  (runs from a checkout, uninstalled)

LOSSES = {  # name -> (function, keyword arguments): each recipe's clip range or gate.
    "ppo_clip_loss": (objs.ppo_clip_loss, dict(eps_low=0.2, eps_high=0.28)),
    "gspo_loss": (objs.gspo_loss, dict(eps_low=3e-4, eps_high=4e-4)),
    "cispo_loss": (objs.cispo_loss, dict(eps_low=1.0, eps_high=0.28)),
    "sapo_loss": (objs.sapo_loss, dict(tau_pos=1.0, tau_neg=1.05)),
}
GROUP_SIZE = 16  # DAPO's G


def interleaved(variants, repeats, repeat_s=0.05):
    """{name: (fn, args)} -> {name: median seconds per call of fn(*args)}.

    Rows are timed round by round, so load from other processes falls on all of them
    alike; a round runs enough calls of each to last ~repeat_s. Compilation and warm-up
    are excluded and every result is block_until_ready (a no-op for non-jax values).
    """
    calls, times = {}, {name: [] for name in variants}
    for name, (fn, args) in variants.items():
        jax.block_until_ready(fn(*args))
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        calls[name] = max(1, int(repeat_s / max(time.perf_counter() - start, 1e-6)))
    for _ in range(repeats):
        for name, (fn, args) in variants.items():
            start = time.perf_counter()
            for _ in range(calls[name]):
                jax.block_until_ready(fn(*args))
            times[name].append((time.perf_counter() - start) / calls[name])
    return {name: float(np.median(t)) for name, t in times.items()}


def make_batch(rows, seq, seed=0):
    """Ragged float32 batch: logp, old_logp (ratios spread across the clip), mask, adv."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, seq + 1, rows)
    mask = (np.arange(seq)[None, :] < lengths[:, None]).astype(np.float32)
    logp = np.log(rng.uniform(0.01, 1.0, (rows, seq))).astype(np.float32)
    old_logp = (logp + rng.normal(0.0, 0.3, (rows, seq))).astype(np.float32)
    rewards = rng.integers(0, 2, rows).astype(np.float32)
    adv = np.array(objs.group_advantages(jnp.asarray(rewards), GROUP_SIZE))
    return dict(logp=logp, old_logp=old_logp, mask=mask, advantages=adv, rewards=rewards)


def _torch():
    try:
        import torch
        return torch
    except ImportError:
        return None


def header(args, argv):
    cpu = re.search(r"model name\s*:\s*(.*)", pathlib.Path("/proc/cpuinfo").read_text())
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip()
    torch = _torch()
    now = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    print(f"# bench_objectives  commit {commit or '?'}  {now}")
    print(f"# CPU {cpu.group(1) if cpu else platform.processor()}, {os.cpu_count()} cores; python "
          f"{platform.python_version()}, jax {jax.__version__} ({jax.default_backend()}), numpy "
          f"{np.__version__}, torch {torch.__version__ if torch else 'not installed'}")
    print(f"# command: python experiments/bench_objectives.py {' '.join(argv)}".rstrip())
    print(f"# B={args.batch} T={args.seq} float32, median of {args.repeats} repeats; load "
          f"average at start {os.getloadavg()[0]:.1f} (other processes share the cores)\n")


def table(title, columns, rows):
    print(title)
    widths = [max(len(str(x)) for x in col) for col in zip(columns, *rows)]
    for cells in [columns, ["-" * w for w in widths], *rows]:
        print("  ".join(str(c).rjust(w) if i else str(c).ljust(w)
                        for i, (c, w) in enumerate(zip(cells, widths))))
    print()


# --- 1. Policy losses x aggregation modes ----------------------------------------------

def bench_losses(data, repeats):
    tokens = data["logp"].size
    inputs = [jnp.asarray(data[k]) for k in ("logp", "old_logp", "advantages", "mask")]
    variants = {}
    for name, (loss_fn, kwargs) in LOSSES.items():
        for mode in objs.AGGREGATION_MODES:
            def value(logp, old_logp, adv, mask, loss_fn=loss_fn, kwargs=kwargs, mode=mode):
                loss_bt, _ = loss_fn(logp, old_logp, adv, mask, **kwargs)
                return objs.aggregate(loss_bt, mask, mode=mode)
            variants[name, mode] = (jax.jit(jax.value_and_grad(value)), inputs)
    seconds = interleaved(variants, repeats)
    modes = objs.AGGREGATION_MODES
    rows = [[name, *(f"{tokens / seconds[name, m] / 1e6:.1f}" for m in modes)] for name in LOSSES]
    table(f"1. value+grad w.r.t. logp, Mtokens/s (B*T = {tokens:,}, {data['mask'].mean():.0%} "
          "valid)", ["loss", *modes], rows)


# --- 2. Advantage estimators -----------------------------------------------------------

def bench_advantages(rows, seq, repeats):
    data = make_batch(rows, seq, seed=1)
    rng = np.random.default_rng(2)
    mask, rewards = jnp.asarray(data["mask"]), jnp.asarray(data["rewards"])
    token_rewards = np.zeros_like(data["mask"])  # the scalar reward on the last valid token
    token_rewards[np.arange(rows), data["mask"].sum(axis=1).astype(int) - 1] = data["rewards"]
    values = jnp.asarray(rng.normal(size=(rows, seq)).astype(np.float32))
    multi = jnp.asarray(rng.integers(0, 2, (rows, 3)).astype(np.float32))
    g = GROUP_SIZE
    cases = {
        f"group_advantages (G={g})": (lambda r: objs.group_advantages(r, g), (rewards,)),
        f"rloo_advantages (G={g})": (lambda r: objs.rloo_advantages(r, g), (rewards,)),
        f"gdpo_advantages (G={g}, K=3)": (lambda r: objs.gdpo_advantages(r, g), (multi,)),
        f"reinforce_pp_advantages (T={seq})": (objs.reinforce_pp_advantages, (rewards, mask)),
        f"gae (T={seq}, gamma=1, lam=0.95)": (
            lambda r, v, m: objs.gae(r, v, m, gamma=1.0, lam=0.95),
            (jnp.asarray(token_rewards), values, mask)),
    }
    seconds = interleaved({k: (jax.jit(fn), args) for k, (fn, args) in cases.items()}, repeats)
    out = [[name, f"{rows / s:,.0f}", f"{s * 1e3:.3f}"] for name, s in seconds.items()]
    table(f"2. advantage estimators (forward), {rows:,} rows",
          ["function", "rows/s", "ms/call"], out)


# --- 3. Composed DAPO objective vs eager PyTorch ---------------------------------------

def dapo_objective(group_size):
    """DAPO's objective from its preset (what configs/dapo.py builds): core install only."""
    return objs.presets.dapo(group_size=group_size)


def torch_dapo(torch, eps_low, eps_high):
    """A plain eager (verl-style) DAPO loss: token-mean PPO clip and the same metrics."""

    def step(logp, old_logp, adv, mask):
        logp = logp.detach().requires_grad_(True)
        log_ratio = torch.clamp(logp - old_logp, -20.0, 20.0)
        ratio, adv = torch.exp(log_ratio), adv[:, None]
        loss_bt = torch.maximum(-adv * ratio, -adv * torch.clamp(ratio, 1 - eps_low, 1 + eps_high))
        count = mask.sum().clamp(min=1.0)
        loss = (loss_bt * mask).sum() / count
        loss.backward()
        with torch.no_grad():
            mean = lambda x: (x * mask).sum() / count
            kl_old = torch.clamp(torch.expm1(log_ratio) - log_ratio, min=0.0)   # r - 1 - log r
            metrics = {"loss": loss.detach(), "policy_loss": loss.detach(),
                       "ratio": mean(ratio), "kl_old": mean(kl_old),
                       "clip_high": mean(((adv > 0) & (ratio > 1 + eps_high)).float()),
                       "clip_low": mean(((adv < 0) & (ratio < 1 - eps_low)).float())}
        return (loss.detach(), metrics), logp.grad

    return step


def bench_dapo(data, repeats):
    objective, tokens = dapo_objective(group_size=16), data["logp"].size
    cfg = objective.spec
    logp = jnp.asarray(data["logp"])
    batch = {k: jnp.asarray(data[k]) for k in ("old_logp", "mask", "advantages")}
    fn = jax.jit(jax.value_and_grad(objective, has_aux=True))
    variants = {"jax.jit(value_and_grad(policy_objective(dapo)))": (fn, (logp, batch))}
    torch, check = _torch(), "torch not installed: no eager comparison"
    if torch is not None:
        step = torch_dapo(torch, cfg.eps_low, cfg.eps_high)
        targs = [torch.from_numpy(data[k]) for k in ("logp", "old_logp", "advantages", "mask")]
        for threads in sorted({torch.get_num_threads(), 1}, reverse=True):  # credit torch its best
            variants[f"torch eager forward+backward, {threads} thread(s)"] = (
                _with_threads(torch, threads, step), targs)
        (_, metrics), grad = fn(logp, batch)
        (_, t_metrics), t_grad = step(*targs)
        diff = max(abs(float(metrics[k]) - float(t_metrics[k])) for k in t_metrics)
        grad_diff = float(np.max(np.abs(np.asarray(grad) - t_grad.numpy())))
        assert diff < 1e-5 and grad_diff < 1e-6, (diff, grad_diff)
        check = (f"values agree: max |metric diff| {diff:.1e} over {sorted(t_metrics)}; "
                 f"max |grad diff| {grad_diff:.1e}")
    seconds = interleaved(variants, repeats)
    rows = [[name, f"{tokens / s / 1e6:.1f}", f"{s * 1e3:.3f}"] for name, s in seconds.items()]
    jax_s = seconds.pop(next(iter(variants)))
    if seconds:
        ratio = min(seconds.values()) / jax_s
        rows.append(["ratio JAX / fastest torch (target >= 5x)", f"{ratio:.1f}x", ""])
    table(f"3. composed DAPO objective (presets.dapo: {cfg.policy_loss}, eps {cfg.eps_low}/"
          f"{cfg.eps_high}, {cfg.aggregation}), value+grad with its metrics, interleaved",
          ["implementation", "Mtokens/s", "ms/call"], rows)
    print(check, "\n")
    return dict(seconds=jax_s, fn=fn, logp=logp, batch=batch, cfg=cfg)


def _with_threads(torch, threads, step):
    def run(*args):
        torch.set_num_threads(threads)
        return step(*args)
    return run


# --- 4. Memory-bandwidth limit ---------------------------------------------------------

def copy_bandwidth(nbytes, repeats):
    """Bytes read + written per second: numpy copyto, and a jitted jax a+1 done in place."""
    src = np.random.default_rng(0).random(nbytes // 4, dtype=np.float32)
    add_one, state = jax.jit(lambda a: a + 1.0, donate_argnums=0), [jnp.asarray(src)]

    def step():  # donated: the output reuses the input buffer, no fresh pages to fault in
        state[0] = add_one(state[0])
        return state[0]

    seconds = interleaved({"numpy copyto": (np.copyto, (np.empty_like(src), src)),
                           "jax a+1": (step, ())}, repeats)
    return {name: 2 * nbytes / s for name, s in seconds.items()}


def hlo_traffic(compiled_text):
    """(fusions, other ops, bytes) of ENTRY: every op's operands and output, counted once each."""
    entry = compiled_text[compiled_text.index("\nENTRY"):]
    shapes, fusions, others, moved = {}, 0, 0, 0
    for name, shape, op, operands in re.findall(r"(%[\w.\-]+) = (.+?) ([\w\-]+)\((.*?)\)", entry):
        shapes[name] = sum({"pred": 1, "s8": 1, "u8": 1, "bf16": 2, "f16": 2}.get(t, 4)
                           * int(np.prod([int(d) for d in dims.split(",") if d]))
                           for t, dims in re.findall(r"(\w+)\[([\d,]*)\]", shape))
        if op not in ("parameter", "constant", "tuple", "get-tuple-element", "bitcast"):
            fusions, others = fusions + (op == "fusion"), others + (op != "fusion")
            inputs = re.findall(r"%[\w.\-]+", operands)
            moved += shapes[name] + sum(shapes.get(o, 0) for o in inputs)
    return fusions, others, moved


def _size(nbytes):
    return f"{nbytes / 2**20:.1f} MiB" if nbytes >= 2**20 else f"{nbytes / 2**10:.1f} KiB"


def bench_limit(dapo, repeats, dram_bytes):
    rows_b, seq = dapo["logp"].shape
    tokens = rows_b * seq
    min_bytes = 4 * (4 * tokens + rows_b)  # read logp, old_logp, mask, adv [B]; write the grad
    measured = tokens / dapo["seconds"]
    fusions, others, moved = hlo_traffic(
        dapo["fn"].lower(dapo["logp"], dapo["batch"]).compile().as_text())
    out = [["minimum traffic of the DAPO value+grad", f"{_size(min_bytes)} "
            f"({min_bytes // tokens} B/token)"],
           ["its compiled HLO (ENTRY)", f"{fusions} fusions + {others} other ops moving "
            f"{_size(moved)} = {moved / min_bytes:.1f}x the minimum"]]
    for where, nbytes in (("DRAM", dram_bytes), ("cache", min_bytes // 2)):
        bandwidth = copy_bandwidth(nbytes, repeats)
        out += [[f"copy bandwidth, {where}: {_size(nbytes)} ({k})", f"{v / 1e9:.1f} GB/s"]
                for k, v in bandwidth.items()]
        limit = max(bandwidth.values()) / min_bytes * tokens
        out.append([f"  -> {where} limit (best copy)", f"{limit / 1e6:.0f} Mtokens/s; measured "
                    f"{measured / 1e6:.1f} = {measured / limit:.0%} of it"])
    table("4. memory-bandwidth limit of the DAPO value+grad", ["quantity", "value"], out)


# --- 5. Where the DAPO time goes --------------------------------------------------------

def lean_dapo(loss_cfg):
    """EXPERIMENT, not the library: policy_objective's DAPO path (no KL, entropy or
    importance weights), equal values, with the valid tokens counted as a float32 sum
    (XLA:CPU turns the bool count into an s32 copy + reduce-window) and the six metric
    sums taken by ONE reduction over a stacked [6, B, T] array instead of one each."""

    def objective(logp, batch):
        valid = batch["mask"].astype(bool)
        loss_bt, diagnostics = objs.ppo_clip_loss(
            logp, batch["old_logp"], batch["advantages"], batch["mask"],
            eps_low=loss_cfg.eps_low, eps_high=loss_cfg.eps_high)
        count = jnp.maximum(jnp.sum(valid.astype(jnp.float32)), 1.0)  # exact below 2**24
        loss = jnp.sum(jnp.where(valid, loss_bt, 0.0)) / count
        diagnostics["nonfinite_logp"] = ~(jnp.isfinite(logp) & jnp.isfinite(batch["old_logp"]))
        stacked = jnp.stack([jnp.where(valid, v, 0.0) for v in diagnostics.values()])
        metrics = dict(zip(diagnostics, jnp.sum(stacked, axis=(1, 2)) / count))
        return loss, {**metrics, "policy_loss": loss, "loss": loss}

    return objective


def bench_variants(dapo, repeats):
    logp, batch, loss_cfg = dapo["logp"], dapo["batch"], dapo["cfg"]
    lean = jax.jit(jax.value_and_grad(lean_dapo(loss_cfg), has_aux=True))
    (_, metrics), grad = dapo["fn"](logp, batch)
    (_, lean_metrics), lean_grad = lean(logp, batch)
    diff = max(abs(float(metrics[k]) - float(lean_metrics[k])) for k in metrics)
    assert diff < 1e-6 and bool(jnp.all(grad == lean_grad)), diff

    def loss_only(logp, batch):
        loss_bt, _ = objs.ppo_clip_loss(logp, batch["old_logp"], batch["advantages"], batch["mask"],
                                        eps_low=loss_cfg.eps_low, eps_high=loss_cfg.eps_high)
        return objs.aggregate(loss_bt, batch["mask"], mode="token-mean")

    variants = {"policy_objective(dapo): loss + 6 metrics": (dapo["fn"], (logp, batch)),
                "experimental lean_dapo: same values": (lean, (logp, batch)),
                "ppo_clip_loss + aggregate, no metrics": (jax.jit(jax.value_and_grad(loss_only)),
                                                          (logp, batch))}
    times = interleaved(variants, repeats)
    base, rows = times[next(iter(variants))], []
    for name, (fn, args) in variants.items():
        fusions, _, moved = hlo_traffic(fn.lower(*args).compile().as_text())
        rows.append([name, f"{times[name] * 1e3:.3f}", f"{base / times[name]:.2f}x", fusions,
                     _size(moved)])
    table("5. where the DAPO value+grad time goes (interleaved)",
          ["variant", "ms/call", "speed-up", "fusions", "HLO traffic"], rows)
    print(f"lean_dapo agrees with the library: max |metric diff| {diff:.1e}, gradient identical\n")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, default=256, help="rows B")
    parser.add_argument("--seq", type=int, default=1024, help="response tokens T")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--quick", action="store_true", help="tiny shapes, 3 repeats (smoke test)")
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parser.parse_args(argv)
    adv_rows, dram_bytes = 4096, 1 << 30
    if args.quick:
        args.batch, args.seq, args.repeats, adv_rows, dram_bytes = 16, 32, 3, 32, 16 << 20
    header(args, argv)
    data = make_batch(args.batch, args.seq)
    bench_losses(data, args.repeats)
    bench_advantages(adv_rows, args.seq, args.repeats)
    dapo = bench_dapo(data, args.repeats)
    bench_limit(dapo, args.repeats, dram_bytes)
    bench_variants(dapo, args.repeats)


if __name__ == "__main__":
    main()
