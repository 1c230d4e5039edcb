"""The task side of a run: datasets, prompts as token rows, completions back to text, rewards."""

from typing import Any

import grain
import numpy as np

from grpo_jax import data, parallel, rewards, sampling

# Prompt widths a run compiles for: powers of two from 8 (short arithmetic prompts waste
# half of a 16-wide bucket, and every column costs compute in every step).
PROMPT_BUCKETS = tuple(2**i for i in range(3, 17))
PREPARE_ON = ("main", "every")


def data_source(task_cfg: Any, split: str) -> Any:
    """The TFDS data source of `split`, built on first use into ``task.data_dir``.

    With several processes and ``task.prepare_on = "main"`` (a data dir every host
    shares), process 0 builds the dataset while the others wait, then all open it;
    ``"every"`` builds it in each process (per-host local data dirs).
    """
    if task_cfg.prepare_on not in PREPARE_ON:
        raise ValueError(
            f"task.prepare_on must be one of {PREPARE_ON}, got {task_cfg.prepare_on!r}"
        )
    kwargs = dict(split=split, **_dataset_location(task_cfg))
    if task_cfg.prepare_on == "every" or parallel.is_main():
        source = data.data_source(task_cfg.name, **kwargs)
    parallel.sync(f"dataset {task_cfg.name} {split} prepared")
    if task_cfg.prepare_on == "main" and not parallel.is_main():
        source = data.data_source(task_cfg.name, prepare=False, **kwargs)
    return source


def is_prepared(task_cfg: Any) -> bool:
    """Whether the task's dataset is already built in ``task.data_dir`` (a run that finds
    it missing builds it first)."""
    return data.is_prepared(task_cfg.name, **_dataset_location(task_cfg))


def _dataset_location(task_cfg):
    return dict(data_dir=task_cfg.data_dir,   # absolute: config_lib.resolve_paths
                config=data.builder_config(task_cfg.name, task_cfg.knobs.to_dict()),
                manual_dir=task_cfg.manual_dir or None)


def loader(source: Any, config: Any, *, batch_size: int) -> Any:
    """This process's share of an endless, shuffled stream of global batches.

    Every process walks the same stream of `batch_size`-example batches (a function of
    the seed alone) and keeps its slice: process i of n the examples
    ``[i b / n, (i + 1) b / n)``. So the global batch of a step is the same on any number
    of processes, and their rows join in process order (`parallel.global_rows`).
    """
    count, index = parallel.process_count(), parallel.process_index()
    if batch_size % count:
        raise ValueError(f"a batch of {batch_size} examples does not split over {count} "
                         "processes; make rollout.prompts_per_batch (sft.batch_size) a multiple")
    share = batch_size // count
    stream = data.make_loader(source, seed=config.seed, num_epochs=None, batch_size=batch_size,
                              drop_remainder=True, shard_options=grain.sharding.NoSharding())
    return stream.map(lambda batch: batch[index * share:(index + 1) * share])


def prompt_text(task_cfg: Any, example: dict[str, Any], tokenizer: Any) -> str:
    """The prompt string of `example`: the model family's template
    (``task.prompt_template``), else the plain template or the tokenizer's chat template."""
    if task_cfg.prompt_template:
        if task_cfg.chat_template or task_cfg.system_prompt or task_cfg.shots:
            raise ValueError(
                f"task.prompt_template={task_cfg.prompt_template!r} writes the whole prompt; "
                "leave task.chat_template=False, task.system_prompt='' and task.shots=() "
                "(or set task.prompt_template='')")
        return data.template_prompt(example, task_cfg.prompt_template)
    return data.format_prompt(example, tokenizer=tokenizer if task_cfg.chat_template else None,
                              system_prompt=task_cfg.system_prompt or None,
                              shots=task_cfg.shots)


def prompt_rows(task_cfg: Any, examples: list[dict[str, Any]],
                tokenizer: Any) -> tuple[list[str], np.ndarray, np.ndarray]:
    """`(texts, prompt_tokens [P, S], prompt_mask [P, S])`, left-padded numpy rows.

    S is the smallest bucket that holds every process's longest prompt, so the rows of
    all processes stack into one global array.
    """
    texts = [prompt_text(task_cfg, ex, tokenizer) for ex in examples]
    ids = tokenizer(texts, add_special_tokens=False)["input_ids"]
    width = parallel.agree_max(sampling.bucket_length(max(map(len, ids)), buckets=PROMPT_BUCKETS))
    tokens, mask = sampling.pad_prompts(ids, pad_id=tokenizer.pad_token_id, buckets=(width,))
    return texts, tokens, mask


def check_positions(longest_prompt: int, new_tokens: int, context: int, where: str) -> None:
    """Raises ValueError naming the fields when a prompt of `longest_prompt` tokens and
    `new_tokens` more (``rollout.max_new_tokens``) take more positions than the model's
    `context` (its ``max_position_embeddings``: the trained RoPE range, rescaled ones
    included): past it the model reads positions it never saw, at the memory and time of
    the longer rows."""
    if longest_prompt + new_tokens > context:
        raise ValueError(
            f"{where}: a prompt of {longest_prompt} tokens + rollout.max_new_tokens="
            f"{new_tokens} = {longest_prompt + new_tokens} positions, more than the model's "
            f"context of {context} (max_position_embeddings of model.path / model.name); "
            "lower rollout.max_new_tokens, shorten the prompts (task.system_prompt, "
            "task.shots), or use a model with a longer context")


def check_context(config: Any, context: int, examples: list[dict[str, Any]], tokenizer: Any,
                  where: str) -> None:
    """`check_positions` of the longest prompt of `examples` (as the run formats them)."""
    texts = [prompt_text(config.task, ex, tokenizer) for ex in examples]
    ids = tokenizer(texts, add_special_tokens=False)["input_ids"] if texts else []
    check_positions(max(map(len, ids), default=0), config.rollout.max_new_tokens, context,
                    where)


def target_rows(examples: list[dict[str, Any]], task_cfg: Any, tokenizer: Any,
                completion_len: int) -> tuple[dict[str, np.ndarray], float]:
    """This process's prompt and reference-solution rows (solution + eos) as numpy, the
    layout of the sampler's rows; targets are cut at `completion_len` tokens. Returns
    `(rows, share of targets cut)`: the supervised targets of SFT (and of the RL loop's
    optional supervised term, ``train.sft_weight``)."""
    _, prompt_tokens, prompt_mask = prompt_rows(task_cfg, examples, tokenizer)
    targets = tokenizer([ex["solution"] for ex in examples], add_special_tokens=False)["input_ids"]
    tokens = np.full((len(examples), completion_len), tokenizer.pad_token_id, np.int32)
    mask = np.zeros((len(examples), completion_len), np.int32)
    cut = 0
    for row, ids in enumerate(targets):
        ids = (ids + [tokenizer.eos_token_id])[:completion_len]
        cut += len(ids) < len(targets[row]) + 1
        tokens[row, :len(ids)], mask[row, :len(ids)] = ids, 1
    rows = {"prompt_tokens": prompt_tokens, "prompt_mask": prompt_mask, "tokens": tokens,
            "mask": mask, "row_valid": np.ones(len(examples), bool)}
    return rows, cut / len(examples)


def tokenizer_corpus(source: Any, limit: int = 2000) -> list[str]:
    """Texts that cover the task's characters (prompts and solutions), for a char tokenizer."""
    examples = [data.decode_example(source[i]) for i in range(min(limit, len(source)))]
    return [data.format_prompt(ex) + ex["solution"] for ex in examples] + ["0123456789"]


def decode_completions(tokenizer: Any, tokens_bn: np.ndarray, mask_bn: np.ndarray) -> list[str]:
    """Completion strings without the stop token and padding."""
    eos = tokenizer.eos_token_id
    return [tokenizer.decode([t for t, m in zip(row, mrow) if m and t != eos])
            for row, mrow in zip(np.asarray(tokens_bn).tolist(), np.asarray(mask_bn).tolist())]


def decode_prompts(tokenizer: Any, tokens_bs: np.ndarray, mask_bs: np.ndarray) -> list[str]:
    """Prompt strings as the model read them: every token under `mask_bs` (`[B, S]`),
    special ones included (a chat template's end-of-turn marker is the tokenizer's eos)."""
    return [tokenizer.decode([t for t, m in zip(row, mrow) if m])
            for row, mrow in zip(np.asarray(tokens_bs).tolist(), np.asarray(mask_bs).tolist())]


class Scorer:
    """Scores completions with the config's rewards; slow graders run in a process pool.

    Rewards come back as `[B, K]` columns for GDPO (``separate=True``), each normalised
    within its group before the weighted sum, and summed with their ``reward.specs``
    weights otherwise; the column named by ``reward.correct`` gives accuracy.
    """

    def __init__(self, reward_cfg, *, separate, max_new_tokens):
        self.specs = rewards.as_specs(reward_cfg.specs)
        names = [s.name for s in self.specs]
        if reward_cfg.correct not in names:
            raise ValueError(f"reward.correct={reward_cfg.correct!r} must be one of the "
                             f"reward.specs names {names}")
        self.correct_column = names.index(reward_cfg.correct)
        self.weights = rewards.spec_weights(self.specs)
        self.separate = separate
        self.max_new_tokens = max_new_tokens
        needs_pool = any(rewards.get_reward(n).where == "pool" for n in names)
        for line in rewards.sandbox_lines(self.specs):   # which sandbox runs the programs
            print(line, flush=True)
        self.pool = rewards.GraderPool(timeout_s=reward_cfg.timeout_s) if needs_pool else None

    def __call__(self, prompts, completions, examples, lengths):
        """-> (rewards `[B]` or `[B, K]` float32, correct `[B]` bool, metrics)."""
        columns, metrics = rewards.score_batch(
            self.specs, prompts, completions, examples, pool=self.pool,
            completion_lengths=lengths, max_new_tokens=self.max_new_tokens, combine="separate")
        correct = columns[:, self.correct_column] >= 1.0
        values = columns if self.separate else columns @ self.weights
        return values.astype(np.float32), correct, metrics

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()
