"""Lazy reading and plain writing of safetensors files, bfloat16 included.

The format is an 8-byte little-endian header length, a JSON header
(`{name: {"dtype", "shape", "data_offsets"}}`) and the raw little-endian tensors
(https://github.com/huggingface/safetensors). Reading memory-maps the file, so a tensor
is only paged in when a device shard of it is copied; numpy has no bfloat16, so the
`safetensors` package cannot hand one to numpy, but `ml_dtypes` can.
"""

import json
import struct

import ml_dtypes
import numpy as np

from grpo_jax import paths

_DTYPES = {
    "F64": np.dtype(np.float64),
    "F32": np.dtype(np.float32),
    "F16": np.dtype(np.float16),
    "BF16": np.dtype(ml_dtypes.bfloat16),
    "I64": np.dtype(np.int64),
    "I32": np.dtype(np.int32),
    "I16": np.dtype(np.int16),
    "I8": np.dtype(np.int8),
    "U8": np.dtype(np.uint8),
    "BOOL": np.dtype(np.bool_),
}
_NAMES = {dtype: name for name, dtype in _DTYPES.items()}


class SafetensorsFile:
    """One `.safetensors` file, memory-mapped; `file[name]` is a read-only numpy view."""

    def __init__(self, path):
        self.path = path
        with open(path, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(n))
        header.pop("__metadata__", None)
        self.header = header
        self._data_start = 8 + n
        self._map = np.memmap(path, dtype=np.uint8, mode="r")

    def keys(self):
        return self.header.keys()

    def __getitem__(self, name):
        entry = self.header[name]
        if entry["dtype"] not in _DTYPES:
            raise ValueError(f"{self.path}: tensor {name} has unsupported dtype {entry['dtype']}")
        begin, end = entry["data_offsets"]
        raw = self._map[self._data_start + begin : self._data_start + end]
        return raw.view(_DTYPES[entry["dtype"]]).reshape(entry["shape"])


def save_file(tensors, path, metadata=None):
    """Writes `{name: np.ndarray}` to `path` (names sorted, as the reference writer does)."""
    header, offset = {}, 0
    names = sorted(tensors)
    for name in names:
        array = tensors[name]
        header[name] = {
            "dtype": _NAMES[array.dtype],
            "shape": list(array.shape),
            "data_offsets": [offset, offset + array.nbytes],
        }
        offset += array.nbytes
    if metadata:
        header["__metadata__"] = metadata
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)  # the data section starts 8-byte aligned
    with paths.replacing(path) as f:   # local or in a bucket
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        for name in names:
            f.write(np.ascontiguousarray(tensors[name]).tobytes())  # x86 and ARM are little-endian
