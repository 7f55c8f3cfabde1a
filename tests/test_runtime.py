"""The runtime's process setup: TVM's CPU thread pool gets one thread per usable physical core unless the user says."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import psutil
import pytest

PROBE = "import os, tvmrnn.runtime; print(os.environ.get({name!r}))"
USER_SETTINGS = ("TVM_NUM_THREADS", "OMP_NUM_THREADS", "TVM_THREAD_POOL_SPIN_COUNT")


def _setting_after_import(name, **env_extra) -> str:
    env = {k: v for k, v in os.environ.items() if k not in USER_SETTINGS}
    env.update(env_extra)
    out = subprocess.run([sys.executable, "-c", PROBE.format(name=name)], env=env, capture_output=True, text=True,
                         check=True)
    return out.stdout.strip().splitlines()[-1]


def _threads_after_import(**env_extra) -> str:
    return _setting_after_import("TVM_NUM_THREADS", **env_extra)


def test_thread_pool_uses_every_physical_core():
    usable = len(os.sched_getaffinity(0))
    assert _threads_after_import() == str(min(usable, psutil.cpu_count(logical=False) or usable))


def test_user_thread_settings_win():
    assert _threads_after_import(OMP_NUM_THREADS="1") == "None"
    assert _threads_after_import(TVM_NUM_THREADS="3") == "3"


def test_idle_pool_workers_sleep_unless_the_user_says():
    """TVM's idle workers sleep at once (a spin count of 0) rather than spin on sched_yield; the user's count wins."""
    assert _setting_after_import("TVM_THREAD_POOL_SPIN_COUNT") == "0"
    assert _setting_after_import("TVM_THREAD_POOL_SPIN_COUNT", TVM_THREAD_POOL_SPIN_COUNT="300000") == "300000"


def test_module_records_its_cooperative_grid_and_a_smaller_gpu_is_refused_by_name():
    """A CUDA module says how many co-resident blocks its persistent kernels launch (one per SM); loading it on a GPU
    with fewer SMs (an H100 PCIe has 114, the SXM 132) is a clear error, not CUDA's failed launch at the first call."""
    import pytest

    from onnx_cases import Case
    import tvmrnn
    from tvmrnn.runtime import check_grid_fits

    model = Case(op="LSTM", hidden=1024, input_size=16).model()  # fp32: persistent at batch 2-4 (fp16 polls on 128 blocks)
    meta = tvmrnn.compile(model, target="nvidia/nvidia-h100", logs=False).metadata
    assert meta["layers"][0]["cooperative_blocks"] == 132  # persistent: one block per SM of the H100 SXM
    check_grid_fits(meta, 132, "H100 SXM")
    with pytest.raises(tvmrnn.UnsupportedModelError, match="132 co-resident blocks, and this GPU \\(H100 PCIe\\) has 114 SMs"):
        check_grid_fits(meta, 114, "H100 PCIe")
    stepwise = tvmrnn.compile(model, target="nvidia/nvidia-h100", logs=False, kernel="stepwise").metadata
    assert stepwise["layers"][0]["cooperative_blocks"] == 0
    check_grid_fits(stepwise, 8, "a small GPU")


def test_local_gpu_sm_count_sizes_the_persistent_grids(monkeypatch):
    """Compiling for the local GPU sizes persistent grids to its SM count (runtime.kernel_device): with 114 SMs an
    H=1024 fp32 layer's persistent kernel takes 114 blocks, and persistent_mma (128 blocks of 8 units) no longer fits a
    wave. A GPU of another arch leaves the target's flagship count; CPU kernels split work for the runtime's pool."""
    import tvm

    from onnx_cases import Case
    from schedules import plan_kernel
    from schedules.cells import cell_for
    from tvmrnn import runtime

    spec = Case(op="LSTM", hidden=1024, input_size=16).spec()
    target = tvm.target.Target({"kind": "cuda", "arch": "sm_90"})
    monkeypatch.setattr(runtime, "local_sm_count", lambda arch: 114 if arch == "sm_90" else None)
    plan = plan_kernel(spec, cell_for(spec), target, device=runtime.kernel_device(target))
    assert [b.config.kind for b in plan.branches] == ["persistent", "stepwise", "tiled"], plan.describe()
    assert plan.branches[0].config["blocks"] == 114
    assert runtime.kernel_device(tvm.target.Target({"kind": "cuda", "arch": "sm_80"})).sm_count == 108
    monkeypatch.setenv("TVM_NUM_THREADS", "3")
    assert runtime.kernel_device(tvm.target.Target("llvm")).cpu_threads == 3


def _lstm_with_pass_through():
    """An LSTM whose graph also returns its input X unchanged (Identity): the VM's output is then the input tensor."""
    import onnx
    from onnx import TensorProto, helper

    rng = np.random.default_rng(0)
    hidden, size = 8, 5
    weights = [helper.make_tensor(n, TensorProto.FLOAT, s, rng.standard_normal(s).astype(np.float32).ravel())
               for n, s in (("W", [1, 4 * hidden, size]), ("R", [1, 4 * hidden, hidden]))]
    nodes = [helper.make_node("LSTM", ["X", "W", "R"], ["Y"], hidden_size=hidden), helper.make_node("Identity", ["X"], ["Xout"])]
    graph = helper.make_graph(nodes, "pass_through", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [6, 2, size])],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [6, 1, 2, hidden]),
                               helper.make_tensor_value_info("Xout", TensorProto.FLOAT, [6, 2, size])], weights)
    return onnx.helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)], ir_version=9)


def test_cpu_run_outputs_belong_to_the_caller():
    """run() stages inputs in reused buffers and hands outputs over without a copy: a later call must not change an
    earlier call's outputs, a passed-through input included, and results match ONNX Runtime."""
    import onnxruntime as ort

    import tvmrnn

    model = _lstm_with_pass_through()
    module = tvmrnn.compile(model, target="llvm", logs=False)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(1)
    feeds = [{"X": rng.standard_normal((6, 2, 5)).astype(np.float32)} for _ in range(3)]
    results = [module.run(f) for f in feeds]
    for feed, got in zip(feeds, results):
        y, x_out = sess.run(None, feed)
        np.testing.assert_allclose(got["Y"], y, rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(got["Xout"], feed["X"])
    assert not np.shares_memory(results[0]["Y"], results[1]["Y"])


@pytest.mark.gpu
@pytest.mark.parametrize("cuda_graph", [None, False])
def test_cuda_run_reuses_its_buffers_and_answers_each_call(cuda_graph):
    """run() on a GPU goes through page-locked host arrays kept per shape. With a CUDA graph (the model is static) the
    module's copy-in kernel reads the inputs there and one launch writes the outputs there: no device tensor is staged.
    Without one, inputs are copied into device tensors kept per shape. Either way the outputs are copies the caller owns
    (a later call leaves them alone), and every call's outputs match ONNX Runtime, the input passed through included."""
    import onnxruntime as ort

    import tvmrnn

    model = _lstm_with_pass_through()
    module = tvmrnn.compile(model, target="cuda", logs=False, cuda_graph=cuda_graph)
    assert (module._outputs_to_host is not None) == (cuda_graph is None)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(2)
    feeds = [{"X": rng.standard_normal((6, 2, 5)).astype(np.float32)} for _ in range(3)]
    results = []
    for feed in feeds:
        results.append(module.run(feed))
        assert module.host_inputs._pinned, "no page-locked host memory on this GPU host"
    for feed, got in zip(feeds, results):
        np.testing.assert_allclose(got["Y"], sess.run(None, feed)[0], rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(got["Xout"], feed["X"])
    assert not np.shares_memory(results[0]["Y"], results[1]["Y"])
    assert [shape for _, shape, _ in module._staged] == ([] if cuda_graph is None else [(6, 2, 5)])
