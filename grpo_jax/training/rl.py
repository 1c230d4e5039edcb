"""The RL loop: rollout -> rewards -> advantages -> filter -> updates -> metrics -> checkpoints.

    python -m grpo_jax.main --config configs/dapo.py:runlocal=True --workdir /tmp/dapo

Re-running the same command resumes from the last checkpoint: parameters, optimizer
state, step and data position are restored, and the step's RNG is `fold_in(seed, step)`,
so the resumed run continues exactly as an uninterrupted one would.
"""

import dataclasses
import os
import time

import jax
import jax.numpy as jnp
import numpy as np

from grpo_jax import objectives, parallel, paths, sampling
from grpo_jax.training import batching, common, evaluation, rollouts


@dataclasses.dataclass
class Policy:
    """The live policy: what rollouts and evaluation read."""

    mesh: object
    graphdef: object
    params: object
    tokenizer: object
    task_cfg: object
    sampling_rules: str


def check_config(config, mesh):
    """Raises ValueError naming the field for settings the loop cannot run."""
    objectives.validate_objective_config(config.objective)
    P, G = config.rollout.prompts_per_batch, config.objective.group_size
    rows = P * G
    parts = config.train.minibatches * config.train.micro_batches
    if rows % parts:
        raise ValueError(f"rollout.prompts_per_batch * objective.group_size = {rows} rows must "
                         f"divide into train.minibatches * train.micro_batches = {parts} pieces")
    ways = parallel.batch_ways(mesh)
    if (rows // parts) % ways:
        raise ValueError(f"a micro-batch of {rows // parts} rows does not split over the "
                         f"{ways}-way data axes of mesh {dict(mesh.shape)}; change "
                         "rollout.prompts_per_batch, train.micro_batches or the mesh")
    if config.train.behaviour_logp not in ("recompute", "sampler"):
        raise ValueError("train.behaviour_logp must be 'recompute' or 'sampler', got "
                         f"{config.train.behaviour_logp!r}")
    weights = config.objective.advantage.reward_weights
    if config.objective.advantage.estimator == "gdpo" and weights and len(weights) != len(config.reward.specs):
        raise ValueError(f"objective.advantage.reward_weights has {len(weights)} weights but "
                         f"reward.specs names {len(config.reward.specs)} rewards; give one each")
    if config.train.epochs < 1:
        raise ValueError(f"train.epochs must be >= 1, got {config.train.epochs}")


class Trainer:
    """Holds the run's state; `run()` is the loop."""

    def __init__(self, config, workdir):
        self.config, self.workdir = config, paths.resolve_run_paths(config, workdir)
        self.mesh = common.make_mesh(config)
        check_config(config, self.mesh)
        self.setup = common.RunSetup(config, self.workdir, self.mesh,
                                     batch_size=config.rollout.prompts_per_batch)
        s = self.setup
        self.policy = Policy(self.mesh, s.graphdef, s.params, s.tokenizer, config.task,
                             config.rollout.rules)
        self.objective = objectives.policy_objective(config.objective)
        updates = config.train.steps * config.train.epochs * config.train.minibatches
        self.opt = common.Optimizer(config.optimizer, updates, s.graphdef, s.params, self.mesh,
                                    self._loss)
        self.ref_params = None
        if config.objective.kl.beta > 0:
            self.ref_params = jax.tree.map(jnp.copy, s.params)   # frozen copy of the start
        self.method = sampling.TopP(config.rollout.top_p, temperature=config.rollout.temperature)
        self.logp_fn = jax.jit(batching.make_logprob_fn(s.graphdef))
        self.step = 0

    # --- the loss of one micro-batch, differentiated by common.Optimizer -------------------

    def _loss(self, model, micro):
        logp, entropy, aux_loss = batching.completion_logprobs(model, micro, with_stats=True)
        batch = {k: v for k, v in micro.items() if k in batching.LOSS_KEYS}
        loss, metrics = self.objective(logp, {**batch, "entropy": entropy})
        if model.cfg.n_experts:   # MoE: keep the experts balanced
            share = micro["mask"].sum() / micro["num_tokens"]   # micro-batches add up to 1
            loss = loss + model.cfg.router_aux_loss_coef * aux_loss * share
            metrics = {**metrics, "router_aux_loss": aux_loss * share}
        return loss, metrics

    def rng(self, stream, step):
        """The key of `stream` ("rollout", "shuffle", "eval") at `step`: fold_in(seed, ...)."""
        stream_id = ("rollout", "shuffle", "eval").index(stream)
        return jax.random.fold_in(jax.random.fold_in(jax.random.key(self.config.seed), stream_id), step)

    def rollout_rng(self, step):
        return self.rng("rollout", step)

    @property
    def train_iter(self):
        return self.setup.train_iter

    @property
    def scorer(self):
        return self.setup.scorer

    # --- one step ------------------------------------------------------------------------

    def prepare(self, host):
        """Behaviour and reference log-probs, then advantages over the full batch."""
        cfg = self.config
        start = time.time()
        batch = dict(host)
        pieces = cfg.train.minibatches * cfg.train.micro_batches
        if cfg.train.behaviour_logp == "recompute":
            batch["old_logp"] = batching.logprobs_in_pieces(
                self.logp_fn, self.policy.params, batch, pieces, self.mesh)
        else:
            batch["old_logp"] = batch["behaviour_logp"]
        if self.ref_params is not None:
            batch["ref_logp"] = batching.logprobs_in_pieces(
                self.logp_fn, self.ref_params, batch, pieces, self.mesh)
        batch["advantages"] = np.asarray(self.objective.advantages(batch))
        return batch, {"time_old_logp": time.time() - start}

    def update(self, batch, step):
        cfg = self.config
        start, all_metrics = time.time(), []
        rows = batch["mask"].shape[0]
        for epoch in range(cfg.train.epochs):
            shuffle_rng = jax.random.fold_in(self.rng("shuffle", step), epoch)
            order = np.asarray(jax.random.permutation(shuffle_rng, rows))
            for part in np.array_split(order, cfg.train.minibatches):
                minibatch = batching.minibatch(batch, part, cfg.train.micro_batches, self.mesh)
                self.policy.params, metrics = self.opt.apply(self.policy.params, minibatch)
                all_metrics.append(metrics)
        metrics = {k: float(np.mean([m[k] for m in all_metrics])) for k in all_metrics[0]}
        seconds = time.time() - start
        tokens = float(np.sum(batch["mask"])) * cfg.train.epochs
        metrics.update(time_update=seconds, update_tokens_per_s=tokens / max(seconds, 1e-9))
        return metrics

    def run(self):
        cfg, s = self.config, self.setup
        self.step = s.restore(self.policy, self.opt)
        writer = common.metric_writer(self.workdir, cfg.train.steps, start_step=self.step)
        try:
            for step in range(self.step + 1, cfg.train.steps + 1):
                host, metrics = rollouts.collect(self, step)
                batch, prep_metrics = self.prepare(host)
                metrics.update(prep_metrics)
                metrics.update(self.update(batch, step))
                common.stop_if_not_finite(metrics, step, s.checkpointer)
                if step % cfg.train.eval_every == 0:
                    metrics.update(self.evaluate(step))
                writer.write(step, metrics)
                if step % cfg.train.checkpoint_every == 0 or step == cfg.train.steps:
                    s.save(step, self.policy, self.opt)
                self.step = step
        finally:
            writer.close()
            s.close()
        if cfg.train.export:
            common.export(self.policy, self.setup, os.path.join(self.workdir, "export"))
        return self.step

    def evaluate(self, step):
        cfg = self.config
        start = time.time()
        metrics = evaluation.evaluate(self.policy, self.scorer, self.setup.eval_examples, cfg,
                                      rng=self.rng("eval", step))
        metrics["time_eval"] = time.time() - start
        return metrics


def train(config, workdir):
    """Runs (or resumes) the RL loop; returns the last step."""
    return Trainer(config, workdir).run()
