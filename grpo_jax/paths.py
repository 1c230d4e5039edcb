"""Paths as a run sees them: absolute from where they enter, remote URLs untouched.

orbax-checkpoint refuses relative checkpoint paths, and a run that resumes from another
working directory must find the same files, so every path a run reads or writes is made
absolute once, where it enters (the command line, the config), and used as is after that.
"""

import contextlib
import fcntl
import os
import re

_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")   # gs://bucket/x, s3://..., file://...

# The config fields that hold paths (a run's workdir is passed beside the config).
CONFIG_PATH_FIELDS = ("model.path", "critic.path", "task.data_dir", "task.manual_dir")


def resolve(path):
    """`path` with ``~`` expanded and made absolute against the current directory.

    URLs (``gs://bucket/run``) come back unchanged, and so does the empty string (an
    unset optional path).

    >>> resolve("gs://bucket/run")
    'gs://bucket/run'
    >>> resolve("") == ""
    True
    """
    path = os.fspath(path)
    if not path or _URL.match(path):
        return path
    return os.path.abspath(os.path.expanduser(path))


def resolve_run_paths(config, workdir):
    """Returns `(config, workdir)`: a read-only copy of `config` (`config_lib.frozen`) with
    its path fields absolute, and `workdir` absolute; `config` is left as is.

    Every entry point of a run (train, sft, demo, eval) calls this first; calling it
    again on resolved paths changes nothing.
    """
    from grpo_jax import config_lib   # needs the train extra, which resolve() does not
    changes = {}
    for dotted in CONFIG_PATH_FIELDS:
        section, field = dotted.split(".")
        changes[dotted] = resolve(config[section][field])
    return config_lib.replaced(config, changes), resolve(workdir)


@contextlib.contextmanager
def exclusive(path):
    """Holds an exclusive lock on the file `path` (created, with its directory) while the
    block runs, so runs on one machine that share a directory (a sweep's runs, a test
    suite's workers) build what they share (a dataset, a warm start) once, one at a time.

    A URL path takes no lock (object stores have no file locks: build those beforehand,
    or from one process). Several JAX processes of one run coordinate by barriers
    instead and must not call this in one process only.
    """
    if _URL.match(os.fspath(path)):
        yield
        return
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
