"""The task side of a run: prompts from a dataset, their token ids, and their rewards."""

import numpy as np

from grpo_jax import data, paths, rewards

# Prompt widths a run compiles for: powers of two from 8 (short arithmetic prompts waste
# half of a 16-wide bucket, and every column costs compute in every step).
PROMPT_BUCKETS = tuple(2**i for i in range(3, 17))

_KNOB_CLASSES = {"arithmetic": data.ArithmeticConfig, "reasoning_gym": data.ReasoningGymConfig,
                 "rpt": data.RptConfig}


def data_source(task_cfg, split):
    """The TFDS data source of `split`, built on first use into ``task.data_dir``."""
    knobs = task_cfg.knobs.to_dict()
    config = _KNOB_CLASSES[task_cfg.name](**knobs) if task_cfg.name in _KNOB_CLASSES else None
    return data.data_source(
        task_cfg.name, split=split, data_dir=paths.resolve(task_cfg.data_dir), config=config,
        manual_dir=paths.resolve(task_cfg.manual_dir) or None)


def prompt_text(task_cfg, example, tokenizer):
    """The prompt string of `example`: the plain template or the tokenizer's chat template."""
    return data.format_prompt(example, tokenizer=tokenizer if task_cfg.chat_template else None,
                              system_prompt=task_cfg.system_prompt or None)


def encode_prompts(task_cfg, examples, tokenizer):
    """`(prompt strings, token-id lists)` of a list of examples."""
    texts = [prompt_text(task_cfg, ex, tokenizer) for ex in examples]
    ids = tokenizer(texts, add_special_tokens=False)["input_ids"]
    return texts, ids


def tokenizer_corpus(source, limit=2000):
    """Texts that cover the task's characters (prompts and solutions), for a char tokenizer."""
    examples = [data.decode_example(source[i]) for i in range(min(limit, len(source)))]
    return [data.format_prompt(ex) + ex["solution"] for ex in examples] + ["0123456789"]


def decode_completions(tokenizer, tokens_bn, mask_bn):
    """Completion strings without the stop token and padding."""
    eos = tokenizer.eos_token_id
    return [tokenizer.decode([t for t, m in zip(row, mrow) if m and t != eos])
            for row, mrow in zip(np.asarray(tokens_bn).tolist(), np.asarray(mask_bn).tolist())]


class Scorer:
    """Scores completions with the config's rewards; slow graders run in a process pool.

    Rewards are kept as `[B, K]` columns for GDPO (``separate=True``) and summed with
    their weights otherwise; the column named by ``reward.correct`` gives accuracy.
    """

    def __init__(self, reward_cfg, *, separate):
        self.specs = rewards.as_specs(reward_cfg.specs)
        names = [s.name for s in self.specs]
        if reward_cfg.correct not in names:
            raise ValueError(f"reward.correct={reward_cfg.correct!r} must be one of the "
                             f"reward.specs names {names}")
        self.correct_column = names.index(reward_cfg.correct)
        self.weights = rewards.spec_weights(self.specs)
        self.separate = separate
        needs_pool = any(rewards.get_reward(n).where == "pool" for n in names)
        self.pool = rewards.GraderPool(timeout_s=reward_cfg.timeout_s) if needs_pool else None

    def __call__(self, prompts, completions, examples, lengths):
        """-> (rewards `[B]` or `[B, K]` float32, correct `[B]` bool, metrics)."""
        columns, metrics = rewards.score_batch(
            self.specs, prompts, completions, examples, pool=self.pool,
            completion_lengths=lengths, combine="separate")
        correct = columns[:, self.correct_column] >= 1.0
        values = columns if self.separate else columns @ self.weights
        return values.astype(np.float32), correct, metrics

    def close(self):
        if self.pool is not None:
            self.pool.close()
