"""Records peers' own outputs for GMPO, DPPO, M2PO, Clip-Cov and KL-Cov.

Runs each peer's function, unmodified, with torch (float64) on fixed seeded inputs and
writes tests/objectives/peer_outputs/<name>.json: the peer's repository, file, commit and
function, the inputs, and the peer's outputs (the aggregated loss per loss_agg_mode and
its gradient with respect to ``log_prob``; the mask for M2PO). The tests
(tests/objectives/test_trust_region.py) read those files and need neither torch nor the
network. Nothing of the peers is copied: their files are read from trees extracted from
their repositories, and the heavy modules they import (omegaconf, verl's config classes,
tensordict through verl.utils) are replaced by small stand-ins in ``sys.modules``.

Extract the trees (commits recorded in the JSON files) and run, e.g.:

    mkdir -p /tmp/peers/{verl,stable_rl,areal,entropy}
    git --git-dir=$VERL archive HEAD verl/trainer/ppo/core_algos.py \\
        verl/utils/torch_functional.py | tar -x -C /tmp/peers/verl
    (likewise sail-sg/Stable-RL -> stable_rl, PRIME-RL/Entropy-Mechanism-of-RL -> entropy,
     and inclusionAI/AReaL's areal/trainer/ppo/actor.py -> areal)
    python experiments/peer_agreement/record_trust_region.py \\
        --verl_dir /tmp/peers/verl --verl_commit $(git --git-dir=$VERL rev-parse HEAD) \\
        --stable_rl_dir /tmp/peers/stable_rl --stable_rl_commit ... \\
        --entropy_dir /tmp/peers/entropy --entropy_commit ... \\
        --areal_dir /tmp/peers/areal --areal_commit ...
"""

import argparse
import ast
import contextlib
import importlib.util
import json
import math
import pathlib
import sys
import types

import numpy as np
import torch

B, T = 6, 7
OUT_DIR = pathlib.Path(__file__).resolve().parents[2] / "tests" / "objectives" / "peer_outputs"
CORE_ALGOS = "verl/trainer/ppo/core_algos.py"
TORCH_FUNCTIONAL = "verl/utils/torch_functional.py"
AREAL_ACTOR = "areal/trainer/ppo/actor.py"


# --------------------------------------------------------------------------- loading peers

def _functions_from(path, names, namespace):
    """Executes the top-level functions `names` of the file at `path` in `namespace`."""
    tree = ast.parse(pathlib.Path(path).read_text())
    wanted = [
        node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name in names
    ]
    missing = set(names) - {node.name for node in wanted}
    if missing:
        raise ValueError(f"{path} lacks {sorted(missing)}")
    exec(compile(ast.Module(body=wanted, type_ignores=[]), str(path), "exec"), namespace)
    return namespace


def _module(name, **attrs):
    module = types.ModuleType(name)
    module.__dict__.update(attrs)
    return module


class _Config(dict):
    """Attribute and .get access, the two ways verl reads its actor config."""

    def __getattr__(self, name):
        try:
            return self[name]
        except KeyError as e:
            raise AttributeError(name) from e


@contextlib.contextmanager
def _stubbed_verl(tree):
    """The modules a verl core_algos.py imports, reduced to what its losses call."""
    functional = _functions_from(pathlib.Path(tree) / TORCH_FUNCTIONAL,
                                 ["masked_sum", "masked_mean"], {"torch": torch})
    functional_module = _module("verl.utils.torch_functional",
                                masked_sum=functional["masked_sum"],
                                masked_mean=functional["masked_mean"])
    unused = lambda *a, **k: None  # noqa: E731
    stubs = {
        "omegaconf": _module("omegaconf", DictConfig=type("DictConfig", (dict,), {})),
        "verl": _module("verl"),
        "verl.utils": _module("verl.utils", as_torch_index=unused, group_mean_std=unused,
                              torch_functional=functional_module),
        "verl.utils.torch_functional": functional_module,
        "verl.utils.import_utils": _module("verl.utils.import_utils",
                                           deprecated=lambda *a, **k: (lambda f: f)),
        "verl.trainer": _module("verl.trainer"),
        "verl.trainer.config": _module("verl.trainer.config",
                                       AlgoConfig=type("AlgoConfig", (), {})),
        "verl.workers": _module("verl.workers"),
        "verl.workers.config": _module("verl.workers.config",
                                       ActorConfig=type("ActorConfig", (), {})),
    }
    saved = {name: sys.modules.get(name) for name in stubs}
    sys.modules.update(stubs)
    try:
        yield
    finally:
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module


def load_core_algos(tree, label):
    with _stubbed_verl(tree):
        spec = importlib.util.spec_from_file_location(f"peer_core_algos_{label}",
                                                      pathlib.Path(tree) / CORE_ALGOS)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    return module


# --------------------------------------------------------------------------- inputs

def _mask(lengths):
    return np.array([[1.0 if t < n else 0.0 for t in range(T)] for n in lengths])


def _inputs(seed, *, lengths, adv_rows, spread, per_token_adv=False, prob_moves=None):
    """Seeded float64 inputs; padding holds arbitrary finite values (the peers mask them).

    spread: std of logp - old_logp; prob_moves: instead, std of pi - mu in probability
    (DPPO's divergences act on probabilities).
    """
    rng = np.random.default_rng(seed)
    mu = rng.uniform(0.03, 0.97, (B, T))
    old = np.log(mu)
    if prob_moves is None:
        logp = np.minimum(old + rng.normal(0.0, spread, (B, T)), math.log(0.995))
    else:
        logp = np.log(np.clip(mu + rng.normal(0.0, prob_moves, (B, T)), 0.005, 0.995))
    adv = np.repeat(np.asarray(adv_rows, float)[:, None], T, axis=1)
    if per_token_adv:
        adv = adv + rng.normal(0.0, 0.5, (B, T))
    return {"log_prob": logp, "old_log_prob": old, "advantages": adv,
            "response_mask": _mask(lengths)}


RAGGED = [7, 5, 3, 6, 2, 0]      # one row fully masked
FULL = [7, 7, 7, 7, 7, 7]
ADV = [1.3, -0.7, 0.4, -1.6, 2.1, -0.2]
ADV_WITH_ZERO = [1.3, -0.7, 0.0, -1.6, 2.1, 0.9]


def _tensors(inputs):
    t = {k: torch.tensor(v, dtype=torch.float64) for k, v in inputs.items()}
    t["log_prob"].requires_grad_(True)
    return t


def _run(fn, inputs, modes, **kwargs):
    """{mode: {"loss", "grad"}} and the first call's metrics."""
    outputs, metrics = {}, None
    for mode in modes:
        t = _tensors(inputs)
        result = fn(old_log_prob=t["old_log_prob"], log_prob=t["log_prob"],
                    advantages=t["advantages"], response_mask=t["response_mask"],
                    loss_agg_mode=mode, **kwargs)
        loss = result[0]
        loss.backward()
        outputs[mode] = {"loss": loss.item(), "grad": t["log_prob"].grad.tolist()}
        if metrics is None:
            metrics = {k: (v.item() if torch.is_tensor(v) else v) for k, v in
                       (result[1].items() if isinstance(result[1], dict) else
                        enumerate(result))}
    return outputs, metrics


def _listed(inputs):
    return {k: np.asarray(v).tolist() for k, v in inputs.items()}


def _write(name, peer, cases):
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    record = {"peer": peer,
              "recorded_with": {"torch": torch.__version__, "dtype": "float64",
                                "script": "experiments/peer_agreement/record_trust_region.py"},
              "cases": cases}
    path = OUT_DIR / f"{name}.json"
    path.write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {path} ({len(cases)} cases)")


MODES = ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"]


# --------------------------------------------------------------------------- per peer

def record_gmpo(verl, commit):
    fn = verl.compute_policy_loss_geo_mean
    cases = []
    for name, seed, lengths, adv, spread, lo, hi in [
            ("symmetric_0.4_ragged", 0, RAGGED, ADV, 0.45, 0.4, 0.4),
            ("symmetric_0.4_full_zero_adv", 1, FULL, ADV_WITH_ZERO, 0.5, 0.4, 0.4),
            ("asymmetric_0.2_0.3", 2, RAGGED, ADV, 0.35, 0.2, 0.3),
            ("wide_moves", 3, [1, 7, 4, 5, 7, 3], ADV, 1.0, 0.4, 0.4)]:
        inputs = _inputs(seed, lengths=lengths, adv_rows=adv, spread=spread)
        config = _Config(clip_ratio=0.4, clip_ratio_low=lo, clip_ratio_high=hi,
                         global_batch_info={})
        outputs, metrics = _run(fn, inputs, ["token-mean"], config=config)
        cases.append({"name": name, "kwargs": {"eps_low": lo, "eps_high": hi},
                      "inputs": _listed(inputs),
                      # geo_mean ignores loss_agg_mode: its loss is the mean over all rows
                      "outputs": {"seq-mean-token-mean": outputs["token-mean"]},
                      "metrics": metrics})
    _write("gmpo_verl", {"repo": "verl-project/verl", "commit": commit, "file": CORE_ALGOS,
                         "function": "compute_policy_loss_geo_mean",
                         "registered_as": "geo_mean"}, cases)


DPPO_CASES = [  # name, seed, lengths, adv rows, prob std, per-token adv, delta_low, delta_high, cap
    ("tv_ragged", 10, RAGGED, ADV, 0.15, False, 0.15, 0.15, 20.0),
    ("tv_asymmetric_token_adv", 11, FULL, ADV_WITH_ZERO, 0.2, True, 0.1, 0.2, 20.0),
    ("tv_cap_3", 12, RAGGED, ADV, 0.25, False, 0.15, 0.15, 3.0),
    ("kl_ragged", 13, RAGGED, ADV, 0.15, False, 0.05, 0.05, 20.0),
    ("kl_asymmetric_token_adv", 14, FULL, ADV_WITH_ZERO, 0.2, True, 0.03, 0.08, 20.0),
    ("kl_cap_3", 15, RAGGED, ADV, 0.25, False, 0.05, 0.05, 3.0),
]


def _dppo_cases(call):
    cases = []
    for name, seed, lengths, adv, moves, per_token, lo, hi, cap in DPPO_CASES:
        inputs = _inputs(seed, lengths=lengths, adv_rows=adv, spread=None, prob_moves=moves,
                         per_token_adv=per_token)
        divergence = "binary_tv" if name.startswith("tv") else "binary_kl"
        config = _Config(clip_ratio=lo, clip_ratio_low=lo, clip_ratio_high=hi,
                         clip_ratio_c=cap, global_batch_info={}, policy_loss=_Config())
        outputs, metrics = call(divergence, inputs, config)
        cases.append({"name": name, "kwargs": {"divergence": divergence, "delta_low": lo,
                                               "delta_high": hi, "ratio_cap": cap},
                      "inputs": _listed(inputs), "outputs": outputs, "metrics": metrics})
    return cases


def record_dppo(verl, commit):
    fns = {"binary_tv": verl.compute_policy_loss_dppo_tv,
           "binary_kl": verl.compute_policy_loss_dppo_kl}
    cases = _dppo_cases(lambda div, inputs, config: _run(fns[div], inputs, MODES, config=config))
    _write("dppo_verl", {"repo": "verl-project/verl", "commit": commit, "file": CORE_ALGOS,
                         "function": {"binary_tv": "compute_policy_loss_dppo_tv",
                                      "binary_kl": "compute_policy_loss_dppo_kl"},
                         "registered_as": {"binary_tv": "dppo_tv", "binary_kl": "dppo_kl"}},
           cases)


def record_dppo_stable_rl(stable, commit):
    """The authors' own: the loss registered as dppo_binary_tv / dppo_binary_kl, with the
    rollout log-probs equal to the old ones (the ratio and the mask both use them)."""
    modes = {"binary_tv": "dppo_binary_tv", "binary_kl": "dppo_binary_kl"}

    def call(divergence, inputs, config):
        zeros = torch.zeros(B, T, dtype=torch.float64)
        rollout = torch.tensor(inputs["old_log_prob"], dtype=torch.float64)
        return _run(stable.POLICY_LOSS_REGISTRY[modes[divergence]], inputs, MODES,
                    config=config, rollout_log_prob=rollout, topk_kl=zeros, topk_tv=zeros,
                    entropy=zeros)

    def metrics_only_scalars(cases):
        for case in cases:
            case["metrics"] = {k: v for k, v in case["metrics"].items()
                               if isinstance(v, float)}
        return cases

    _write("dppo_stable_rl", {"repo": "sail-sg/Stable-RL", "commit": commit, "file": CORE_ALGOS,
                              "function": "compute_policy_loss_with_mask",
                              "registered_as": modes},
           metrics_only_scalars(_dppo_cases(call)))


@contextlib.contextmanager
def _capture_selection(captured):
    """Records verl's draw: the candidates torch.nonzero lists and torch.randperm's order."""
    randperm, nonzero = torch.randperm, torch.nonzero

    def recording_randperm(n, *args, **kwargs):
        captured["perm"] = randperm(n, *args, **kwargs)
        return captured["perm"]

    def recording_nonzero(x, *args, **kwargs):
        out = nonzero(x, *args, **kwargs)
        if x.dtype == torch.bool and x.dim() == 2 and not kwargs.get("as_tuple", False):
            captured["candidates"] = out
        return out

    torch.randperm, torch.nonzero = recording_randperm, recording_nonzero
    try:
        yield
    finally:
        torch.randperm, torch.nonzero = randperm, nonzero


CLIP_COV_CASES = [  # name, seed, lengths, adv rows, spread, per-token adv, fraction, eps
    ("all_candidates_eps_1", 20, RAGGED, [2.2, -1.8, 1.5, -2.4, 2.0, 0.5], 0.3, False, 1.0, 1.0),
    ("all_candidates_eps_0.2", 21, FULL, [2.2, -1.8, 1.5, -2.4, 2.0, -1.0], 0.3, True, 1.0, 0.2),
    ("random_tenth", 22, FULL, [2.2, -1.8, 1.5, -2.4, 2.0, -1.0], 0.3, False, 0.1, 0.2),
    ("random_one", 23, RAGGED, [2.2, -1.8, 1.5, -2.4, 2.0, 0.5], 0.3, True, 1e-4, 1.0),
]


def _clip_cov_cases(call):
    cases = []
    for name, seed, lengths, adv, spread, per_token, fraction, eps in CLIP_COV_CASES:
        inputs = _inputs(seed, lengths=lengths, adv_rows=adv, spread=spread,
                         per_token_adv=per_token)
        outputs, metrics, draw = call(inputs, fraction, eps)
        cases.append({"name": name, "kwargs": {"clip_fraction": fraction, "cov_low": 1.0,
                                               "cov_high": 5.0, "eps_low": eps, "eps_high": eps},
                      "inputs": _listed(inputs), "outputs": outputs, "metrics": metrics, **draw})
    return cases


def _draw(captured, metrics, inputs, clipfrac_key):
    """The candidates and the chosen tokens of verl's draw, as [B, T] 0/1 arrays."""
    candidates = np.zeros((B, T))
    chosen = np.zeros((B, T))
    idx = captured["candidates"].numpy()
    candidates[idx[:, 0], idx[:, 1]] = 1.0
    n_chosen = int(round(metrics[clipfrac_key] * inputs["response_mask"].sum()))
    if len(idx):
        picked = idx[captured["perm"].numpy()[:n_chosen]]
        chosen[picked[:, 0], picked[:, 1]] = 1.0
    return {"candidates": candidates.tolist(), "chosen": chosen.tolist()}


def record_clip_cov(verl, commit):
    def call(inputs, fraction, eps):
        config = _Config(clip_ratio=eps, clip_ratio_low=eps, clip_ratio_high=eps,
                         global_batch_info={},
                         policy_loss=_Config(clip_cov_ratio=fraction, clip_cov_lb=1.0,
                                             clip_cov_ub=5.0))
        outputs, metrics, draws = {}, None, []
        for mode in MODES:
            captured = {}
            torch.manual_seed(0)
            with _capture_selection(captured):
                out, m = _run(verl.compute_policy_loss_clip_cov, inputs, [mode], config=config)
            outputs.update(out)
            metrics = metrics or m
            draws.append(_draw(captured, m, inputs, "actor/pg_clipfrac"))
        assert all(d == draws[0] for d in draws), "the same seed drew different tokens"
        return outputs, metrics, draws[0]

    _write("clip_cov_verl", {"repo": "verl-project/verl", "commit": commit, "file": CORE_ALGOS,
                             "function": "compute_policy_loss_clip_cov",
                             "registered_as": "clip_cov",
                             "draw": "torch.manual_seed(0) before each call; candidates from "
                                     "its torch.nonzero, chosen from its torch.randperm"},
           _clip_cov_cases(call))


def record_clip_cov_authors(entropy, commit):
    def call(inputs, fraction, eps):
        captured = {}
        torch.manual_seed(0)
        with _capture_selection(captured):
            outputs, metrics = _run(entropy.compute_policy_loss_clip_cov, inputs, ["token-mean"],
                                    cliprange=eps, cliprange_low=eps, cliprange_high=eps,
                                    clip_ratio=fraction, clip_cov_lb=1.0, clip_cov_ub=5.0)
        metrics = {"pg_clipfrac": metrics[1], "ppo_kl": metrics[2]}
        return outputs, metrics, _draw(captured, metrics, inputs, "pg_clipfrac")

    _write("clip_cov_authors", {"repo": "PRIME-RL/Entropy-Mechanism-of-RL", "commit": commit,
                                "file": CORE_ALGOS, "function": "compute_policy_loss_clip_cov"},
           _clip_cov_cases(call))


KL_COV_CASES = [  # name, seed, lengths, adv rows, spread, per-token adv, fraction, coef
    ("tenth_ragged", 30, RAGGED, [2.2, -1.8, 1.5, -2.4, 2.0, 0.5], 0.3, False, 0.1, 1.0),
    ("quarter_token_adv", 31, FULL, [2.2, -1.8, 1.5, -2.4, 2.0, -1.0], 0.3, True, 0.25, 1.0),
    ("one_token_coef_0.5", 32, RAGGED, [1.0, -1.0, 0.5, -0.5, 2.0, 0.5], 0.3, False, 2e-3, 0.5),
    ("seven_tenths_of_10", 33, [7, 3, 0, 0, 0, 0], [1.0, -1.0, 0.5, -0.5, 2.0, 0.5], 0.3,
     True, 0.7, 1.0),
]


def record_kl_cov(verl, entropy, commits):
    verl_cases, authors_cases = [], []
    for name, seed, lengths, adv, spread, per_token, fraction, coef in KL_COV_CASES:
        inputs = _inputs(seed, lengths=lengths, adv_rows=adv, spread=spread,
                         per_token_adv=per_token)
        kwargs = {"kl_fraction": fraction, "kl_coef": coef}
        config = _Config(global_batch_info={},
                         policy_loss=_Config(kl_cov_ratio=fraction, ppo_kl_coef=coef))
        outputs, metrics = _run(verl.compute_policy_loss_kl_cov, inputs, MODES, config=config)
        verl_cases.append({"name": name, "kwargs": kwargs, "inputs": _listed(inputs),
                           "outputs": outputs, "metrics": metrics})
        # The authors' function takes k in percent (their recipe's k_percent=0.2 is 2e-3).
        outputs, metrics = _run(entropy.compute_policy_loss_kl_cov, inputs, ["token-mean"],
                                k_percent=fraction * 100, ppo_kl_coef=coef)
        authors_cases.append({"name": name, "kwargs": kwargs, "inputs": _listed(inputs),
                              "outputs": outputs, "metrics": {"ppo_kl_abs": metrics[2]}})
    _write("kl_cov_verl", {"repo": "verl-project/verl", "commit": commits[0], "file": CORE_ALGOS,
                           "function": "compute_policy_loss_kl_cov", "registered_as": "kl_cov"},
           verl_cases)
    _write("kl_cov_authors", {"repo": "PRIME-RL/Entropy-Mechanism-of-RL", "commit": commits[1],
                              "file": CORE_ALGOS, "function": "compute_policy_loss_kl_cov",
                              "argument_note": "k_percent = 100 * kl_fraction"},
           authors_cases)


def record_m2po(areal_dir, commit):
    ns = _functions_from(pathlib.Path(areal_dir) / AREAL_ACTOR,
                         ["_apply_m2po_masking", "_get_m2po_loss_mask"], {"torch": torch})
    cases = []
    for name, seed, lengths, spread, tau, outliers in [
            ("ragged_tau_0.04", 40, RAGGED, 0.15, 0.04, 3),
            ("full_tau_0.04_many_outliers", 41, FULL, 0.2, 0.04, 8),
            ("tau_0.01", 42, RAGGED, 0.3, 0.01, 0),
            ("all_within_budget", 43, FULL, 0.05, 0.04, 0),
            ("no_suffix_within_budget", 44, [7, 7, 0, 0, 0, 0], 2.0, 1e-6, 0)]:
        inputs = _inputs(seed, lengths=lengths, adv_rows=ADV, spread=spread)
        rng = np.random.default_rng(seed + 1000)
        rows, cols = rng.integers(0, B, outliers), rng.integers(0, T, outliers)
        inputs["log_prob"][rows, cols] -= rng.uniform(1.0, 3.0, outliers)   # stale outliers
        behaviour = torch.tensor(inputs["old_log_prob"], dtype=torch.float64)
        current = torch.tensor(inputs["log_prob"], dtype=torch.float64)
        mask = torch.tensor(inputs["response_mask"]).bool()
        # AReaL's order: (behaviour log-probs, the policy compared with them, mask, tau)
        keep = ns["_apply_m2po_masking"](behaviour, current, mask, tau)
        cases.append({"name": name, "kwargs": {"tau": tau},
                      "inputs": {k: _listed(inputs)[k] for k in
                                 ("log_prob", "old_log_prob", "response_mask")},
                      "outputs": {"mask": keep.double().tolist()}})
    _write("m2po_areal", {"repo": "inclusionAI/AReaL", "commit": commit, "file": AREAL_ACTOR,
                          "function": "_apply_m2po_masking",
                          "argument_note": "old_logp = the behaviour log-probs (our old_logp), "
                                           "prox_logp = the log-probs compared with them "
                                           "(our logp)"}, cases)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    for peer in ("verl", "stable_rl", "entropy", "areal"):
        parser.add_argument(f"--{peer}_dir", required=True)
        parser.add_argument(f"--{peer}_commit", required=True)
    args = parser.parse_args()
    torch.set_default_dtype(torch.float64)
    verl = load_core_algos(args.verl_dir, "verl")
    stable = load_core_algos(args.stable_rl_dir, "stable_rl")
    entropy = load_core_algos(args.entropy_dir, "entropy")
    record_gmpo(verl, args.verl_commit)
    record_dppo(verl, args.verl_commit)
    record_dppo_stable_rl(stable, args.stable_rl_commit)
    record_clip_cov(verl, args.verl_commit)
    record_clip_cov_authors(entropy, args.entropy_commit)
    record_kl_cov(verl, entropy, (args.verl_commit, args.entropy_commit))
    record_m2po(args.areal_dir, args.areal_commit)


if __name__ == "__main__":
    main()
