"""Records TRL's own distillation losses: GKD's generalized JSD and the sampled-token reverse KL.

Runs, unmodified, with torch (float64) on fixed seeded logits:

- ``GKDTrainer.generalized_jsd_loss`` (trl/experimental/gkd/gkd_trainer.py, a static
  method): the divergence per vocabulary entry (``reduction="none"``, no labels) summed
  here over the vocabulary to one value per position, and the masked ``"batchmean"`` loss
  (``labels`` -100 at the masked positions) with its gradient with respect to the
  student's logits; beta 0 (forward KL), 0.1, 0.5, 0.9 and 1 (reverse KL), temperatures
  1 and 0.7, ragged masks with a fully masked row.
- ``compute_sampled_token_self_distillation_loss`` (trl/experimental/sdft/loss_utils.py):
  the reverse KL on the student's sampled tokens, ``sg(log pi_s - log pi_T) log pi_s``
  per token, and the gradient of its masked sum with respect to the student's logits.

Writes tests/objectives/peer_outputs/trl_distill.json: TRL's version, the files (with
their sha256 from the installed wheel's RECORD) and functions, the inputs and TRL's
outputs. The tests (tests/objectives/test_distill.py) read it and need neither torch nor
TRL. Nothing of TRL is copied here.

Run with torch (CPU) and trl 1.16.0 importable, e.g. in a throwaway virtualenv:

    python -m venv /tmp/trlvenv && /tmp/trlvenv/bin/pip install torch trl==1.16.0
    /tmp/trlvenv/bin/python experiments/peer_agreement/record_trl_distill.py
"""

import importlib.metadata
import json
import pathlib

import numpy as np
import torch
import trl
from trl.experimental.gkd.gkd_trainer import GKDTrainer
from trl.experimental.sdft.loss_utils import compute_sampled_token_self_distillation_loss

B, T, V = 3, 4, 7
OUT = (pathlib.Path(__file__).resolve().parents[2] / "tests" / "objectives" / "peer_outputs"
       / "trl_distill.json")
FILES = ("trl/experimental/gkd/gkd_trainer.py", "trl/experimental/sdft/loss_utils.py")
LENGTHS = [[4, 2, 0], [4, 4, 4], [1, 3, 4]]


def _inputs(seed, lengths, spread):
    """Seeded logits (the teacher's near the student's by `spread`), tokens drawn from the
    student, and a ragged mask; masked positions hold arbitrary finite values."""
    rng = np.random.default_rng(seed)
    student = rng.normal(0.0, 2.0, (B, T, V))
    teacher = student + rng.normal(0.0, spread, (B, T, V))
    probs = np.exp(student - student.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    tokens = np.array([[rng.choice(V, p=probs[b, t]) for t in range(T)] for b in range(B)])
    mask = np.array([[1.0 if t < n else 0.0 for t in range(T)] for n in lengths])
    return {"student_logits": student, "teacher_logits": teacher, "tokens": tokens,
            "mask": mask}


def _jsd(inputs, beta, temperature):
    """GKD's divergence per position (unreduced, summed over the vocabulary), and the
    masked batchmean loss with its gradient w.r.t. the student's logits."""
    student = torch.tensor(inputs["student_logits"], dtype=torch.float64, requires_grad=True)
    teacher = torch.tensor(inputs["teacher_logits"], dtype=torch.float64)
    mask = torch.tensor(inputs["mask"]) > 0
    per_entry = GKDTrainer.generalized_jsd_loss(student.detach(), teacher, beta=beta,
                                                temperature=temperature, reduction="none")
    labels = torch.where(mask, torch.zeros(B, T, dtype=torch.long), -100)
    loss = GKDTrainer.generalized_jsd_loss(student, teacher, labels=labels, beta=beta,
                                           temperature=temperature, reduction="batchmean")
    loss.backward()
    return {"per_position": per_entry.sum(-1).tolist(), "batchmean": loss.item(),
            "grad_student_logits": student.grad.tolist()}


def _sampled_reverse_kl(inputs):
    """TRL's per-token sampled reverse KL and the gradient of its masked sum."""
    student = torch.tensor(inputs["student_logits"], dtype=torch.float64, requires_grad=True)
    teacher = torch.tensor(inputs["teacher_logits"], dtype=torch.float64)
    tokens = torch.tensor(inputs["tokens"], dtype=torch.long)
    per_token = compute_sampled_token_self_distillation_loss(student, teacher, tokens,
                                                             distillation_alpha=1.0)
    (per_token * torch.tensor(inputs["mask"])).sum().backward()
    return {"per_token": per_token.tolist(), "grad_student_logits": student.grad.tolist()}


def _listed(inputs):
    return {k: np.asarray(v).tolist() for k, v in inputs.items()}


def _file_hashes():
    record = importlib.metadata.distribution("trl").read_text("RECORD")
    hashes = dict(line.split(",")[:2] for line in record.splitlines() if line.count(",") >= 2)
    return {f: hashes[f] for f in FILES}


def main():
    jsd_cases, sampled_cases = [], []
    for i, (beta, temperature) in enumerate(
            [(0.0, 1.0), (0.1, 1.0), (0.5, 1.0), (0.9, 1.0), (1.0, 1.0), (0.0, 0.7),
             (0.5, 0.7), (1.0, 0.7)]):
        inputs = _inputs(70 + i, LENGTHS[i % len(LENGTHS)], spread=1.0)
        jsd_cases.append({"name": f"jsd_beta{beta}_temperature{temperature}",
                          "config": {"beta": beta, "temperature": temperature},
                          "inputs": _listed(inputs), "outputs": _jsd(inputs, beta, temperature)})
    for i, spread in enumerate([0.3, 1.0, 3.0]):
        inputs = _inputs(90 + i, LENGTHS[i], spread)
        sampled_cases.append({"name": f"sampled_reverse_kl_spread{spread}",
                              "inputs": _listed(inputs), "outputs": _sampled_reverse_kl(inputs)})
    record = {"peer": {"repo": "huggingface/trl", "version": trl.__version__,
                       "files": _file_hashes(),
                       "functions": {"jsd": "GKDTrainer.generalized_jsd_loss",
                                     "sampled_reverse_kl":
                                         "compute_sampled_token_self_distillation_loss"}},
              "recorded_with": {"torch": torch.__version__, "dtype": "float64",
                                "script": "experiments/peer_agreement/record_trl_distill.py"},
              "jsd": jsd_cases, "sampled_reverse_kl": sampled_cases}
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {OUT} ({len(jsd_cases)} + {len(sampled_cases)} cases, trl {trl.__version__})")


if __name__ == "__main__":
    main()
