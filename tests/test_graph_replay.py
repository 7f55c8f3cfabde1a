"""run()'s whole-call graphs (tvmrnn.graph_replay) on the CPU, with the driver's calls stood in for: a captured "graph"
replays the calls the whole-call function made while capturing. What is checked is the bookkeeping around the driver:
a capture per input signature, replays after it, the first replay checked against the VM's own run, eviction past
MAX_GRAPHS, and the VM's path wherever a capture fails or its replay differs."""

from __future__ import annotations

import numpy as np
import pytest
import tvm

from tvmrnn import graph_replay


class _Driver:
    """cuda-bindings' driver calls graph_replay makes, on the CPU: a graph is the list of calls recorded in capture."""

    class CUresult:
        CUDA_SUCCESS = 0

    class CUstream_flags:
        CU_STREAM_DEFAULT = 0

    class CUstreamCaptureMode:
        CU_STREAM_CAPTURE_MODE_RELAXED = 1

    def __init__(self):
        self.recording, self.launches = None, 0

    def cuStreamCreate(self, _flags):
        return 0, 7

    def cuStreamBeginCapture(self, _stream, _mode):
        self.recording = []
        return (0,)

    def cuStreamEndCapture(self, _stream):
        graph, self.recording = self.recording, None
        return 0, graph

    def cuGraphInstantiate(self, graph, _flags):
        return 0, list(graph)

    def cuGraphLaunch(self, exe, _stream):
        self.launches += 1
        for call in exe:
            call()
        return (0,)

    def cuStreamSynchronize(self, _stream):
        return (0,)

    def cuGraphDestroy(self, _graph):
        return (0,)

    cuGraphExecDestroy = cuStreamDestroy = cuGraphDestroy


class _Host:
    """HostBuffers as the runtime has them on a GPU: an array kept per (name, shape, dtype), and its "device" view."""

    def __init__(self):
        self.arrays = {}

    def __call__(self, name, shape, dtype):
        return self.arrays.setdefault((name, tuple(shape), np.dtype(dtype).str), np.zeros(shape, dtype))

    on_device = __call__


class _Model:
    """y = 2x + 1 through the VM (fallback) and as a whole call that writes y in place; `wrong` records a capture
    that leaves out the +1, `refuse` one that raises while capturing."""

    def __init__(self, driver, wrong=False, refuse=False):
        self.driver, self.wrong, self.refuse, self.vm_runs = driver, wrong, refuse, 0

    def fallback(self, arrays):
        self.vm_runs += 1
        return [2 * arrays[0] + 1]

    def whole(self, x, y, _buffers):
        capturing = self.driver.recording is not None
        if capturing and self.refuse:
            raise RuntimeError("a kernel the driver refuses in a graph")
        call = (lambda: np.copyto(y, 2 * x)) if capturing and self.wrong else (lambda: np.copyto(y, 2 * x + 1))
        self.driver.recording.append(call) if capturing else call()
        return ()


def _graphs(monkeypatch, **model_options):
    driver = _Driver()
    monkeypatch.setattr(graph_replay, "_driver", lambda: driver)
    model = _Model(driver, **model_options)
    graphs = graph_replay.WholeCallGraphs(model.whole, lambda: ("planned",), tvm.cpu(0), ["x"], ["y"], _Host(), _Host(),
                                          model.fallback)
    return graphs, model, driver


def _x(shape, seed):
    return np.random.default_rng(seed).standard_normal(shape).astype("float32")


def test_each_signature_is_captured_once_then_replayed(monkeypatch):
    graphs, model, driver = _graphs(monkeypatch)
    phases = {}
    for seed, shape in enumerate([(2, 3), (2, 3), (4, 3), (2, 3), (4, 3)]):
        x = _x(shape, seed)
        np.testing.assert_array_equal(graphs.run([x], phases)[0], 2 * x + 1)
    assert model.vm_runs == 2  # one VM run a new signature: the outputs' shapes and the check of the first replay
    assert driver.launches == 5 and set(phases) == {"input", "infer", "output"}


def test_signatures_past_max_graphs_are_captured_again(monkeypatch):
    graphs, model, _ = _graphs(monkeypatch)
    monkeypatch.setattr(graph_replay, "MAX_GRAPHS", 2)
    for seed, rows in enumerate([1, 2, 3, 1, 3]):
        x = _x((rows, 5), seed)
        np.testing.assert_array_equal(graphs.run([x], {})[0], 2 * x + 1)
    assert model.vm_runs == 4  # 1, 2, 3 captured; 1 evicted by 3 and captured again; 3 still kept


@pytest.mark.parametrize("options", [{"wrong": True}, {"refuse": True}], ids=["replay-differs", "capture-refused"])
def test_a_signature_whose_graph_is_not_right_runs_through_the_vm(monkeypatch, options):
    """Every answer right: the first from the VM's run, the rest through the VM for that signature from then on."""
    graphs, model, driver = _graphs(monkeypatch, **options)
    for seed in range(3):
        x = _x((2, 3), seed)
        np.testing.assert_array_equal(graphs.run([x], {})[0], 2 * x + 1)
    assert model.vm_runs == 3 and driver.launches == (1 if options.get("wrong") else 0)


def test_an_input_assembled_in_the_graphs_own_array_is_read_in_place(monkeypatch):
    """The server assembles a batch in the module's page-locked input array; the replay reads it there."""
    graphs, _, _ = _graphs(monkeypatch)
    x = _x((2, 3), 0)
    graphs.run([x], {})
    host = graphs._host_inputs("x", x.shape, x.dtype)
    host[...] = _x((2, 3), 1)
    np.testing.assert_array_equal(graphs.run([host], {})[0], 2 * host + 1)
