"""What the SFT and RL loops share: mesh, data, policy, optimizer, checkpoints, export."""

import math
import os

import jax
from flax import nnx

from grpo_jax import data, models, parallel
from grpo_jax.training import policy as policy_lib
from grpo_jax.training import task as task_lib
from grpo_jax.training.checkpoint import Checkpointer
from grpo_jax.training.metrics import MetricWriter
from grpo_jax.training.optimizer import make_optimizer
from grpo_jax.training.steps import init_optimizer_state, make_update_step


_ANNOUNCED_MESHES = set()   # the demo builds one mesh per stage; each is printed once


def make_mesh(config):
    """The config's mesh (after `jax.distributed` start-up on multi-host launches); the
    first time a process builds it, says on which devices it runs."""
    parallel.maybe_initialize_distributed(config.distributed or None)
    mesh = parallel.make_mesh(config.mesh)
    hosts = jax.process_count()
    line = (f"mesh {dict(mesh.shape)} over {mesh.size} {mesh.devices.flat[0].platform} device(s)"
            f"{f' on {hosts} hosts' if hosts > 1 else ''}")
    if jax.process_index() == 0 and line not in _ANNOUNCED_MESHES:
        _ANNOUNCED_MESHES.add(line)
        print(line, flush=True)
    return mesh


class Optimizer:
    """The optax transform, its state (in the parameters' shardings) and the jitted update."""

    def __init__(self, opt_cfg, total_updates, graphdef, params, mesh, loss_fn):
        self.tx = make_optimizer(opt_cfg, total_updates)
        self.state = init_optimizer_state(self.tx, params, mesh)
        shardings = lambda tree: jax.tree.map(lambda x: x.sharding, tree)
        self._update = make_update_step(graphdef, self.tx, loss_fn, param_shardings=shardings(params),
                                        opt_shardings=shardings(self.state), mesh=mesh)

    def apply(self, params, minibatch):
        """One optimizer step on `minibatch` (`[M, b, ...]`); returns (params, host metrics)."""
        params, self.state, metrics = self._update(params, self.state, minibatch)
        return params, {k: float(v) for k, v in jax.device_get(metrics).items()}


class RunSetup:
    """Data, tokenizer, policy weights, scorer and checkpointer of one run in `workdir`."""

    def __init__(self, config, workdir, mesh, *, batch_size):
        self.config, self.workdir = config, workdir
        train_source = task_lib.data_source(config.task, "train")
        eval_source = task_lib.data_source(config.task, config.task.eval_split)
        tokenizer_dir = os.path.join(workdir, "tokenizer")
        texts = None if config.model.path else task_lib.tokenizer_corpus(train_source)
        model, tokenizer = policy_lib.load_policy(config.model, mesh, tokenizer_texts=texts,
                                                  seed=config.seed)
        if os.path.isdir(tokenizer_dir):     # a resumed run keeps the tokenizer it started with
            tokenizer = policy_lib.load_saved_tokenizer(tokenizer_dir)
        elif jax.process_index() == 0:
            tokenizer.save_pretrained(tokenizer_dir)
        self.tokenizer = tokenizer
        self.graphdef, self.params = nnx.split(model)
        self.train_iter = iter(data.make_loader(
            train_source, seed=config.seed, num_epochs=None, batch_size=batch_size,
            drop_remainder=True))
        count = min(config.eval.num_prompts, len(eval_source))
        self.eval_examples = [data.decode_example(eval_source[i]) for i in range(count)]
        self.scorer = task_lib.Scorer(config.reward,
                                      separate=config.objective.advantage.estimator == "gdpo")
        self.checkpointer = Checkpointer(os.path.join(workdir, "checkpoints"),
                                         keep=config.train.keep_checkpoints)

    def restore(self, policy, opt):
        """Loads the newest checkpoint into `policy` and `opt`; returns its step (0 if none)."""
        step = self.checkpointer.latest_step()
        if step is None:
            return 0
        state, meta = self.checkpointer.restore(
            step, {"params": policy.params, "opt_state": opt.state})
        policy.params, opt.state = state["params"], state["opt_state"]
        self.train_iter.set_state(meta["data"])
        print(f"resumed from the checkpoint of step {step} in {self.workdir}", flush=True)
        return step

    def save(self, step, policy, opt):
        self.checkpointer.save(step, {"params": policy.params, "opt_state": opt.state},
                               {"step": step, "data": self.train_iter.get_state(),
                                "seed": self.config.seed})

    def close(self):
        self.checkpointer.close()
        self.scorer.close()


def metric_writer(workdir, total_steps, *, start_step, prefix="", total_seconds=None):
    return MetricWriter(workdir, total_steps=total_steps, start_step=start_step,
                        total_seconds=total_seconds, prefix=prefix)


WATCHED = ("loss", "policy_loss", "grad_norm", "update_norm", "kl", "approx_kl")


def stop_if_not_finite(metrics, step, checkpointer):
    """Raises FloatingPointError before a non-finite step can be saved over a good one."""
    for name in WATCHED:
        if name in metrics and not math.isfinite(metrics[name]):
            checkpointer.wait()
            last = checkpointer.latest_step()
            raise FloatingPointError(
                f"step {step}: {name} = {metrics[name]} is not finite; stopping without saving. "
                f"The last good checkpoint is step {last}; lower optimizer.learning_rate or "
                "optimizer.grad_clip and re-run to resume from it.")


def export(policy, setup, path):
    """Writes the policy as a Hugging Face checkpoint (config, safetensors, tokenizer)."""
    model = nnx.merge(policy.graphdef, policy.params)
    models.save_pretrained(model, path, tokenizer=setup.tokenizer)
    if jax.process_index() == 0:
        print(f"exported the policy to {path}", flush=True)
