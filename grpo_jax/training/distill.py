"""On-policy distillation in the RL loop: a frozen teacher scores the student's samples.

With ``distill.teacher_path`` (a Hugging Face checkpoint with the policy's tokenizer) the
run loads the teacher once, on the training mesh with the policy's sharding rules
(``model.rules``) and dtypes, and at every RL step scores the sampled tokens with it as
pi_ref's are scored: the same log-prob program (`batch.make_logprob_fn`), at the rollout
temperature, over the same pieces and packing plan, restricted to the sampler's kept
support when the run keeps it. An MoE student's recorded experts are not replayed in the
teacher (they are the student's). The result is the batch's ``teacher_logp`` `[B, N]`.
The teacher is frozen: it has no optimizer state and no checkpoint holds it (a resumed
run loads it again from its path).

Each token's signal is the sampled reverse-KL estimate k_t = log pi_old(y_t) -
log pi_T(y_t) (clamped to [-20, 20] as `objectives.reverse_kl_distill_loss` does), and
its advantage gains -w k_t, w = ``distill.weight``:

- with ``objective.advantage.estimator = "reverse_kl"`` (`objectives.presets.distill`)
  the advantage is -k_t alone (pure distillation: no reward is read; w must be 1);
- with any other estimator, A_t = A + w (log pi_T(y_t) - log pi_old(y_t)), A the
  estimator's advantage of the verifiable reward (per answer, or per token).

That is Thinking Machines' on-policy distillation (K. Lu and Thinking Machines Lab,
"On-Policy Distillation", 2025: the negative reverse KL per token as the advantage, no
discount, added to the environment's advantages with a coefficient, as their Tinker
cookbook's ``kl_penalty_coef``), i.e. the reverse-KL objective of GKD (Agarwal et al.,
arXiv:2306.13649, sec. 3.1) optimised by the recipe's policy loss.
"""

import dataclasses
import math
import numbers
from collections.abc import Callable, Mapping

import jax
import jax.numpy as jnp
import ml_collections
import transformers
from flax import nnx

from grpo_jax import models, objectives, paths
from grpo_jax.training import batch as batch_lib
from grpo_jax.training import policy as policy_lib

# The rows the teacher reads: the tokens and the sampler's kept support, not the
# student's recorded MoE routing.
TEACHER_KEYS = batch_lib.TOKEN_KEYS + ("support_ids", "support_size")


def enabled(config: ml_collections.ConfigDict) -> bool:
    """Whether the run distils from a teacher (``distill.teacher_path`` set)."""
    return bool(config.distill.teacher_path)


def pure(config: ml_collections.ConfigDict) -> bool:
    """Whether the advantage is the teacher's term alone (estimator "reverse_kl")."""
    return config.objective.advantage.estimator == "reverse_kl"


def check_config(config: ml_collections.ConfigDict) -> None:
    """Raises ValueError naming the ``distill`` field and the fix for a combination the
    loop cannot run (mesh-independent; the teacher's own checks are `check_teacher`)."""
    d = config.distill
    if not isinstance(d.teacher_path, str):
        raise ValueError(f"distill.teacher_path must be a str (an HF checkpoint directory; '' = "
                         f"off), got {d.teacher_path!r}")
    weight = d.weight
    if (isinstance(weight, bool) or not isinstance(weight, numbers.Real)
            or not math.isfinite(weight) or weight < 0):
        raise ValueError(f"distill.weight must be a finite number >= 0, got {weight!r}")
    if pure(config) and not enabled(config):
        raise ValueError("objective.advantage.estimator='reverse_kl' reads the teacher's "
                         "log-probs: set distill.teacher_path to the teacher's HF checkpoint")
    if not enabled(config):
        if weight != 1.0:
            raise ValueError(f"distill.weight={weight} has no effect without a teacher: set "
                             "distill.teacher_path (an HF checkpoint), or leave weight at 1.0")
        return
    if pure(config) and weight != 1.0:
        raise ValueError(f"distill.weight={weight} scales the teacher's term added to a reward "
                         "estimator's advantages; with objective.advantage.estimator="
                         "'reverse_kl' the advantage is that term alone: set distill.weight=1.0 "
                         "(and scale the step with optimizer.learning_rate)")
    if not pure(config) and weight == 0:
        raise ValueError("distill.weight=0 loads the teacher for nothing: set distill.weight > 0 "
                         "or distill.teacher_path=''")


def check_teacher(student_cfg: models.ModelConfig, teacher_cfg: models.ModelConfig,
                  student_tokenizer: transformers.PreTrainedTokenizerBase,
                  teacher_tokenizer: transformers.PreTrainedTokenizerBase, path: str) -> None:
    """Raises ValueError naming ``distill.teacher_path`` unless the teacher scores the
    student's token ids: the same vocabulary size and tokenizer (token -> id map, eos)."""
    if teacher_cfg.vocab_size != student_cfg.vocab_size:
        raise ValueError(f"distill.teacher_path {path!r} has a vocabulary of "
                         f"{teacher_cfg.vocab_size} ids, the policy {student_cfg.vocab_size}: "
                         "distillation scores the student's token ids with the teacher, so "
                         "both need the same tokenizer and vocabulary; choose a teacher of the "
                         "policy's family (or a policy of the teacher's)")
    if (teacher_tokenizer.get_vocab() != student_tokenizer.get_vocab()
            or teacher_tokenizer.eos_token_id != student_tokenizer.eos_token_id):
        raise ValueError(f"distill.teacher_path {path!r} has another tokenizer than the policy "
                         "(its token -> id map or eos differ): the teacher would score other "
                         "tokens than the student sampled; use a teacher with the policy's "
                         "tokenizer")


@dataclasses.dataclass(frozen=True)
class Teacher:
    """The frozen teacher on the training mesh.

    Attributes:
      graphdef: its `nnx.GraphDef`; params: its `nnx.State` (never trained or saved).
      forward: jitted ``(params, rows, plan=None) -> [B, N]`` log-probs of the rows'
        completion tokens (`batch.make_logprob_fn`'s program, the teacher's rows keys).
    """

    graphdef: nnx.GraphDef
    params: nnx.State
    forward: Callable

    def logp(self, batch: Mapping[str, jax.Array],
             plan: Mapping[str, jax.Array] | None = None) -> jax.Array:
        """`[B, N]` float32: the teacher's log-probs of the batch's completion tokens."""
        return self.forward(self.params, batch, plan)


def _teacher_dir(config) -> str:
    """``distill.teacher_path`` (absolute: `config_lib.resolve_paths`); raises
    FileNotFoundError naming the field unless it is a directory."""
    path = config.distill.teacher_path
    if not paths.path(path).is_dir():
        raise FileNotFoundError(f"distill.teacher_path {config.distill.teacher_path!r} is not a "
                                "directory; point it at a Hugging Face checkpoint (config.json, "
                                "*.safetensors and the tokenizer)")
    return path


def _teacher_overrides(config, mesh) -> dict:
    """The teacher's `ModelConfig` overrides: the policy's run settings, no adapters."""
    return {**models.run_overrides(config.model, mesh), "lora": None}


def teacher_model_config(config: ml_collections.ConfigDict,
                         mesh: jax.sharding.Mesh | None = None) -> models.ModelConfig | None:
    """The teacher's `ModelConfig` as `load_teacher` builds it (its config.json, the
    policy's dtypes and run settings, no adapters), no weights read; None without
    ``distill.teacher_path``. The memory footprint and the fit report count its weights
    from it (`footprint.replicated_state_bytes`, `grpo_jax.aot`)."""
    if not enabled(config):
        return None
    return models.load_config(_teacher_dir(config), **_teacher_overrides(config, mesh))


def load_teacher(config: ml_collections.ConfigDict, mesh: jax.sharding.Mesh,
                 student: policy_lib.Policy, num_pieces: int) -> Teacher | None:
    """The run's `Teacher` (None without ``distill.teacher_path``): read like the policy's
    ``model.path`` (`models.from_pretrained`, each tensor into its sharding by
    ``model.rules``), with the policy's dtypes and no adapters. `student` is the
    `policy.Policy` (its network config and tokenizer are checked against the teacher's);
    `num_pieces`: the rows' pieces of a forward pass, as the policy's."""
    if not enabled(config):
        return None
    path = _teacher_dir(config)
    overrides = _teacher_overrides(config, mesh)
    with paths.local_copy(path) as local:
        model, tokenizer = models.from_pretrained(local, mesh=mesh, rules=config.model.rules,
                                                  seed=config.seed, **overrides)
    if tokenizer is None:
        raise FileNotFoundError(f"distill.teacher_path {path!r} has no tokenizer files; save "
                                "the tokenizer next to the weights")
    check_teacher(student.model_config(), model.cfg, student.tokenizer, tokenizer, path)
    graphdef, params = nnx.split(model)
    forward = batch_lib.make_rows_fn(
        graphdef, mesh, _scorer(config.rollout.temperature), num_pieces=num_pieces,
        keys=TEACHER_KEYS)
    return Teacher(graphdef, params, forward)


def _scorer(temperature):
    def per_piece(model, piece):
        return batch_lib.scored_logprobs(model, piece, temperature=temperature)
    return per_piece


def reverse_kl(batch: Mapping[str, jax.Array]) -> jax.Array:
    """`[B, N]` float32: k_t = log pi_old(y_t) - log pi_T(y_t), clamped as
    `objectives.reverse_kl_distill_loss`, 0 outside ``batch["mask"]``."""
    _, diagnostics = objectives.reverse_kl_distill_loss(batch["old_logp"],
                                                        batch["teacher_logp"], batch["mask"])
    return diagnostics["reverse_kl"]


def advantages_fn(
    config: ml_collections.ConfigDict, objective: objectives.PolicyObjective
) -> Callable[[Mapping[str, jax.Array]], jax.Array]:
    """``batch -> advantages``: the objective's own with pure distillation (or none), else
    the objective's (broadcast to `[B, N]`) plus ``distill.weight`` x (-k_t)."""
    if not enabled(config) or pure(config):
        return objective.advantages
    weight = float(config.distill.weight)

    def mixed(batch):
        adv = objective.advantages(batch)
        adv = adv[:, None] if adv.ndim == 1 else adv
        return adv - weight * reverse_kl(batch)

    return mixed


def add_teacher_logp(teacher: Teacher | None, batch: dict[str, jax.Array],
                     plan: Mapping[str, jax.Array] | None,
                     loss_mask: jax.Array) -> dict[str, float]:
    """Adds ``teacher_logp`` to `batch` (which has ``old_logp``) and returns the metrics
    ({} without a teacher): ``distill_reverse_kl``, the token mean of k_t over
    `loss_mask` (`[B, N]`, the tokens the loss reads), and ``distill_teacher_logp``, the
    token mean of the teacher's log-probs."""
    if teacher is None:
        return {}
    batch["teacher_logp"] = teacher.logp(batch, plan)
    return {k: float(v) for k, v in jax.device_get(
        _statistics(batch["old_logp"], batch["teacher_logp"], batch["mask"],
                    loss_mask)).items()}


@jax.jit
def _statistics(old_logp, teacher_logp, mask, loss_mask):
    _, diagnostics = objectives.reverse_kl_distill_loss(old_logp, teacher_logp, mask)
    weight = loss_mask.astype(jnp.float32)
    tokens = jnp.maximum(jnp.sum(weight), 1.0)
    return {"distill_reverse_kl": jnp.sum(diagnostics["reverse_kl"] * weight) / tokens,
            "distill_teacher_logp": jnp.sum(teacher_logp * weight) / tokens}


def layout(config: ml_collections.ConfigDict, rows: int,
           new_tokens: int) -> dict[str, tuple[tuple[int, int], jax.typing.DTypeLike]]:
    """The RL batch's distillation key: ``{"teacher_logp": ([B, N], float32)}`` with a
    teacher, else {} (`programs.batch_layout`)."""
    return {"teacher_logp": ((rows, new_tokens), jnp.float32)} if enabled(config) else {}
