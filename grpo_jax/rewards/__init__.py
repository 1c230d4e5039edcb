"""Verifiable rewards, registered by name: `(prompt, completion, example) -> float`.

Every example dict carries "task", "question" and "answer" (the canonical final answer);
Countdown rows add "numbers" and "target", RPT rows "context" and "continuation".

| name          | reads                                | 1.0 when                                              |
|---------------|--------------------------------------|-------------------------------------------------------|
| `integer_answer` | last `#### X`                     | X is exactly the integer "answer" (procedural arithmetic) |
| `integer_format` | last `#### X`                     | X is an integer, right or wrong (the answer format alone) |
| `math`        | last `\\boxed{}`                      | it equals "answer" (math-verify, after normalisation) |
| `gsm8k`       | later of last `#### X` / `\\boxed{}`, else last number | it equals "answer", as a value (`98+99` scores 0) |
| `countdown`   | last `<answer>...</answer>`          | a valid expression of "numbers" that equals "target"  |
| `format`      | the whole completion                 | exactly the `tags` blocks, in order                   |
| `self_verify` | final `<verify>correct|incorrect</verify>` | the verdict matches the `grader`'s judgement    |
| `rpt`         | last `\\boxed{}`                      | a token-boundary prefix of "continuation"             |
| `code_tests`  | last fenced python block             | it passes "tests" (or a share), run in a sandbox      |
| `overlong`    | "completion_length", "max_new_tokens" | (a penalty in [-1, 0], DAPO's soft overlong shaping) |
| `length_budget` | "completion_length", "max_new_tokens" | the answer has at most `budget` tokens (GDPO)      |

`math` and `gsm8k` read a number followed by unit words as that number (`#### 18 dollars`,
`\\boxed{\\text{18 dollars}}`) but score a hedge 0 (`#### 18 or more`), see `_units`;
they compare integers of any length as digit strings, and bound math-verify's work by
answer size and a time limit, see `_limits`.

`score_batch` scores a batch with several rewards (weighted sum, or `[B, K]` for GDPO);
graders that may hang run in a `GraderPool` under a time budget; failures score 0 and
are counted, never raised. Every grader returns in well under a second on any
completion of up to 10,000 characters, in the pool or not (a test pins it).
"""  # noqa: E501 (a table: rows stay whole)

from grpo_jax import _extras

_extras.require("grpo_jax.rewards")   # before the imports it guards

from grpo_jax.rewards._answers import final_boxed_answer
from grpo_jax.rewards._answers import final_gsm8k_answer
from grpo_jax.rewards._code import code_tests_reward
from grpo_jax.rewards._code import extract_program
from grpo_jax.rewards._code import program_answer
from grpo_jax.rewards._code import run_tests
from grpo_jax.rewards._code import sandbox_lines
from grpo_jax.rewards._countdown import InvalidExpression
from grpo_jax.rewards._countdown import countdown_reward
from grpo_jax.rewards._countdown import evaluate as evaluate_expression
from grpo_jax.rewards._countdown import parse_expression
from grpo_jax.rewards._countdown import is_valid_solution
from grpo_jax.rewards._format import format_reward
from grpo_jax.rewards._format import has_format
from grpo_jax.rewards._integer import integer_answer_reward, integer_format_reward
from grpo_jax.rewards._length import length_budget_reward
from grpo_jax.rewards._length import overlong_reward
from grpo_jax.rewards._math import answers_match
from grpo_jax.rewards._math import gsm8k_reward
from grpo_jax.rewards._math import math_reward
from grpo_jax.rewards._normalise import normalise_answer
from grpo_jax.rewards._pool import GraderPool
from grpo_jax.rewards._pool import Outcome
from grpo_jax.rewards._pool import run_contained
from grpo_jax.rewards._registry import Reward
from grpo_jax.rewards._registry import get_reward
from grpo_jax.rewards._registry import register
from grpo_jax.rewards._registry import reward_names
from grpo_jax.rewards._registry import unregister
from grpo_jax.rewards._rpt import matches_continuation
from grpo_jax.rewards._rpt import rpt_reward
from grpo_jax.rewards._sandbox import BwrapSandbox
from grpo_jax.rewards._sandbox import Limits
from grpo_jax.rewards._sandbox import RunResult
from grpo_jax.rewards._sandbox import Sandbox
from grpo_jax.rewards._sandbox import bwrap_works
from grpo_jax.rewards._sandbox import describe as describe_sandbox
from grpo_jax.rewards._sandbox import get_sandbox
from grpo_jax.rewards._scoring import RewardSpec
from grpo_jax.rewards._scoring import as_specs
from grpo_jax.rewards._scoring import score_batch
from grpo_jax.rewards._scoring import spec_weights
from grpo_jax.rewards._self_verify import final_verdict
from grpo_jax.rewards._self_verify import self_verify_reward
