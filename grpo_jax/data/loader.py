"""Opening a prepared split for random access, and the grain pipeline on top of it.

Reading needs no TensorFlow: builders write the array_record format and
``builder.as_data_source`` (what ``tfds.data_source`` calls) reads it back with
random access. The grain pipeline is

  source -> this process's shard -> shuffle(seed) -> repeat(num_epochs)
         -> decode (+ transform) -> [batch] -> IterDataset

Every step is a function of the index, so the order is fixed by the seed and the
shard, and a run restarted from a saved iterator state continues with exactly the
example that would have come next::

  iterator = iter(make_loader(source, seed=0, num_epochs=None))
  ...
  state = iterator.get_state()        # a small dict; checkpoint it with the model
  iterator = iter(make_loader(source, seed=0, num_epochs=None))
  iterator.set_state(state)           # continues at the next example
"""

import os
from collections.abc import Callable, Sequence
from typing import Any

import grain
import tensorflow_datasets as tfds

from grpo_jax import paths
from grpo_jax.data import _manual
from grpo_jax.data import _records
from grpo_jax.data import _release
from grpo_jax.data import apps
from grpo_jax.data import arithmetic
from grpo_jax.data import benchmarks
from grpo_jax.data import code_tasks
from grpo_jax.data import countdown
from grpo_jax.data import gsm8k
from grpo_jax.data import humaneval
from grpo_jax.data import math500
from grpo_jax.data import math_train
from grpo_jax.data import mbpp
from grpo_jax.data import reasoning_gym_tasks
from grpo_jax.data import rpt

BUILDERS = {
    builder.name: builder
    for builder in (arithmetic.Arithmetic, countdown.Countdown,
                    reasoning_gym_tasks.ReasoningGym, gsm8k.Gsm8k, math500.Math500, rpt.Rpt,
                    humaneval.Humaneval, code_tasks.CodeTasks,
                    *math_train.RELEASE_BUILDERS, *benchmarks.RELEASE_BUILDERS,
                    *mbpp.RELEASE_BUILDERS, *apps.RELEASE_BUILDERS)
}

# The builders whose examples are generated from knobs (a run's ``config.task.knobs``).
CONFIG_CLASSES = {"arithmetic": arithmetic.ArithmeticConfig,
                  "countdown": countdown.CountdownConfig,
                  "reasoning_gym": reasoning_gym_tasks.ReasoningGymConfig,
                  "rpt": rpt.RptConfig,
                  "code_tasks": code_tasks.CodeTasksConfig,
                  # Builders of release files: their config is keyed on the files read.
                  **{builder.name: builder.BUILDER_CONFIG_CLASS
                     for builder in (*math_train.RELEASE_BUILDERS, *benchmarks.RELEASE_BUILDERS,
                                     *mbpp.RELEASE_BUILDERS, *apps.RELEASE_BUILDERS)}}


def builder_config(name: str, knobs: dict[str, Any]) -> tfds.core.BuilderConfig | None:
    """The builder config of dataset `name` from its knobs (None for fixed datasets).

    >>> builder_config("gsm8k", {}) is None
    True
    """
    if name not in CONFIG_CLASSES:
        if knobs:
            raise ValueError(f"task.knobs {sorted(knobs)} given, but {name!r} takes none; "
                             f"knobs apply to {sorted(CONFIG_CLASSES)}")
        return None
    return CONFIG_CLASSES[name](**knobs)


def data_source(name: str, *, split: str, data_dir: str,
                config: tfds.core.BuilderConfig | str | None = None,
                manual_dir: str | None = None,
                prepare: bool = True) -> Sequence[dict[str, Any]]:
    """Prepares the dataset if ``data_dir`` lacks it, then opens ``split`` for random access.

    On several hosts sharing ``data_dir``, prepare once (one process, or a separate
    run) and open with ``prepare=False`` elsewhere, so processes do not race to write.

    Args:
      name: one of ``BUILDERS`` (``"arithmetic"``, ``"countdown"``, ``"reasoning_gym"``,
        ``"gsm8k"``, ``"math500"``, ``"rpt"``, the training sets of ``math_train`` and
        the benchmarks of ``benchmarks``, the code sets ``humaneval``, ``mbpp``,
        ``mbpp_sanitized``, ``apps`` and ``code_tasks``).
      split: ``"train"`` or ``"test"`` (MBPP also ``"validation"`` and ``"prompt"``).
      data_dir: where the array_record files are written and read.
      config: the builder config (an instance, or the name of a predefined one);
        ``None`` picks the builder's default.
      manual_dir: the directory holding the official files (GSM8K, MATH-500, the
        builders of ``math_train`` and ``benchmarks``, HumanEval, MBPP, APPS).
      prepare: build the dataset when it is missing; when False a missing dataset is
        an error.

    Returns:
      A random-access sequence of raw records (decode them with ``decode_example``;
      ``make_loader`` does).
    """
    config, manual_dir = _with_files(name, data_dir, config, manual_dir)
    config = _keyed_on_files(name, config, manual_dir)
    builder = _builder(name, data_dir=data_dir, config=config)
    if not builder.is_prepared():
        if not prepare:
            raise FileNotFoundError(
                f"{builder.data_dir} is not prepared; call data_source(..., "
                "prepare=True) once first")
        # Runs on one machine sharing data_dir take turns; one that waited finds it built.
        with paths.exclusive(os.path.join(data_dir, f".{name}.prepare.lock")):
            builder = _builder(name, data_dir=data_dir, config=config)
            if not builder.is_prepared():
                builder.download_and_prepare(download_config=tfds.download.DownloadConfig(
                    manual_dir=manual_dir, try_download_gcs=False))
    return builder.as_data_source(split=split)


def is_prepared(name: str, *, data_dir: str,
                config: tfds.core.BuilderConfig | str | None = None,
                manual_dir: str | None = None) -> bool:
    """Whether ``data_dir`` holds dataset `name` (built with `config`, from the files in
    `manual_dir` for a builder of release files) ready to open."""
    config, manual_dir = _with_files(name, data_dir, config, manual_dir)
    config = _keyed_on_files(name, config, manual_dir)
    return _builder(name, data_dir=data_dir, config=config).is_prepared()


def metadata(name: str, *, data_dir: str, config: tfds.core.BuilderConfig | None = None,
             manual_dir: str | None = None) -> dict[str, Any]:
    """The ``info.metadata`` of a prepared dataset: a generated task's knobs; for a
    builder of release files, each split's counts (``rows``, ``duplicates``,
    ``no_answer``, ``contaminated``, ``kept``) and the benchmarks it was
    decontaminated against."""
    config, manual_dir = _with_files(name, data_dir, config, manual_dir)
    config = _keyed_on_files(name, config, manual_dir)
    return dict(_builder(name, data_dir=data_dir, config=config).info.metadata or {})


def _keyed_on_files(name, config, manual_dir):
    """A release builder's config named after the identity of the files it reads (so an
    edited file builds a new copy); other configs as given."""
    builder = BUILDERS.get(name)
    if builder is None or not issubclass(builder, _release.ReleaseBuilder):
        return config
    return builder.resolve_config(config, manual_dir)


def _with_files(name, data_dir, config, manual_dir):
    """`(config, manual_dir)` of a build: for a dataset read from official files
    (``MANUAL_FILES`` of its builder), the `_manual.FilesConfig` of those files, so the
    build under ``data_dir`` is keyed on their contents, and the manual dir TFDS reads
    (``data_dir/downloads/manual`` when none is given)."""
    files = getattr(BUILDERS.get(name), "MANUAL_FILES", None)
    if not files or config is not None:
        return config, manual_dir
    manual_dir = manual_dir or os.path.join(data_dir, "downloads", "manual")
    return _manual.files_config(manual_dir, files), manual_dir


def _builder(name, *, data_dir, config):
    if name not in BUILDERS:
        raise ValueError(f"data name must be one of {sorted(BUILDERS)}, got {name!r}")
    return tfds.builder(name, data_dir=data_dir, config=config,
                        file_format=tfds.core.FileFormat.ARRAY_RECORD)


def make_loader(
    source: Sequence[Any],
    *,
    seed: int,
    shuffle: bool = True,
    num_epochs: int | None = 1,
    shard_options: grain.sharding.ShardOptions | None = None,
    transform: Callable[[dict[str, Any]], Any] | None = None,
    batch_size: int | None = None,
    drop_remainder: bool = False,
    read_options: grain.ReadOptions | None = None,
) -> grain.IterDataset:
    """A deterministic, shardable, resumable grain pipeline over decoded examples.

    Args:
      source: a random-access sequence of records, e.g. from ``data_source``.
      seed: shuffle seed in ``[0, 2**32)``; each epoch is shuffled differently.
      shuffle: whether to shuffle at all (evaluation usually does not).
      num_epochs: passes over this process's shard; ``None`` repeats forever.
      shard_options: which part of the data this process reads. ``None`` means
        ``grain.sharding.ShardByJaxProcess()``: process ``i`` of ``n`` reads the
        ``i``-th of ``n`` contiguous blocks, so the processes together read every
        example exactly once per epoch (``drop_remainder=True`` in the options gives
        equal shards instead, dropping up to ``n - 1`` examples).
      transform: applied to each decoded example, e.g. to add a formatted prompt.
      batch_size: when set, elements are lists of this many examples.
      drop_remainder: drop a final short batch.
      read_options: grain's threading and prefetch options.

    Returns:
      A ``grain.IterDataset``; its iterator has ``get_state()`` / ``set_state()``.
    """
    shard_options = shard_options or grain.sharding.ShardByJaxProcess()
    start, stop = shard_bounds(len(source), shard_options)
    dataset = grain.MapDataset.source(source)[start:stop]
    if shuffle:
        dataset = dataset.shuffle(seed=seed)
    dataset = dataset.repeat(num_epochs).map(_records.decode_example)
    if transform is not None:
        dataset = dataset.map(transform)
    if batch_size is not None:
        dataset = dataset.batch(batch_size, drop_remainder=drop_remainder, batch_fn=list)
    return dataset.to_iter_dataset(read_options)


def shard_bounds(num_examples: int, options: grain.sharding.ShardOptions) -> tuple[int, int]:
    """``[start, stop)`` of the contiguous block that ``options.shard_index`` reads.

    The first ``num_examples % shard_count`` shards get one extra example, unless
    ``options.drop_remainder``, in which case every shard gets
    ``num_examples // shard_count``.
    """
    per_shard, extra = divmod(num_examples, options.shard_count)
    index = options.shard_index
    if options.drop_remainder:
        return index * per_shard, (index + 1) * per_shard
    start = index * per_shard + min(index, extra)
    return start, start + per_shard + (index < extra)
