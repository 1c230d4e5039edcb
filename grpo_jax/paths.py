"""Paths as a run sees them: absolute from where they enter, remote URLs untouched, and
one file layer for everything a run, a sweep or a report reads or writes in a workdir.

orbax-checkpoint refuses relative checkpoint paths, and a run that resumes from another
working directory must find the same files, so every path a run reads or writes is made
absolute once, where it enters (the command line, the config), and used as is after that.

A workdir may be local or in a bucket (``gs://bucket/run``): its files go through
`path` (an `etils.epath.Path`, which reaches gs:// through gcsfs). Object stores
cannot append to or rename an object in place, so a file that grows is rewritten whole
(`write_whole`: all at once on a store, through a temporary file and a rename on a
local disk, so a reader or a kill never sees half of it), and a library that writes only
local files (a tokenizer, a plot) writes into `staged`, a temporary directory copied up.
"""

import contextlib
import fcntl
import importlib.util
import os
import re
import shutil
import tempfile

import fsspec
from etils import epath

# gcsfs answers a folder's listing from its first listing of it unless told not to; other
# processes (the runs of a sweep) and other clients (orbax's tensorstore, tensorboardX)
# write into a run's folders, so every look lists them again.
fsspec.config.conf.setdefault("gcs", {})["use_listings_cache"] = False

_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")   # gs://bucket/x, s3://..., file://...

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


def is_url(path):
    """True for ``gs://bucket/x`` and other URLs, False for local paths."""
    return bool(_URL.match(os.fspath(path)))


def path(location):
    """`location` (resolved, `resolve`) as an `epath.Path`: the one way a workdir's files
    are read and written, on a local disk or in a bucket."""
    return epath.Path(resolve(location))


def join(location, *parts):
    """`location` (resolved) with `parts` appended, as a string: ``gs://b/run/checkpoints``."""
    return os.fspath(path(location).joinpath(*parts))


@contextlib.contextmanager
def replacing(location):
    """Yields a binary file whose bytes replace the file `location` as one piece when the
    block ends: a reader sees the old file or the new one, and so does a run killed
    while writing. On a local disk it is a temporary file beside `location`, renamed
    over it; in an object store, an upload (an object is replaced whole, once the
    upload completes)."""
    target = path(location)
    target.parent.mkdir(parents=True, exist_ok=True)
    if is_url(target):
        with target.open("wb") as f:
            yield f
        return
    temporary = target.with_name(f".{target.name}.tmp")
    with temporary.open("wb") as f:
        yield f
    temporary.replace(target)


def write_whole(location, data):
    """Replaces the file `location` with `data` (str, written as UTF-8, or bytes) as one
    piece (`replacing`)."""
    with replacing(location) as f:
        f.write(data.encode("utf-8") if isinstance(data, str) else data)


def read_text_or_none(location):
    """The text of the file `location` (UTF-8), or None when there is none."""
    target = path(location)
    return target.read_text(encoding="utf-8") if target.exists() else None


@contextlib.contextmanager
def staged(directory):
    """Yields a local directory whose files end up in `directory`.

    For a local `directory`, it is that directory (created). For a URL, a new temporary
    directory, whose files are copied into `directory` (`copy_tree`) when the block ends
    without an error, then deleted: for libraries that write only to a local disk
    (transformers' `save_pretrained`, matplotlib)."""
    if not is_url(directory):
        path(directory).mkdir(parents=True, exist_ok=True)
        yield resolve(directory)
        return
    local = tempfile.mkdtemp(prefix="grpo_jax-staged-")
    try:
        yield local
        copy_tree(local, directory)
    finally:
        shutil.rmtree(local, ignore_errors=True)


@contextlib.contextmanager
def local_copy(directory):
    """Yields a local directory holding the files of `directory`: the directory itself
    when it is local, else a temporary copy (`copy_tree`, deleted when the block ends),
    for libraries that read only local files (transformers' `from_pretrained`)."""
    if not is_url(directory):
        yield resolve(directory)
        return
    local = tempfile.mkdtemp(prefix="grpo_jax-fetched-")
    try:
        copy_tree(directory, local)
        yield local
    finally:
        shutil.rmtree(local, ignore_errors=True)


def walk(directory):
    """`epath.Path.walk` of `directory`: `(folder, subfolder names, file names)` from the
    top down (remove a name from the subfolders to skip it), with each folder a full
    path on a store too (epath gives a store's folders without their ``gs://``)."""
    top = path(directory)
    scheme = os.fspath(top).partition("://")[0] + "://" if is_url(top) else ""
    for folder, folders, files in top.walk():
        folder = os.fspath(folder)
        yield epath.Path(folder if folder.startswith(scheme) else scheme + folder), folders, files


def copy_tree(source, target):
    """Copies every file under the directory `source` into `target`, in the same layout;
    either may be a URL (each file is read and written whole)."""
    source, target = path(source), path(target)
    for root, _, files in walk(source):
        for name in files:
            destination = target / (root / name).relative_to(source)
            destination.parent.mkdir(parents=True, exist_ok=True)
            destination.write_bytes((root / name).read_bytes())


def check_reachable(location, flag):
    """Raises ImportError naming `flag` when `location` is in Google Cloud Storage and
    gcsfs, which `etils.epath` reaches it through, is not installed."""
    if os.fspath(location).startswith("gs://") and importlib.util.find_spec("gcsfs") is None:
        raise ImportError(f"{flag}={location} is in Google Cloud Storage, which needs gcsfs: "
                          'pip install "grpo_jax[train]" (or pip install gcsfs)')


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
