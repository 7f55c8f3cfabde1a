"""A small stack in one block (schedules.recurrent_block_stack): streaming stacks whose layers carry state, as torch's
legacy exporter writes them (one state input sliced per layer), are found with their states, planned as one kernel
that projects every layer's input itself, built through NVRTC, and on a GPU match ONNX Runtime."""

from __future__ import annotations

import io
import re
import warnings

import numpy as np
import onnx
import pytest

import tvmrnn
from compiled import cuda_sources
from tvmrnn.frontend import load_onnx
from tvmrnn.frontend.stacks import find_chains
from tvmrnn.plan import IN_THE_STEP

SEQ, FEATURES = 10, 12


def _streaming_stack(op: str, layers: int, hidden: int, seed: int = 0, features: int = FEATURES, seq: int = SEQ,
                     **options) -> onnx.ModelProto:
    """torch's nn.RNN/LSTM/GRU with its states as inputs and outputs, through the legacy exporter (batch symbolic)."""
    import torch

    torch.manual_seed(seed)
    net = getattr(torch.nn, op)(features, hidden, num_layers=layers, **options)
    names = ["h0", "c0"] if op == "LSTM" else ["h0"]

    class Streaming(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.net = net

        def forward(self, x, *states):
            y, out = self.net(x, tuple(states) if op == "LSTM" else states[0])
            return (y, *out) if op == "LSTM" else (y, out)

    x = torch.randn(seq, 1, features)
    states = [torch.zeros(layers, 1, hidden) for _ in names]
    outs = ["y"] + [n.replace("0", "n") for n in names]
    axes = {n: {1: "batch"} for n in ["x", *names, *outs]}
    buffer = io.BytesIO()
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(Streaming(), (x, *states), buffer, input_names=["x", *names], output_names=outs,
                          dynamic_axes=axes, opset_version=17, dynamo=False)
    return onnx.load_from_string(buffer.getvalue())


def _kinds(module) -> list[str]:
    return [layer["schedule"][0]["config"]["kind"] for layer in module.metadata["layers"]]


def test_carried_states_join_the_chain_and_their_slices_move_before_it():
    model = _streaming_stack("RNN", 3, 25)
    members = find_chains(model)[0]
    assert [sorted(m.states) for m in members] == [["initial_h"], ["initial_h"]]  # slices of h0, not zeros
    prepared = load_onnx(model)
    ops = [n.op_type for n in prepared.graph.node]
    first = ops.index("RNN")
    assert all(ops.index(o) < first for o in ops if o == "Slice") and ops.count("Slice") == 3


@pytest.mark.parametrize("options", [{}, {"nonlinearity": "relu"}])
def test_a_small_rnn_stack_at_batch_one_is_one_block(options):
    """Every layer's input projection inside the kernel: no GEMM before it; the stack's line says how it runs."""
    module = tvmrnn.compile(_streaming_stack("RNN", 3, 16, **options), target="cuda", max_dims={"batch": 1}, logs=False)
    assert _kinds(module) == ["block_stack"] * 3
    assert module.metadata["stacks"][0].split(": ", 1)[1].startswith("block stack: ")
    assert {layer["projection"] for layer in module.metadata["layers"]} == {IN_THE_STEP}
    text = module.executable.as_text()
    assert "rnn_stack_" in text and "matmul" not in text.split("@main_cuda_graph_capture")[1].split("\n\n")[0]


def test_a_carried_state_is_read_and_written_whole():
    """torch's exporter slices h0 per layer and concatenates the layers' final h: the block stack takes h0 and writes
    hn whole (frontend.stacks.joined_states, StackKernel.joined_states), so the call runs the copy in, the stack and
    the copy out, no slice or concatenation kernels."""
    from tvmrnn.runtime import WHOLE_CALL

    model = _streaming_stack("RNN", 3, 25)
    module = tvmrnn.compile(model, target="cuda", max_dims={"batch": 1}, logs=False)
    text = module.executable.as_text()
    body = text[text.index(f"@{WHOLE_CALL}:"):].split("\n\n", 1)[0].splitlines()
    kernels = [line.split()[1] for line in body if line.strip().startswith("call") and "builtin" not in line
               and "shape_func" not in line]
    assert [k.split("_")[0] for k in kernels] == ["copy", "rnn", "copy"], kernels
    (stack,) = [line for line in body if "rnn_stack_" in line]
    assert len(stack.split("in: ")[1].split(",")) == 1 + 1 + 3 * 2 + 3 + 1  # X, h0, WR and bias a layer, Y a layer, hn
    assert _kinds(tvmrnn.compile(_streaming_stack("LSTM", 2, 16), target="cuda", max_dims={"batch": 1}, logs=False)) \
        == ["wavefront"] * 2  # (an LSTM's states stay per layer: the wavefront takes them so)


@pytest.mark.parametrize("op, layers, hidden, batch", [("RNN", 3, 40, 4), ("RNN", 2, 120, 1), ("LSTM", 2, 16, 1), ("GRU", 2, 16, 1)])
def test_other_stacks_keep_the_wavefront(op, layers, hidden, batch):
    """Past MAX_STEP_ELEMENTS of weights a step for one SM (more rows, more units), and LSTM and GRU stacks (slower in
    one block at every size measured), the wavefront runs."""
    model = _streaming_stack(op, layers, hidden)
    assert _kinds(tvmrnn.compile(model, target="cuda", max_dims={"batch": batch}, logs=False)) == ["wavefront"] * layers


def _kernel(src: str, threads: int) -> str:
    (kernel,) = set(re.findall(rf"__launch_bounds__\({threads}, 1\) rnn_stack_\w+\([^)]*\) \{{\n.*?\n\}}\n", src, re.S))
    return kernel


def _one_barrier_a_step(kernel: str):
    """A barrier after the start's loads and one at the end of each step, neither inside a condition (TVM's planner
    sees none of the step's shared stores); the start's loads unrolled, issued together."""
    barriers = [line for line in kernel.splitlines() if "__syncthreads()" in line]
    # the kernel's body is indented 2 spaces, the steps' loop body 4: neither barrier sits in a branch or the row loop
    assert barriers == ["  __syncthreads();", "    __syncthreads();"], barriers
    assert "for (" not in kernel[:kernel.index("__syncthreads()")]


def test_a_block_stack_step_has_one_barrier_a_lane_a_unit_and_its_sm_to_itself():
    """NVRTC and ptxas for sm_90a (madmom's onset stack: 236 features, three layers of 25 units): a lane computes a
    whole unit (one warp a layer, no shuffle in the step), the block's 5 other warps project layer 0's input a step
    ahead, its index arithmetic in the step 32-bit; one block an SM in the launch bounds, so ptxas takes the
    registers it needs and spills nothing."""
    from schedules.ptxas import ptxas

    module = tvmrnn.compile(_streaming_stack("RNN", 3, 25, features=236), target="cuda", max_dims={"batch": 1}, logs=False)
    assert _kinds(module) == ["block_stack"] * 3
    assert ("(1+1+1 warps, a lane a unit, layer 0's input projected a step ahead by 5 warps, 8 warps in all)"
            in module.metadata["stacks"][0])
    src = cuda_sources(module)
    kernel = _kernel(src, 256)
    _one_barrier_a_step(kernel)
    step = kernel[kernel.index("__syncthreads()"):kernel.rindex("__syncthreads()")]
    assert "shfl" not in step and "warp_reduce" not in step
    # the dot products, float4 loads of W and of x or h at constant offsets: 59 of X[t + 1] by the 5 projecting warps
    # (12 a warp, 11 the last), 6 of h by layer 0, 6 + 6 by layers 1 and 2
    assert step.count("*(float4*)(_ptr") == 2 * (59 + 6 + 2 * (6 + 6))
    loads = [re.sub(r"\(int\)\(\(int64_t\)threadIdx\.[xy]\)", "", line)  # but the thread index's cast
             for line in step.splitlines() if "float4" in line]
    assert not [line for line in loads if "int64_t" in line]  # 32-bit addresses
    report = ptxas(src, "sm_90a")
    assert report.spill_stores == 0 and report.registers <= 65536 // 256, report.describe()


@pytest.mark.parametrize("layers, hidden, features, projectors", [(2, 40, 12, 0), (4, 12, 13, 0), (3, 64, 12, 0),
                                                                   (2, 16, 50, 6)])
def test_lane_steps_of_other_shapes_spill_nothing(layers, hidden, features, projectors, monkeypatch):
    """Two warps a layer (40 and 64 units), widths 4 does not divide (13 and 50 features, 12 units), the block's 8
    warps, and 50 features projected a step ahead by 6 warps (2 float4s each, the last with the 2 columns after)."""
    from schedules import recurrent_block_stack as block_stack
    from schedules.ptxas import ptxas

    monkeypatch.setattr(block_stack, "MAX_STEP_ELEMENTS", 1 << 30)  # 3x64 reads more than the block stack's default
    module = tvmrnn.compile(_streaming_stack("RNN", layers, hidden, features=features), target="cuda",
                            max_dims={"batch": 1}, logs=False)
    warps = -(-hidden // 32)
    ahead = f", layer 0's input projected a step ahead by {projectors} warps" if projectors else ""
    assert f"({'+'.join([str(warps)] * layers)} warps, a lane a unit{ahead}, 8 warps in all)" in module.metadata["stacks"][0]
    src = cuda_sources(module)
    threads = 32 * max(8, warps * layers)
    _one_barrier_a_step(_kernel(src, threads))
    report = ptxas(src, "sm_90a")
    assert report.spill_stores == 0 and report.registers <= 65536 // threads, report.describe()


def test_past_a_few_warps_a_layer_the_warps_share_units(monkeypatch):
    """warp_gates' step where a layer's units would take more than LANE_WARPS warps: lanes split K, shuffles sum."""
    from schedules import recurrent_block_stack as block_stack
    from schedules.ptxas import ptxas

    monkeypatch.setattr(block_stack, "LANE_WARPS", 0)
    module = tvmrnn.compile(_streaming_stack("RNN", 3, 25, features=236), target="cuda", max_dims={"batch": 1}, logs=False)
    assert "(9+9+9 warps of 3 units)" in module.metadata["stacks"][0]
    src = cuda_sources(module)
    kernel = _kernel(src, 864)
    _one_barrier_a_step(kernel)
    assert "warp_reduce" in kernel
    report = ptxas(src, "sm_90a")
    assert report.spill_stores == 0 and report.registers <= 72, report.describe()


@pytest.mark.gpu
@pytest.mark.parametrize("layers, hidden, features, batch, seq, options", [
    (3, 25, FEATURES, 1, SEQ, {}), (3, 25, FEATURES, 2, SEQ, {}), (2, 40, FEATURES, 1, SEQ, {"nonlinearity": "relu"}),
    (4, 12, FEATURES, 3, SEQ, {}),
    (3, 25, 236, 1, SEQ, {}), (3, 25, 236, 1, 1, {}),  # madmom's onset stack; one step
    (3, 12, 236, 4, SEQ, {}), (2, 16, 13, 3, 1, {}), (2, 16, 13, 2, SEQ, {"nonlinearity": "relu"}),
    (3, 16, 12, 4, SEQ, {}),  # float4 loads of x and h (4 divides every width)
    (2, 16, 50, 3, SEQ, {}),  # layer 0's input projected a step ahead (also at 236 features), 2 columns past float4s
    (2, 40, 13, 2, SEQ, {"warps": True}), (3, 25, 236, 1, SEQ, {"warps": True}),  # warp_gates' step
])
def test_block_stack_matches_onnxruntime_with_states_carried(layers, hidden, features, batch, seq, options, monkeypatch):
    """Three chunks streamed with the states carried, each against ONNX Runtime on the exported graph: rows 1-4, one
    step and ten, input widths that 4 does and does not divide; a lane a unit, and (warps) warp_gates' step."""
    import onnxruntime as ort
    from schedules import recurrent_block_stack as block_stack

    options = dict(options)
    lanes = not options.pop("warps", False)
    if not lanes:
        monkeypatch.setattr(block_stack, "LANE_WARPS", 0)
    model = _streaming_stack("RNN", layers, hidden, seed=layers + hidden, features=features, seq=seq, **options)
    module = tvmrnn.compile(model, target="cuda", max_dims={"batch": batch}, logs=False)
    assert _kinds(module) == ["block_stack"] * layers
    assert {layer["schedule"][0]["config"].get("lanes", 0) for layer in module.metadata["layers"]} == {int(lanes)}
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(hidden + features + seq)
    states = {"h0": 0.5 * rng.standard_normal((layers, batch, hidden)).astype(np.float32)}
    for _ in range(3):
        feeds = {"x": rng.standard_normal((seq, batch, features)).astype(np.float32), **states}
        want, got = sess.run(None, feeds), module.run(feeds)
        for name, w in zip(module.output_names, want):
            np.testing.assert_allclose(got[name], w, rtol=1e-5, atol=1e-6, err_msg=name)
        states = {"h0": got["hn"]}


def test_inspect_says_which_batch_bounds_run_a_block_stack(tmp_path):
    from tvmrnn.interface.inspect import inspect_command

    onnx.save(_streaming_stack("RNN", 3, 40), tmp_path / "rnn.onnx")  # 8,480 weights a row: one row fits, four do not
    lines = []
    inspect_command(str(tmp_path / "rnn.onnx"), echo=lines.append, target="cuda")
    (stack,) = [line for line in lines if line.startswith("  stack ")]
    block, wavefront, tensor_cores = stack.split("; ")
    assert block.split(": ", 1)[1].startswith("one block stack: 3 stacked layers") and block.endswith("N <= 1)")
    assert wavefront.startswith("one wavefront: 3 stacked layers") and wavefront.endswith("N <= 4)")
    assert tensor_cores.startswith("one tensor-core wavefront: 3 stacked layers") and tensor_cores.endswith("16 <= N <= 544)")  # 3 x 5 blocks a 32-row tile
