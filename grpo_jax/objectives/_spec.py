"""An objective's hyper-parameters as one frozen value: `ObjectiveSpec`.

The composer (`policy_objective`) and the presets (`grpo_jax.objectives.presets`) build
from it; a recipe's ``config.objective`` section (nested: ``loss.eps_high``) converts to
it once, at construction, so an objective never changes after it is built and a typo in
a field name is an error that names the closest field.

Each field has a flat keyword (what presets and `ObjectiveSpec` take) and a config path
(the nested ``objective`` section of a recipe); `CONFIG_PATHS` maps one to the other.
"""

import dataclasses
import difflib
import numbers
import typing
import warnings
from typing import Any, Mapping

from grpo_jax.objectives import _checks
from grpo_jax.objectives._aggregation import AGGREGATION_MODES
from grpo_jax.objectives._kl import KL_KINDS
from grpo_jax.objectives._mismatch import MISMATCH_LEVELS, MISMATCH_MODES, resolve_bounds
from grpo_jax.objectives._registry import ADVANTAGE_ESTIMATORS, POLICY_LOSSES
from grpo_jax.objectives._trust_region import DPPO_DIVERGENCES

OVERLONG_MODES = ("none", "mask")
ADVANTAGE_SCALES = ("group", "batch", "none")
# Losses whose paper defines the objective per answer: 1/G sum_i 1/|y_i| sum_t.
BUILTIN_ESTIMATORS = ("group", "rloo", "reinforce_pp", "gdpo", "gae", "reverse_kl")
BUILTIN_LOSSES = ("pg", "ppo_clip", "gspo", "cispo", "sapo", "gmpo", "dppo", "clip_cov",
                  "kl_cov", "luspo", "vespo")
PER_ANSWER_LOSSES = {"gspo": "Zheng et al., arXiv:2507.18071, eq. 5",
                     "sapo": "Gao et al., arXiv:2511.20347, the SAPO objective",
                     "gmpo": "Zhao et al., arXiv:2507.20673, the GMPO objective"}
# Losses defined with another aggregation: kind -> (the mode, where it is defined).
# LUSPO is GSPO's loss with each answer's term scaled by its length: a token sum.
LOSS_MODES = {"luspo": ("seq-mean-token-sum",
                        "Liu et al., arXiv:2602.05261, the LUSPO objective")}


@dataclasses.dataclass(frozen=True)
class ObjectiveSpec:
    """Every hyper-parameter of a policy objective; frozen, checked when made.

    Flat keyword (config path under ``objective``), default, meaning:

    group_size (group_size), required: G, the completions per prompt; rows are P
      prompts x G completions laid out consecutively, and G must divide the batch.
    estimator (advantage.estimator) "group": "group" (GRPO, Dr. GRPO), "rloo",
      "reinforce_pp", "gdpo", "gae" (PPO, VAPO: GAE over batch["values"]), or
      "reverse_kl" (on-policy distillation: per-token teacher_logp - old_logp, no reward).
    advantage_scale (advantage.scale) "group": group estimator's divisor: the group's
      std ("group"), the batch's ("batch"), none ("none", Dr. GRPO).
    ddof (advantage.ddof) 0: the std's ddof (0 population; TRL and verl use 1).
    advantage_eps (advantage.eps) 1e-6: added to the std before dividing.
    gamma (advantage.gamma) 1.0: reinforce_pp and gae discount.
    baseline (advantage.baseline) False: reinforce_pp subtracts the group mean first.
    lam (advantage.lam) 0.95: gae's lambda.
    lam_alpha (advantage.lam_alpha) 0.0: > 0, VAPO's length-adaptive lambda
      1 - 1/(alpha * length) replaces lam.
    whiten (advantage.whiten) True: gae whitens its advantages over the batch's tokens.
    policy_loss (loss.kind) "ppo_clip": "pg", "ppo_clip", "gspo", "cispo", "sapo",
      "gmpo", "dppo", "clip_cov", "kl_cov", "luspo" (GSPO's loss under
      seq-mean-token-sum), "vespo" (`vespo_loss`).
    eps_low, eps_high (loss.eps_low, loss.eps_high) 0.2, 0.2: the clip range (gmpo: of
      the log-ratio).
    dual_clip (loss.dual_clip) None: c > 1 caps -r A at -c A for A < 0 (ppo_clip).
    tau_pos, tau_neg (loss.tau_pos, loss.tau_neg) 1.0, 1.05: sapo's gate temperatures.
    dppo_divergence (loss.divergence) "binary_tv": dppo's trust-region divergence,
      "binary_tv" or "binary_kl" (`dppo_loss`).
    dppo_delta_low, dppo_delta_high (loss.delta_low, loss.delta_high) None, None: its
      thresholds for tokens pushed down / up; None: 0.15 (TV) or 0.05 (KL).
    dppo_ratio_cap (loss.ratio_cap) 20.0: the cap on dppo's importance weight.
    clip_cov_fraction (loss.clip_fraction) 2e-4: clip_cov's share of tokens left out,
      drawn with batch["loss_seed"] (`clip_cov_loss`).
    clip_cov_low, clip_cov_high (loss.cov_low, loss.cov_high) 1.0, 5.0: its covariance band.
    kl_cov_fraction (loss.kl_fraction) 2e-3: kl_cov's share of tokens penalised.
    kl_cov_coef (loss.kl_coef) 1.0: kl_cov's penalty weight (`kl_cov_loss`).
    vespo_k_pos, vespo_lambda_pos, vespo_k_neg, vespo_lambda_neg (loss.k_pos,
      loss.lambda_pos, loss.k_neg, loss.lambda_neg) 2.0, 3.0, 3.0, 2.0: vespo's kernel
      power and decay for A >= 0 and A < 0 (TRL's defaults).
    aggregation (aggregation.mode) "token-mean": how per-token losses become a scalar
      (`aggregate`; "bnpo": TRL's per-micro-batch token mean).
    norm_len (aggregation.norm_len) None: seq-mean-token-sum-norm's constant (None: T).
    allow_other_modes (aggregation.allow_other_modes) False: let gspo, sapo and gmpo,
      defined per answer (seq-mean-token-mean), and luspo (seq-mean-token-sum) run with
      another aggregation on purpose.
    kl_beta (kl.beta) 0.0: weight of the KL to the reference (batch["ref_logp"]).
    kl_kind (kl.kind) "k3": "k1", "k2", "k3" or "k3_unbiased" (`kl_penalty`).
    kl_in_reward (kl.in_reward) False: reinforce_pp folds -beta KL into token rewards.
    entropy_coef (entropy_coef) 0.0: weight of the entropy bonus (batch["entropy"]).
    top_entropy_quantile (top_entropy_quantile) 1.0: rho < 1 keeps the policy loss on
      the top rho share of tokens by entropy only (batch["entropy"]; `top_entropy_mask`,
      "80/20", arXiv:2506.01939, which uses 0.2); the KL and entropy terms and the
      normalisation keep every token.
    positive_nll_weight (positive_nll_weight) 0.0: VAPO's weight on the NLL of the
      batch's correct answers (batch["correct"]).
    overlong (overlong.mode) "none": "mask" drops truncated answers from the loss and its
      token count (DAPO's overlong filtering). DAPO's soft overlong penalty is a reward,
      not a mode (`overlong_penalty`; ``("overlong", weight, {...})`` in ``reward.specs``).
    offpolicy_mask (offpolicy_mask.enabled) False: DeepSeek-V3.2's off-policy sequence
      mask (`offpolicy_sequence_mask`) ...
    offpolicy_delta (offpolicy_mask.delta) 0.5: ... and its threshold.
    m2po (m2po.enabled) False: M2PO's second-moment mask (`m2po_mask`, against
      batch["behaviour_logp"] when present, else old_logp) ...
    m2po_tau (m2po.tau) 0.04: ... and its budget on the kept tokens' mean squared
      log-ratio.
    importance (importance.enabled) False: weight the loss by pi_old / pi_behaviour, the
      sampler/trainer mismatch correction (batch["behaviour_logp"]; `rollout_correction`)
      ... With old_logp from a proximal policy and behaviour_logp from a stale one, and
      mode "mask", low 0, high = cap, this is decoupled PPO (AReaL, arXiv:2505.24298,
      eq. 5, `decoupled_ppo_loss`) ...
    importance_level (importance.level) "token": ... per "token", "sequence" (product of
      the token ratios) or "geometric" (their geometric mean) ...
    importance_mode (importance.mode) "truncate": ... capped at high ("truncate", TIS) or
      zero outside [low, high] ("mask", MIS / IcePop) ...
    importance_low, importance_high (importance.low, importance.high) None, None: ... the
      bounds; None takes the papers' values: high 2 for "truncate" (TIS), [0.5, 5] for
      "mask" (IcePop, arXiv:2510.18855).
    """

    group_size: int
    estimator: str = "group"
    advantage_scale: str = "group"
    ddof: int = 0
    advantage_eps: float = 1e-6
    gamma: float = 1.0
    baseline: bool = False
    lam: float = 0.95
    lam_alpha: float = 0.0
    whiten: bool = True
    policy_loss: str = "ppo_clip"
    eps_low: float = 0.2
    eps_high: float = 0.2
    dual_clip: float | None = None
    tau_pos: float = 1.0
    tau_neg: float = 1.05
    dppo_divergence: str = "binary_tv"
    dppo_delta_low: float | None = None
    dppo_delta_high: float | None = None
    dppo_ratio_cap: float | None = 20.0
    clip_cov_fraction: float = 2e-4
    clip_cov_low: float = 1.0
    clip_cov_high: float = 5.0
    kl_cov_fraction: float = 2e-3
    kl_cov_coef: float = 1.0
    vespo_k_pos: float = 2.0
    vespo_lambda_pos: float = 3.0
    vespo_k_neg: float = 3.0
    vespo_lambda_neg: float = 2.0
    aggregation: str = "token-mean"
    norm_len: int | None = None
    allow_other_modes: bool = False
    kl_beta: float = 0.0
    kl_kind: str = "k3"
    kl_in_reward: bool = False
    entropy_coef: float = 0.0
    top_entropy_quantile: float = 1.0
    positive_nll_weight: float = 0.0
    overlong: str = "none"
    offpolicy_mask: bool = False
    offpolicy_delta: float = 0.5
    m2po: bool = False
    m2po_tau: float = 0.04
    importance: bool = False
    importance_level: str = "token"
    importance_mode: str = "truncate"
    importance_low: float | None = None
    importance_high: float | None = None

    def __post_init__(self):
        for name in ("group_size", "norm_len"):   # numpy integers (np.int64) are ints too
            value = getattr(self, name)
            if isinstance(value, numbers.Integral) and not isinstance(value, (bool, int)):
                object.__setattr__(self, name, int(value))
        _validate(self)

    def replace(self, **changes):
        """A copy with `changes` (flat keywords); unknown names, and fields the copy does
        not read, are rejected."""
        check_keywords(changes, "ObjectiveSpec.replace")
        spec = dataclasses.replace(self, **changes)
        check_read(spec, changes, "ObjectiveSpec.replace")
        return spec

    def config_items(self):
        """``(config path, value)`` for every field, in declaration order."""
        return [(CONFIG_PATHS[f.name], getattr(self, f.name)) for f in dataclasses.fields(self)]


CONFIG_PATHS = {
    "group_size": "group_size",
    "estimator": "advantage.estimator",
    "advantage_scale": "advantage.scale",
    "ddof": "advantage.ddof",
    "advantage_eps": "advantage.eps",
    "gamma": "advantage.gamma",
    "baseline": "advantage.baseline",
    "lam": "advantage.lam",
    "lam_alpha": "advantage.lam_alpha",
    "whiten": "advantage.whiten",
    "policy_loss": "loss.kind",
    "eps_low": "loss.eps_low",
    "eps_high": "loss.eps_high",
    "dual_clip": "loss.dual_clip",
    "tau_pos": "loss.tau_pos",
    "tau_neg": "loss.tau_neg",
    "dppo_divergence": "loss.divergence",
    "dppo_delta_low": "loss.delta_low",
    "dppo_delta_high": "loss.delta_high",
    "dppo_ratio_cap": "loss.ratio_cap",
    "clip_cov_fraction": "loss.clip_fraction",
    "clip_cov_low": "loss.cov_low",
    "clip_cov_high": "loss.cov_high",
    "kl_cov_fraction": "loss.kl_fraction",
    "kl_cov_coef": "loss.kl_coef",
    "vespo_k_pos": "loss.k_pos",
    "vespo_lambda_pos": "loss.lambda_pos",
    "vespo_k_neg": "loss.k_neg",
    "vespo_lambda_neg": "loss.lambda_neg",
    "aggregation": "aggregation.mode",
    "norm_len": "aggregation.norm_len",
    "allow_other_modes": "aggregation.allow_other_modes",
    "kl_beta": "kl.beta",
    "kl_kind": "kl.kind",
    "kl_in_reward": "kl.in_reward",
    "entropy_coef": "entropy_coef",
    "top_entropy_quantile": "top_entropy_quantile",
    "positive_nll_weight": "positive_nll_weight",
    "overlong": "overlong.mode",
    "offpolicy_mask": "offpolicy_mask.enabled",
    "offpolicy_delta": "offpolicy_mask.delta",
    "m2po": "m2po.enabled",
    "m2po_tau": "m2po.tau",
    "importance": "importance.enabled",
    "importance_level": "importance.level",
    "importance_mode": "importance.mode",
    "importance_low": "importance.low",
    "importance_high": "importance.high",
}
_KEYWORD_OF_PATH = {path: name for name, path in CONFIG_PATHS.items()}


# The names TRL (GRPOConfig) and verl (actor_rollout_ref.actor, algorithm) give the same
# settings -> (flat keyword, a note). Spelling does not find them: difflib maps
# clip_ratio_low to clip_cov_low and kl_loss_coef to kl_cov_coef, other losses' fields.
PEER_NAMES = {
    "clip_ratio_low": ("eps_low", ""),
    "clip_ratio_high": ("eps_high", ""),
    "clip_ratio": ("eps_low", "set eps_low and eps_high to it"),
    "epsilon": ("eps_low", "TRL's symmetric range: set eps_low and eps_high to it"),
    "epsilon_low": ("eps_low", ""),
    "epsilon_high": ("eps_high", "TRL's CISPO cap is absolute, eps_high relative: "
                                 "presets.cispo(..., trl_epsilon_high=...)"),
    "clip_ratio_c": ("dual_clip", ""),
    "beta": ("kl_beta", ""),
    "kl_loss_coef": ("kl_beta", ""),
    "kl_coef": ("kl_beta", "verl's in-reward KL: kl_beta with kl_in_reward=True"),
    "kl_loss_type": ("kl_kind", "low_var_kl is k3"),
    "use_kl_loss": ("kl_beta", "a KL loss is kl_beta > 0"),
    "use_kl_in_reward": ("kl_in_reward", ""),
    "importance_sampling_level": (
        "policy_loss", "TRL's 'sequence' level is GSPO's ratio, policy_loss='gspo' "
                       "(importance_level is the sampler/trainer correction's level)"),
    "loss_type": ("aggregation", "TRL's 'grpo', 'bnpo', 'dr_grpo', 'dapo' are "
                                 "normalisations; its 'cispo', 'sapo', 'luspo' and 'vespo' "
                                 "are policy_loss"),
    "use_adaptive_entropy": ("entropy_coef", "adaptive control is a trainer's state from "
                                             "step to step: adaptive_entropy_coef and "
                                             "entropy_bonus_coef give each step's entropy_coef"),
    "loss_agg_mode": ("aggregation", ""),
    "scale_rewards": ("advantage_scale", ""),
    "num_generations": ("group_size", ""),
    "entropy_coeff": ("entropy_coef", ""),
    "mask_truncated_completions": ("overlong", "overlong='mask'"),
    "vllm_importance_sampling_correction": ("importance", ""),
    "vllm_importance_sampling_cap": ("importance_high", ""),
    "vllm_importance_sampling_mode": ("importance_mode", "and importance_level"),
    "max_completion_length": ("norm_len", "Dr. GRPO's constant"),
}


def _closest(name, candidates, *, paths=False):
    """The "; did you mean ...?" hint for an unknown name (keywords, or config paths)."""
    leaf = name.rsplit(".", 1)[-1]
    if leaf in PEER_NAMES:
        keyword, note = PEER_NAMES[leaf]
        shown = f"objective.{CONFIG_PATHS[keyword]}" if paths else repr(keyword)
        return (f"; did you mean {shown}? ({leaf!r} is TRL's or verl's name"
                + (f"; {note})" if note else ")"))
    match = difflib.get_close_matches(name, list(candidates), n=1, cutoff=0.5)
    if not match:
        return ""
    return f"; did you mean objective.{match[0]}?" if paths else f"; did you mean {match[0]!r}?"


def check_keywords(changes, where):
    """Raises TypeError naming the first keyword of `changes` that is not a field."""
    for name in changes:
        if name not in CONFIG_PATHS:
            raise TypeError(f"{where}: unknown objective keyword {name!r}"
                            f"{_closest(name, CONFIG_PATHS)} (every keyword, with its config "
                            "path: grpo_jax.objectives.ObjectiveSpec)")


def _leaves(section, prefix=""):
    """``(dotted path, value)`` of every leaf of a nested mapping (a ConfigDict too)."""
    for key, value in section.items():
        path = f"{prefix}{key}"
        if hasattr(value, "items"):
            yield from _leaves(value, f"{path}.")
        else:
            yield path, value


def objective_spec(config: Any) -> ObjectiveSpec:
    """The frozen `ObjectiveSpec` of an ``objective`` section, a nested dict, or a spec.

    A section may leave fields out (they take `ObjectiveSpec`'s defaults) but must give
    group_size; a path that is not a field raises ValueError naming the closest one.
    """
    if isinstance(config, ObjectiveSpec):
        return config
    if not hasattr(config, "items"):
        raise TypeError(f"an objective is built from an ObjectiveSpec, a preset "
                        f"(grpo_jax.objectives.presets) or a recipe's config.objective "
                        f"section (a nested mapping); got {type(config).__name__}")
    values = {}
    for path, value in _leaves(config):
        if path == "importance.cap":
            raise ValueError("objective.importance.cap is now objective.importance.high (the "
                             "truncation cap, or the mask's upper bound) with "
                             "objective.importance.low (the mask's lower bound)")
        if path not in _KEYWORD_OF_PATH:
            raise ValueError(f"objective.{path} is not an objective field"
                             f"{_closest(path, _KEYWORD_OF_PATH, paths=True)}")
        values[_KEYWORD_OF_PATH[path]] = value
    if "group_size" not in values:
        raise ValueError("objective.group_size is missing: set it to G, the completions per "
                         "prompt (the batch's rows are P prompts x G completions)")
    spec = ObjectiveSpec(**values)
    warn_unread(spec)
    return spec


def _field(name):
    return f"objective.{CONFIG_PATHS[name]}"


def _validate(spec):
    """Raises ValueError naming the first impossible field (by its config path)."""
    _checks.check_static_int("objective.group_size", spec.group_size)
    if not isinstance(spec.group_size, int) or isinstance(spec.group_size, bool) \
            or spec.group_size < 1:
        raise ValueError(f"objective.group_size must be an integer >= 1, got {spec.group_size!r}")
    _checks.check_choice(_field("estimator"), spec.estimator, tuple(ADVANTAGE_ESTIMATORS))
    _checks.check_choice(_field("policy_loss"), spec.policy_loss, tuple(POLICY_LOSSES))
    _checks.check_choice(_field("aggregation"), spec.aggregation, AGGREGATION_MODES)
    _checks.check_choice(_field("kl_kind"), spec.kl_kind, KL_KINDS)
    _checks.check_choice(_field("overlong"), spec.overlong, OVERLONG_MODES)
    _checks.check_choice(_field("importance_level"), spec.importance_level, MISMATCH_LEVELS)
    _checks.check_choice(_field("importance_mode"), spec.importance_mode, MISMATCH_MODES)
    try:
        resolve_bounds(spec.importance_mode, spec.importance_low, spec.importance_high)
    except ValueError as error:
        raise ValueError(f"objective.importance (mode {spec.importance_mode!r}, low "
                         f"{spec.importance_low}, high {spec.importance_high}): {error}") from None
    _checks.check_choice(_field("advantage_scale"), spec.advantage_scale, ADVANTAGE_SCALES)
    for name in ("eps_low", "eps_high", "kl_beta", "offpolicy_delta", "positive_nll_weight",
                 "lam_alpha", "dppo_delta_low", "dppo_delta_high", "kl_cov_coef"):
        _checks.check_nonnegative(_field(name), getattr(spec, name))
    for name in ("dppo_ratio_cap", "clip_cov_fraction", "kl_cov_fraction", "m2po_tau",
                 "vespo_k_pos", "vespo_lambda_pos", "vespo_k_neg", "vespo_lambda_neg"):
        _checks.check_greater(_field(name), getattr(spec, name), 0.0)
    _checks.check_choice(_field("dppo_divergence"), spec.dppo_divergence, DPPO_DIVERGENCES)
    if not spec.clip_cov_low < spec.clip_cov_high:
        raise ValueError(f"objective.loss.cov_low must be < objective.loss.cov_high, got "
                         f"{spec.clip_cov_low} and {spec.clip_cov_high}")
    if spec.dual_clip is not None:
        _checks.check_greater(_field("dual_clip"), spec.dual_clip, 1.0)
    for name in ("gamma", "lam", "top_entropy_quantile"):
        _checks.check_unit_interval(_field(name), getattr(spec, name))
    if spec.norm_len is not None and (isinstance(spec.norm_len, bool)
                                      or not isinstance(spec.norm_len, int)
                                      or spec.norm_len < 1):
        raise ValueError(f"objective.aggregation.norm_len must be None (T, the batch's token "
                         f"axis) or an integer >= 1 (Dr. GRPO: the generation budget), got "
                         f"{spec.norm_len!r}")
    if spec.estimator == "rloo" and spec.group_size < 2:
        raise ValueError(f"objective.group_size must be >= 2 for rloo, got {spec.group_size}")
    if spec.group_size < 2 and (spec.estimator in ("group", "gdpo") or (
            spec.estimator == "reinforce_pp" and spec.baseline)):
        raise ValueError(f"objective.group_size must be >= 2 for the {spec.estimator!r} "
                         f"estimator (it compares the answers of a prompt with each other; one "
                         f"answer has advantage 0), got {spec.group_size}")
    if spec.kl_in_reward and spec.estimator != "reinforce_pp":
        raise ValueError("objective.kl.in_reward=True needs objective.advantage.estimator="
                         f"'reinforce_pp' (token rewards); got {spec.estimator!r}")
    if spec.kl_in_reward and spec.kl_kind == "k3_unbiased":
        raise ValueError("objective.kl.kind='k3_unbiased' corrects the KL loss's gradient; "
                         "a KL folded into the reward (objective.kl.in_reward=True) has none: "
                         "use kind 'k1', 'k2' or 'k3' there")
    kind, mode = spec.policy_loss, spec.aggregation
    defined = LOSS_MODES.get(kind) or (
        ("seq-mean-token-mean", PER_ANSWER_LOSSES[kind]) if kind in PER_ANSWER_LOSSES else None)
    if defined and mode != defined[0] and not spec.allow_other_modes:
        raise ValueError(
            f"objective.aggregation.mode={mode!r} changes the {kind} objective, which its paper "
            f"({defined[1]}) defines with {defined[0]!r}; set "
            f"objective.aggregation.mode={defined[0]!r}, or "
            "objective.aggregation.allow_other_modes=True to run this variant on purpose")
    if kind == "vespo" and spec.importance:
        raise ValueError("objective.importance.enabled=True with objective.loss.kind='vespo': "
                         "VESPO corrects the sampler/trainer gap inside its sequence weight "
                         "(TRL adds the log of that ratio to log w), not as a weight per "
                         "token, and that is not built here; leave importance off or use "
                         "another loss")


def _reads(spec):
    """``{field: the settings that read it}`` for each field `spec` does NOT read."""
    kind, est = spec.policy_loss, spec.estimator
    unread = {}

    def need(fields, reads, settings):
        if not reads:
            unread.update({f: settings for f in fields})

    loss_fields = {}   # every loss's fields, from the registry (registered losses too)
    for name, (_, fields) in POLICY_LOSSES.items():
        for field in fields:
            loss_fields.setdefault(field if isinstance(field, str) else field[0], []).append(name)
    reads = {f if isinstance(f, str) else f[0] for f in POLICY_LOSSES[kind][1]}
    if kind in BUILTIN_LOSSES:   # a registered loss may read any field (functools.partial)
        for field, kinds in loss_fields.items():
            need((field,), field in reads,
                 "objective.loss.kind " + ", ".join(repr(k) for k in kinds))
    if est in BUILTIN_ESTIMATORS:   # a registered estimator may read any field
        need(("advantage_scale", "ddof"), est == "group", "objective.advantage.estimator 'group'")
        need(("advantage_eps",), est in ("group", "gdpo"),
             "objective.advantage.estimator 'group' or 'gdpo'")
        need(("gamma",), est in ("reinforce_pp", "gae"),
             "objective.advantage.estimator 'reinforce_pp' or 'gae'")
        need(("baseline",), est == "reinforce_pp", "objective.advantage.estimator 'reinforce_pp'")
        need(("lam", "lam_alpha", "whiten"), est == "gae", "objective.advantage.estimator 'gae'")
    need(("norm_len",), spec.aggregation == "seq-mean-token-sum-norm",
         "objective.aggregation.mode 'seq-mean-token-sum-norm'")
    need(("allow_other_modes",), kind in PER_ANSWER_LOSSES or kind in LOSS_MODES,
         "objective.loss.kind " + ", ".join(repr(k) for k in [*PER_ANSWER_LOSSES, *LOSS_MODES]))
    need(("offpolicy_delta",), spec.offpolicy_mask, "objective.offpolicy_mask.enabled=True")
    need(("m2po_tau",), spec.m2po, "objective.m2po.enabled=True")
    need(("importance_level", "importance_mode", "importance_low", "importance_high"),
         spec.importance, "objective.importance.enabled=True")
    return unread


_DEFAULTS = {f.name: f.default for f in dataclasses.fields(ObjectiveSpec)
             if f.default is not dataclasses.MISSING}
_WARNED = set()


def _unread_message(spec, name, settings):
    return (f"{_field(name)}={getattr(spec, name)!r} has no effect here: only {settings} "
            f"read it (this objective: loss.kind {spec.policy_loss!r}, advantage.estimator "
            f"{spec.estimator!r}, aggregation.mode {spec.aggregation!r})")


def check_read(spec, given, where):
    """Raises ValueError when a keyword the caller gave (`given`) is a field `spec` never
    reads: it would do nothing (``presets.sapo(group_size=4, eps_high=0.3)``: SAPO has
    no clip). `where` names the call."""
    unread = _reads(spec)
    for name in given:
        if name in unread:
            raise ValueError(f"{where}: {_unread_message(spec, name, unread[name])}; "
                             "leave it out")


def warn_unread(spec):
    """Warns, once per message, for each field of a config section that `spec` never
    reads but that differs from its default. A section carries every field, and a
    sweep's base may set one that only some entries read, so this warns, not raises."""
    for name, settings in _reads(spec).items():
        if getattr(spec, name) != _DEFAULTS[name]:
            message = _unread_message(spec, name, settings)
            if message not in _WARNED:
                _WARNED.add(message)
                warnings.warn(message, UserWarning, stacklevel=3)


def field_types() -> Mapping[str, type]:
    """Config path -> the Python type of its value (``float | None`` fields: float)."""
    def value_type(field):
        types = [t for t in typing.get_args(field.type) if t is not type(None)]
        return types[0] if types else field.type

    return {CONFIG_PATHS[f.name]: value_type(f) for f in dataclasses.fields(ObjectiveSpec)}
