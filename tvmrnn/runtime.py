"""Run a compiled module: load model.so + model.json with TVM's runtime only, check inputs, return numpy outputs.

Nothing here imports the compiler, ONNX or tvmrnn's frontend: a deployment needs only
`tvm.runtime` (the Relax VM) and numpy.
"""

from __future__ import annotations

import json
import os
from typing import Mapping

import numpy as np
import tvm.runtime
from tvm.runtime.vm import VirtualMachine

from .errors import InputError

FORMAT = "tvmrnn-module/1"


def metadata_path(so_path) -> str:
    return os.path.splitext(os.fspath(so_path))[0] + ".json"


def _device(kind: str):
    dev = tvm.runtime.device(kind, 0)
    if not dev.exist:
        raise InputError(f"device '{kind}' is not present on this machine")
    return dev


class Module:
    """A compiled model ready to run: `.run({input name: array}) -> {output name: array}`."""

    def __init__(self, executable, metadata: dict, device=None):
        self.metadata = metadata
        kind = device or ("cuda" if metadata["target_kind"] == "cuda" else "cpu")
        self.device = _device(kind)
        self._vm = VirtualMachine(executable, self.device)
        self._main = self._vm["main"]

    @property
    def input_names(self) -> list[str]:
        return [i["name"] for i in self.metadata["inputs"]]

    @property
    def output_names(self) -> list[str]:
        return [o["name"] for o in self.metadata["outputs"]]

    def check_inputs(self, feeds: Mapping[str, object]) -> list[np.ndarray]:
        """Match feeds to the module's inputs (name, dtype, rank, static dims, consistent symbolic dims)."""
        expected = self.metadata["inputs"]
        unknown = sorted(set(feeds) - set(self.input_names))
        if unknown:
            raise InputError(f"unknown input {unknown[0]!r}; the model's inputs are {self.input_names}")
        missing = [n for n in self.input_names if n not in feeds]
        if missing:
            raise InputError(f"missing input {missing[0]!r}; the model's inputs are {self.input_names}")
        dims: dict[str, tuple[int, str]] = {}
        arrays = []
        for info in expected:
            name, arr = info["name"], feeds[info["name"]]
            arr = np.ascontiguousarray(arr) if isinstance(arr, np.ndarray) else np.asarray(arr)
            if str(arr.dtype) != info["dtype"]:
                raise InputError(f"input {name!r} has dtype {arr.dtype}; expected {info['dtype']}")
            shape = info["shape"]
            if arr.ndim != len(shape):
                raise InputError(f"input {name!r} has shape {list(arr.shape)}; expected rank {len(shape)}: {shape}")
            for axis, (got, want) in enumerate(zip(arr.shape, shape)):
                if isinstance(want, int):
                    if got != want:
                        raise InputError(f"input {name!r} has shape {list(arr.shape)}; expected {shape} (axis {axis} must be {want})")
                elif want in dims and dims[want][0] != got:
                    raise InputError(f"input {name!r} axis {axis} ({want}) is {got}, but {dims[want][1]} set {want}={dims[want][0]}")
                else:
                    dims.setdefault(want, (got, f"input {name!r}"))
            arrays.append(arr)
        self._check_sequence_lens(dict(zip(self.input_names, arrays)))
        self._check_indices(dict(zip(self.input_names, arrays)))
        return arrays

    def _check_indices(self, feeds):
        """Indices into constant tables (token ids into an embedding) must be in range: ONNX's rule, and TVM would read past the table."""
        for name, size in self.metadata.get("index_bounds", {}).items():
            idx = feeds[name]
            bad = np.flatnonzero((idx < -size) | (idx >= size))
            if bad.size:
                raise InputError(f"input {name!r} has {int(idx.flat[bad[0]])} at flat position {int(bad[0])}; "
                                 f"it indexes a table of {size} rows, so values must be in [-{size}, {size - 1}]")

    def _check_sequence_lens(self, feeds):
        """ONNX Runtime refuses lengths outside [1, seq]; so do we, instead of computing something else."""
        for layer in self.metadata.get("layers", []):
            names = layer.get("graph_inputs", {})
            if "sequence_lens" not in names or "X" not in names:
                continue
            lens, x = feeds[names["sequence_lens"]], feeds[names["X"]]
            seq = x.shape[0 if layer["layout"] == 0 else 1]
            bad = np.flatnonzero((lens < 1) | (lens > seq))
            if bad.size:
                raise InputError(f"input {names['sequence_lens']!r} (sequence_lens of {layer['op']} node '{layer['name']}') "
                                 f"has {int(lens[bad[0]])} at row {int(bad[0])}; each length must be in [1, {seq}], the sequence length of {names['X']!r}")

    def to_device(self, feeds: Mapping[str, object]) -> list:
        """Checked inputs as device tensors, in the module's input order (for `invoke`)."""
        return [tvm.runtime.tensor(a, self.device) for a in self.check_inputs(feeds)]

    def invoke(self, device_inputs: list) -> list:
        """Run on inputs already on the device; returns device tensors (asynchronous on GPUs: no copy back)."""
        out = self._main(*device_inputs)
        return [out] if isinstance(out, tvm.runtime.Tensor) else list(out)

    def run(self, feeds: Mapping[str, object]) -> dict[str, np.ndarray]:
        outs = self.invoke(self.to_device(feeds))
        return {name: o.numpy() for name, o in zip(self.output_names, outs)}


def load_module(path, device=None) -> Module:
    path = os.fspath(path)
    meta_file = metadata_path(path)
    for p in (path, meta_file):
        if not os.path.exists(p):
            raise InputError(f"'{p}' does not exist (a compiled module is a .so with its .json beside it)")
    with open(meta_file) as f:
        metadata = json.load(f)
    if metadata.get("format") != FORMAT:
        raise InputError(f"'{meta_file}' is not tvmrnn module metadata (format {metadata.get('format')!r}, expected {FORMAT!r})")
    return Module(tvm.runtime.load_module(path), metadata, device)
