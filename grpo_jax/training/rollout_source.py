"""Where an RL step's rollouts come from: one interface, three sources.

A source hands the loop (`rl.train`) each step's rollouts and takes the versions of the
trained parameters it may sample them with (theta_v: the trained part after v RL steps):

    publish(version, trained)   theta_version, once the loop has it (the step's start)
    take(step)                  step `step`'s `async_rl.Produced`: the batch, its metrics
                                and examples, the version that sampled it, and the data
                                position and partial rollouts' pool after it (what a
                                checkpoint of that step saves)
    sigterm_passed_on()         whether another process passed a SIGTERM on to this one
    close()                     ends the source (the rollouts in flight are dropped)

`Synchronous` samples in `take`, on the loop's thread, with the parameters of
``rollout.policy_lag`` steps ago. `Asynchronous` (``async_rl.enabled``) is the
`async_rl.Producer` thread, which samples the next steps while the loop updates. With
process roles (``rollout.mesh`` on several processes) the source is `roles.Learner`,
which receives the batches of the sampling processes. Every one samples step s with the
version `async_rl.version_for` gives (k = the run's lagged copies) but a free-running
producer (``async_rl.fixed = False``), which takes the newest.
"""

import copy
import time
from typing import Any, Protocol

import jax
from flax import nnx

from grpo_jax import parallel, paths, run_files
from grpo_jax.training import async_rl, partial, rollout, steps
from grpo_jax.training import policy as policy_lib
from grpo_jax.training import task as task_lib


class Source(Protocol):
    """The interface every rollout source has (the module's docstring)."""

    def publish(self, version: int, trained: Any) -> None: ...

    def take(self, step: int) -> async_rl.Produced: ...

    def sigterm_passed_on(self) -> bool: ...

    def close(self) -> None: ...


class Synchronous:
    """Samples each step in `take`, on the loop's thread and its devices (or the rollout
    mesh, `collect`), with the run's oldest lagged copy: theta_v, v = max(0, step - 1 - k),
    k = ``rollout.policy_lag`` (the policy as it is when k = 0).

    Args:
      run: the `rl_run.Run`; its lagged copies, prompt stream, scorer, environment and
        pool of partial rollouts are the source's.
    """

    def __init__(self, run):
        self._run = run

    def publish(self, version: int, trained: Any) -> None:
        """Nothing to keep: the run's lagged copies hold the versions this source samples
        with (the loop moves them on after each `take`)."""

    def take(self, step: int) -> async_rl.Produced:
        """Samples step `step` now; returns its `async_rl.Produced`."""
        run = self._run
        policy, k = run.policy, len(run.lagged)
        behaviour = (policy_lib.sampling_policy(policy.graphdef, policy.params, run.lagged[0],
                                                policy.tokenizer) if k else policy)
        version = async_rl.version_for(step, k)
        begin = time.time()
        batch, metrics, examples, carry = collect(
            run, behaviour, step, scorer=run.scorer, episodic=run.episodic, carry=run.carry,
            version=version)
        write_samples(run.config, run.workdir, step, batch, policy.tokenizer)
        return async_rl.Produced(step, version, batch, metrics, examples,
                                 run.train_iter.get_state(), time.time() - begin, carry)

    def sigterm_passed_on(self) -> bool:
        """Never: the run's own processes get their SIGTERMs."""
        return False

    def close(self) -> None:
        """Nothing to end: the run closes its own scorer and environment."""


class Asynchronous:
    """The `async_rl.Producer` of steps ``start + 1 .. last``: it samples on the run's
    rollout mesh (`collect`) with its own tokenizer copy, reward workers and environment,
    so nothing the learner's thread uses (evaluation) is shared; the frozen part of the
    parameters (a LoRA run's base) is read from the policy as it is now, which the update
    does not donate in an asynchronous run. With partial rollouts it carries the pool
    from step to step itself, starting from the run's, and hands each step's pool over
    with its batch (what that step's checkpoint saves).

    On one mesh the learner and the producer take turns on its devices
    (`async_rl.DeviceTurns`): the learner holds the turn but while it waits in `take`.

    Args:
      run: the `rl_run.Run`, restored; start, last: the steps to produce.
      learner_outputs: returns every array the learner's programs write (the run's
        checkpoint state), computed before the learner gives its turn up.
    """

    def __init__(self, run, start, last, *, learner_outputs):
        config, policy = run.config, run.policy
        self._turns = async_rl.DeviceTurns(shared=run.rollout_mesh is run.mesh)
        self._learner_outputs, self._published = learner_outputs, None
        frozen = nnx.filter_state(policy.params, nnx.Not(run.policy_programs.trained))
        tokenizer = copy.deepcopy(policy.tokenizer)
        self._scorer = new_scorer(config)
        self._episodic = rollout.Episodic.of(config, tokenizer)
        carry = run.carry

        def sample(step, version, trained):
            nonlocal carry
            with self._turns.held():   # on one mesh the learner waits meanwhile
                behaviour = policy_lib.sampling_policy(policy.graphdef, frozen, trained,
                                                       tokenizer)
                batch, metrics, examples, carry = collect(
                    run, behaviour, step, scorer=self._scorer, episodic=self._episodic,
                    carry=carry, version=version)
                write_samples(config, run.workdir, step, batch, tokenizer)
                jax.block_until_ready(batch)
            return batch, metrics, examples, run.train_iter.get_state(), carry

        k = config.async_rl.max_staleness
        versions = {max(0, start - k + i): trained for i, trained in enumerate(run.lagged)}
        self._producer = async_rl.Producer(sample, first=start + 1, last=last, max_staleness=k,
                                           fixed=config.async_rl.fixed, versions=versions)
        self._turns.take()

    def publish(self, version: int, trained: Any) -> None:
        """Hands theta_version to the producer."""
        self._published = trained
        self._producer.publish(version, trained)

    def take(self, step: int) -> async_rl.Produced:
        """Step `step`'s `async_rl.Produced`, waited for with the turn given up; its metrics
        gain ``time_rollout_wait``."""
        with self._turns.given_up((self._learner_outputs(), self._published)):
            begin = time.time()   # the wait for the batch, not for the learner's own programs
            produced = self._producer.take(step)
        produced.metrics["time_rollout_wait"] = time.time() - begin
        return produced

    def sigterm_passed_on(self) -> bool:
        """Never: the producer is a thread of this process."""
        return False

    def close(self) -> None:
        """Gives the turn up (the producer may finish its own), then stops the producer:
        the rollouts in flight are dropped, a resume samples them again."""
        self._turns.give_back(self._learner_outputs())
        self._producer.close()
        self._scorer.close()
        if self._episodic is not None:
            self._episodic.close()


def new_scorer(config: Any) -> task_lib.Scorer:
    """The rewards of `config`'s rollouts (`task_lib.Scorer`; each source its own workers)."""
    return task_lib.Scorer(config.reward, separate=config.objective.advantage.estimator == "gdpo",
                           max_new_tokens=config.rollout.max_new_tokens)


def collect(run: Any, behaviour: policy_lib.Policy, step: int, *, scorer: Any, episodic: Any,
            carry: Any, version: int) -> tuple:
    """`rollout.collect` of step `step` by the `behaviour` policy (version `version`: the
    parameters after that many steps), on the rollout mesh; with partial rollouts
    (`carry`, the `partial.Pool` of the groups carried over) `partial.collect`. Returns
    `(batch, metrics, examples, carry)`, carry the pool for the next step (None without).

    With split meshes (``rollout.mesh``) the trained part of its parameters is copied to
    the rollout mesh first (the frozen part is there already: ``run.rollout_frozen``) and
    the batch back to the training mesh after: JAX's cross-mesh transfers, each timed to
    its end (``time_weight_transfer``, ``time_batch_transfer`` in the metrics).

    With ``rollout.dtype`` (`Run.precision`) the sampler gets the parameters cast to it,
    once per call (before the copy, which then moves the smaller arrays)."""
    config = run.config
    common = dict(config=config, scorer=scorer, method=run.method,
                  rng=steps.step_rng(config.seed, "rollout", step))

    def collect(policy, mesh):
        if carry is None:
            return (*rollout.collect(policy, mesh, run.train_iter, episodic=episodic, **common),
                    None)
        return partial.collect(policy, mesh, run.train_iter, carry, step=step, version=version,
                               **common)

    precision = run.precision
    if run.rollout_mesh is run.mesh:
        return collect(behaviour if precision is None else precision.policy(behaviour), run.mesh)
    begin = time.time()
    trained = nnx.filter_state(behaviour.params, run.policy_programs.trained)
    trained = jax.block_until_ready(parallel.on_mesh(
        trained if precision is None else precision.params(trained), run.rollout_mesh))
    sent = time.time() - begin
    graphdef = behaviour.graphdef if precision is None else precision.graphdef
    sampler = policy_lib.sampling_policy(graphdef, run.rollout_frozen, trained,
                                         behaviour.tokenizer)
    batch, metrics, examples, carry = collect(sampler, run.rollout_mesh)
    begin = time.time()
    batch = jax.block_until_ready(parallel.on_mesh(batch, run.mesh))
    metrics.update(time_weight_transfer=sent, time_batch_transfer=time.time() - begin)
    return batch, metrics, examples, carry


def write_samples(config: Any, workdir: str, step: int, batch: dict, tokenizer: Any) -> None:
    """Writes step `step`'s rollouts to ``workdir/rollouts/<step>.jsonl`` every
    ``train.log_rollouts_every`` steps."""
    if config.train.log_rollouts_every and step % config.train.log_rollouts_every == 0:
        rollout.write_samples(batch, tokenizer,
                              paths.join(workdir, run_files.ROLLOUTS, f"{step}.jsonl"))
