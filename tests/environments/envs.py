"""Scripted environments for the tests (module level, so worker processes can import them)."""

import dataclasses
import time

from grpo_jax.environments import Environment, Step, ToolEnvironment


@dataclasses.dataclass(frozen=True)
class AnswerEveryA(Environment):
    """Every turn that ends with "a" gets ``<r>N</r>`` back (N: the row's turn count), the
    third ends the episode; ``hang_on``/``crash_on`` make one example's step hang or raise."""

    pause_text: str = "a"
    hang_on: int = -1
    crash_on: int = -1

    def ends_turn(self, turn):
        return turn.endswith("a")

    def step(self, example, turns):
        if example["id"] == self.hang_on:
            time.sleep(3600)
        if example["id"] == self.crash_on:
            raise RuntimeError("the tool crashed")
        if len(turns) >= 3:
            return Step(done=True, tool_call=True)
        return Step(observation=f"<r>{len(turns)}</r>", tool_call=True)

    def failed(self, status, detail):
        return Step(observation="<f>", tool_call=True, tool_error=True)


@dataclasses.dataclass(frozen=True)
class CalculatorPausingOnEquals(ToolEnvironment):
    """The calculator environment, but every row also pauses after each "=": on arithmetic
    scratchpads, a row pauses at every column and is never called (no tags)."""

    pause_text = "="


@dataclasses.dataclass(frozen=True)
class HostileReply(Environment):
    """Answers every turn with `observation` (any object: a 20 MB string, bytes, a number),
    or with `returned` itself in place of a `Step` when it is given."""

    observation: object = ""
    returned: object = None

    def step(self, example, turns):
        if self.returned is not None:
            return self.returned
        return Step(observation=self.observation, tool_call=True)
