"""Procedural tasks from reasoning-gym (basic_arithmetic, chain_sum, countdown, gsm_symbolic).

reasoning-gym generates the problems (offline, from a seed); this module turns them
into the project's example contract and TFDS splits. Its scorers are not used: the
rewards are ours (``grpo_jax.rewards``). Difficulty knobs are reasoning-gym's own
config fields, passed through ``task_kwargs``; for example
``ReasoningGymConfig(task="chain_sum", task_kwargs={"min_terms": 2, "max_terms": 3,
"max_digits": 2})`` or ``task="countdown", task_kwargs={"min_numbers": 3,
"max_numbers": 4}``.

Countdown questions are rewritten from the instance's numbers and target, because
reasoning-gym's text asks for a bare expression while ours asks for
``<answer>...</answer>``.
"""

import dataclasses
import itertools
from collections.abc import Iterator
from typing import Any, ClassVar

import numpy as np
import tensorflow_datasets as tfds

from grpo_jax.data import _procedural
from grpo_jax.data import _records
from grpo_jax.data import countdown
from grpo_jax.data import prompts

TASKS = ("basic_arithmetic", "chain_sum", "countdown", "gsm_symbolic")
# reasoning-gym generates item i of a dataset from Random(seed + i), so consecutive
# chunks seeded seed, seed + _CHUNK, ... form one non-overlapping stream. Chunks keep
# memory bounded: some tasks (gsm_symbolic) precompute a list of `size` entries.
_CHUNK = 1000


def countdown_question(numbers: list[int], target: int) -> str:
    """Our countdown problem statement (a subset of the numbers may be used)."""
    listed = ", ".join(str(n) for n in numbers)
    return (f"Using the numbers {listed}, write an arithmetic expression that equals "
            f"{target}. You may use +, -, *, / and parentheses, and each number at "
            "most once.")


def to_example(task: str, item: dict[str, Any]) -> dict[str, Any]:
    """A reasoning-gym item (question, answer, metadata) as a project example."""
    answer = str(item["answer"])
    example = {"task": task, "question": item["question"], "answer": answer,
               "solution": prompts.render_answer(task, answer)}
    metadata = item["metadata"]
    if task == "countdown":
        numbers, target = [int(n) for n in metadata["numbers"]], int(metadata["target"])
        example.update(question=countdown_question(numbers, target), numbers=numbers,
                       target=target)
    if task == "gsm_symbolic":
        example["solution"] = metadata["answer_cot"].strip()
    return example


def example_key(example: dict[str, Any]) -> str:
    """Countdown: the multiset of numbers and the target; other tasks: the question."""
    if example["task"] == "countdown":
        return countdown.example_key(example)
    return example["question"]


@dataclasses.dataclass(eq=False)
class ReasoningGymConfig(_procedural.ProceduralConfig):
    """Which reasoning-gym task, and its difficulty knobs.

    Attributes:
      task: one of ``TASKS``.
      task_kwargs: fields of reasoning-gym's config for the task (not seed or size).
    """

    PREFIX: ClassVar[str] = "reasoning_gym"

    task: str = "chain_sum"
    task_kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        if self.task not in TASKS:
            raise ValueError(f"reasoning_gym.task must be one of {TASKS}, got {self.task!r}")
        reserved = {"seed", "size"} & set(self.task_kwargs)
        if reserved:
            raise ValueError(
                f"reasoning_gym.task_kwargs may not set {sorted(reserved)}; use "
                "reasoning_gym.seed and num_train / num_test")
        self.name = self.name or f"{self.task}_{self.digest()}"
        super().__post_init__()


def generate(config: ReasoningGymConfig) -> Iterator[dict[str, Any]]:
    """The infinite candidate stream of ``config.task`` from ``config.seed``."""
    # Imported here: reasoning-gym takes seconds to import and only builds need it.
    import reasoning_gym  # pylint: disable=g-import-not-at-top

    for chunk in itertools.count():
        dataset = reasoning_gym.create_dataset(
            config.task, seed=(config.seed + chunk * _CHUNK) % 2**32, size=_CHUNK,
            **config.task_kwargs)
        for item in dataset:
            yield to_example(config.task, item)


class ReasoningGym(_procedural.ProceduralBuilder):
    """reasoning-gym tasks as verifiable problems (see ``grpo_jax.data.reasoning_gym_tasks``)."""

    BUILDER_CONFIGS = [ReasoningGymConfig(name=task, task=task) for task in TASKS]

    def features(self) -> tfds.features.FeaturesDict:
        if self.builder_config.task == "countdown":
            return _records.example_features(
                numbers=tfds.features.Sequence(np.int64), target=np.int64)
        return _records.example_features()

    def candidates(self) -> Iterator[dict[str, Any]]:
        return generate(self.builder_config)

    def key(self, example: dict[str, Any]) -> str:
        return example_key(example)
