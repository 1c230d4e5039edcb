"""Multi-turn rollouts: a tiny model's rows answered by an environment through `sampling.Engine`;
on several processes (layouts faked with a scripted engine), each answers its own rows."""

import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import tokenizers
import transformers
from flax import nnx

from grpo_jax import environments, models, objectives, rewards, sampling
from grpo_jax.training import batch as batch_lib, packing
from tests.environments.envs import AnswerEveryA

CHARS = "abcdefghij0123456789<>/ "
BUDGET = 64   # no stop token: a row ends at the budget or when the environment ends it


@pytest.fixture(scope="module")
def tokenizer():
    """One id per character (0 pad, 1 eos)."""
    vocab = {"<pad>": 0, "<eos>": 1, **{c: i + 2 for i, c in enumerate(CHARS)}}
    model = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="<pad>"))
    model.pre_tokenizer = tokenizers.pre_tokenizers.Split(
        tokenizers.Regex("."), behavior="isolated"
    )
    model.decoder = tokenizers.decoders.Fuse()
    return transformers.PreTrainedTokenizerFast(tokenizer_object=model, pad_token="<pad>",
                                                eos_token="<eos>")


@pytest.fixture(scope="module")
def model(tokenizer):
    cfg = models.get_model_config("tiny", vocab_size=len(tokenizer.get_vocab()), d_model=64,
                                  n_layers=2, eos_token_id=1)
    return nnx.split(models.init_model(cfg, seed=3))


def episodes(model, tokenizer, environment, *, slots=3, pool=None, **engine_args):
    prompts = [tokenizer.encode(p) for p in ("12+3", "abc", "7")]
    tokens, mask = sampling.pad_prompts(prompts, pad_id=0)
    engine = sampling.Engine(*model, tokens, mask, rng=jax.random.key(1),
                             method=sampling.Temperature(1.0), group_size=4, max_new_tokens=BUDGET,
                             stop_tokens=[], pad_id=0, slots=slots, max_append=8,
                             pause_tokens=environments.pause_ids(tokenizer, environment),
                             **engine_args)
    examples = [{"id": p} for p in range(3) for _ in range(4)]
    got = environments.run_episodes(engine, environment, examples, tokenizer, pool=pool)
    return got, sampling.to_host(engine.rollout())


def test_episode_counts_cut_and_join_by_row():
    """`first` and `concatenate` (an evaluation's chunks): the metrics of the joined rows are
    those of the rows themselves."""
    counts = lambda *rows: environments.Episodes(*[np.asarray(rows)] * 6)
    joined = environments.Episodes.concatenate([counts(0, 2, 1).first(2), counts(3, 0)])
    for field, values in vars(joined).items():
        np.testing.assert_array_equal(values, [0, 2, 3, 0], err_msg=field)
    metrics = joined.metrics()
    assert metrics["tool_calls_per_episode"] == 1.25 and metrics["tool_use_rate"] == 0.5
    assert metrics["environment_failures"] == 5.0


def test_pause_ids_are_the_tokens_with_the_pause_text(tokenizer):
    assert environments.pause_ids(tokenizer, AnswerEveryA()) == [
        tokenizer.convert_tokens_to_ids("a")
    ]
    with pytest.raises(ValueError, match=r"no token of the tokenizer contains '\$'"):
        environments.pause_ids(tokenizer, AnswerEveryA(pause_text="$"))


@pytest.mark.slow
def test_replies_follow_their_turns_and_the_counts_add_up(model, tokenizer):
    """Each answered turn (ending in "a") is followed by exactly its reply, marked
    appended; the third turn ends the row; the counts match the rows' tokens."""
    got, rollout = episodes(model, tokenizer, AnswerEveryA())
    a = tokenizer.convert_tokens_to_ids("a")
    for row in range(12):
        tokens = rollout.tokens[row, :rollout.lengths[row]]
        appended = rollout.appended[row, :rollout.lengths[row]]
        want, turn = np.zeros_like(appended), 0
        i = 0
        while i < len(tokens):
            if tokens[i] == a and not appended[i] and i < BUDGET - 1:   # at the budget: no pause
                turn += 1
                if turn < 3:
                    reply = tokenizer.encode(f"<r>{turn}</r>")
                    n = min(len(reply), len(tokens) - i - 1)
                    np.testing.assert_array_equal(tokens[i + 1:i + 1 + n], reply[:n])
                    want[i + 1:i + 1 + n] = True
                    i += n
                else:   # ended by the environment: nothing after it
                    assert i == len(tokens) - 1 and not rollout.truncated[row]
            i += 1
        np.testing.assert_array_equal(appended, want, err_msg=f"row {row}")
        assert got.tool_calls[row] == min(turn, 3)
        assert got.turns[row] == turn + (turn < 3)
    np.testing.assert_array_equal(got.environment_tokens, rollout.appended.sum(axis=1))
    assert got.tool_calls.sum() >= 6 and (got.tool_calls == 3).any() and got.failures.sum() == 0
    metrics = got.metrics()
    assert metrics["tool_calls_per_episode"] == pytest.approx(got.tool_calls.mean())
    assert metrics["tool_use_rate"] == pytest.approx(np.mean(got.tool_calls > 0))


@pytest.mark.slow
def test_a_hung_or_crashing_step_is_a_failed_turn(model, tokenizer):
    """Prompt 0's steps hang (killed at the pool's 2 s budget), prompt 1's raise: their
    turns get the failure as observation and the rollout ends; prompt 2's are answered."""
    environment = AnswerEveryA(hang_on=0, crash_on=1)
    with rewards.GraderPool(2, timeout_s=2.0) as pool:
        got, rollout = episodes(model, tokenizer, environment, pool=pool)
    calls = got.tool_calls
    np.testing.assert_array_equal(got.failures[:8], calls[:8])   # every step of 0 and 1 failed
    assert calls[:4].sum() >= 1 and calls[4:8].sum() >= 1 and got.failures[8:].sum() == 0
    np.testing.assert_array_equal(got.tool_errors[:8], calls[:8])
    for row in range(8):   # every reply of a failed step is the environment's failure text
        replies = tokenizer.decode(rollout.tokens[row][rollout.appended[row]])
        assert replies == "<f>" * (len(replies) // 3) and len(replies) % 3 == 0 or \
            rollout.lengths[row] == BUDGET   # (the last one may be cut by the budget)


@pytest.mark.slow
def test_the_trainer_reads_environment_tokens_and_its_loss_skips_them(model, tokenizer):
    """The batch of a multi-turn rollout: `mask` (the loss) on the model's tokens,
    `context_mask` on every token. The trainer's log-probs, padded and packed, equal the
    sampler's on the model's tokens across the turn boundaries; DAPO's loss gives the
    environment's tokens exactly zero gradient and ignores their old log-probs."""
    _, rollout = episodes(model, tokenizer, AnswerEveryA())
    env = rollout.appended & (rollout.mask > 0)
    rows = {"prompt_tokens": rollout.prompt_tokens, "prompt_mask": rollout.prompt_mask,
            "tokens": rollout.tokens, "mask": (rollout.mask * ~rollout.appended).astype(np.int32),
            "context_mask": rollout.mask}
    rows = {k: jnp.asarray(v) for k, v in rows.items()}
    sampled = np.asarray(rows["mask"]) > 0
    # turns go on after replies
    assert env.sum() >= 10 and (env.argmax(1) < rollout.lengths - 1).any()
    policy = nnx.merge(*model)
    padded = np.asarray(batch_lib.completion_logprobs(policy, rows))
    np.testing.assert_allclose(padded[sampled], rollout.logp[sampled], atol=1e-5, rtol=0)
    s, n = rollout.prompt_tokens.shape[1], rollout.tokens.shape[1]
    plan = packing.plan_chunks(*packing.row_lengths(rows), 12, prompt_len=s, new_tokens=n)
    chunk = {k: jnp.asarray(plan[k][0]) for k in packing.ROW_KEYS}
    packed = np.asarray(packing.unpack(batch_lib.scored_logprobs(policy, {**rows, **chunk}),
                                       jnp.asarray(plan["pack_back"])))
    np.testing.assert_allclose(packed[sampled], rollout.logp[sampled], atol=1e-5, rtol=0)
    without_context = np.asarray(
        batch_lib.completion_logprobs(policy, {**rows, "context_mask": rows["mask"]})
    )
    after_reply = sampled & (np.cumsum(env, axis=1) > 0)
    assert np.abs(without_context - padded)[after_reply].min() > 0   # the replies are read

    objective = objectives.presets.dapo(group_size=4)
    batch = {"mask": rows["mask"].astype(jnp.float32), "old_logp": jnp.asarray(rollout.logp),
             "rewards": jnp.arange(12, dtype=jnp.float32) % 3}
    loss_of = lambda logp, batch: objective(logp, batch)[0]
    loss, grad = jax.value_and_grad(loss_of)(jnp.asarray(padded) + 0.1, batch)
    np.testing.assert_array_equal(np.asarray(grad)[env], 0.0)
    assert np.count_nonzero(np.asarray(grad)[sampled]) > 0.5 * sampled.sum()
    garbage = {**batch, "old_logp": jnp.where(jnp.asarray(env), 1e3, batch["old_logp"])}
    assert loss_of(jnp.asarray(padded) + 0.1, garbage) == loss


@pytest.mark.slow
def test_a_turn_over_its_budget_ends_the_episode_truncated(model, tokenizer):
    """turn_budget=6: a turn that samples 6 tokens without ending ("a") ends its episode,
    truncated; every other row ended at its budget or by the environment."""
    got, rollout = episodes(model, tokenizer, AnswerEveryA(), turn_budget=6)
    a = tokenizer.convert_tokens_to_ids("a")
    over = got.turns_over_budget.astype(bool)
    assert over.sum() >= 3 and got.metrics()["turns_over_budget_rate"] == over.mean()
    for row in np.flatnonzero(over):
        tokens, appended = (
            x[row, : rollout.lengths[row]] for x in (rollout.tokens, rollout.appended)
        )
        last = len(tokens) - (np.flatnonzero(appended).max() + 1 if appended.any() else 0)
        assert last == 6 and a not in tokens[-6:] and rollout.truncated[row]
    done = ~over & (rollout.lengths < BUDGET)
    np.testing.assert_array_equal(got.tool_calls[done], 3)   # ended by the environment
    assert not rollout.truncated[done].any()


# Several processes: `run_episodes` of each process on a scripted engine holding its rows.
# Each row's turns, one per pause. AnswerEveryA answers a turn ending in "a" and ends the
# episode at the third; example 1 (rows 2 and 3) crashes its step. Row 0: three calls,
# two replies "<r>1</r>", "<r>2</r>" (8 tokens each), then done. Row 1: a pause that is
# not a turn (resumed with nothing), a call and its reply, then its stop token. Row 2:
# a call whose step crashes (reply "<f>", 3 tokens). Row 3: 4 tokens without a turn's
# end, the turn budget: ended, truncated.
SCRIPTS = [["ba", "ca", "da"], ["b", "a"], ["a"], ["bbbb"]]
EXAMPLES = [{"id": row // 2} for row in range(4)]
WANT = {"turns": [3, 2, 2, 1], "tool_calls": [3, 1, 1, 0], "tool_errors": [0, 0, 1, 0],
        "environment_tokens": [16, 8, 3, 0], "failures": [0, 0, 1, 0],
        "turns_over_budget": [0, 0, 0, 1]}


class ScriptedEngine:
    """`sampling.Engine`'s host side for one process holding `own_rows`: every row of it
    not done pauses at each `run` with its next turn of `SCRIPTS`; a resumed row whose
    script is over ends. Each answer must name exactly the rows it paused."""

    rows, turn_budget, max_append = len(SCRIPTS), 4, 8

    def __init__(self, own_rows, tokenizer):
        self.own_rows, self._tokenizer = np.asarray(own_rows), tokenizer
        self._turn = {r: 0 for r in own_rows}   # None once the row is done
        self._appended = np.zeros(self.rows, np.int64)
        self._paused, self.answers = [], []

    @property
    def finished(self):
        return all(turn is None for turn in self._turn.values())

    def run(self):
        self._paused = [r for r, turn in self._turn.items() if turn is not None]
        return np.asarray(self._paused)

    def turn_tokens(self, rows):
        return [self._tokenizer.encode(SCRIPTS[r][self._turn[r]]) for r in rows]

    def answer(self, replies, *, end=(), truncate=()):
        answered = sorted([*replies, *end, *truncate])
        assert answered == self._paused, (answered, self._paused)
        self.answers.append(answered)
        for r, ids in replies.items():
            self._appended[r] += len(ids)
            self._turn[r] = self._turn[r] + 1 if self._turn[r] + 1 < len(SCRIPTS[r]) else None
        for r in [*end, *truncate]:
            self._turn[r] = None

    def rollout(self):
        appended = np.arange(16)[None, :] < self._appended[:, None]
        return types.SimpleNamespace(appended=jnp.asarray(appended))


@pytest.mark.parametrize("layout, answers", [
    ([[0, 1, 2, 3]], [[[0, 1, 2, 3], [0, 1], [0]]]),   # one process
    ([[0, 1], [2, 3]], [[[0, 1], [0, 1], [0]], [[2, 3]]]),   # two, two rows each
])
def test_each_process_answers_its_own_rows_and_the_counts_join(tokenizer, layout, answers):
    environment = AnswerEveryA(crash_on=1)
    parts = []
    for own, want_answers in zip(layout, answers):
        engine = ScriptedEngine(own, tokenizer)
        parts.append(environments.run_episodes(engine, environment, [EXAMPLES[r] for r in own],
                                               tokenizer))
        assert engine.answers == want_answers   # its own rows, one answer per pause
    joined = environments.Episodes.concatenate(parts)
    for field, values in WANT.items():
        np.testing.assert_array_equal(getattr(joined, field), values, err_msg=field)
    metrics = joined.metrics()
    assert metrics["tool_calls_per_episode"] == 1.25 and metrics["tool_use_rate"] == 0.75
    assert metrics["environment_failures"] == 1.0 and metrics["turns_over_budget_rate"] == 0.25


def test_the_examples_are_those_of_the_rows_a_process_holds(tokenizer):
    with pytest.raises(ValueError, match=r"examples_b has 4 examples; give one per row this "
                                         r"process holds \(2 of 4\)"):
        environments.run_episodes(ScriptedEngine([2, 3], tokenizer), AnswerEveryA(), EXAMPLES,
                                  tokenizer)
