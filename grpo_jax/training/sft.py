"""Supervised warm start: the task's reference solutions, token-mean cross-entropy.

    python -m grpo_jax.main --config configs/dapo.py:runlocal=True --config.mode=sft \\
        --workdir /tmp/sft

Rows have the RL layout (prompt left-padded, target right-padded), so the SFT and RL
losses read the same log-probs. The run ends by exporting a Hugging Face checkpoint to
``workdir/export``, which an RL run loads with ``--config.model.path``.
"""

import os
import time

import jax
import numpy as np

from grpo_jax import objectives, paths, sampling
from grpo_jax.training import batching, common, evaluation, task as task_lib
from grpo_jax.training.rl import Policy


def target_rows(examples, task_cfg, tokenizer, completion_len):
    """Prompt and target (solution + eos) token rows; targets cut at `completion_len`."""
    _, prompt_ids = task_lib.encode_prompts(task_cfg, examples, tokenizer)
    prompt_tokens, prompt_mask = sampling.pad_prompts(prompt_ids, pad_id=tokenizer.pad_token_id,
                                                      buckets=task_lib.PROMPT_BUCKETS)
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


def nll_loss(model, micro):
    """Token-mean negative log-likelihood of the targets, over the GLOBAL token count."""
    logp = batching.completion_logprobs(model, micro)
    loss = objectives.aggregate(-logp, micro["mask"], mode="token-mean",
                                num_tokens=micro["num_tokens"])
    return loss, {"loss": loss}


class SftTrainer:
    """Holds the SFT run; `run()` is the loop."""

    def __init__(self, config, workdir):
        self.config, self.workdir = config, paths.resolve_run_paths(config, workdir)
        self.mesh = common.make_mesh(config)
        self.setup = s = common.RunSetup(config, self.workdir, self.mesh, batch_size=config.sft.batch_size)
        self.policy = Policy(self.mesh, s.graphdef, s.params, s.tokenizer, config.task,
                             config.rollout.rules)
        self.opt = common.Optimizer(config.sft.optimizer, config.sft.steps, s.graphdef, s.params,
                                    self.mesh, nll_loss)

    def train_step(self):
        """One optimizer step on the next batch; returns its metrics."""
        examples = next(self.setup.train_iter)
        rows, cut = target_rows(examples, self.config.task, self.setup.tokenizer,
                                self.config.rollout.max_new_tokens)
        batch = batching.minibatch(rows, np.arange(len(examples)), self.config.train.micro_batches,
                                   self.mesh)
        self.policy.params, metrics = self.opt.apply(self.policy.params, batch)
        return {**metrics, "targets_cut": cut}

    def evaluate(self, step):
        rng = jax.random.fold_in(jax.random.key(self.config.seed + 1), step)
        return evaluation.evaluate(self.policy, self.setup.scorer, self.setup.eval_examples,
                                   self.config, rng=rng)

    def run(self, *, seconds=None):
        """Trains to `sft.steps` (or for `seconds` of wall time); returns the last step."""
        cfg, s = self.config, self.setup
        step = s.restore(self.policy, self.opt)
        writer = common.metric_writer(self.workdir, cfg.sft.steps, start_step=step, total_seconds=seconds,
                                      prefix="sft " if seconds is None else "sft (timed) ")
        start = time.time()
        try:
            while step < cfg.sft.steps and (seconds is None or time.time() - start < seconds):
                step += 1
                metrics = self.train_step()
                common.stop_if_not_finite(metrics, step, s.checkpointer)
                last = step == cfg.sft.steps
                if step % cfg.sft.eval_every == 0:
                    metrics.update(self.evaluate(step))
                if step % cfg.sft.log_every == 0 or last or "eval_accuracy" in metrics:
                    writer.write(step, metrics)
                if step % cfg.sft.checkpoint_every == 0 or last:
                    s.save(step, self.policy, self.opt)
        finally:
            writer.close()
            s.close()
        common.export(self.policy, s, os.path.join(self.workdir, "export"))
        return step


def train(config, workdir):
    return SftTrainer(config, workdir).run()
