"""Held-out evaluation: greedy pass@1, and mean@k / pass@k over k samples per prompt.

    python -m grpo_jax.main --config configs/dapo.py:runlocal=True --config.mode=eval \\
        --config.model.path=/tmp/dapo/export --config.model.name= --workdir /tmp/dapo_eval

Each process evaluates its own share of the held-out prompts on the shared mesh and the
counts are summed over processes, so every process returns the same numbers. The
trainers evaluate their policy every ``eval_every`` steps (`evaluate`; with
``eval.suite`` also on the suite, `suite_results`); the "eval" mode evaluates a saved
policy (`evaluate_to_file`), on the task's held-out split or, with ``eval.suite``, on
every benchmark of a named suite (`evaluate_suite`, `suites`: avg@k, pass@k and maj@k).
The draws of an evaluation at step s are the seed's "eval" stream at s, the suite's its
"eval_suite" stream at s (`steps.step_rng`), whoever evaluates.
"""

import dataclasses
import json
from collections.abc import Callable
from typing import Any

import jax
import ml_collections
import numpy as np
from flax import nnx

from grpo_jax import config_lib, data, environments, models, parallel, paths, rewards, sampling
from grpo_jax import run_files
from grpo_jax.training import footprint, policy as policy_lib
from grpo_jax.training import rollout as rollout_lib
from grpo_jax.training import steps, suites, task as task_lib
# The papers' sampled-evaluation protocols, importable from here.
from grpo_jax.training.at_k import avg_at_k  # noqa: F401
from grpo_jax.training.at_k import maj_at_k  # noqa: F401
from grpo_jax.training.at_k import mean_pass_at_k  # noqa: F401
from grpo_jax.training.at_k import pass_at_k  # noqa: F401

EVAL_CHUNK = 256   # prompts per sampler call (per process)


def check_config(config: Any) -> None:
    """Raises ValueError naming the field unless the ``eval`` section can run: at least one
    held-out prompt, ``eval.samples`` >= 0 (0: greedy pass@1 only), and with ``eval.suite``
    a known suite, ``eval.samples`` >= 1 and ``eval.suite_dir``."""
    if not isinstance(config.eval.num_prompts, int) or config.eval.num_prompts < 1:
        raise ValueError(f"eval.num_prompts must be an int >= 1 (held-out prompts per "
                         f"evaluation; raise train.eval_every to evaluate less often), got "
                         f"{config.eval.num_prompts!r}")
    if not isinstance(config.eval.samples, int) or config.eval.samples < 0:
        raise ValueError(f"eval.samples must be an int >= 0 (k of mean@k and pass@k; 0: greedy "
                         f"pass@1 only), got {config.eval.samples!r}")
    if config.eval.suite:
        suite = suites.get_suite(config.eval.suite)
        if config.eval.samples < 1 or not config.eval.suite_dir:
            raise ValueError(
                f"eval.suite={config.eval.suite!r} needs eval.samples >= 1 (got "
                f"{config.eval.samples}) and eval.suite_dir, a directory with one subdirectory "
                f"per benchmark {list(suite.benchmarks)} holding its release file (or "
                "eval.suite='' to evaluate task.eval_split alone)")


def check_num_prompts(num_prompts: int, source: Any) -> None:
    """Raises unless the held-out split `source` holds the ``eval.num_prompts`` asked for
    (an evaluation on fewer prompts than configured would be reported as if on all)."""
    if num_prompts > len(source):
        raise ValueError(
            f"eval.num_prompts={num_prompts} is more than the {len(source)} examples of the "
            f"held-out split (task.eval_split): lower eval.num_prompts to {len(source)} or "
            "less, or evaluate on a bigger split (for a generated task, a larger "
            "task.knobs.num_test)")


def own_examples(source: Any, count: int) -> tuple[list[dict[str, Any]], int]:
    """This process's share of the first `count` held-out examples of `source`.

    Returns `(examples, real)`: every process gets the same number of examples (the
    sampler runs on all processes at once), the last `len(examples) - real` of them
    repeats that only pad the share and are not counted. Raises when `source` has fewer
    than `count` examples (`check_num_prompts`).
    """
    check_num_prompts(count, source)
    share = -(-count // parallel.process_count())
    start = min(parallel.process_index() * share, count)
    stop = min(start + share, count)
    indices = list(range(start, stop)) or [count - 1]
    examples = [data.decode_example(source[i]) for i in indices]
    return examples + [examples[-1]] * (share - len(examples)), stop - start


def _padded(examples, mesh):
    """`examples` topped up (repeating the last) so that every process's prompt rows, and
    so the completions, split over the mesh's row axes."""
    multiple = max(parallel.row_ways(mesh) // parallel.process_count(), 1)
    return list(examples) + [examples[-1]] * (-len(examples) % multiple)


def prompt_ids(count: int, share: int, start: int, width: int, processes: int) -> np.ndarray:
    """`[processes * width]` ids of the random streams of one sampler call's global prompt
    rows (`sampling.row_keys`): process p's `width` rows hold its examples from its
    `start`-th on, and p's share (`own_examples`: `share` examples of the first `count`)
    begins at example min(p * share, count) of the held-out split; each row's id is its
    example's place in the split, so an example draws the same samples on any number of
    processes (the repeats that pad a share take the ids after its last example).

    Example (5 examples, 2 processes of 3, rows padded to 4):
      >>> prompt_ids(5, 3, 0, 4, 2)
      array([0, 1, 2, 3, 3, 4, 5, 6])
    """
    return np.concatenate([min(p * share, count) + start + np.arange(width)
                           for p in range(processes)])


def _correct(policy, mesh, scorer, examples, config, *, rng, method, group_size, count,
             episodic=None, answer_of=None):
    """`([len(examples) * group_size] bool correctness, episode counts, answers)` of this
    process's examples (its share of the split's first `count`, `own_examples`): with
    `episodic`, each `Episodes` field over the same rows, else None; with `answer_of` (a
    completion -> its final answer or None), each row's answer, else []."""
    correct, counts, answers = [], [], []
    for start in range(0, len(examples), EVAL_CHUNK):
        chunk = examples[start:start + EVAL_CHUNK]
        padded = _padded(chunk, mesh)
        texts, tokens, mask = task_lib.prompt_rows(config.task, padded, policy.tokenizer)
        prompts = parallel.global_rows(mesh, {"tokens": tokens, "mask": mask})
        ids = prompt_ids(count, len(examples), start, len(padded), parallel.process_count())
        rollout, episodes = rollout_lib.sample_on_mesh(
            policy, mesh, prompts, rng=jax.random.fold_in(rng, start), method=method,
            group_size=group_size, max_new_tokens=config.rollout.max_new_tokens,
            rules=config.rollout.rules, episodic=episodic, examples=padded, prompt_ids=ids)
        _, ok, _ = rollout_lib.score_own_rows(rollout, texts, padded, scorer, policy.tokenizer,
                                              group_size)
        rows = len(chunk) * group_size
        correct.append(ok[:rows])
        if episodes is not None:
            counts.append(episodes.first(rows))
        if answer_of is not None:
            own = (parallel.local_rows(x) for x in (rollout.tokens, rollout.mask))
            completions = task_lib.decode_completions(policy.tokenizer, *own)
            answers += [answer_of(completion) for completion in completions[:rows]]
    episodes = environments.Episodes.concatenate(counts) if counts else None
    return (np.concatenate(correct) if correct else np.zeros(0, bool)), episodes, answers


def evaluate(policy: policy_lib.Policy, mesh: jax.sharding.Mesh, scorer: task_lib.Scorer,
             own: tuple[list[dict[str, Any]], int], config: Any, *, step: int, method: Any,
             episodic: rollout_lib.Episodic | None = None) -> dict[str, float]:
    """Accuracy on held-out examples: ``config.eval.samples`` samples per prompt with the
    rollout's sampling `method`, at most ``config.rollout.max_new_tokens`` tokens.

    Args:
      own: `(examples, real)` from `own_examples`: this process's share.
      step: the training step evaluated at (0 for a saved policy); the draws are the
        ``"eval"`` stream of ``config.seed`` at it.
      episodic: the environment (`rollout.Episodic`) that answers the model's calls, or
        None (single-turn answers).

    Returns:
      ``eval_accuracy`` (greedy pass@1), ``eval_mean_at_k`` (mean correctness of k
      samples at the rollout temperature, an estimate of sampled pass@1),
      ``eval_pass_at_k`` (share of prompts with at least one correct sample), ``eval_k``;
      with `episodic`, the greedy episodes' `Episodes.metrics` prefixed ``eval_``
      (``eval_tool_use_rate``, ...), over every process's prompts.
    """
    examples, real = own
    k = config.eval.samples
    rng = steps.step_rng(config.seed, "eval", step)
    count = config.eval.num_prompts
    greedy, episodes, _ = _correct(policy, mesh, scorer, examples, config, rng=rng,
                                   method=sampling.Greedy(), group_size=1, count=count,
                                   episodic=episodic)
    greedy = greedy[:real]
    totals = [greedy.sum(), greedy.size]
    if k > 0:
        sampled, _, _ = _correct(policy, mesh, scorer, examples, config,
                                 rng=jax.random.fold_in(rng, 1), method=method, group_size=k,
                                 count=count, episodic=episodic)
        per_prompt = sampled.reshape(len(examples), k)[:real]
        totals += [per_prompt.sum(), per_prompt.any(axis=1).sum()]
    summed = np.sum(parallel.allgather_json([int(t) for t in totals]), axis=0)
    metrics = {"eval_accuracy": summed[0] / max(summed[1], 1)}
    if k > 0:
        metrics.update(eval_mean_at_k=summed[2] / max(summed[1] * k, 1),
                       eval_pass_at_k=summed[3] / max(summed[1], 1), eval_k=float(k))
    if episodes is not None:
        every_row = rollout_lib.all_episodes(episodes.first(real))
        metrics.update({f"eval_{name}": value for name, value in every_row.metrics().items()})
    return {name: float(value) for name, value in metrics.items()}


def load_for_evaluation(config: Any,
                        path: str) -> tuple[jax.sharding.Mesh, policy_lib.Policy, Any]:
    """`(mesh, policy, held-out source)`: the saved policy at `path` on the config's mesh,
    through the same loading code as any checkpoint, and the task's evaluation split."""
    mesh = parallel.setup_mesh(config, lambda: footprint.replicated_state_bytes(config, "eval"))
    source = task_lib.data_source(config.task, config.task.eval_split)
    check_num_prompts(config.eval.num_prompts, source)   # before loading the model
    return mesh, _saved_policy(config, mesh, path), source


def _saved_policy(config, mesh, path):
    model, tokenizer = models.from_pretrained(path, mesh=mesh, rules=config.model.rules)
    graphdef, params = nnx.split(model)
    return policy_lib.Policy(graphdef, params, tokenizer)


def evaluate_export(config: Any, path: str) -> dict[str, float]:
    """Held-out metrics of a saved policy (`load_for_evaluation`), its calls answered by
    ``environment.name``'s environment when one is set."""
    mesh, policy, source = load_for_evaluation(config, path)
    scorer = task_lib.Scorer(config.reward, separate=False,
                             max_new_tokens=config.rollout.max_new_tokens)
    episodic = rollout_lib.Episodic.of(config, policy.tokenizer)
    try:
        return evaluate(policy, mesh, scorer, own_examples(source, config.eval.num_prompts),
                        config, step=0, method=rollout_lib.sampling_method(config),
                        episodic=episodic)
    finally:
        scorer.close()
        if episodic is not None:
            episodic.close()


def benchmark_task(config: Any, name: str) -> Any:
    """A derived ``task`` section that reads benchmark `name`'s release file from
    ``eval.suite_dir/<name>`` (the run's prompt settings kept)."""
    return config_lib.replaced(config, {
        "task.name": name, "task.knobs": {},
        "task.manual_dir": paths.join(config.eval.suite_dir, name)}).task


def suite_grading(
    suite: suites.Suite, timeout_s: float,
) -> tuple[ml_collections.ConfigDict, Callable[[str], str | None]]:
    """`(reward section, answer_of)` of `suite`: its grader as the only reward (the
    graders' pool bounds each row by `timeout_s`, ``reward.timeout_s``), and what its
    majority vote compares (a completion -> its answer or None)."""
    reward = ml_collections.ConfigDict(dict(specs=((suite.grader, 1.0),),
                                            correct=suite.grader, timeout_s=timeout_s))
    if suite.grader == "code_tests":
        return reward, rewards.program_answer
    if suite.grader == "math":
        return reward, rewards.final_boxed_answer
    raise ValueError(f"a suite's grader must be 'math' or 'code_tests', got {suite.grader!r}")


@dataclasses.dataclass(frozen=True)
class OpenSuite:
    """``eval.suite`` ready to evaluate (`open_suite`): its benchmarks' test splits
    (`sources`, in the suite's order), the scorer of its grader, what its majority vote
    compares (`answer_of`: a completion -> its answer or None) and its sampling `method`.
    `close` stops the scorer's graders."""

    sources: dict[str, Any]
    scorer: task_lib.Scorer
    answer_of: Callable[[str], str | None]
    method: Any

    def close(self) -> None:
        self.scorer.close()


def open_suite(config: Any) -> OpenSuite:
    """``eval.suite`` (checked by `check_config`) ready to evaluate: every benchmark's
    release file is read here, so a missing one fails before a model loads."""
    suite = suites.get_suite(config.eval.suite)
    sources = {name: task_lib.data_source(benchmark_task(config, name), "test")
               for name in suite.benchmarks}
    reward, answer_of = suite_grading(suite, config.reward.timeout_s)
    scorer = task_lib.Scorer(reward, separate=False, max_new_tokens=config.rollout.max_new_tokens)
    method = sampling.make_method(temperature=suite.temperature, top_p=suite.top_p, top_k=0,
                                  min_p=0.0)
    return OpenSuite(sources, scorer, answer_of, method)


def suite_results(policy: policy_lib.Policy, mesh: jax.sharding.Mesh, opened: OpenSuite,
                  config: Any, *, step: int) -> dict[str, Any]:
    """The suite's metrics of `policy` (``suites``): k = ``eval.samples`` answers per
    problem of each benchmark (its first ``eval.suite_problems``, 0: all) at the suite's
    temperature and top-p, graded by the suite's reward (``math``: majority votes over
    each answer's last ``\\boxed{}``; ``code_tests``: the programs run in the sandbox,
    votes over the programs). The draws are the ``"eval_suite"`` stream of ``config.seed``
    at `step` (0 for a saved policy), benchmark i's folded with i: none is a key of the
    held-out evaluation (`evaluate`, the ``"eval"`` stream), whose draws a suite leaves as
    they are.

    Returns:
      ``{benchmark: metrics, ..., "macro": averages}`` and each benchmark's problems'
      counts under ``"per_problem"``, the same on every process.
    """
    k = config.eval.samples
    rng = steps.step_rng(config.seed, "eval_suite", step)
    results, per_problem = {}, {}
    for index, (name, source) in enumerate(opened.sources.items()):
        count = min(config.eval.suite_problems or len(source), len(source))
        examples, real = own_examples(source, count)
        correct, _, answers = _correct(
            policy, mesh, opened.scorer, examples, config, rng=jax.random.fold_in(rng, index),
            method=opened.method, group_size=k, count=count, answer_of=opened.answer_of)
        own = [[int(correct[p * k:(p + 1) * k].sum()),
                maj_at_k(answers[p * k:(p + 1) * k], correct[p * k:(p + 1) * k])]
               for p in range(real)]
        every = [row for part in parallel.allgather_json(own) for row in part]
        counts, majority = [row[0] for row in every], [row[1] for row in every]
        results[name] = suites.benchmark_metrics(counts, majority, k)
        per_problem[name] = {"correct": counts, "majority_correct": majority}
    return {**results, "macro": suites.macro_average(results), "per_problem": per_problem}


def suite_metrics(results: dict[str, Any]) -> dict[str, float]:
    """`suite_results`' metrics as the trainer logs them: ``eval_suite/<benchmark>/<key>``
    (``macro`` among the benchmarks), the per-problem counts left out."""
    return {f"eval_suite/{name}/{key}": value for name, row in results.items()
            if name != "per_problem" for key, value in row.items()}


def evaluate_suite(config: Any, path: str) -> dict[str, Any]:
    """``eval.suite``'s metrics of the saved policy at `path` (`suite_results` at step 0)."""
    check_config(config)
    mesh = parallel.setup_mesh(config, lambda: footprint.replicated_state_bytes(config, "eval"))
    opened = open_suite(config)   # every benchmark's file read before the model loads
    try:
        return suite_results(_saved_policy(config, mesh, path), mesh, opened, config, step=0)
    finally:
        opened.close()


def evaluate_to_file(config: Any, workdir: str) -> dict[str, Any]:
    """The "eval" mode: held-out metrics of ``model.path``, printed and saved as JSON
    (``eval.json``); with ``eval.suite``, the suite's (``eval_suite.json``, and its table
    in ``eval_suite.md``)."""
    if not config.model.path:
        raise ValueError("mode 'eval' needs --config.model.path, a checkpoint to evaluate")
    config, workdir = config_lib.resolve_run_paths(config, workdir)
    check_config(config)
    parallel.initialize(config.distributed)   # which process is the main one
    if parallel.is_main():
        config_lib.record(config, workdir)
    if config.eval.suite:
        results = evaluate_suite(config, config.model.path)
        if parallel.is_main():
            table = suites.results_table({name: results[name] for name in results
                                          if name != "per_problem"})
            paths.write_whole(paths.join(workdir, run_files.EVAL_SUITE),
                              json.dumps(results, indent=2))
            paths.write_whole(paths.join(workdir, run_files.EVAL_SUITE_TABLE), table + "\n")
            print(table, flush=True)
        return results
    metrics = evaluate_export(config, config.model.path)
    if parallel.is_main():
        paths.write_whole(paths.join(workdir, run_files.EVAL), json.dumps(metrics, indent=2))
        print(json.dumps(metrics, indent=2), flush=True)
    return metrics
