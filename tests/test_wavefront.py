"""Stacked layers as one wavefront kernel (schedules.recurrent_wavefront, tvmrnn.frontend.stacks): which chains the
import finds and when it runs them as one kernel, the split of the SMs, and on a GPU every layer's outputs against the
float64 reference, with the CUDA graph and without."""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnx_cases import ONNX_DTYPE, Case
from reference import rnn_reference
from schedules import recurrent_wavefront as wavefront
from schedules.cells import cell_for
from schedules.device import Device
from schedules.layer import Activation, RNNLayerSpec
import tvmrnn
from tvmrnn.frontend.stacks import find_chains
from tvmrnn.plan import IN_THE_STEP

SIGMOID_TANH = (Activation("Sigmoid"), Activation("Tanh"), Activation("Tanh"))


def stack_model(cases: list[Case], glue: str = "squeeze", opset: int = 14) -> onnx.ModelProto:
    """The cases as stacked nodes, each one's Y glued to the next one's X as exporters do; the first node's optional
    inputs (initial states) are graph inputs, the others' weights initializers. Outputs: the last Y and every node's
    Y_h (and Y_c), named L{i}_Y_h ..."""
    elem = ONNX_DTYPE[cases[0].dtype]
    nodes, inits, x = [], [], "X"
    inputs = [helper.make_tensor_value_info("X", elem, ["seq", "batch", cases[0].input_size])]
    outputs = []
    inits.append(numpy_helper.from_array(np.array([1], np.int64), "axis1"))
    inits.append(numpy_helper.from_array(np.array([0, 0, -1], np.int64), "flatten"))
    for i, case in enumerate(cases):
        names = []
        for n in case.input_names:
            if n in case.weights():
                names.append(f"L{i}_{n}")
                inits.append(numpy_helper.from_array(case.weights()[n], f"L{i}_{n}"))
            elif n in ("initial_h", "initial_c"):
                names.append(f"L{i}_{n}")
                inputs.append(helper.make_tensor_value_info(f"L{i}_{n}", elem, case._shape(n)))
            elif n == "sequence_lens":  # one lengths input, read by every node that takes lengths
                names.append("lengths")
                if all(v.name != "lengths" for v in inputs):
                    inputs.append(helper.make_tensor_value_info("lengths", TensorProto.INT32, ["batch"]))
            else:
                names.append(x if n == "X" else n)
        outs = [f"L{i}_{o}" for o in case.output_names]
        nodes.append(helper.make_node(case.op, names, outs, name=f"layer{i}", **case.attrs()))
        outputs += [helper.make_tensor_value_info(o, elem, None) for o in outs[1:]]
        if i + 1 < len(cases):
            x = f"L{i}_X_next"
            if glue == "squeeze":
                nodes.append(helper.make_node("Squeeze", [outs[0], "axis1"], [x]))
            else:
                nodes.append(helper.make_node("Transpose", [outs[0]], [f"L{i}_Yt"], perm=[0, 2, 1, 3]))
                nodes.append(helper.make_node("Reshape", [f"L{i}_Yt", "flatten"], [x]))
    outputs.insert(0, helper.make_tensor_value_info(f"L{len(cases) - 1}_Y", elem, None))
    graph = helper.make_graph(nodes, "stack", inputs, outputs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)


def stack_reference(cases: list[Case], feeds: dict) -> dict:
    """float64, layer by layer: each output of stack_model by name."""
    out, x = {}, feeds["X"].astype("float64")
    for i, case in enumerate(cases):
        w = {k: v.astype("float64") for k, v in case.weights().items()}
        states = {n: feeds[f"L{i}_{n}"].astype("float64") for n in ("initial_h", "initial_c") if f"L{i}_{n}" in feeds}
        lengths = feeds.get("lengths") if "sequence_lens" in case.optional else None
        res = rnn_reference(case.op, X=x, W=w["W"], R=w["R"], B=w.get("B"), sequence_lens=lengths, P=w.get("P"),
                            initial_h=states.get("initial_h"), initial_c=states.get("initial_c"), **case.attrs())
        out.update({f"L{i}_{o}": r for o, r in zip(case.output_names, res)})
        x = res[0][:, 0]
    return out


def lstm_stack(layers=2, hidden=48, input_size=20, sizes=None, **first):
    """LSTM layers, hidden units each (or sizes[i] for layer i); the first may take options of its own (optional
    inputs, clip, ...)."""
    sizes = sizes or [hidden] * layers
    base = Case(op="LSTM", optional=("B",), outputs=("Y", "Y_h", "Y_c"))
    head = dataclasses.replace(base, hidden=sizes[0], input_size=input_size, seed=0, **first)
    return [head] + [dataclasses.replace(base, hidden=sizes[i], input_size=sizes[i - 1], seed=i) for i in range(1, len(sizes))]


def _feeds(cases, rng, T, N):
    feeds = {"X": rng.standard_normal((T, N, cases[0].input_size)).astype(cases[0].dtype)}
    if "sequence_lens" in cases[0].optional:
        lengths = rng.integers(1, T + 1, N)
        lengths[rng.integers(N)] = T  # ONNX Runtime sizes Y by the longest row
        feeds["lengths"] = lengths.astype(np.int32)
    for n in ("initial_h", "initial_c"):
        if n in cases[0].optional:
            feeds[f"L0_{n}"] = rng.standard_normal((1, N, cases[0].hidden)).astype(cases[0].dtype)
    return feeds


def _kinds(module) -> list[str]:
    return [layer["schedule"][0]["config"]["kind"] for layer in module.metadata["layers"]]


@pytest.mark.parametrize("glue, opset", [("squeeze", 14), ("squeeze", 11), ("transpose", 14)])
def test_chains_are_found_through_both_exporters_glues(glue, opset):
    cases = lstm_stack(3)
    model = stack_model(cases, glue, opset)
    if opset < 13:  # Squeeze's axes were an attribute
        for node in model.graph.node:
            if node.op_type == "Squeeze":
                node.input.pop()
                node.attribute.append(helper.make_attribute("axes", [1]))
    chains = find_chains(model)
    assert list(chains) == [0] and [m.index for m in chains[0]] == [1, 2]
    assert set(chains[0][0].constants) == {"W", "R", "B"}


def test_layers_reading_the_same_lengths_are_stacked():
    """One lengths input read by every node: a chain (the kernel masks every layer with it); a node above that reads
    none, or lengths of its own, runs alone (its steps past a row's end would differ)."""
    cases = [dataclasses.replace(c, optional=("B", "sequence_lens")) for c in lstm_stack(3)]
    chains = find_chains(stack_model(cases))
    assert [(m.index, m.lengths) for m in chains[0]] == [(1, True), (2, True)]
    module = tvmrnn.compile(stack_model(cases), target="cuda", max_dims={"seq": 50, "batch": 4}, logs=False)
    assert _kinds(module) == ["wavefront"] * 3 and module.metadata["layers"][0]["graph_inputs"] == {"X": "X", "sequence_lens": "lengths"}
    # the first layer's input projection is one GEMM before the kernel; the layers above project inside it
    first, *above = [layer["projection"] for layer in module.metadata["layers"]]
    assert first and first != IN_THE_STEP and above == [IN_THE_STEP] * 2
    cases[2] = dataclasses.replace(cases[2], optional=("B",))
    assert [m.index for m in find_chains(stack_model(cases))[0]] == [1]
    model = stack_model(cases)
    model.graph.node[2].input[4] = "X_lengths"  # layer1 (after layer0 and its Squeeze) with lengths of its own
    assert find_chains(model) == {}


def test_a_node_reading_more_than_constants_is_not_stacked():
    """A node above whose initial state is computed from the chain below runs alone (the chain is one kernel); so does one
    whose X is not the Y below reshaped, or whose weights are not constants. One with states of its own joins."""
    cases = lstm_stack(2)
    cases[1] = dataclasses.replace(cases[1], optional=("B", "initial_h"))
    model = stack_model(cases)
    (member,) = find_chains(model)[0]
    assert member.states == {"initial_h": "L1_initial_h"}
    layer1 = [n for n in model.graph.node if n.op_type == "LSTM"][1]
    layer1.input[5] = "L0_Y_h"  # its state: the layer below's last h
    assert find_chains(model) == {}
    model = stack_model(lstm_stack(2))
    squeeze = next(n for n in model.graph.node if n.op_type == "Squeeze")
    squeeze.input[1] = "flatten"  # axes [0, 0, -1]: not the layer glue
    assert find_chains(model) == {}
    model = stack_model(lstm_stack(2))
    model.graph.input.append(helper.make_tensor_value_info("R1", TensorProto.FLOAT, [1, 192, 48]))
    [n for n in model.graph.node if n.op_type == "LSTM"][1].input[2] = "R1"  # computed weights
    assert find_chains(model) == {}


def _spec(H, In, dtype="float32", op="LSTM"):
    acts = (SIGMOID_TANH if op == "LSTM" else (Activation("Tanh"),),)
    return RNNLayerSpec("l", op, H, In, activations=acts, present=frozenset({"X", "W", "R", "B"}), dtype=dtype)


def test_plan_splits_the_sms_by_work_and_refuses_what_does_not_fit():
    specs = [_spec(512, 512), _spec(512, 512)]
    cells = [cell_for(s) for s in specs]
    cfg = wavefront.plan(specs, cells, Device.cuda("sm_90"))
    # layer 1 reduces over I + H = 1024: one round of 8 units per block each, 128 of the 132 SMs
    assert (cfg.units, cfg.blocks) == ((8, 8), (64, 64))
    for i, (s, c, u) in enumerate(zip(specs, cells, cfg.units)):
        assert u * c.gates * wavefront.reduction(s, i == 0) * 4 <= 227 * 1024
    # two fp32 H=1024 layers hold 48 MB of weights: more than 132 SMs' shared memory
    assert wavefront.plan([_spec(1024, 1024), _spec(1024, 1024)], cells, Device.cuda("sm_90")) is None
    half = [_spec(1024, 1024, "float16"), _spec(1024, 1024, "float16")]
    cfg = wavefront.plan(half, cells, Device.cuda("sm_90"))
    assert cfg.grid <= 132 and all(b * u >= 1024 for b, u in zip(cfg.blocks, cfg.units))


def test_compile_runs_a_bounded_small_batch_stack_as_one_kernel():
    cases = lstm_stack(3)
    module = tvmrnn.compile(stack_model(cases), target="cuda", max_dims={"seq": 50, "batch": 4}, logs=False)
    assert _kinds(module) == ["wavefront"] * 3
    assert module.metadata["stacks"][0].startswith("layer0 -> layer1 -> layer2: wavefront: 3 stacked layers")
    assert {layer["cooperative_blocks"] for layer in module.metadata["layers"]} == {module.metadata["layers"][0]["schedule"][0]["config"]["grid"]}
    text = module.executable.as_text()
    assert "rnn_stack_layer0" in text and "rnn_layer1" not in text
    assert module.metadata["cuda_graph"].startswith("on:")


@pytest.mark.parametrize("change, bounds, why", [
    ({}, {"seq": 50}, "batch unbounded"),
    ({}, {"seq": 50, "batch": 8}, "batch up to 8; LSTM node 'layer0' is exact fp32 (the persistent tensor-core wavefront runs "
     "fp16, bf16 and tf32); the tensor-core wavefront runs batch bounds from 16"),
    ({"dtype": "float16"}, {"seq": 50, "batch": 8}, "LSTM node 'layer0': its sizes are not multiples of 32"),
    ({"hidden": 1024, "input_size": 1024, "dtype": "float16"}, {"seq": 50, "batch": 128},
     "a tensor-core wavefront step would launch 1024 blocks, more than 2 a streaming multiprocessor (132)"),
    ({"op": "GRU", "linear_before_reset": 1}, {"seq": 50, "batch": 64}, "its h gate adds R_h h apart from W_h x"),
    ({"kernel": "persistent"}, {"seq": 50, "batch": 1}, "only kernel='auto' on CUDA"),
    ({"op": "GRU"}, {"seq": 50, "batch": 1}, "GRU cell without linear_before_reset: its h gate needs all of r*h first"),
    ({"hidden": 512, "input_size": 512}, {"seq": 50, "batch": 1}, "each layer runs a grid of clusters at batch 1"),
])
def test_stacks_that_do_not_qualify_run_layer_by_layer_and_say_why(change, bounds, why):
    kernel = change.pop("kernel", "auto")
    cases = [dataclasses.replace(c, **change) for c in lstm_stack(2)]
    module = tvmrnn.compile(stack_model(cases), target="cuda", max_dims=bounds, kernel=kernel, logs=False)
    assert "wavefront" not in _kinds(module)
    assert module.metadata["stacks"][0].startswith("layer0 -> layer1: layer by layer (") and why in module.metadata["stacks"][0]


def test_a_stack_bounded_to_a_larger_batch_runs_the_tensor_core_wavefront_above_batch_4():
    """One kernel: the wavefront at batch 1-4, above it a launch of every layer's mma tiles a step (T+L-1 launches)."""
    cases = _half(lstm_stack(3, hidden=64))
    module = tvmrnn.compile(stack_model(cases), target="cuda", max_dims={"seq": 50, "batch": 64}, logs=False)
    schedules = [[(b["up_to_batch"], b["config"]["kind"]) for b in layer["schedule"]] for layer in module.metadata["layers"]]
    assert schedules == [[(4, "wavefront"), (None, "mma_wavefront")]] * 3
    assert module.metadata["stacks"][0].startswith("layer0 -> layer1 -> layer2: batch <= 4: wavefront: 3 stacked layers")
    assert "else tensor-core wavefront: 3 stacked layers, one launch of mma tiles a step of them all (8+8+8 blocks" in module.metadata["stacks"][0]
    text = module.executable.as_text()
    assert "rnn_stack_layer0" in text and "rnn_layer1" not in text


def test_gru_stack_with_linear_before_reset_runs_as_one_kernel():
    """A higher GRU layer's h gate as two rows per unit: WR [4H, I+H] with [W_h | 0] and [0 | R_h]; the biases it adds
    are Wb with Rb folded for z and r only (Rb_h is its parameter, inside r's product)."""
    from tvmrnn.lowering import _stacked_weights

    cases = [dataclasses.replace(c, op="GRU", linear_before_reset=1) for c in lstm_stack(2)]
    module = tvmrnn.compile(stack_model(cases), target="cuda", max_dims={"seq": 50, "batch": 1}, logs=False)
    assert _kinds(module) == ["wavefront"] * 2
    case = cases[1]
    w = case.weights()
    H, In = case.hidden, case.input_size
    spec = next(s for s in module_specs(module) if s.name == "layer1")
    wr, bias, params = _stacked_weights(spec, cell_for(spec), w)
    W, R, B = w["W"][0], w["R"][0], w["B"][0]
    assert wr.shape == (1, 4 * H, In + H)
    np.testing.assert_array_equal(wr[0, 2 * H:3 * H], np.concatenate([W[2 * H:], np.zeros((H, H))], axis=1))
    np.testing.assert_array_equal(wr[0, 3 * H:], np.concatenate([np.zeros((H, In)), R[2 * H:]], axis=1))
    np.testing.assert_allclose(bias, np.concatenate([B[:2 * H] + B[3 * H:5 * H], B[2 * H:3 * H]]), rtol=1e-6)
    np.testing.assert_array_equal(params.reshape(-1), B[5 * H:])


def module_specs(module):
    from schedules.layer import RNNLayerSpec

    return [RNNLayerSpec(**{k: v for k, v in layer.items() if k in RNNLayerSpec.__dataclass_fields__ and k not in ("activations", "present")},
                         present=frozenset(layer["present"])) for layer in module.metadata["layers"]]


def test_pytorch_export_is_found_through_its_zero_states_and_constant_axes():
    """torch.onnx.export's stacks (models/lstm_lm.onnx): initial states as slices of ConstantOfShape(0), Squeeze's axes
    from a Constant node. Zero states are the kernel's own start; other states it reads: either way the layer above joins."""
    import os

    from test_models import MODELS

    path = os.path.join(MODELS, "lstm_lm.onnx")
    model = onnx.load(path)
    assert [m.index for m in find_chains(model)[0]] == [1] and "initial_h" not in find_chains(model)[0][0].constants
    module = tvmrnn.compile(path, target="cuda", max_dims={"seq": 64, "batch": 2}, logs=False)
    assert _kinds(module) == ["wavefront"] * 2
    slices = [n for n in model.graph.node if n.op_type == "Slice"]
    fill = next(n for n in model.graph.node if n.op_type == "ConstantOfShape").attribute[0].t
    fill.CopyFrom(numpy_helper.from_array(np.ones(1, np.float32)))  # states of ones: no longer the kernel's zeros
    (member,) = find_chains(model)[0]
    assert slices and set(member.states) == {"initial_h", "initial_c"}


def test_bidirectional_stack_runs_layer_by_layer():
    """The bench's glue of a bidirectional stack (Transpose + Reshape to [T, N, 2H]) is found; a wavefront runs forward."""
    from tvmrnn import bench

    row = bench.Row("bi", "LSTM", 10, 1, 20, 48, 2, True)
    module = tvmrnn.compile(bench.onnx_model(bench.torch_module(row), row), target="cuda", max_dims={"seq": 10, "batch": 1}, logs=False)
    assert module.metadata["stacks"] == ["lstm0 -> lstm1: layer by layer (LSTM node 'lstm0': direction bidirectional (a stack runs forward in time))"]
    assert _kinds(module) == ["persistent", "persistent"]


def test_inspect_says_how_each_stack_runs(tmp_path):
    from tvmrnn.interface.inspect import inspect_command

    lines = []
    for name, cases in (("lstm", lstm_stack(2)), ("gru", [dataclasses.replace(c, op="GRU") for c in lstm_stack(2)])):
        onnx.save(stack_model(cases), tmp_path / f"{name}.onnx")
        inspect_command(str(tmp_path / f"{name}.onnx"), echo=lines.append, target="cuda")  # stacks run as one kernel on CUDA
    stacks = [line for line in lines if line.startswith("  stack ")]
    assert stacks[0].startswith("  stack layer0 -> layer1: one wavefront: 2 stacked layers") and "--max-dim batch=N, N <= 4" in stacks[0]
    assert stacks[1] == ("  stack layer0 -> layer1: layer by layer (GRU node 'layer0': GRU cell without linear_before_reset: its h gate "
                         "needs all of r*h first (two phases))")


@pytest.mark.parametrize("storage", ["float16", "bfloat16"])
def test_fp32_stack_in_half_storage_builds_as_one_kernel(storage):
    """compile(dtype=...) converts the layers above the first too (their W and R cast by Relax: numpy has no bfloat16)."""
    module = tvmrnn.compile(stack_model(lstm_stack(2)), target="cuda", dtype=storage, max_dims={"seq": 50, "batch": 2}, logs=False)
    assert _kinds(module) == ["wavefront"] * 2 and {layer["dtype"] for layer in module.metadata["layers"]} == {storage}


def test_cpu_builds_have_no_stacks():
    module = tvmrnn.compile(stack_model(lstm_stack(2)), target="llvm", max_dims={"seq": 50, "batch": 1}, logs=False)
    assert module.metadata["stacks"] == [] and _kinds(module) == ["cpu", "cpu"]


GPU_CASES = {
    "lstm-2": (lstm_stack(2), "float32"),
    "lstm-3-states-peepholes-clip": (lstm_stack(3, optional=("B", "initial_h", "initial_c", "P"), clip=2.5), "float32"),
    "lstm-2-h512": (lstm_stack(2, hidden=512, input_size=512), "float32"),
    "lstm-2-h37": (lstm_stack(2, hidden=37, input_size=13), "float32"),  # no 16-byte loads, a partial block
    "lstm-3-sizes-64-24-40": (lstm_stack(sizes=[64, 24, 40], input_size=20), "float32"),
    "lstm-3-lengths": ([dataclasses.replace(c, optional=("B", "sequence_lens") + (("initial_h",) if i == 0 else ()))
                        for i, c in enumerate(lstm_stack(3))], "float32"),
    "rnn-2-relu": ([dataclasses.replace(c, op="RNN", outputs=("Y", "Y_h"), activations=("Relu",)) for c in lstm_stack(2)], "float32"),
    "lstm-2-fp16": ([dataclasses.replace(c, dtype="float16") for c in lstm_stack(2)], "float16"),
    # PyTorch's and Keras's GRU: the layers above the first sum their h gate's two parts apart
    "gru-lbr-3": ([dataclasses.replace(c, op="GRU", linear_before_reset=1, optional=("B", "initial_h") if i == 0 else ("B",))
                   for i, c in enumerate(lstm_stack(sizes=[40, 48, 32]))], "float32"),
    "gru-lbr-2-fp16": ([dataclasses.replace(c, op="GRU", linear_before_reset=1, dtype="float16") for c in lstm_stack(2)], "float16"),
}


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(GPU_CASES))
@pytest.mark.parametrize("graph", [True, False], ids=["graph", "no-graph"])
def test_wavefront_matches_float64_layer_by_layer(name, graph):
    """Every layer's Y_h (and Y_c) and the last Y, batches 1-4 and two lengths, fresh inputs each run, against float64;
    the same inputs twice give the same bits (a race would move them)."""
    cases, dtype = GPU_CASES[name]
    module = tvmrnn.compile(stack_model(cases), target="cuda", max_dims={"seq": 40, "batch": 4}, cuda_graph=graph, logs=False)
    assert set(_kinds(module)) == {"wavefront"}
    tol = 1e-5 if dtype == "float32" else 1e-2
    rng = np.random.default_rng(3)
    for T, N in [(40, 1), (17, 4), (40, 3), (1, 2)]:
        feeds = _feeds(cases, rng, T, N)
        ref = stack_reference(cases, feeds)
        got = module.run(feeds)
        assert module.run(feeds).keys() == got.keys()
        for out, value in module.run(feeds).items():
            np.testing.assert_array_equal(value, got[out], err_msg=f"{out}: two runs of the same inputs differ")
        for out, expected in ref.items():
            if out not in got:
                continue
            err = np.abs(got[out].astype("float64") - expected).max() / max(np.abs(expected).max(), 1e-30)
            assert err < tol, f"{out} T={T} N={N}: rel. error {err:.2e}"


@pytest.mark.gpu
def test_pytorch_export_as_one_kernel_matches_onnxruntime():
    """models/lstm_lm.onnx (torch.onnx.export: embedding, two LSTM layers, softmax) bounded to batch 2: one wavefront
    kernel, against ONNX Runtime on the same token ids."""
    import os

    from test_models import MODELS, ZOO, ort_reference

    path = os.path.join(MODELS, "lstm_lm.onnx")
    module = tvmrnn.compile(path, target="cuda", max_dims={"seq": 64, "batch": 2}, logs=False)
    assert _kinds(module) == ["wavefront"] * 2
    for batch, time in ((2, 16), (1, 64), (2, 3)):
        feeds = ZOO.example_inputs("lstm_lm", batch=batch, time=time, seed=batch + time)
        ours, ref = module.run(feeds), ort_reference(path, feeds)
        for name in ref:
            np.testing.assert_allclose(ours[name], ref[name], rtol=1e-4, atol=1e-5, err_msg=f"{name} batch {batch} time {time}")


@pytest.mark.gpu
def test_fp32_stack_in_half_storage_matches_float64():
    cases = lstm_stack(2)
    module = tvmrnn.compile(stack_model(cases), target="cuda", dtype="float16", max_dims={"seq": 40, "batch": 4}, logs=False)
    assert set(_kinds(module)) == {"wavefront"}
    feeds = _feeds(cases, np.random.default_rng(4), 40, 3)
    ref, got = stack_reference(cases, feeds), module.run(feeds)
    assert got.keys() <= ref.keys() and len(got) == 5
    for out, value in got.items():
        err = np.abs(value.astype("float64") - ref[out]).max() / np.abs(ref[out]).max()
        assert err < 1e-2, f"{out}: rel. error {err:.2e}"


def _half(cases):
    return [dataclasses.replace(c, dtype="float16") for c in cases]


# stacks bounded to batch 128, where each layer alone runs the per-step mma: the tensor-core wavefront above batch 4
# (above batch 64 where the first case's persistent tensor-core wavefront runs 5-64)
MMA_CASES = {
    "lstm-3-fp16": (_half(lstm_stack(3, hidden=64, input_size=32)), "float16"),
    "lstm-2-states-peepholes-clip": (lstm_stack(2, hidden=64, optional=("B", "initial_h", "initial_c", "P"), clip=2.5), "float32"),
    "lstm-3-lengths": ([dataclasses.replace(c, optional=("B", "sequence_lens") + (("initial_h",) if i == 0 else ()))
                        for i, c in enumerate(lstm_stack(3, hidden=64))], "float32"),
    # no whole 32-column chunks: scalar loads, zeros past the edge of both of layer 1's segments (I = 40, H = 48)
    "lstm-2-sizes-40-48-fp16": (_half(lstm_stack(sizes=[40, 48], input_size=20)), "float16"),
    "rnn-2-relu-fp16": ([dataclasses.replace(c, op="RNN", outputs=("Y", "Y_h"), activations=("Relu",), dtype="float16")
                         for c in lstm_stack(2, hidden=64)], "float16"),
}


def _branch_kinds(module) -> set:
    return {branch["config"]["kind"] for layer in module.metadata["layers"] for branch in layer["schedule"]}


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(MMA_CASES))
def test_tensor_core_wavefront_matches_float64_layer_by_layer(name):
    """Batches 5-128 run the tensor-core wavefront (3 and 1 step, all batch tiles full or not), batch 3 the wavefront;
    every layer's outputs against float64, and the same inputs twice give the same bits."""
    cases, dtype = MMA_CASES[name]
    module = tvmrnn.compile(stack_model(cases), target="cuda", max_dims={"seq": 40, "batch": 128}, logs=False)
    # batches 5-64 of the first case run the persistent tensor-core wavefront (its sizes are whole chunks)
    assert _branch_kinds(module) - {"persistent_mma_wavefront"} == {"wavefront", "mma_wavefront"}
    shapes = [(40, 128), (17, 97), (9, 50), (40, 5), (1, 9), (3, 3)]
    _matches_float64_twice(module, cases, shapes, 1e-5 if dtype == "float32" else 1e-2, 5)


def _matches_float64_twice(module, cases, shapes, tol: float, seed: int):
    """At each (T, N): every layer's outputs within tol of float64 (relative to the largest), and the same bits twice."""
    rng = np.random.default_rng(seed)
    for T, N in shapes:
        feeds = _feeds(cases, rng, T, N)
        ref = stack_reference(cases, feeds)
        got = module.run(feeds)
        for out, value in module.run(feeds).items():
            np.testing.assert_array_equal(value, got[out], err_msg=f"{out}: two runs of the same inputs differ")
        for out, expected in ref.items():
            if out in got:
                err = np.abs(got[out].astype("float64") - expected).max() / max(np.abs(expected).max(), 1e-30)
                assert err < tol, f"{out} T={T} N={N}: rel. error {err:.2e}"


# the persistent tensor-core wavefront (batch bounds 5-64): name -> (cases, dtype, precision, batch bound)
RESIDENT_CASES = {
    "lstm-3-fp16-bound-8": (_half(lstm_stack(3, hidden=64, input_size=32)), "float16", None, 8),
    "lstm-2-states-peepholes-clip-fp16-bound-64": (
        _half(lstm_stack(2, hidden=64, input_size=32, optional=("B", "initial_h", "initial_c", "P"), clip=2.5)), "float16", None, 64),
    "lstm-3-lengths-fp16-bound-24": (_half([dataclasses.replace(c, optional=("B", "sequence_lens") + (("initial_h",) if i == 0 else ()))
                                            for i, c in enumerate(lstm_stack(3, hidden=64, input_size=32))]), "float16", None, 24),
    # two widths (layer 1's input 96, its H 160), fp32 on TF32 tensor cores
    "lstm-2-sizes-96-160-tf32-bound-8": (lstm_stack(sizes=[96, 160], input_size=64), "float32", "tf32", 8),
    "lstm-2-sizes-96-160-tf32-bound-40": (lstm_stack(sizes=[96, 160], input_size=64), "float32", "tf32", 40),
    "rnn-2-relu-fp16-bound-8": (_half([dataclasses.replace(c, op="RNN", outputs=("Y", "Y_h"), activations=("Relu",))
                                       for c in lstm_stack(2, hidden=64, input_size=32)]), "float16", None, 8),
}


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(RESIDENT_CASES))
def test_persistent_tensor_core_wavefront_matches_float64_layer_by_layer(name):
    """Batches 5 to the bound run the persistent tensor-core wavefront (full and partial passes, 1 and 3 steps), batch 3
    the wavefront; every layer's outputs against float64, and the same inputs twice give the same bits."""
    cases, dtype, precision, bound = RESIDENT_CASES[name]
    module = tvmrnn.compile(stack_model(cases), target="cuda", max_dims={"seq": 40, "batch": bound}, logs=False,
                            **({"precision": precision} if precision else {}))
    assert _branch_kinds(module) == {"wavefront", "persistent_mma_wavefront"}
    tol = 1e-5 if dtype == "float32" and precision is None else 1e-2
    _matches_float64_twice(module, cases, [(40, bound), (17, 5), (1, bound - 1), (9, (bound + 5) // 2), (3, 3)], tol, 7)


def test_persistent_tensor_core_wavefront_splits_the_sms_by_work_and_spills_nothing():
    """Two fp16 H=1024 layers (24 MB of R and WR): layer 1 reduces over I + H = 2048, so its blocks take half layer 0's
    units, 129 blocks of 132 SMs, each within 227 KB of shared memory; three such layers (40 MB) do not fit. The kernel
    (both wavefronts) compiles for sm_90a without spills."""
    from schedules import recurrent_persistent_mma_wavefront as resident, stack_kernel
    from schedules.ptxas import kernel_source, ptxas
    import tvm

    half = [_spec(1024, 1024, "float16") for _ in range(2)]
    cells = [cell_for(s) for s in half]
    device = Device.cuda("sm_90")
    cfg = resident.plan(half, cells, device, 8)
    assert (cfg.units, cfg.blocks(half), cfg.tiles.rows) == ((24, 12), (43, 86), 8)
    assert resident.smem_bytes(half, cells, cfg) <= device.smem_limit
    assert resident.plan(half + half[:1], cells + cells[:1], device, 8) is None
    assert [resident.plan(half, cells, device, b).tiles.rows for b in (32, 64)] == [32, 64]
    assert resident.largest_bound(half, cells, device) == 64
    assert resident.refusal([half[0], _spec(1024, 1024, "bfloat16")], cells) == "the stacked layers' dtypes differ"
    kernel, why = stack_kernel(half, cells, tvm.target.Target({"kind": "cuda", "arch": "sm_90a"}), batch_bound=64, device=device)
    assert why.endswith("else persistent tensor-core wavefront: 2 stacked layers in one cooperative kernel of 129 blocks "
                        "(43+86, 24/12 units), layer l+1 one step behind layer l, 64 batch rows a pass, batch <= 64")
    report = ptxas(kernel_source(kernel.func, "sm_90a"), "sm_90a")
    threads = {32 * p.n_warps * p.k_warps for p in (resident.plan(half, cells, device, b).tiles for b in (8, 32, 64))}
    assert len(threads) == 1 and report.spill_stores == 0 and report.registers <= 65536 // threads.pop(), report.describe()


def test_a_half_precision_stack_bounded_to_batch_8_runs_the_persistent_tensor_core_wavefront():
    cases = _half(lstm_stack(3, hidden=64, input_size=32))
    module = tvmrnn.compile(stack_model(cases), target="cuda", max_dims={"seq": 50, "batch": 8}, logs=False)
    schedules = [[(b["up_to_batch"], b["config"]["kind"]) for b in layer["schedule"]] for layer in module.metadata["layers"]]
    assert schedules == [[(4, "wavefront"), (None, "persistent_mma_wavefront")]] * 3
    assert "else persistent tensor-core wavefront: 3 stacked layers in one cooperative kernel of 40 blocks (8+16+16" in module.metadata["stacks"][0]
    # the load checks the larger of the two cooperative grids against the GPU's SMs
    grids = {b["config"]["grid"] for layer in module.metadata["layers"] for b in layer["schedule"]}
    assert {layer["cooperative_blocks"] for layer in module.metadata["layers"]} == {max(grids)}


def test_a_stack_bounded_to_128_runs_each_batch_on_its_wavefront():
    """Batch 1-4 the wavefront, 5-8, 9-32 and 33-64 the persistent tensor-core wavefront's three points (the first
    adding its partial sums flat), 65-128 one launch of mma tiles a step."""
    module = tvmrnn.compile(stack_model(_half(lstm_stack(3, hidden=64, input_size=32))), target="cuda",
                            max_dims={"seq": 50, "batch": 128}, logs=False)
    schedules = [[(b["up_to_batch"], b["config"]["kind"], b["config"].get("n_tiles"), b["config"].get("n_warps"))
                  for b in layer["schedule"]] for layer in module.metadata["layers"]]
    assert schedules == [[(4, "wavefront", None, None), (8, "persistent_mma_wavefront", 1, 1), (32, "persistent_mma_wavefront", 2, 2),
                          (64, "persistent_mma_wavefront", 2, 4), (None, "mma_wavefront", 2, 2)]] * 3
    flat = [[b["config"].get("flat_sums", 0) for b in layer["schedule"][1:4]] for layer in module.metadata["layers"]]
    assert flat == [[1, 0, 0]] * 3, flat
    assert module.metadata["stacks"][0].endswith("; else tensor-core wavefront: 3 stacked layers, one launch of mma tiles a "
                                                 "step of them all (8+8+8 blocks a batch tile), layer l+1 one step behind "
                                                 "layer l, batch <= 128")


def test_inspect_names_the_batch_bounds_of_the_tensor_core_wavefront(tmp_path):
    """A stack of symbolic batch: inspect names the bounds that run it as one tensor-core wavefront (16 up to where a
    launch would pass 2 blocks an SM: 3 x 8 blocks a 32-row tile on 132 SMs -> 11 tiles, 352 rows)."""
    from tvmrnn.interface.inspect import inspect_command

    lines = []
    onnx.save(stack_model(_half(lstm_stack(3, hidden=64))), tmp_path / "s.onnx")
    inspect_command(str(tmp_path / "s.onnx"), echo=lines.append, target="cuda")
    (stack,) = [line for line in lines if line.startswith("  stack ")]
    assert stack.endswith("; one tensor-core wavefront: 3 stacked layers, one launch of mma tiles a step of them all (8+8+8 blocks a "
                          "batch tile), layer l+1 one step behind layer l above batch 4 when compiled with the batch bounded "
                          "(--max-dim batch=N, 16 <= N <= 352)")


def test_inspect_names_both_tensor_core_wavefronts_where_the_stack_fits_a_wave(tmp_path):
    """Sizes of whole 32-column chunks in fp16: bounds 5-64 run the persistent tensor-core wavefront, 65 up the other."""
    from tvmrnn.interface.inspect import inspect_command

    lines = []
    onnx.save(stack_model(_half(lstm_stack(3, hidden=64, input_size=32))), tmp_path / "s.onnx")
    inspect_command(str(tmp_path / "s.onnx"), echo=lines.append, target="cuda")
    (stack,) = [line for line in lines if line.startswith("  stack ")]
    assert ("; one persistent tensor-core wavefront: 3 stacked layers in one cooperative kernel of 40 blocks (8+16+16, 8/4/4 "
            "units), layer l+1 one step behind layer l above batch 4 when compiled with the batch bounded (--max-dim batch=N, "
            "5 <= N <= 64); one tensor-core wavefront: ") in stack
    assert stack.endswith("layer l+1 one step behind layer l above batch 64 when compiled with the batch bounded "
                          "(--max-dim batch=N, 65 <= N <= 352)")
