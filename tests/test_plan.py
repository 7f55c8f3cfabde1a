"""The plan stage (tvmrnn.plan): every decision made from the ONNX graph before any Relax is emitted, and compile
emitting exactly what it says."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import tvm

import tvmrnn
import tvmrnn.plan
from onnx_cases import Case
from schedules import Device
from tvmrnn import bench
from tvmrnn.plan import IN_THE_STEP, PlanOptions, plan_model
from tvmrnn.runtime import kernel_device

SM90A = tvm.target.Target({"kind": "cuda", "arch": "sm_90a"})
STACK = bench.Row("stack", "LSTM", 6, 1, 32, 64, layers=2)  # small enough for one wavefront kernel at batch 1


def _stack_model():
    return bench.onnx_model(bench.torch_module(STACK), STACK)


def test_stacked_layers_are_planned_as_one_wavefront_kernel_where_the_batch_is_bounded():
    plan = plan_model(_stack_model(), SM90A, PlanOptions(max_dims={"seq": 6, "batch": 1}))
    first, above = plan.layers
    (chain,) = plan.chains
    assert chain.kernel is not None and chain.layers == (0, 1) and first.stack is chain and above.stack is None
    assert [b.config.kind for layer in plan.layers for b in layer.kernel.branches] == ["wavefront", "wavefront"]
    assert first.projection is not None and above.projection is None and above.kernel.projection == IN_THE_STEP
    assert first.graph_inputs == {"X": "X"} and above.graph_inputs == {}
    assert plan.graph.bounds == {"seq": 6, "batch": 1}

    unbounded = plan_model(_stack_model(), SM90A)
    assert unbounded.chains[0].kernel is None and "batch unbounded" in unbounded.chains[0].describe()
    assert unbounded.graph.bounds is None and all(layer.stack is None for layer in unbounded.layers)


def test_a_stack_of_layers_that_run_cluster_alone_is_one_wavefront_kernel():
    """A layer of H 512 alone runs the cluster kernel at batch 1 (persistent above); stacked, the layers run as one
    wavefront kernel: one step of all layers a barrier, not a cluster kernel per layer."""
    row = bench.Row("stack-h512", "LSTM", 6, 1, 512, 512, layers=2)
    plan = plan_model(bench.onnx_model(bench.torch_module(row), row), SM90A, PlanOptions(max_dims={"seq": 6, "batch": 4}))
    (chain,) = plan.chains
    assert chain.kernel is not None, chain.describe()
    assert [b.config.kind for layer in plan.layers for b in layer.kernel.branches] == ["wavefront", "wavefront"]
    alone = plan_model(Case(hidden=512, input_size=512).model(), SM90A, PlanOptions(max_dims={"seq": 6, "batch": 4}))
    assert alone.layers[0].kernel.branch_at(1).config.kind == "cluster"


def test_storage_dtype_and_projection_are_planned_per_layer():
    plan = plan_model(Case(op="GRU", hidden=32, input_size=16).model(), SM90A, PlanOptions(storage="float16"))
    (layer,) = plan.layers
    assert layer.converts and layer.spec.dtype == "float16" and layer.projection.xw_dtype == "float16"
    assert layer.kernel.projection == layer.projection.label and layer.projection.label.endswith("XW in float16")


def test_inspect_plans_what_it_can_and_lists_the_rest():
    bad = Case(op="LSTM", clip=-1.0).model()
    with pytest.raises(tvmrnn.UnsupportedModelError, match="clip"):
        plan_model(bad, SM90A)
    plan = plan_model(bad, SM90A, refuse=False)
    assert plan.layers == () and "clip" in plan.refused[0].problem


def test_compile_writes_the_plan_into_the_metadata():
    case = Case(op="LSTM", hidden=16, input_size=8, optional=("B", "sequence_lens", "initial_h"))
    module = tvmrnn.compile(case.model(), target="llvm", logs=False)
    plan = plan_model(case.model(), tvm.target.Target(module.metadata["target"]))
    (meta,), (layer,) = module.metadata["layers"], plan.layers
    assert meta["kernel"] == layer.kernel.describe() and meta["projection"] == layer.projection.label
    assert meta["schedule"] == [b.as_dict() for b in layer.kernel.branches]
    assert meta["graph_inputs"] == {"X": "X", "sequence_lens": "sequence_lens"}
    assert dataclasses.asdict(layer.spec)["hidden_size"] == meta["hidden_size"] == 16


def test_bad_options_are_refused_by_name():
    with pytest.raises(tvmrnn.UnsupportedModelError, match="kernel='fast' is not supported"):
        PlanOptions(kernel="fast")
    with pytest.raises(tvmrnn.UnsupportedModelError, match="dtype='int8' is not supported"):
        PlanOptions(storage="int8")


def test_the_plan_is_made_for_the_device_kernel_device_gives(monkeypatch):
    """The plan carries the Device its kernels are sized for (tvmrnn.runtime.kernel_device, which emission builds for
    too): a part with fewer SMs than the arch's flagship gets persistent grids it can launch (batch 2 at H768: batch 1
    runs a grid of clusters, and clusters side by side take batch 2 only to H512)."""
    model = Case(hidden=768).model()  # R over one block's share (recurrent_persistent.ONE_BLOCK_MAX_R_BYTES)
    assert plan_model(model, SM90A).device == kernel_device(SM90A)
    monkeypatch.setattr(tvmrnn.plan, "kernel_device", lambda target: Device.cuda("sm_90a", sm_count=114))
    plan = plan_model(model, SM90A)
    assert plan.device.sm_count == 114 and plan.layers[0].kernel.branch_at(2).config["blocks"] == 114


def test_a_fixed_batch_builds_only_the_cpu_kernel_branch_that_runs_it():
    """The CPU plan has a branch per batch bucket (1, 2, 3, above); with the batch fixed (input_shapes) the kernel is
    built for that batch alone, without the dispatch, and computes what the symbolic one does. A branch whose batches
    are all too small for the thread pool builds no parallel copy of its time loop."""
    from tvmrnn.frontend import load_onnx, to_relax

    case = Case(op="GRU", hidden=16, input_size=8, optional=("B", "initial_h"))
    target = tvm.target.Target("llvm")
    kernels = {}
    for shapes in (None, {"batch": 2}):
        model = load_onnx(case.model(), shapes)
        plan = plan_model(model, target)
        assert [b.up_to for b in plan.layers[0].kernel.branches] == [1, 2, 3, None]
        mod = to_relax(model, plan).mod
        kernels[bool(shapes)] = next(f for gv, f in mod.functions_items() if gv.name_hint.startswith("rnn_"))
    assert "batch <=" in kernels[False].script() and "batch" not in kernels[True].script()
    # a step of GRU(16) pays for the pool only at a large batch: only the last branch, any batch from 4, builds a
    # parallel copy of the time loop beside the serial one
    assert kernels[False].script().count("pragma_parallel_launch_point") == 1
    feeds = case.feeds(np.random.default_rng(0), 5, 2)
    fixed = tvmrnn.compile(case.model(), target="llvm", logs=False, input_shapes={"batch": 2}).run(feeds)
    for name, want in case.reference(feeds).items():
        assert np.abs(fixed[name] - want).max() < 1e-5


def test_stacked_layers_of_one_shape_share_their_cpu_kernel():
    """A kernel reads XW, not X: two stacked LSTM(64) layers (inputs 32 and 64) run one function, compiled once."""
    from tvmrnn.frontend import to_relax

    model = _stack_model()
    mod = to_relax(model, plan_model(model, tvm.target.Target("llvm"))).mod
    assert [gv.name_hint for gv, _ in mod.functions_items() if gv.name_hint.startswith("rnn_")] == ["rnn_lstm0"]
