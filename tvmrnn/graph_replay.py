"""A CUDA module's whole call replayed as one CUDA graph: the copy in from page-locked host memory, every kernel, the
copy out to page-locked host memory. One launch and one wait a call, instead of the VM's instructions, three launches
and its graph's.

The module's WHOLE_CALL function (tvmrnn.cuda_graph.with_whole_call) is main writing its outputs into tensors it is
given (page-locked host arrays here), taking the buffers memory planning sized (one set a module, made once: graphs
replay one at a time) and returning whatever else it allocates. Captured once per input signature on a stream of our
own, its result is kept: the graph's buffers stay its own, never handed by the VM's pool to another tensor. The
page-locked arrays the graph reads and writes are the entry's; run() copies inputs into them and outputs out of them.
Runtime-only: TVM's runtime and the CUDA driver through cuda-bindings.
"""

from __future__ import annotations

import time
from collections import OrderedDict

import numpy as np

MAX_GRAPHS = 16  # signatures captured a module (each its graph and host arrays); the least recently used goes first


def _driver():
    try:
        from cuda.bindings import driver
    except ImportError:  # a runtime install without cuda-bindings: the VM's path
        return None
    return driver


class CaptureError(RuntimeError):
    pass


def _check(driver, result):
    """The value of a cuda-bindings call's (status, value...) result; CaptureError naming the status otherwise."""
    status, *values = result if isinstance(result, tuple) else (result,)
    if status != driver.CUresult.CUDA_SUCCESS:
        raise CaptureError(f"CUDA graph capture: {status.name}")
    return values[0] if len(values) == 1 else values


class _Graph:
    """One signature's capture: the executable graph, what the captured call returned (its buffers), and the page-locked
    arrays it reads inputs from and writes outputs to."""

    def __init__(self, driver, exe, kept, inputs, outputs):
        self.driver, self.exe, self.kept, self.inputs, self.outputs = driver, exe, kept, inputs, outputs

    def __del__(self):
        if self.exe is not None:
            self.driver.cuGraphExecDestroy(self.exe)


class WholeCallGraphs:
    """`graphs.run(arrays)`: the module's outputs for checked input arrays, through the graph captured for their
    signature (captured at its first run). A signature whose capture failed runs through `fallback` from then on."""

    def __init__(self, whole, make_buffers, device, input_names, output_names, host_inputs, host_outputs, fallback):
        self._driver = _driver()
        self._whole, self._make_buffers, self._device = whole, make_buffers, device
        self._buffers = None  # WHOLE_CALL's planned buffers, made at the first capture, shared by every graph
        self._input_names, self._output_names = input_names, output_names
        self._host_inputs, self._host_outputs = host_inputs, host_outputs
        self._fallback = fallback
        self._graphs: OrderedDict[tuple, _Graph | None] = OrderedDict()
        self._stream = None

    def __del__(self):
        self._graphs.clear()  # graphs before the stream they launch on
        if self._stream is not None:
            self._driver.cuStreamDestroy(self._stream)

    @property
    def available(self) -> bool:
        return self._driver is not None

    def run(self, arrays: list[np.ndarray], phases: dict) -> list[np.ndarray]:
        """Outputs in output order; `phases` gets the run's split (copies in, the graph to its end, copies out)."""
        key = tuple((a.shape, a.dtype.str) for a in arrays)
        if key not in self._graphs:
            return self._first_run(key, arrays, phases)
        graph = self._graphs[key]
        self._graphs.move_to_end(key)
        return self._fallback(arrays) if graph is None else self._replay(graph, arrays, phases)

    def _first_run(self, key, arrays, phases) -> list[np.ndarray]:
        """A new signature: captured, and its first replay checked against the VM's own run of the same call (the same
        kernels: anything else means the capture missed something). A signature that cannot be captured, or whose
        replay differs, runs through the VM from then on; the VM's outputs are returned."""
        graph, expected = self._capture_or_none(arrays)
        if graph is not None and not _same(self._replay(graph, arrays, phases), expected):
            graph = None
        self._graphs[key] = graph
        while len(self._graphs) > MAX_GRAPHS:
            self._graphs.popitem(last=False)
        return expected if expected is not None else self._fallback(arrays)

    def _replay(self, graph: _Graph, arrays, phases) -> list[np.ndarray]:
        t0 = time.perf_counter()
        for host, a in zip(graph.inputs, arrays):
            if host is not a:  # else assembled in place by the caller
                np.copyto(host, a)
        t1 = time.perf_counter()
        _check(self._driver, self._driver.cuGraphLaunch(graph.exe, self._stream))
        _check(self._driver, self._driver.cuStreamSynchronize(self._stream))
        t2 = time.perf_counter()
        result = [out.copy() for out in graph.outputs]
        phases.update(input=t1 - t0, infer=t2 - t1, output=time.perf_counter() - t2)
        return result

    def _capture_or_none(self, arrays) -> tuple[_Graph | None, list | None]:
        """(the signature's graph, the VM's outputs for this call), the graph None where it cannot be captured here (no
        page-locked memory, a kernel the driver refuses in a graph): the VM's path then serves that signature."""
        expected = None
        try:
            expected = self._fallback(arrays)  # the outputs' shapes, and what the first replay must give
            return self._capture(arrays, expected), expected
        except Exception:  # noqa: BLE001 - whatever refused the capture, the VM's path still runs the call
            return None, expected

    def _capture(self, arrays, expected: list[np.ndarray]) -> _Graph:
        import tvm_ffi

        hosts = [self._host_inputs(n, a.shape, a.dtype) for n, a in zip(self._input_names, arrays)]
        views = [self._host_inputs.on_device(n, a.shape, a.dtype) for n, a in zip(self._input_names, arrays)]
        if views[0] is None:
            raise CaptureError("no page-locked memory")
        keys = [(n, o.shape, o.dtype) for n, o in zip(self._output_names, expected)]
        views += [self._host_outputs.on_device(*k) for k in keys]
        if self._buffers is None:
            self._buffers = self._make_buffers()
        views.append(self._buffers)
        self._whole(*views)  # loads the kernels and sets their attributes before capture
        driver = self._driver
        if self._stream is None:  # blocking (TVM's own streams are not): ordered after the warm-up above, whose
            # unplanned buffers went back to the pool, and after and before whatever else runs on the default stream
            self._stream = int(_check(driver, driver.cuStreamCreate(int(driver.CUstream_flags.CU_STREAM_DEFAULT))))
        with tvm_ffi.use_raw_stream(self._device, self._stream):
            relaxed = driver.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_RELAXED
            _check(driver, driver.cuStreamBeginCapture(self._stream, relaxed))
            try:
                kept = self._whole(*views)
            finally:
                graph = _check(driver, driver.cuStreamEndCapture(self._stream))
        try:
            exe = _check(driver, driver.cuGraphInstantiate(graph, 0))
        finally:
            driver.cuGraphDestroy(graph)
        return _Graph(driver, exe, kept, hosts, [self._host_outputs(*k) for k in keys])


def _same(got: list[np.ndarray], expected: list[np.ndarray]) -> bool:
    """The replay's outputs are the VM's (floats to rounding: a kernel may sum in another order from run to run)."""
    def close(g, e):
        if not np.issubdtype(e.dtype, np.inexact):
            return np.array_equal(g, e)
        return np.allclose(g, e, rtol=1e-5, atol=1e-6, equal_nan=True)

    return len(got) == len(expected) and all(g.shape == e.shape and close(g, e) for g, e in zip(got, expected))
