"""Multi-turn rollouts: a `sampling.Engine` whose paused rows the environment answers.

    engine = sampling.Engine(..., pause_tokens=pause_ids(tokenizer, environment), slots=C)
    episodes = run_episodes(engine, environment, examples_b, tokenizer, pool=pool)
    rollout = engine.rollout()          # rollout.appended: the environment's tokens

Every time rows pause, the host decodes each paused row's current turn, keeps those that
`environment.ends_turn`, runs `environment.step` for all of them at once in the pool's
worker processes (bounded in time and memory; without a pool, in this process), appends
each observation's tokens to its row (the row feeds them into its cache and samples on),
ends the rows whose step says done, and lets the others go on unanswered.

On a mesh spanning several processes every process runs this loop at once over the rows
it holds (`Engine.own_rows`: those of its own prompts, as its rewards are): it decodes,
steps and counts only those, and the engine puts every process's replies into its rows.
"""

import dataclasses

import numpy as np

from grpo_jax import parallel, rewards
from grpo_jax.environments._interface import Step

# A reply is cut to this many characters per token of `max_append` before it is tokenized
# (in the worker, so a huge reply never reaches the trainer): a token of a real tokenizer
# spans far fewer characters, so the cut keeps every token the row can take.
CHARS_PER_TOKEN = 64


def reply_chars(max_append):
    """The most characters of one reply kept before tokenizing (`CHARS_PER_TOKEN` each)."""
    return CHARS_PER_TOKEN * max_append


@dataclasses.dataclass
class Episodes:
    """Per-row counts of a multi-turn rollout, `[B]` int arrays.

    Attributes:
      turns: the model's turns (answered ones, plus the last).
      tool_calls: turns the environment counted as tool calls.
      tool_errors: calls that failed (bad call, tool error, timeout, crash).
      environment_tokens: tokens the environment appended to the row (an observation is
        cut at the engine's `max_append` and at the row's budget).
      failures: environment steps that raised or timed out.
      turns_over_budget: 1 where the episode ended because a turn reached the engine's
        `turn_budget` without ending (truncated, like a row at its token budget).
    """

    turns: np.ndarray
    tool_calls: np.ndarray
    tool_errors: np.ndarray
    environment_tokens: np.ndarray
    failures: np.ndarray
    turns_over_budget: np.ndarray

    def first(self, rows):
        """The counts of the first `rows` rows."""
        return Episodes(**{k: v[:rows] for k, v in dataclasses.asdict(self).items()})

    @classmethod
    def concatenate(cls, parts):
        """The rows of `parts` (a non-empty list of `Episodes`), in order."""
        return cls(**{k: np.concatenate([getattr(p, k) for p in parts])
                      for k in dataclasses.asdict(parts[0])})

    def metrics(self):
        """Means per episode (`tool_calls_per_episode`, ...) and the share with a call."""
        return {
            "turns_per_episode": float(np.mean(self.turns)),
            "tool_calls_per_episode": float(np.mean(self.tool_calls)),
            "tool_errors_per_episode": float(np.mean(self.tool_errors)),
            "tool_use_rate": float(np.mean(self.tool_calls > 0)),
            "environment_tokens_per_episode": float(np.mean(self.environment_tokens)),
            "environment_failures": float(np.sum(self.failures)),
            "turns_over_budget_rate": float(np.mean(self.turns_over_budget)),
        }


def pause_ids(tokenizer, environment):
    """The ids whose text contains `environment.pause_text` (e.g. every token with a
    ">"; special tokens never): a row pauses after sampling one, and the host looks
    whether its turn ended."""
    special = set(tokenizer.all_special_ids)
    ids = [i for i in tokenizer.get_vocab().values()
           if i not in special and environment.pause_text in tokenizer.decode([i])]
    if not ids:
        raise ValueError(f"no token of the tokenizer contains {environment.pause_text!r} "
                         "(the environment's pause_text): the model could never end a turn")
    return sorted(ids)


def _step(environment, example, turns, max_chars):
    """`environment.step` by name, for a worker process: its `Step` with the observation
    cut to `max_chars` characters. Raises TypeError (a failed step) for anything but a
    `Step` whose observation is a str or None."""
    step = environment.step(example, turns)
    if not isinstance(step, Step):
        raise TypeError(f"{type(environment).__name__}.step returned a {type(step).__name__}, "
                        "not a Step")
    observation = step.observation
    if observation is not None and not isinstance(observation, str):
        raise TypeError(f"{type(environment).__name__}.step's observation is a "
                        f"{type(observation).__name__}; give a str (or None for no reply)")
    if observation is not None and len(observation) > max_chars:
        step = dataclasses.replace(step, observation=observation[:max_chars])
    return step


def _steps(environment, calls, pool, max_chars):
    """`rewards.Outcome`s (value: the `Step`, None where it failed) for `calls` of
    `(example, turns)`: in the pool's workers, or here, an exception contained either way;
    each observation at most `max_chars` characters (`_step`)."""
    calls = [(environment, *call, max_chars) for call in calls]
    if pool is not None:
        return pool.map(_step, calls, as_reward=False)
    return [rewards.run_contained(_step, call, {}, as_reward=False) for call in calls]


def reply_frame(environment):
    """`(before, after)`: the text a `ToolEnvironment`'s ``reply`` puts around a tool's
    output (a chat template's turn markers, ``<result>``), or None for an environment
    that writes its replies whole."""
    reply = getattr(environment, "reply", None)
    if not isinstance(reply, str):
        return None
    before, *after = reply.format("\0").split("\0")
    return (before, after[0]) if len(after) == 1 else None


def reply_ids(tokenizer, observation, max_append, frame=None):
    """The ids of a reply, at most `max_append` (the row's budget may cut it further): the
    text cut to `reply_chars` characters first (an environment run in this process, or a
    failure's reply, is bounded too), then tokenized without special tokens added.

    A tool's output often quotes the model's text (an error naming a bad call), which may
    hold the text of the tokenizer's special or added tokens (``<eos>``, a chat role
    marker): inside the `frame` (`reply_frame`) such text is tokenized as plain text, so
    the model cannot forge a turn end through a tool; the frame's own markers stay one
    token each. Outside a frame the environment's text is tokenized as it is.
    """
    text = (observation or "")[:reply_chars(max_append)]
    encode = lambda part, **kw: tokenizer.encode(part, add_special_tokens=False, **kw)
    if frame is None or not text.startswith(frame[0]):
        return encode(text)[:max_append]
    before, content = frame[0], text[len(frame[0]):]
    after = frame[1] if frame[1] and content.endswith(frame[1]) else ""
    content = content[:len(content) - len(after)]
    if not any(token in content for token in tokenizer.get_added_vocab()):
        return encode(text)[:max_append]   # nothing to neutralize: the text as it is
    ids = encode(before) + encode(content, split_special_tokens=True) + encode(after)
    return ids[:max_append]


def run_episodes(engine, environment, examples_b, tokenizer, *, pool=None):
    """Runs `engine` to the end, answering its paused rows with `environment`.

    On several processes every process calls it at once and answers the rows it holds
    (`engine.own_rows`); with one process, every row.

    Args:
      engine: a `sampling.Engine` made with `pause_tokens=pause_ids(tokenizer, environment)`.
      environment: an `Environment`.
      examples_b: the dataset example of each row this process holds, in row order (P*G
        with one process; the G rows of a prompt share one).
      tokenizer: decodes turns and encodes observations (no special tokens added).
      pool: a `rewards.GraderPool` to run the steps in, or None (in this process).

    Returns:
      `Episodes` of this process's rows; the rollout is `engine.rollout()`.
    """
    own = engine.own_rows
    if len(examples_b) != len(own):
        raise ValueError(f"examples_b has {len(examples_b)} examples; give one per row this "
                         f"process holds ({len(own)} of {engine.rows})")
    at = {int(r): i for i, r in enumerate(own)}   # row id -> its place among this process's
    turns = [[] for _ in own]
    counts = {k: np.zeros(len(own), np.int64) for k in ("tool_calls", "tool_errors", "failures",
                                                        "turns_over_budget")}
    ended = np.zeros(len(own), bool)   # the environment ended the episode after a turn
    frame = reply_frame(environment)
    while not engine.finished:
        paused = [int(r) for r in engine.run()]
        turn_ids = dict(zip(paused, engine.turn_tokens(paused)))
        texts = {r: tokenizer.decode(turn_ids[r]) for r in paused}
        answering = [r for r in paused if environment.ends_turn(texts[r])]
        over = [r for r in paused if r not in answering and engine.turn_budget
                and len(turn_ids[r]) >= engine.turn_budget]   # the turn ran out
        for r in answering:
            turns[at[r]].append(texts[r])
        steps = _steps(environment, [(examples_b[at[r]], list(turns[at[r]])) for r in answering],
                       pool, reply_chars(engine.max_append))
        replies = {r: [] for r in paused if r not in answering and r not in over}
        ending = []
        counts["turns_over_budget"][[at[r] for r in over]] = 1
        for r, outcome in zip(answering, steps):
            step = outcome.value
            if outcome.status != "ok" or step is None:
                counts["failures"][at[r]] += outcome.status != "ok"
                step = environment.failed(outcome.status, outcome.detail or "returned no step")
            counts["tool_calls"][at[r]] += step.tool_call
            counts["tool_errors"][at[r]] += step.tool_error
            if step.done:
                ending.append(r)
                ended[at[r]] = True
                continue
            replies[r] = reply_ids(tokenizer, step.observation, engine.max_append, frame)
        engine.answer(replies, end=ending, truncate=over)   # every process, once per pause
    appended = parallel.read_rows(engine.rollout().appended, own)
    return Episodes(turns=np.asarray([len(t) for t in turns]) + ~ended,
                    environment_tokens=appended.sum(axis=1), **counts)
