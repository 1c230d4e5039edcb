"""Records what verl's and AReaL's own code output on fixed inputs, for
tests/objectives/test_mismatch.py to reproduce with grpo_jax.objectives._mismatch.

Nothing of the peers is copied into this repository: this script extracts their files
from local git mirrors at pinned commits into a temporary directory, imports the
functions there (torch, CPU), runs them and writes only inputs and outputs as JSON to
tests/objectives/peer_outputs/. The tests read those JSON files and need neither torch
nor network.

    python experiments/peer_agreement/record_mismatch.py \
        --verl_dir /path/to/verl.git --areal_dir /path/to/AReaL.git

`--verl_dir` / `--areal_dir` are git directories (a bare mirror, or a checkout's .git);
`git archive` reads the pinned commits from them. Heavy modules the peer functions never
call (tensordict, transformers, verl.protocol's DataProto, the config dataclasses) are
replaced in `sys.modules` by minimal stand-ins before the import, listed in `_stub_*`
below; the arithmetic that is recorded is the peers' own.

Recorded functions:

- verl @ VERL_COMMIT, verl/trainer/ppo/rollout_corr_helper.py:
  compute_rollout_correction_weights (truncated IS, token and sequence),
  compute_rollout_rejection_mask (token_k1, seq_sum_k1, seq_mean_k1),
  compute_offpolicy_metrics;
- verl @ VERL_OLD_COMMIT, verl/trainer/ppo/mismatch_helper.py:
  compute_rollout_importance_weights (token / sequence / geometric x truncate / mask:
  the last version with the three levels and both modes in one function);
- AReaL @ AREAL_COMMIT, areal/utils/functional/functional.py: ppo_actor_loss_fn with
  ``rejection_sampling`` (its current behaviour-weight control);
- AReaL @ AREAL_OLD_COMMIT (the parent of the commit that replaced it), the same file:
  ppo_actor_loss_fn with ``behav_imp_weight_cap``.
"""

import argparse
import dataclasses
import datetime
import json
import pathlib
import platform
import subprocess
import sys
import tempfile
import types

import numpy as np
import torch

VERL_REPO = "volcengine/verl"
VERL_COMMIT = "b178a3cd56f58b2d502255daba591e92833930a7"       # 2026-01-29 (HEAD when recorded)
VERL_OLD_COMMIT = "4f1c489e45f8ab8119ab2007ed94f344d303ac8c"   # 2025-10-20
AREAL_REPO = "inclusionAI/AReaL"
AREAL_COMMIT = "4aef98d8d818af55b43621aaadba047ae10f4e77"      # 2026-05-21 (HEAD when recorded)
AREAL_OLD_COMMIT = "61d1bbb3d5c8891a76f5c461a5e1fde1dbf0270a"  # parent of 03d71153a (2026-03-03)

B, T = 6, 7
OUT_DIR = pathlib.Path(__file__).resolve().parents[2] / "tests" / "objectives" / "peer_outputs"


# --- Extracting and importing the peers' files.

def _git(git_dir, *args):
    return subprocess.run(["git", "--git-dir", str(git_dir), *args], check=True,
                          capture_output=True).stdout


def _extract(git_dir, commit, paths, dest):
    """`git archive <commit> <paths>` unpacked under `dest`; returns the commit's date."""
    archive = _git(git_dir, "archive", commit, *paths)
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    return _git(git_dir, "show", "-s", "--format=%cI", commit).decode().strip()


def _purge(top):
    for name in [n for n in sys.modules if n == top or n.startswith(top + ".")]:
        del sys.modules[name]


def _package(name, root):
    """An empty package whose submodules load from `root`: skips the peer's heavy __init__."""
    module = types.ModuleType(name)
    module.__path__ = [str(pathlib.Path(root, *name.split(".")))]
    sys.modules[name] = module


def _module(name, **attrs):
    module = types.ModuleType(name)
    module.__dict__.update(attrs)
    sys.modules[name] = module


class _DataProto:
    """Stand-in for verl.protocol.DataProto: the functions only wrap their output in it."""

    def __init__(self, batch):
        self.batch = batch

    @classmethod
    def from_dict(cls, tensors):
        return cls(dict(tensors))


def _stub_verl(root):
    _purge("verl")
    _module("tensordict", TensorDict=dict)                 # type annotations only
    _module("transformers", PreTrainedTokenizer=object)
    for name in ("verl", "verl.utils", "verl.trainer", "verl.trainer.ppo", "verl.trainer.config",
                 "verl.workers", "verl.workers.config"):
        _package(name, root)
    _module("verl.protocol", DataProto=_DataProto)
    _module("verl.trainer.config.algorithm", RolloutCorrectionConfig=dict)
    _module("verl.workers.config.actor", PolicyLossConfig=dict)


@dataclasses.dataclass
class RejectionSampling:
    """The fields AReaL's ppo_actor_loss_fn reads from its RejectionSamplingConfig."""

    level: str = "token"
    action: str = "mask"
    metric: str = "ratio"
    agg: str = "mean"
    upper: float = 5.0
    lower: float | None = None


class _NoKLEstimator:
    @staticmethod
    def _compute_approx_kl(**kwargs):
        raise NotImplementedError("the recorded cases use metric='ratio' only")


def _stub_areal(root):
    _purge("areal")
    for name in ("areal", "areal.api", "areal.utils", "areal.utils.functional"):
        _package(name, root)
    _module("areal.api.cli_args", RejectionSamplingConfig=RejectionSampling)
    _module("areal.utils.data", KLEstimator=_NoKLEstimator)


def _import(name):
    __import__(name)
    return sys.modules[name]


# --- Inputs: seeded, float32, B = 6 rows, T = 7 tokens. Padding holds finite junk that
# differs between the arrays, so a leak through the mask would show.

def _lengths_mask(lengths):
    return (np.arange(T)[None, :] < np.asarray(lengths)[:, None]).astype(np.float32)


def _pad(x, mask, value):
    return np.where(mask > 0, x, value).astype(np.float32)


def _logprobs(rng):
    return -(np.abs(rng.normal(0.0, 1.2, (B, T))) + 0.02)


def _below_zero(*logps):
    """Shifts all arrays down together where any exceeds -0.005: log-probs stay <= 0 and
    every log-ratio between them is kept."""
    shift = np.maximum(np.max(logps, axis=0) + 0.005, 0.0)
    return [x - shift for x in logps]


MISMATCH_CASES = {
    # name: (seed, noise scale of the log-ratio, per-row bias, lengths, [(b, t, log-ratio)])
    "small_full": (0, 0.01, [0] * B, [T] * B, []),
    "moderate_ragged": (1, 0.35, [0] * B, [7, 5, 1, 0, 3, 6], []),
    "large_ragged": (2, 1.2, [0] * B, [7, 2, 6, 4, 0, 5], [(0, 1, 3.5), (2, 3, -4.0)]),
    "rows_apart": (3, 0.1, [0.9, -0.9, 0.05, 0.3, -0.2, 0.0], [7, 6, 5, 4, 3, 2], []),
    "beyond_clamp": (4, 0.2, [0] * B, [T] * B, [(1, 2, 25.0), (1, 4, -23.0), (3, 0, 21.0)]),
}


def mismatch_inputs(name):
    seed, scale, bias, lengths, extremes = MISMATCH_CASES[name]
    rng = np.random.default_rng(seed)
    sampler = _logprobs(rng)
    delta = rng.normal(0.0, scale, (B, T)) + np.asarray(bias)[:, None]
    for b, t, v in extremes:
        delta[b, t] = v
    mask = _lengths_mask(lengths)
    trainer, sampler = _below_zero(sampler + delta, sampler)
    trainer = _pad(trainer, mask, -7.5)
    return {"trainer_logp": trainer, "sampler_logp": _pad(sampler, mask, -0.3), "mask": mask}


PPO_CASES = {
    # name: (seed, staleness log-ratio scale, update log-ratio scale, lengths, per-token adv)
    "moderate_ragged": (10, 0.6, 0.15, [7, 5, 1, 0, 3, 6], True),
    "large_stale": (11, 1.5, 0.3, [7, 7, 6, 5, 7, 4], False),
    "prox_is_behav": (12, 0.0, 0.3, [7, 3, 7, 6, 2, 7], True),
    "small": (13, 0.01, 0.01, [T] * B, False),
}


def ppo_inputs(name):
    seed, stale, update, lengths, per_token = PPO_CASES[name]
    rng = np.random.default_rng(seed)
    behav = _logprobs(rng)
    prox = behav + rng.normal(0.0, stale, (B, T))
    logp = prox + rng.normal(0.0, update, (B, T))
    adv = (
        rng.normal(0.0, 1.0, (B, T)) if per_token else np.repeat(rng.normal(0.0, 1.0, (B, 1)), T, 1)
    )
    mask = _lengths_mask(lengths)
    logp, prox, behav = _below_zero(logp, prox, behav)
    return {"logp": _pad(logp, mask, -2.0), "prox_logp": _pad(prox, mask, -9.0),
            "behav_logp": _pad(behav, mask, -0.1), "adv": _pad(adv, mask, 3.0), "mask": mask}


def _t(x):
    return torch.tensor(np.asarray(x, np.float32))


def _list(x):
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu()
        x = x.float() if x.dtype != torch.bool else x
        return x.tolist()
    return float(x)


# --- The recordings.

def record_verl(git_dir, tmp):
    root = tmp / "verl_head"
    root.mkdir()
    path = "verl/trainer/ppo/rollout_corr_helper.py"
    date = _extract(git_dir, VERL_COMMIT, [path, "verl/utils/torch_functional.py",
                                           "verl/utils/device.py"], root)
    _stub_verl(root)
    helper = _import("verl.trainer.ppo.rollout_corr_helper")
    cases = {name: mismatch_inputs(name) for name in MISMATCH_CASES}
    calls = []
    for name, x in cases.items():
        trainer, sampler, mask = _t(x["trainer_logp"]), _t(x["sampler_logp"]), _t(x["mask"])
        log_ratio = trainer - sampler
        for level in ("token", "sequence"):
            for threshold in (2.0, 1.5):
                weights, metrics = helper.compute_rollout_correction_weights(
                    log_ratio=log_ratio, response_mask=mask, rollout_is=level,
                    rollout_is_threshold=threshold)
                calls.append({"case": name, "function": "compute_rollout_correction_weights",
                              "kwargs": {"rollout_is": level, "rollout_is_threshold": threshold},
                              "outputs": {"weights": _list(weights),
                                          "rollout_is_ratio_fraction_high":
                                              metrics["rollout_is_ratio_fraction_high"]}})
        for option in ("token_k1", "seq_sum_k1", "seq_mean_k1"):
            for spec in ("2.0", "0.5_5.0", "0.8_1.5"):
                keep, metrics = helper.compute_rollout_rejection_mask(
                    log_ratio=log_ratio, response_mask=mask, rollout_rs=option,
                    rollout_rs_threshold=spec)
                calls.append({"case": name, "function": "compute_rollout_rejection_mask",
                              "kwargs": {"rollout_rs": option, "rollout_rs_threshold": spec},
                              "outputs": {"modified_response_mask": _list(keep),
                                          "rollout_rs_masked_fraction":
                                              metrics["rollout_rs_masked_fraction"]}})
        metrics = helper.compute_offpolicy_metrics(old_log_prob=trainer, rollout_log_prob=sampler,
                                                   response_mask=mask)
        calls.append({"case": name, "function": "compute_offpolicy_metrics", "kwargs": {},
                      "outputs": {k: float(v) for k, v in metrics.items()}})
    return _document(VERL_REPO, VERL_COMMIT, date, path,
                     ["compute_rollout_correction_weights", "compute_rollout_rejection_mask",
                      "compute_offpolicy_metrics"],
                     "log_ratio = trainer_logp - sampler_logp "
                     "(verl: old_log_prob - rollout_log_prob); "
                     "response_mask = mask",
                     cases, calls)


def record_verl_old(git_dir, tmp):
    root = tmp / "verl_old"
    root.mkdir()
    path = "verl/trainer/ppo/mismatch_helper.py"
    date = _extract(git_dir, VERL_OLD_COMMIT, [path, "verl/utils/torch_functional.py",
                                               "verl/utils/device.py"], root)
    _stub_verl(root)
    helper = _import("verl.trainer.ppo.mismatch_helper")
    cases = {name: mismatch_inputs(name) for name in MISMATCH_CASES}
    calls = []
    settings = [("truncate", 2.0, None), ("truncate", 1.5, None), ("mask", 2.0, None),
                ("mask", 5.0, 0.5), ("mask", 1.5, 0.8)]
    for name, x in cases.items():
        trainer, sampler, mask = _t(x["trainer_logp"]), _t(x["sampler_logp"]), _t(x["mask"])
        for level in ("token", "sequence", "geometric"):
            for mode, upper, lower in settings:
                proto, metrics = helper.compute_rollout_importance_weights(
                    old_log_prob=trainer, rollout_log_prob=sampler, response_mask=mask,
                    rollout_is_level=level, rollout_is_mode=mode, rollout_is_threshold=upper,
                    rollout_is_threshold_lower=lower, rollout_is_veto_threshold=None)
                outputs = {"weights": _list(proto.batch["rollout_is_weights"])}
                for key in ("mismatch/rollout_is_masked_fraction", "mismatch/mismatch_kl",
                            "mismatch/mismatch_k3_kl"):
                    if key in metrics:
                        outputs[key] = float(metrics[key])
                calls.append({"case": name, "function": "compute_rollout_importance_weights",
                              "kwargs": {"rollout_is_level": level, "rollout_is_mode": mode,
                                         "rollout_is_threshold": upper,
                                         "rollout_is_threshold_lower": lower,
                                         "rollout_is_veto_threshold": None},
                              "outputs": outputs})
    return _document(VERL_REPO, VERL_OLD_COMMIT, date, path,
                     ["compute_rollout_importance_weights"],
                     "old_log_prob = trainer_logp, rollout_log_prob = sampler_logp, "
                     "response_mask = mask", cases, calls)


def _areal_calls(fn, cases, configs):
    calls = []
    for name, x in cases.items():
        for kwargs in configs:
            logp = _t(x["logp"]).requires_grad_(True)
            mask = _t(x["mask"]).bool()
            call_kwargs = dict(kwargs)
            if isinstance(call_kwargs.get("rejection_sampling"), dict):
                call_kwargs["rejection_sampling"] = RejectionSampling(
                    **call_kwargs["rejection_sampling"]
                )
            loss, stat = fn(logprobs=logp, proximal_logprobs=_t(x["prox_logp"]),
                            old_logprobs=_t(x["behav_logp"]), advantages=_t(x["adv"]),
                            loss_mask=mask, **call_kwargs)
            (grad,) = torch.autograd.grad(loss, logp)
            outputs = {"loss": _list(loss),
                       "grad_logprobs": _list(grad),
                       "per_token_loss": _list(torch.where(mask, stat["loss"], 0.0)),
                       "clip_mask": _list(stat["clip_mask"]),
                       "dual_clip_mask": _list(stat["dual_clip_mask"])}
            for key in ("behave_imp_weight", "behave_mask"):
                if key in stat:
                    outputs[key] = _list(
                        torch.where(mask, stat[key], False if key == "behave_mask" else 0.0)
                    )
            calls.append({"case": name, "function": "ppo_actor_loss_fn", "kwargs": kwargs,
                          "outputs": outputs})
    return calls


def record_areal(git_dir, tmp):
    root = tmp / "areal_head"
    root.mkdir()
    path = "areal/utils/functional/functional.py"
    date = _extract(git_dir, AREAL_COMMIT, [path], root)
    _stub_areal(root)
    fn = _import("areal.utils.functional.functional").ppo_actor_loss_fn
    cases = {name: ppo_inputs(name) for name in PPO_CASES}
    configs = [
        {"eps_clip": 0.2, "rejection_sampling": None},
        {"eps_clip": 0.2, "rejection_sampling": {"level": "token", "action": "mask",
                                                 "metric": "ratio", "upper": 5.0}},
        {"eps_clip": 0.2, "eps_clip_higher": 0.28,
         "rejection_sampling": {"level": "token", "action": "mask", "metric": "ratio",
                                "upper": 2.0}},
        {"eps_clip": 0.2, "rejection_sampling": {"level": "token", "action": "clamp",
                                                 "metric": "ratio", "upper": 2.0}},
        {"eps_clip": 0.2, "c_clip": 3.0,
         "rejection_sampling": {"level": "token", "action": "mask", "metric": "ratio",
                                "upper": 5.0}},
    ]
    return _document(AREAL_REPO, AREAL_COMMIT, date, path, ["ppo_actor_loss_fn"],
                     "logprobs = logp, proximal_logprobs = prox_logp, old_logprobs = behav_logp, "
                     "advantages = adv, loss_mask = mask.bool(); the recorded loss is the scalar "
                     "it returns (sum over loss_mask / loss_mask count), per_token_loss is "
                     "where(loss_mask, stat['loss'], 0), grad_logprobs is d loss / d logprobs",
                     cases, _areal_calls(fn, cases, configs))


def record_areal_old(git_dir, tmp):
    root = tmp / "areal_old"
    root.mkdir()
    path = "areal/utils/functional/functional.py"
    date = _extract(git_dir, AREAL_OLD_COMMIT, [path], root)
    _purge("areal")
    _package("areal", root)
    _package("areal.utils", root)
    _package("areal.utils.functional", root)
    fn = _import("areal.utils.functional.functional").ppo_actor_loss_fn
    cases = {name: ppo_inputs(name) for name in PPO_CASES}
    configs = [
        {"eps_clip": 0.2, "behav_imp_weight_cap": None},
        {"eps_clip": 0.2, "behav_imp_weight_cap": 5.0},
        {"eps_clip": 0.2, "eps_clip_higher": 0.28, "behav_imp_weight_cap": 2.0},
        {"eps_clip": 0.2, "c_clip": 3.0, "behav_imp_weight_cap": 5.0},
    ]
    return _document(AREAL_REPO, AREAL_OLD_COMMIT, date, path, ["ppo_actor_loss_fn"],
                     "as areal_ppo_actor_loss_fn.json, with behav_imp_weight_cap", cases,
                     _areal_calls(fn, cases, configs))


def _document(repo, commit, date, path, functions, mapping, cases, calls):
    return {
        "peer": {"repo": repo, "url": f"https://github.com/{repo}", "commit": commit,
                 "commit_date": date, "path": path, "functions": functions},
        "recorded_with": {"script": "experiments/peer_agreement/record_mismatch.py",
                          "torch": torch.__version__, "python": platform.python_version(),
                          "dtype": "float32", "device": "cpu",
                          "date": datetime.date.today().isoformat()},
        "argument_mapping": mapping,
        "cases": {name: {k: v.tolist() for k, v in x.items()} for name, x in cases.items()},
        "calls": calls,
    }


def _number(x):
    """The shortest text that reads back as the same float32 (inputs round-trip exactly)."""
    if isinstance(x, bool) or x is None:
        return json.dumps(x)
    if isinstance(x, int):
        return str(x)
    return np.format_float_positional(np.float32(x), unique=True, trim="-")


def _dump(obj, indent=0):
    """JSON with one line per number array (a row-major nest of lists)."""
    pad = " " * indent
    if isinstance(obj, dict):
        items = [f'{pad} {json.dumps(k)}: {_dump(v, indent + 1).lstrip()}' for k, v in obj.items()]
        return pad + "{\n" + ",\n".join(items) + "\n" + pad + "}"
    if isinstance(obj, list) and all(isinstance(v, str) for v in obj):
        return pad + json.dumps(obj)
    if isinstance(obj, list) and not any(isinstance(v, dict) for v in obj):
        return pad + _flat(obj)
    if isinstance(obj, list):
        return pad + "[\n" + ",\n".join(_dump(v, indent + 1) for v in obj) + "\n" + pad + "]"
    if isinstance(obj, str):
        return pad + json.dumps(obj)
    return pad + _number(obj)


def _flat(values):
    if isinstance(values, list):
        return "[" + ",".join(_flat(v) for v in values) + "]"
    return _number(values)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--verl_dir", required=True, help="git directory of a verl mirror")
    parser.add_argument("--areal_dir", required=True, help="git directory of an AReaL mirror")
    parser.add_argument("--out_dir", default=str(OUT_DIR))
    args = parser.parse_args()
    torch.manual_seed(0)
    out = pathlib.Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = pathlib.Path(tmp)
        documents = {
            "verl_rollout_corr_helper": record_verl(args.verl_dir, tmp),
            "verl_mismatch_helper": record_verl_old(args.verl_dir, tmp),
            "areal_ppo_actor_loss_fn": record_areal(args.areal_dir, tmp),
            "areal_ppo_actor_loss_fn_behav_imp_weight_cap": record_areal_old(args.areal_dir, tmp),
        }
    for name, document in documents.items():
        target = out / f"{name}.json"
        target.write_text(_dump(document) + "\n")
        json.loads(target.read_text())   # well-formed
        print(f"wrote {target} ({len(document['calls'])} calls)")


if __name__ == "__main__":
    main()
