"""GRPO-family and PPO objectives: pure functions of arrays, importable into any JAX model.

Nothing here sees a model or a config object, and only `clip_cov_loss` takes a PRNG key
(as an argument). The composer (`policy_objective`) reads an `ObjectiveSpec` (or a
recipe's config section, converted to one once) and returns a pure function; `presets`
builds each method's objective by name (``presets.dapo(group_size=16)``).
docs/semantics.md gives the exact semantics of each, side by side.

The gradient contract, the same for every function: the current policy's log-probs
(``logp``; a value model's ``values``) are the only differentiated input. Old, reference
and behaviour log-probs, advantages, importance weights and value targets are read with
a stop-gradient inside, so passing the array being differentiated as ``old_logp`` (the
on-policy case) gives the policy gradient, not zero. Masks select; they carry no gradient.
"""

from grpo_jax.objectives._advantages import gae
from grpo_jax.objectives._advantages import gdpo_advantages
from grpo_jax.objectives._advantages import group_advantages
from grpo_jax.objectives._advantages import length_adaptive_lambda
from grpo_jax.objectives._advantages import masked_whiten
from grpo_jax.objectives._advantages import outcome_token_rewards
from grpo_jax.objectives._advantages import reinforce_pp_advantages
from grpo_jax.objectives._advantages import rloo_advantages
from grpo_jax.objectives._aggregation import AGGREGATION_MODES
from grpo_jax.objectives._aggregation import SPLIT_DEPENDENT_MODES
from grpo_jax.objectives._aggregation import aggregate
from grpo_jax.objectives._batch import BATCH_KEYS
from grpo_jax.objectives._batch import TRAINER_KEYS
from grpo_jax.objectives._batch import check_group_layout
from grpo_jax.objectives._compose import PolicyObjective
from grpo_jax.objectives._compose import describe
from grpo_jax.objectives._compose import policy_objective
from grpo_jax.objectives._compose import validate_objective_config
from grpo_jax.objectives._covariance import clip_cov_loss
from grpo_jax.objectives._distill import generalized_jsd
from grpo_jax.objectives._distill import reverse_kl_distill_loss
from grpo_jax.objectives._covariance import kl_cov_loss
from grpo_jax.objectives._covariance import token_covariance
from grpo_jax.objectives._kl import KL_KINDS
from grpo_jax.objectives._kl import kl_penalty
from grpo_jax.objectives._logits import completion_logprobs
from grpo_jax.objectives._logits import entropy_from_logits
from grpo_jax.objectives._logits import token_logprobs
from grpo_jax.objectives._mismatch import decoupled_ppo_loss
from grpo_jax.objectives._mismatch import mismatch_metrics
from grpo_jax.objectives._mismatch import rollout_correction
from grpo_jax.objectives._policy_losses import cispo_loss
from grpo_jax.objectives._policy_losses import gspo_loss
from grpo_jax.objectives._policy_losses import pg_loss
from grpo_jax.objectives._policy_losses import ppo_clip_loss
from grpo_jax.objectives._policy_losses import sapo_loss
from grpo_jax.objectives._registry import ADVANTAGE_ESTIMATORS
from grpo_jax.objectives._registry import POLICY_LOSSES
from grpo_jax.objectives._registry import RANDOM_LOSSES
from grpo_jax.objectives._registry import register_advantage_estimator
from grpo_jax.objectives._registry import register_policy_loss
from grpo_jax.objectives._shaping import SIGNALS
from grpo_jax.objectives._shaping import dynamic_sampling_signal
from grpo_jax.objectives._shaping import group_has_signal
from grpo_jax.objectives._shaping import importance_weights
from grpo_jax.objectives._shaping import offpolicy_sequence_mask
from grpo_jax.objectives._shaping import overlong_penalty
from grpo_jax.objectives._shaping import truncated_mask
from grpo_jax.objectives._spec import CONFIG_PATHS
from grpo_jax.objectives._spec import OVERLONG_MODES
from grpo_jax.objectives._spec import ObjectiveSpec
from grpo_jax.objectives._spec import objective_spec
from grpo_jax.objectives._trl_variants import adaptive_entropy_coef
from grpo_jax.objectives._trl_variants import entropy_bonus_coef
from grpo_jax.objectives._trl_variants import top_entropy_mask
from grpo_jax.objectives._trl_variants import vespo_loss
from grpo_jax.objectives._trust_region import binary_divergence
from grpo_jax.objectives._trust_region import dppo_loss
from grpo_jax.objectives._trust_region import gmpo_loss
from grpo_jax.objectives._trust_region import m2po_mask
from grpo_jax.objectives._value import explained_variance
from grpo_jax.objectives._value import value_loss
from grpo_jax.objectives import presets  # noqa: E402  (after the functions it builds on)
