"""Environments for multi-turn rollouts: the model's turns answered by tools.

    environment = ToolEnvironment(tools={"calculator": calculator})
    engine = sampling.Engine(..., pause_tokens=pause_ids(tokenizer, environment), slots=C)
    episodes = run_episodes(engine, environment, examples_b, tokenizer, pool=pool)
    rollout = engine.rollout()   # rollout.appended: the environment's tokens (no loss)

See `_interface` for what an environment is and `_episodes` for the loop.
"""

from grpo_jax import _extras

_extras.require("grpo_jax.environments")   # before the imports it guards

from grpo_jax.environments._chat import chat_reply
from grpo_jax.environments._episodes import Episodes
from grpo_jax.environments._episodes import pause_ids
from grpo_jax.environments._episodes import run_episodes
from grpo_jax.environments._interface import Environment
from grpo_jax.environments._interface import Step
from grpo_jax.environments._interface import ToolEnvironment
from grpo_jax.environments._tools import ENVIRONMENTS
from grpo_jax.environments._tools import TOOLS
from grpo_jax.environments._tools import calculator
from grpo_jax.environments._tools import countdown_check
from grpo_jax.environments._tools import make
