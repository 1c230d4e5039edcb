"""Tasks and datasets: TFDS builders (array_record, no TensorFlow) and grain loaders.

Build and read a split, then iterate it deterministically and resumably::

  from grpo_jax import data
  source = data.data_source("arithmetic", split="train", data_dir="/tmp/tfds",
                            config=data.ArithmeticConfig(digits=3, num_train=5000))
  loader = data.make_loader(source, seed=0, num_epochs=None,
                            transform=lambda ex: {**ex, "prompt": data.format_prompt(ex)})

Every example is a dict with ``task``, ``question``, ``answer`` and ``solution``
(see ``grpo_jax.data._records``); ``grpo_jax.data.prompts`` documents the answer
format of each task.
"""

from grpo_jax import _extras

_extras.require("grpo_jax.data")   # before the imports it guards

from grpo_jax.data._records import decode_example
from grpo_jax.data._records import split_of
from grpo_jax.data.apps import Apps
from grpo_jax.data.apps import AppsConfig
from grpo_jax.data.arithmetic import Arithmetic
from grpo_jax.data.arithmetic import ArithmeticConfig
from grpo_jax.data.benchmarks import BENCHMARKS
from grpo_jax.data.code_tasks import CodeTasks
from grpo_jax.data.code_tasks import CodeTasksConfig
from grpo_jax.data.countdown import Countdown
from grpo_jax.data.countdown import CountdownConfig
from grpo_jax.data.gsm8k import Gsm8k
from grpo_jax.data.humaneval import Humaneval
from grpo_jax.data.loader import BUILDERS
from grpo_jax.data.loader import builder_config
from grpo_jax.data.loader import data_source
from grpo_jax.data.loader import is_prepared
from grpo_jax.data.loader import make_loader
from grpo_jax.data.loader import metadata
from grpo_jax.data.loader import shard_bounds
from grpo_jax.data.math500 import Math500
from grpo_jax.data.mbpp import Mbpp
from grpo_jax.data.mbpp import MbppSanitized
from grpo_jax.data.prompts import TASK_FORMATS
from grpo_jax.data.prompts import chat_prompt
from grpo_jax.data.prompts import format_prompt
from grpo_jax.data.prompts import plain_prompt
from grpo_jax.data.prompts import render_answer
from grpo_jax.data.reasoning_gym_tasks import ReasoningGym
from grpo_jax.data.reasoning_gym_tasks import ReasoningGymConfig
from grpo_jax.data.rpt import Rpt
from grpo_jax.data.rpt import RptConfig
from grpo_jax.data.templates import TEMPLATES
from grpo_jax.data.templates import template_prompt
