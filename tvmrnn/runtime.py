"""Run a compiled module: load model.so + model.json with TVM's runtime only, check inputs, return numpy outputs.

Nothing here imports the compiler, ONNX or tvmrnn's frontend: a deployment needs only
`tvm.runtime` (the Relax VM) and numpy.
"""

from __future__ import annotations

import ctypes
import importlib.util
import json
import os
import threading
import time
from dataclasses import dataclass
from typing import Mapping

import numpy as np
import tvm.runtime
from tvm.runtime.vm import VirtualMachine

from .errors import InputError, UnsupportedModelError

FORMAT = "tvmrnn-module/1"
MAX_CACHED_SHAPES = 256  # host buffers kept per (name, shape); past it the cache starts over
OUTPUTS_TO_HOST = "outputs_to_host"  # the copy of main's outputs a CUDA module built with a graph has (tvmrnn.cuda_graph)
WHOLE_CALL = "main_whole_call"  # main writing into given outputs, returning its buffers: run() captures it (tvmrnn.cuda_graph)
WHOLE_CALL_BUFFERS = "main_whole_call_buffers"  # the buffers WHOLE_CALL takes, planned statically: one set a module


def cpu_threads() -> int:
    """The threads TVM's CPU pool runs here: TVM_NUM_THREADS or OMP_NUM_THREADS where set, else one per physical core
    this process may run on (what use_every_core gives it; the CPU kernels that split work by thread build for this)."""
    for name in ("TVM_NUM_THREADS", "OMP_NUM_THREADS"):
        if os.environ.get(name):
            return int(os.environ[name])
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    try:
        import psutil
    except ImportError:
        return usable
    return max(1, min(usable, psutil.cpu_count(logical=False) or usable))


def local_sm_count(arch: str) -> int | None:
    """The local GPU's SM count where it is of `arch` (sm_90a counts as sm_90), else None."""
    try:
        dev = tvm.runtime.device("cuda", 0)
        if not dev.exist:
            return None
        local = "sm_" + dev.compute_version.replace(".", "")
    except Exception:  # no CUDA driver at all
        return None
    return dev.multi_processor_count if arch.removesuffix("a") == local else None


def kernel_device(target):
    """The device the kernels for `target` are built for (schedules.Device): on CUDA the local GPU's SM count where it
    is of the target's arch (a smaller part than the arch's flagship, such as the H100 PCIe's 114, gets a grid it can
    launch), on CPUs the threads of the pool here (cpu_threads)."""
    from schedules.device import Device

    arch = Device.of_target(target).arch
    return Device.of_target(target, sm_count=local_sm_count(arch) if target.kind.name == "cuda" else None,
                            cpu_threads=cpu_threads())


def use_every_core() -> None:
    """Give TVM's CPU thread pool one thread per physical core this process may run on (cpu_threads).

    Untold, TVM takes half the logical CPUs, assuming two hyperthreads per core: on a machine
    without SMT that leaves half the cores idle (this 2-core VM got 1 thread; lat-b1-h512-l2
    ran in 14.8 ms instead of 9.0). TVM_NUM_THREADS or OMP_NUM_THREADS, when set, still decide.
    Runs at import, before the pool exists (TVM reads the variable when it creates it).
    """
    # unpinned workers: a worker pinned to a core that another process (or another library's spinning pool) holds
    # waits out that core's timeslice at every barrier; an unpinned one moves (docs/decisions.md)
    os.environ.setdefault("TVM_BIND_THREADS", "0")
    # idle workers sleep at once instead of calling sched_yield 300,000 times: on a busy machine a spinning worker is
    # often descheduled when the next launch comes and the caller waits out a timeslice; a sleeping one is woken
    # (docs/decisions.md)
    os.environ.setdefault("TVM_THREAD_POOL_SPIN_COUNT", "0")
    if "TVM_NUM_THREADS" in os.environ or "OMP_NUM_THREADS" in os.environ:
        return
    if importlib.util.find_spec("psutil") is None:  # a bare runtime install: keep TVM's default
        return
    os.environ["TVM_NUM_THREADS"] = str(cpu_threads())


use_every_core()


def metadata_path(so_path) -> str:
    return os.path.splitext(os.fspath(so_path))[0] + ".json"


def _device(kind: str):
    dev = tvm.runtime.device(kind, 0)
    if not dev.exist:
        raise InputError(f"device '{kind}' is not present on this machine")
    return dev


@dataclass(frozen=True)
class SequenceLensInput:
    """A graph input that is a recurrent layer's sequence_lens, with the graph input that is its X."""

    lens: str  # graph input name of sequence_lens
    x: str  # graph input name of X
    seq_axis: int  # X's sequence axis (0 for layout 0, 1 for layout 1)
    layer: str  # "LSTM node 'name'"


def sequence_lens_inputs(metadata: dict) -> list[SequenceLensInput]:
    """The layers whose sequence_lens and X are both graph inputs (so lengths can be checked and padded against X)."""
    found = []
    for layer in metadata.get("layers", []):
        names = layer.get("graph_inputs", {})
        if "sequence_lens" in names and "X" in names:
            found.append(SequenceLensInput(names["sequence_lens"], names["X"], 0 if layer["layout"] == 0 else 1,
                                           f"{layer['op']} node '{layer['name']}'"))
    return found


def _numpy_dtype(name: str):
    try:
        return np.dtype(name)
    except TypeError:  # bfloat16 and the like: compared by name
        return None


class ModuleInputs:
    """What a module's inputs must be, from model.json alone (no VM): names, dtypes, shapes, sequence
    lengths within X's length, indices within the tables they index. Modules check with it before every
    run; the server checks requests with it in its own process."""

    def __init__(self, metadata: dict):
        self.metadata = metadata
        self.input_names = [i["name"] for i in metadata["inputs"]]
        self.output_names = [o["name"] for o in metadata["outputs"]]
        self.sequence_lens = sequence_lens_inputs(metadata)
        self.index_bounds = metadata.get("index_bounds", {})
        self.max_dims = metadata.get("max_dims", {})
        # (input position, name, axis, dim, bound) for every input axis compile bounded: worked out once, checked per call
        self._bounded = [(i, info["name"], axis, dim, self.max_dims[dim]) for i, info in enumerate(metadata["inputs"])
                         for axis, dim in enumerate(info["shape"]) if dim in self.max_dims]
        self._dtypes = {info["dtype"]: _numpy_dtype(info["dtype"]) for info in metadata["inputs"]}  # str(dtype) is slow
        self._last_accepted = None  # ((name, dtype, shape) per input) of the last feeds check_inputs accepted

    def check_inputs(self, feeds: Mapping[str, object]) -> list[np.ndarray]:
        """Match feeds to the module's inputs (name, dtype, rank, static dims, consistent symbolic dims, bounds), then
        their values (sequence lengths, indices). Feeds of the names, dtypes and shapes last accepted (a stream's
        chunks) skip straight to the values."""
        arrays = self._as_last_accepted(feeds)
        if arrays is None:
            arrays = self._check_signature(feeds)
            self._last_accepted = tuple((name, a.dtype, a.shape) for name, a in zip(self.input_names, arrays))
        if self.sequence_lens or self.index_bounds:
            named = dict(zip(self.input_names, arrays))
            self._check_sequence_lens(named)
            self._check_indices(named)
        return arrays

    def _as_last_accepted(self, feeds: Mapping[str, object]) -> list[np.ndarray] | None:
        """The feeds in input order where each is a C-contiguous ndarray of the dtype and shape last accepted, else None."""
        last = self._last_accepted
        if last is None or len(feeds) != len(last):
            return None
        arrays = []
        for name, dtype, shape in last:
            a = feeds.get(name)
            if type(a) is not np.ndarray or a.dtype != dtype or a.shape != shape or not a.flags.c_contiguous:
                return None
            arrays.append(a)
        return arrays

    def _check_signature(self, feeds: Mapping[str, object]) -> list[np.ndarray]:
        unknown = sorted(set(feeds) - set(self.input_names))
        if unknown:
            raise InputError(f"unknown input {unknown[0]!r}; the model's inputs are {self.input_names}")
        missing = [n for n in self.input_names if n not in feeds]
        if missing:
            raise InputError(f"missing input {missing[0]!r}; the model's inputs are {self.input_names}")
        dims: dict[str, tuple[int, str]] = {}
        arrays = []
        for info in self.metadata["inputs"]:
            name, arr = info["name"], feeds[info["name"]]
            arr = np.ascontiguousarray(arr) if isinstance(arr, np.ndarray) else np.asarray(arr)
            want = self._dtypes[info["dtype"]]
            if (arr.dtype != want) if want is not None else (str(arr.dtype) != info["dtype"]):
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
        self.check_bounds([a.shape for a in arrays])
        return arrays

    def check_bounds(self, shapes) -> None:
        """The inputs' shapes (in input order) within compile's max_dims, which the module's buffers are planned for."""
        for i, name, axis, dim, bound in self._bounded:
            if shapes[i][axis] > bound:
                raise InputError(f"input {name!r} has {dim}={shapes[i][axis]}; this module was compiled for {dim} <= {bound} "
                                 f"(max_dims: its buffers are planned for that bound; recompile with a larger one)")

    def _check_indices(self, feeds):
        """Indices into constant tables (token ids into an embedding) must be in range: ONNX's rule, and TVM would read past the table."""
        for name, size in self.index_bounds.items():
            idx = feeds[name]
            bad = np.flatnonzero((idx < -size) | (idx >= size))
            if bad.size:
                raise InputError(f"input {name!r} has {int(idx.flat[bad[0]])} at flat position {int(bad[0])}; "
                                 f"it indexes a table of {size} rows, so values must be in [-{size}, {size - 1}]")

    def _check_sequence_lens(self, feeds):
        """ONNX Runtime refuses lengths outside [1, seq]; so do we, instead of computing something else."""
        for sl in self.sequence_lens:
            lens, seq = feeds[sl.lens], feeds[sl.x].shape[sl.seq_axis]
            bad = np.flatnonzero((lens < 1) | (lens > seq))
            if bad.size:
                if seq == 0:
                    raise InputError(f"input {sl.x!r} has no time steps, so {sl.lens!r} (sequence_lens of {sl.layer}) cannot be "
                                     f"met: each length must be in [1, the sequence length of {sl.x!r}]")
                raise InputError(f"input {sl.lens!r} (sequence_lens of {sl.layer}) has {int(lens[bad[0]])} at row {int(bad[0])}; "
                                 f"each length must be in [1, {seq}], the sequence length of {sl.x!r}")


def check_grid_fits(metadata: dict, sms: int, gpu: str) -> None:
    """A module's persistent kernels launch one block per SM, all resident at once: refuse, by name, a GPU with fewer
    SMs than the largest grid (CUDA would fail the launch with COOPERATIVE_LAUNCH_TOO_LARGE at the first call)."""
    for layer in metadata.get("layers", []):
        need = layer.get("cooperative_blocks", 0)
        if need > sms:
            raise UnsupportedModelError(f"layer '{layer['name']}' was compiled for {metadata['target']} with a persistent kernel of "
                                        f"{need} co-resident blocks, and this GPU ({gpu}) has {sms} SMs; compile on this GPU "
                                        f"(target 'cuda' sizes the kernels to it) or with kernel='stepwise'")


class Module(ModuleInputs):
    """A compiled model ready to run: `.run({input name: array}) -> {output name: array}`."""

    def __init__(self, executable, metadata: dict, device=None):
        super().__init__(metadata)
        kind = device or ("cuda" if metadata["target_kind"] == "cuda" else "cpu")
        self.device = _device(kind)
        sms = self.device.multi_processor_count if kind == "cuda" else None
        if sms:  # None where the driver does not say: the launch itself reports it then
            check_grid_fits(metadata, sms, self.device.device_name)
        self._vm = VirtualMachine(executable, self.device)
        self._main = self._vm["main"]
        self._lock = threading.Lock()
        self._on_cpu = kind == "cpu"
        self._staged: dict[tuple, tuple] = {}  # (input position, shape, dtype) -> (tensor, numpy view on the CPU, address)
        # on a GPU, page-locked host arrays by input and by output name that the copies go through; a caller may
        # assemble an input in `host_inputs(name, shape, dtype)` itself (the serving batcher), and its copy is skipped
        self.host_inputs = None if self._on_cpu else HostBuffers(pinned=True, device_id=self.device.index)
        self._host_outputs = None if self._on_cpu else HostBuffers(pinned=True, device_id=self.device.index)
        # with it, the kernels read inputs from and write outputs to page-locked host memory: no cudaMemcpy a call
        self._outputs_to_host = None if self._on_cpu else module_function(executable, OUTPUTS_TO_HOST)
        self._graphs = self._whole_call_graphs()
        self.phases: dict[str, float] = {}  # the last GPU run's split: copies in, the module to its end, copies out

    def _whole_call_graphs(self):
        """run()'s whole call as one CUDA graph per input signature, where the module has WHOLE_CALL (tvmrnn.graph_replay)."""
        if self._on_cpu or not all(self._vm.module.implements_function(f) for f in (WHOLE_CALL, WHOLE_CALL_BUFFERS)):
            return None
        from .graph_replay import WholeCallGraphs

        graphs = WholeCallGraphs(self._vm[WHOLE_CALL], self._vm[WHOLE_CALL_BUFFERS], self.device, self.input_names,
                                 self.output_names, self.host_inputs, self._host_outputs, self._run_through_vm)
        return graphs if graphs.available else None

    def to_device(self, feeds: Mapping[str, object]) -> list:
        """Checked inputs as device tensors, in the module's input order (for `invoke`)."""
        return [tvm.runtime.tensor(a, self.device) for a in self.check_inputs(feeds)]

    def invoke(self, device_inputs: list) -> list:
        """Run on inputs already on the device; returns device tensors (asynchronous on GPUs: no copy back). Only their
        dims are checked against the module's bounds (max_dims), which its buffers are planned for; the rest of
        check_inputs is the caller's (to_device does it)."""
        self.check_bounds([t.shape for t in device_inputs])
        return self._execute(device_inputs)

    def _execute(self, device_inputs: list) -> list:
        out = self._main(*device_inputs)
        return [out] if isinstance(out, tvm.runtime.Tensor) else list(out)

    def run(self, feeds: Mapping[str, object]) -> dict[str, np.ndarray]:
        """Outputs as numpy arrays the caller owns. One call at a time per module (the VM and the staged inputs are
        shared): concurrent callers wait for each other."""
        return dict(zip(self.output_names, self._run_arrays(self.check_inputs(feeds))))  # (bounds checked there)

    def run_checked(self, arrays: list[np.ndarray]) -> list[np.ndarray]:
        """run() on arrays in input order whose values are already checked (the server's per-request checks); their
        dims are checked against the module's bounds here."""
        self.check_bounds([a.shape for a in arrays])
        return self._run_arrays(arrays)

    def _run_arrays(self, arrays: list[np.ndarray]) -> list[np.ndarray]:
        """On a GPU, a CUDA module built with a graph replays its whole call as one (graph_replay); the VM runs it
        otherwise."""
        with self._lock:
            if self._on_cpu:
                return self._run_on_cpu(arrays)
            if self._graphs is not None:
                return self._graphs.run(arrays, self.phases)
            return self._run_through_vm(arrays)

    def _run_through_vm(self, arrays: list[np.ndarray]) -> list[np.ndarray]:
        t0 = time.perf_counter()
        tensors = self.stage(arrays)
        t1 = time.perf_counter()
        outs = self._execute(tensors)
        self.device.sync()
        t2 = time.perf_counter()
        result = self.to_host(outs)
        self.phases.update(input=t1 - t0, infer=t2 - t1, output=time.perf_counter() - t2)
        return result

    def stage(self, arrays: list[np.ndarray]) -> list:
        """Checked arrays as tensors for invoke, valid until the next call: page-locked host arrays kept per input and
        shape where the module's first kernel copies its inputs in (it reads them there), else device tensors so kept."""
        if self._outputs_to_host is not None:
            views = [self._host_input(name, a) for name, a in zip(self.input_names, arrays)]
            if views[0] is not None:  # else no page-locked memory here
                return views
        return [self._staged_input(i, a)[0] for i, a in enumerate(arrays)]

    def _host_input(self, name: str, array: np.ndarray):
        host = self.host_inputs(name, array.shape, array.dtype)
        if host is not array:  # else assembled in place by the caller
            np.copyto(host, array)
        return self.host_inputs.on_device(name, array.shape, array.dtype)

    def to_host(self, outs: list) -> list[np.ndarray]:
        """A GPU run's outputs as numpy arrays the caller owns, through page-locked host arrays kept per output and shape:
        written there by one launch of the module's OUTPUTS_TO_HOST where it has it, else copied (a copy from or to
        pageable memory is staged by the driver: about 15 us for a few KB on an H100, against 2.5 us page-locked)."""
        host = self._host_outputs
        keys = [(name, tuple(out.shape), out.dtype) for name, out in zip(self.output_names, outs)]
        views = [host.on_device(*key) for key in keys]
        if views[0] is None:  # no page-locked memory here
            return [out.numpy() for out in outs]
        if self._outputs_to_host is not None:
            self._outputs_to_host(*outs, *views)
        else:
            for out, key in zip(outs, keys):
                out.copyto(host.tensor(*key))
        self.device.sync()  # both are queued on the stream the kernels ran on
        return [host(*key).copy() for key in keys]

    def _run_on_cpu(self, arrays: list[np.ndarray]) -> list[np.ndarray]:
        """Inputs copied into staged tensors (64-byte aligned, as TVM's kernels assume; kept per shape), outputs handed
        over without a copy: the VM allocates them fresh each call. An output that is a staged input is copied."""
        staged = [self._staged_input(i, a) for i, a in enumerate(arrays)]
        outs = self._execute([tensor for tensor, _, _ in staged])
        inputs_at = {address for _, _, address in staged}
        return [np.from_dlpack(o).copy() if o.data_ptr() in inputs_at else np.from_dlpack(o) for o in outs]

    def _staged_input(self, index: int, array: np.ndarray):
        """(tensor, numpy view of it on the CPU else None, its address) for input `index`, holding `array`: a tensor
        kept per shape, 64-byte aligned on the CPU as TVM's kernels assume; on a GPU a fresh one each call cost a
        device allocation and a free that waits for the GPU (outputs are copied back before run() returns), and the
        copy goes through a page-locked host array."""
        key = (index, array.shape, array.dtype.str)
        entry = self._staged.get(key)
        if entry is None:
            if len(self._staged) >= MAX_CACHED_SHAPES:  # callers sending ever new shapes: start over
                self._staged.clear()
            tensor = tvm.runtime.empty(array.shape, str(array.dtype), self.device)
            view = np.from_dlpack(tensor) if self._on_cpu else None
            entry = self._staged[key] = (tensor, view, tensor.data_ptr())
        if entry[1] is not None:
            np.copyto(entry[1], array)
            return entry
        name = self.input_names[index]
        pinned = self.host_inputs.tensor(name, array.shape, array.dtype)
        if pinned is None:
            entry[0].copyfrom(np.ascontiguousarray(array))
            return entry
        host = self.host_inputs(name, array.shape, array.dtype)
        if host is not array:  # else assembled in place by the caller
            np.copyto(host, array)
        entry[0].copyfrom(pinned)
        return entry


class HostBuffers:
    """`buffers(name, shape, dtype)`: a host array kept per (name, shape), page-locked (cudaMallocHost, through TVM's
    cuda_host device) when `pinned`, so copies to and from the GPU need no staging; `buffers.tensor(...)` is the TVM
    tensor that array views (None where not page-locked), `buffers.on_device(...)` the same memory as a CUDA tensor,
    which kernels read and write over the bus (unified addressing). Copy tensor to tensor: TVMTensorCopyFromBytes from
    a page-locked address still takes about 20 us on an H100, a copy between tensors 2.5. Valid until the next use of
    the same name: one batch is assembled and copied at a time per model."""

    def __init__(self, pinned: bool, device_id: int = 0):
        self._pinned, self._device_id = pinned, device_id
        self._entries: dict[tuple, tuple] = {}  # (name, shape, dtype) -> (array, tensor or None, CUDA view or None)

    def __call__(self, name: str, shape: tuple, dtype) -> np.ndarray:
        return self._entry(name, shape, dtype)[0]

    def tensor(self, name: str, shape: tuple, dtype):
        return self._entry(name, shape, dtype)[1]

    def on_device(self, name: str, shape: tuple, dtype):
        return self._entry(name, shape, dtype)[2]

    def _entry(self, name: str, shape: tuple, dtype) -> tuple:
        dtype = np.dtype(dtype)
        key = (name, tuple(shape), dtype.str)
        entry = self._entries.get(key)
        if entry is None:
            if len(self._entries) >= MAX_CACHED_SHAPES:  # clients sending ever new lengths: start over (arrays own their memory)
                self._entries.clear()
            entry = self._entries[key] = self._allocate(tuple(shape), dtype)
        return entry

    def _allocate(self, shape: tuple, dtype: np.dtype) -> tuple:
        if self._pinned:
            try:
                owner = tvm.runtime.empty(shape, str(dtype), tvm.runtime.device(3, 0))  # kDLCUDAHost
            except Exception:  # noqa: BLE001 - no page-locked memory here: plain host arrays
                self._pinned = False
            else:
                raw = (ctypes.c_byte * (int(np.prod(shape)) * dtype.itemsize)).from_address(owner.data_ptr())
                raw.owner = owner  # the array's base keeps the allocation alive
                array = np.frombuffer(raw, dtype).reshape(shape)
                return array, owner, tvm.runtime.from_dlpack(_CudaView(array, self._device_id))
        return np.empty(shape, dtype), None, None


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLTensorHead(ctypes.Structure):  # a DLManagedTensor begins with its DLTensor: data, then device
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice)]


_capsule_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_pointer.restype, _capsule_pointer.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
KDL_CUDA = 2


class _CudaView:
    """A page-locked numpy array exported by DLPack as a CUDA tensor (TVM's kernels check that their arguments are on
    the CUDA device; the GPU addresses page-locked memory directly). numpy's own capsule, its device changed, so that
    numpy's deleter still owns the reference."""

    def __init__(self, array: np.ndarray, device_id: int):
        self.array, self.device_id = array, device_id

    def __dlpack_device__(self):
        return KDL_CUDA, self.device_id

    def __dlpack__(self, **_):
        capsule = self.array.__dlpack__()
        _DLTensorHead.from_address(_capsule_pointer(capsule, b"dltensor")).device = _DLDevice(KDL_CUDA, self.device_id)
        return capsule


def module_function(executable, name: str):
    """The compiled function `name` of a Relax executable (built here or loaded), or None where it has none."""
    mod = getattr(executable, "mod", executable)
    return mod.get_function(name, query_imports=True) if mod.implements_function(name, query_imports=True) else None


def read_metadata(path) -> dict:
    """model.json of the module at `path` (model.so), checked; InputError naming the file where it is not one."""
    path = os.fspath(path)
    if path.lower().endswith(".onnx"):
        stem = os.path.splitext(path)[0]
        raise InputError(f"'{path}' is an ONNX model; compile it first (tvmrnn compile {path} -o {stem}.so) and give the .so")
    meta_file = metadata_path(path)
    for p in (path, meta_file):
        if not os.path.exists(p):
            raise InputError(f"'{p}' does not exist (a compiled module is a .so with its .json beside it)")
    try:
        with open(meta_file) as f:
            metadata = json.load(f)
    except (OSError, ValueError) as err:
        raise InputError(f"'{meta_file}' is not readable tvmrnn module metadata: {err}") from None
    if not isinstance(metadata, dict) or metadata.get("format") != FORMAT:
        found = metadata.get("format") if isinstance(metadata, dict) else None
        raise InputError(f"'{meta_file}' is not tvmrnn module metadata (format {found!r}, expected {FORMAT!r})")
    return metadata


def check_cuda_here(metadata: dict) -> None:
    """A CUDA module loads only where there is a CUDA GPU (TVM registers its CUDA loader there): say so, and what to do."""
    if metadata.get("target_kind") != "cuda":
        return
    try:
        present = tvm.runtime.cuda(0).exist
    except Exception:  # no CUDA driver at all
        present = False
    if not present:
        try:
            arch = json.loads(metadata["target"]).get("arch", "")
        except (KeyError, TypeError, ValueError, AttributeError):
            arch = ""
        raise UnsupportedModelError(f"this module was built for CUDA {arch}".rstrip() + "; this host has no CUDA GPU: "
                                    "compile with --target llvm (target='llvm') to run it here")


def load_module(path, device=None) -> Module:
    path = os.fspath(path)
    metadata = read_metadata(path)
    check_cuda_here(metadata)
    return Module(tvm.runtime.load_module(path), metadata, device)


DEFAULT_DIM = 8  # a symbolic dim nobody sized; small so the run is quick


def random_inputs(module: ModuleInputs, dims: dict, seed: int, given: dict) -> dict:
    """Random feeds for the inputs not in `given`: floats ~N(0,1), integers in [0, 10), sequence lengths = full length.
    `dims` gets the size each symbolic dim was given (by an array in `given`, or DEFAULT_DIM)."""
    rng = np.random.default_rng(seed)
    sizes = dims
    seq_lens = {sl.lens: (sl.x, sl.seq_axis) for sl in module.sequence_lens}
    for info in module.metadata["inputs"]:  # a given array fixes the symbolic dims it has
        if info["name"] in given:
            for d, n in zip(info["shape"], given[info["name"]].shape):
                if isinstance(d, str):
                    sizes.setdefault(d, n)
    shapes = {i["name"]: [d if isinstance(d, int) else sizes.setdefault(d, DEFAULT_DIM) for d in i["shape"]]
              for i in module.metadata["inputs"]}
    feeds = dict(given)
    for info in module.metadata["inputs"]:
        name, dtype, shape = info["name"], info["dtype"], shapes[info["name"]]
        if name in feeds:
            continue
        if name in seq_lens:
            x, axis = seq_lens[name]
            feeds[name] = np.full(shape, shapes[x][axis], dtype)
        elif np.issubdtype(np.dtype(dtype), np.integer):
            feeds[name] = rng.integers(0, 10, shape).astype(dtype)
        else:
            feeds[name] = rng.standard_normal(shape).astype(dtype)
    return feeds
