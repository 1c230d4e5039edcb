"""What an environment is: a picklable object whose `step` answers the model's latest turn.

An episode is one rollout row: the prompt (from a dataset example), then the model's
turns, each but the last followed by the environment's reply. A row pauses when its
text could end a turn (`Environment.pause_text`, e.g. the ">" of a closing tag); the
host asks `ends_turn` (cheap, in the trainer process) and, for a real turn, runs `step`
in a worker process under a time and memory budget (a hung or crashing environment is a
failed turn, never a hung run), for every paused row in parallel. `step` is a function
of the example and the turns so far, so nothing is lost when a worker is replaced.

A tool environment in a few lines:

    @dataclasses.dataclass(frozen=True)
    class Calculator(ToolEnvironment):
        tools: Mapping = dataclasses.field(default_factory=lambda: {"calculator": calculator})

The model writes ``<calculator>478*256</calculator>`` and reads
``<result>122368</result>`` after it.
"""

import dataclasses
import re
from typing import Callable, Mapping


@dataclasses.dataclass(frozen=True)
class Step:
    """The environment's answer to one turn.

    Attributes:
      observation: text the model reads next (tokenized and appended to its row), or None
        to let the model go on without a reply (the turn was not a call after all).
      done: end the episode after this turn (the row stops; its reward is scored as usual).
      tool_call: the turn called a tool (metrics: `tool_calls_per_episode`).
      tool_error: the call failed (a malformed call, an error the tool reported).
    """

    observation: str | None = None
    done: bool = False
    tool_call: bool = False
    tool_error: bool = False


class Environment:
    """Answers a model's turns. Subclass it (at module level, so it pickles) and define
    `step`; `pause_text` and `ends_turn` say where a turn may end."""

    pause_text: str = ">"

    def ends_turn(self, turn: str) -> bool:
        """Whether `turn` (the text since the row's last reply) is a turn to answer; called
        in the trainer process at every pause, so it must be cheap. Default: always."""
        return True

    def step(self, example: dict, turns: list[str]) -> Step:
        """The answer to `turns[-1]`; `turns[:-1]` are the model's earlier turns."""
        raise NotImplementedError(f"{type(self).__name__} must define step(example, turns) -> "
                                  "Step (or subclass ToolEnvironment and give it tools)")

    def failed(self, status: str, detail: str) -> Step:
        """The answer when `step` itself failed ("error": it raised; "timeout": it ran out
        of time): by default the episode goes on with the failure as its observation."""
        return Step(observation=f"error: the environment {status} ({detail[:200]})",
                    tool_call=True, tool_error=True)


@dataclasses.dataclass(frozen=True)
class ToolEnvironment(Environment):
    """Tools called with tags in the model's text: ``<name>argument</name>`` runs
    `tools[name](argument, example)` and the model reads ``reply.format(output)`` next.

    Attributes:
      tools: tag name -> a module-level function `(argument text, example) -> text`.
      max_calls: calls per episode; the turn that would make one more ends the episode.
      reply: how a tool's output is shown to the model (a chat model's tool role, say).
    """

    tools: Mapping[str, Callable[[str, dict], str]] = dataclasses.field(default_factory=dict)
    max_calls: int = 4
    reply: str = "<result>{}</result>"

    def __post_init__(self):
        bad = [name for name in self.tools if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name)]
        if bad:
            raise ValueError(f"tool names {bad} are not tag names; use letters, digits and _")
        if self.max_calls < 0:
            raise ValueError(f"max_calls={self.max_calls} must be >= 0")

    def call(self, turn: str):
        """`(name, argument)` of the call that ends `turn` (``...<name>argument</name>``,
        trailing spaces allowed), or None."""
        for name in self.tools:   # the argument holds no opening tag: the innermost call
            match = re.search(rf"<{name}>((?:(?!<{name}>).)*?)</{name}>\s*$", turn, flags=re.DOTALL)
            if match:
                return name, match.group(1)
        return None

    def ends_turn(self, turn: str) -> bool:
        return self.call(turn) is not None

    def step(self, example: dict, turns: list[str]) -> Step:
        name, argument = self.call(turns[-1])
        if len(turns) > self.max_calls:
            return Step(done=True, tool_call=True, tool_error=True)
        output = self.tools[name](argument, example)
        return Step(observation=self.reply.format(output), tool_call=True,
                    tool_error=str(output).startswith("error"))

    def failed(self, status: str, detail: str) -> Step:
        what = "timed out" if status == "timeout" else "failed"
        return Step(observation=self.reply.format(f"error: the tool {what}"), tool_call=True,
                    tool_error=True)
