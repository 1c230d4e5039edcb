"""Records TRL's own GRPO losses: bnpo, luspo, vespo, top_entropy_quantile, adaptive entropy.

Runs TRL's ``GRPOTrainer._compute_loss``, unmodified, on fixed seeded inputs (torch,
float64) and writes tests/objectives/peer_outputs/trl_grpo_losses.json: TRL's version,
the file and function, the inputs, the loss and its gradient with respect to the
policy's log-probs, and, for the adaptive entropy controller, the coefficient TRL
applies and holds after each step. The tests (tests/objectives/test_trl_losses.py) read
that file and need neither torch nor TRL.

No model runs: ``_compute_loss`` is called on a stand-in for the trainer (one process,
no gradient accumulation, no vLLM) whose ``_get_per_token_logps_and_entropies`` returns
the fixed log-probs and entropies; TRL's own ``get_high_entropy_mask`` and
``get_gamma_weights`` are bound to it. Nothing of TRL is copied here.

Run in a throwaway virtualenv with torch (CPU) and trl installed:

    python -m venv /tmp/trlvenv && /tmp/trlvenv/bin/pip install torch trl
    /tmp/trlvenv/bin/python experiments/peer_agreement/record_trl.py
"""

import collections
import json
import math
import pathlib
import types

import numpy as np
import torch
import trl
from trl.trainer.grpo_trainer import GRPOTrainer

B, T = 6, 7
OUT = (pathlib.Path(__file__).resolve().parents[2] / "tests" / "objectives" / "peer_outputs"
       / "trl_grpo_losses.json")
RAGGED = [7, 5, 3, 6, 2, 0]      # one row fully masked
FULL = [7, 7, 7, 7, 7, 7]
ADV = [1.3, -0.7, 0.4, -1.6, 2.1, -0.2]
ADV_WITH_ZERO = [1.3, -0.7, 0.0, -1.6, 2.1, 0.9]


class _Accelerator:
    """One process: gather, pad and reduce are the identity."""

    num_processes = 1
    sync_gradients = True

    def gather(self, x):
        return x

    gather_for_metrics = gather

    def pad_across_processes(self, x, dim=0, pad_index=0):
        return x

    def reduce(self, x, reduction="sum"):
        return x


def _trainer(loss_type, *, epsilon=0.2, epsilon_high=None, level="token", quantile=1.0,
             entropy_coef=0.0, adaptive=None, vespo=None):
    """A stand-in carrying the attributes ``_compute_loss`` reads (GRPOConfig defaults)."""
    args = types.SimpleNamespace(
        delta=None, use_bias_correction_kl=False, steps_per_generation=1,
        vespo_k_pos=2.0, vespo_lambda_pos=3.0, vespo_k_neg=3.0, vespo_lambda_neg=2.0,
        entropy_target=0.2, entropy_coef_delta=0.005, entropy_coef_min=0.0,
        entropy_coef_max=1.0, sapo_temperature_pos=1.0, sapo_temperature_neg=1.05,
        should_save=False)
    for key, value in (vespo or {}).items():
        setattr(args, f"vespo_{key}", value)
    for key, value in (adaptive or {}).items():
        setattr(args, key, value)
    self = types.SimpleNamespace(
        args=args, loss_type=loss_type, importance_sampling_level=level,
        epsilon_low=epsilon, epsilon_high=epsilon if epsilon_high is None else epsilon_high,
        beta=0.0, top_entropy_quantile=quantile, off_policy_mask_threshold=None,
        use_vllm=False, vllm_importance_sampling_correction=False, aux_loss_enabled=False,
        model=types.SimpleNamespace(training=True), current_gradient_accumulation_steps=1,
        accelerator=_Accelerator(), entropy_coef=entropy_coef,
        use_adaptive_entropy=adaptive is not None,
        _entropy_bonus_enabled=entropy_coef != 0.0 or adaptive is not None,
        _last_world_entropy=float("inf"), _entropy_window_stats=None,
        _metrics={"train": collections.defaultdict(list)}, max_completion_length=T)
    self.get_high_entropy_mask = GRPOTrainer.get_high_entropy_mask.__get__(self)
    self.get_gamma_weights = GRPOTrainer.get_gamma_weights
    return self


def _inputs(seed, *, lengths, adv_rows, spread):
    """Seeded float64 inputs; padding holds arbitrary finite values (TRL masks them)."""
    rng = np.random.default_rng(seed)
    old = np.log(rng.uniform(0.03, 0.97, (B, T)))
    logp = np.minimum(old + rng.normal(0.0, spread, (B, T)), math.log(0.995))
    entropy = rng.uniform(0.05, 3.0, (B, T))
    mask = np.array([[1.0 if t < n else 0.0 for t in range(T)] for n in lengths])
    return {"logp": logp, "old_logp": old, "entropy": entropy, "mask": mask,
            "advantages": np.asarray(adv_rows, float)}


def _call(trainer, inputs):
    """TRL's loss and its gradient w.r.t. the log-probs, on `inputs`."""
    logp = torch.tensor(inputs["logp"], dtype=torch.float64, requires_grad=True)
    entropy = torch.tensor(inputs["entropy"], dtype=torch.float64)
    trainer._get_per_token_logps_and_entropies = lambda *a, **k: (logp, entropy, None)
    mask = torch.tensor(inputs["mask"], dtype=torch.float64)
    batch = {"prompt_ids": torch.zeros(B, 1, dtype=torch.long),
             "prompt_mask": torch.ones(B, 1, dtype=torch.long),
             "completion_ids": torch.zeros(B, T, dtype=torch.long),
             "completion_mask": mask,
             "advantages": torch.tensor(inputs["advantages"], dtype=torch.float64),
             "old_per_token_logps": torch.tensor(inputs["old_logp"], dtype=torch.float64),
             "num_items_in_batch": mask.sum()}
    loss = GRPOTrainer._compute_loss(trainer, None, batch)
    loss.backward()
    return {"loss": loss.item(), "grad": logp.grad.tolist()}


def _listed(inputs):
    return {k: np.asarray(v).tolist() for k, v in inputs.items()}


# name, loss_type, trainer keywords, seed, lengths, adv rows, spread
LOSS_CASES = [
    ("bnpo_ragged", "bnpo", {}, 40, RAGGED, ADV, 0.4),
    ("bnpo_asymmetric", "bnpo", {"epsilon_high": 0.28}, 41, FULL, ADV_WITH_ZERO, 0.5),
    ("luspo_ragged", "luspo", {"level": "sequence"}, 42, RAGGED, ADV, 0.1),
    ("luspo_clipped", "luspo", {"level": "sequence", "epsilon": 3e-2, "epsilon_high": 4e-2},
     43, [7, 1, 4, 6, 2, 5], ADV_WITH_ZERO, 0.15),
    ("vespo_defaults", "vespo", {}, 44, RAGGED, ADV, 0.1),
    ("vespo_far_off_policy", "vespo", {}, 45, [7, 2, 4, 6, 7, 3], ADV_WITH_ZERO, 0.5),
    ("vespo_other_gamma", "vespo",
     {"vespo": {"k_pos": 1.5, "lambda_pos": 2.0, "k_neg": 4.0, "lambda_neg": 1.0}},
     46, RAGGED, ADV, 0.3),
    ("top_entropy_0.2_dapo", "dapo", {"quantile": 0.2}, 47, RAGGED, ADV, 0.3),
    ("top_entropy_0.5_grpo", "grpo", {"quantile": 0.5}, 48, FULL, ADV_WITH_ZERO, 0.3),
    ("top_entropy_0.0_bnpo", "bnpo", {"quantile": 0.0}, 49, RAGGED, ADV, 0.3),
    ("top_entropy_0.3_luspo", "luspo", {"quantile": 0.3, "level": "sequence"}, 50, RAGGED,
     ADV, 0.1),
]


def record_losses():
    cases = []
    for name, loss_type, keywords, seed, lengths, adv, spread in LOSS_CASES:
        inputs = _inputs(seed, lengths=lengths, adv_rows=adv, spread=spread)
        trainer = _trainer(loss_type, **keywords)
        config = {"loss_type": loss_type, "epsilon_low": trainer.epsilon_low,
                  "epsilon_high": trainer.epsilon_high,
                  "importance_sampling_level": trainer.importance_sampling_level,
                  "top_entropy_quantile": trainer.top_entropy_quantile,
                  **{f"vespo_{k}": getattr(trainer.args, f"vespo_{k}")
                     for k in ("k_pos", "lambda_pos", "k_neg", "lambda_neg")}}
        cases.append({"name": name, "config": config, "inputs": _listed(inputs),
                      "outputs": _call(trainer, inputs)})
    return cases


def record_adaptive_entropy():
    """Eight optimizer steps of TRL's controller on a batch whose entropies are scaled
    to a chosen mean each step: the coefficient applied (gated by the previous step's
    entropy) and the one held after the step's update."""
    adaptive = {"entropy_target": 0.5, "entropy_coef_delta": 0.02, "entropy_coef_min": 0.0,
                "entropy_coef_max": 0.05}
    trainer = _trainer("dapo", entropy_coef=0.01, adaptive=adaptive)
    base = _inputs(60, lengths=RAGGED, adv_rows=ADV, spread=0.2)
    valid = base["mask"] > 0
    steps = []
    for target_mean in [0.9, 0.4, 0.3, 0.2, 0.45, 0.7, 0.6, 0.1]:
        inputs = dict(base)
        inputs["entropy"] = base["entropy"] * target_mean / base["entropy"][valid].mean()
        last = trainer._last_world_entropy
        applied = trainer.entropy_coef if last <= adaptive["entropy_target"] else 0.0
        _call(trainer, inputs)
        steps.append({"entropy": inputs["entropy"].tolist(), "applied_coef": applied,
                      "coef_after": trainer.entropy_coef,
                      "world_entropy": trainer._last_world_entropy})
    return {"config": {**adaptive, "entropy_coef": 0.01}, "mask": base["mask"].tolist(),
            "steps": steps}


def main():
    record = {"peer": {"repo": "huggingface/trl", "version": trl.__version__,
                       "file": "trl/trainer/grpo_trainer.py",
                       "function": "GRPOTrainer._compute_loss, get_high_entropy_mask, "
                                   "get_gamma_weights"},
              "recorded_with": {"torch": torch.__version__, "dtype": "float64",
                                "script": "experiments/peer_agreement/record_trl.py"},
              "cases": record_losses(), "adaptive_entropy": record_adaptive_entropy()}
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {OUT} ({len(record['cases'])} cases, trl {trl.__version__})")


if __name__ == "__main__":
    main()
