"""Verifiable rewards, registered by name: `(prompt, completion, example) -> float`.

The example dict carries at least "task", "question" and "answer"; Countdown rows add
"numbers" and "target", RPT rows "context" and "continuation".
"""

from grpo_jax.rewards._answers import final_boxed_answer
from grpo_jax.rewards._answers import final_gsm8k_answer
from grpo_jax.rewards._countdown import countdown_reward
from grpo_jax.rewards._countdown import is_valid_solution
from grpo_jax.rewards._format import format_reward
from grpo_jax.rewards._format import has_format
from grpo_jax.rewards._length import overlong_reward
from grpo_jax.rewards._integer import integer_answer_reward
from grpo_jax.rewards._math import answers_match
from grpo_jax.rewards._math import gsm8k_reward
from grpo_jax.rewards._math import math_reward
from grpo_jax.rewards._normalise import normalise_answer
from grpo_jax.rewards._pool import GraderPool
from grpo_jax.rewards._pool import Outcome
from grpo_jax.rewards._registry import Reward
from grpo_jax.rewards._registry import get_reward
from grpo_jax.rewards._registry import register
from grpo_jax.rewards._registry import reward_names
from grpo_jax.rewards._registry import unregister
from grpo_jax.rewards._self_verify import final_verdict
from grpo_jax.rewards._self_verify import self_verify_reward
from grpo_jax.rewards._rpt import matches_continuation
from grpo_jax.rewards._rpt import rpt_reward
from grpo_jax.rewards._scoring import RewardSpec
from grpo_jax.rewards._scoring import as_specs
from grpo_jax.rewards._scoring import score_batch
from grpo_jax.rewards._scoring import spec_weights
