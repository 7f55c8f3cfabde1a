"""The layers around the recurrent ones (tvmrnn.graph_pipeline, schedules.graph_cpu): whole torch-exported models against
ONNX Runtime, the packed conv and GEMM kernels against numpy at awkward shapes, CUDA builds without a GPU."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import tvm
from tvm import te

import tvmrnn
from compiled import cuda_sources
from graph_cases import build
from schedules import graph_cpu
from tvmrnn.build import resolve_target


def _rel_err(ours, ref) -> float:
    ours, ref = np.asarray(ours, np.float64), np.asarray(ref, np.float64)
    return float(np.abs(ours - ref).max() / max(np.abs(ref).max(), 1e-30))


def _relax(model, target) -> tvm.IRModule:
    from tvmrnn.frontend import to_relax
    from tvmrnn.plan import plan_model

    return to_relax(model, plan_model(model, target)).mod


def _ort(model, feeds):
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)


@pytest.mark.parametrize("name", ["captcha-crnn", "dense-head", "lstm150-b1", "vgg-crnn", "separable-gru"])
def test_model_matches_onnxruntime_on_llvm(name):
    model, feeds = build(name)
    ours = tvmrnn.compile(model, target="llvm", logs=False).run(feeds)
    for got, ref in zip(ours.values(), _ort(model, feeds)):
        assert got.shape == ref.shape
        assert _rel_err(got, ref) < 1e-4


def test_convs_and_dense_layers_get_the_packed_kernels():
    from tvmrnn.graph_pipeline import passes

    model, _ = build("captcha-crnn")
    target = resolve_target("llvm")
    mod = _relax(model, target)
    with target:
        mod = tvm.transform.Sequential(passes(target))(mod)
    names = [gv.name_hint for gv, f in mod.functions_items() if isinstance(f, tvm.tirx.PrimFunc)]
    assert sum("conv2d_packed" in n for n in names) == 4, names
    assert any("dense_packed" in n for n in names), names
    assert not any("conv2d_nchw" in n or n.startswith("matmul") for n in names), names


def test_a_dense_layer_takes_its_bias_along():
    """x @ W + b over a [steps, batch, K] input (the GEMM's rows copied in and out): one function, the bias add fused
    in (dense_packed is marked out-elementwise-fusable, as its single GEMM block would be)."""
    from tvmrnn.graph_pipeline import fused_module

    model, _ = build("dense-head")
    target = resolve_target("llvm")
    names = [gv.name_hint for gv, f in fused_module(_relax(model, target), target).functions_items()
             if isinstance(f, tvm.tirx.PrimFunc) and "dense_packed" in gv.name_hint]
    assert len(names) == 2 and all(n.startswith("fused_dense_packed") and "_add" in n for n in names), names


def _run(func, target, arrays):
    rt = tvm.compile(tvm.IRModule({"main": func}), target=target)
    dev = tvm.cpu()
    args = [tvm.runtime.tensor(a, dev) for a in arrays]
    rt.mod["main"](*args)
    return args[-1].numpy()


def _i64(*dims):
    """Shapes as Relax legalizes them: int64 extents, a string a symbolic one, an expression as it is."""
    return tuple(tvm.tirx.Var(d, "int64") if isinstance(d, str) else tvm.tirx.IntImm("int64", d) if isinstance(d, int) else d
                 for d in dims)


@pytest.mark.parametrize("c,o,h,w,stride,pad,symbolic", [(3, 24, 9, 13, 1, (1, 1, 1, 1), False), (8, 32, 10, 25, 2, (0, 1, 1, 0), False),
                                                         (5, 7, 6, 6, 1, (0, 0, 0, 0), False), (48, 192, 6, 40, 1, (1, 1, 1, 1), True),
                                                         (24, 24, 5, 37, 1, (1, 1, 1, 1), True), (24, 96, 6, 29, 2, (1, 1, 1, 1), True)])
def test_packed_conv_with_epilogue_matches_numpy(c, o, h, w, stride, pad, symbolic):
    """Both tile layouts; a symbolic width computes whole tiles over a padded input and crops (ddddocr's image width)."""
    target = resolve_target("llvm")
    rng = np.random.default_rng(0)
    x_np, w_np, b_np = (rng.standard_normal(s).astype("f4") for s in ((1, c, h, w), (o, c, 3, 3), (o,)))
    lanes = graph_cpu.vector_lanes(target)
    ob = graph_cpu.channel_block(o, lanes)
    x, wp, b = te.placeholder(_i64(1, c, h, "w" if symbolic else w)), te.placeholder(_i64(o // ob, c, 3, 3, ob)), te.placeholder(_i64(o))
    y = graph_cpu.conv2d_packed(x, wp, [stride, stride], list(pad), [1, 1], lanes)
    out = te.compute(y.shape, lambda n, k, i, j: te.max(y[n, k, i, j] + b[k], 0.0), name="relu")
    sch = graph_cpu.ConvPacked().apply(te.create_prim_func([x, wp, b, out]), target, False)
    assert sch is not None
    import torch

    ref = torch.nn.functional.conv2d(torch.from_numpy(np.pad(x_np, [(0, 0), (0, 0), (pad[0], pad[2]), (pad[1], pad[3])])),
                                     torch.from_numpy(w_np), torch.from_numpy(b_np), stride).relu().numpy()
    got = _run(sch.mod["main"], target, [x_np, graph_cpu.pack_conv_weight(w_np, ob), b_np, np.zeros(ref.shape, "f4")])
    assert _rel_err(got, ref) < 1e-5


@pytest.mark.parametrize("c,o,h,w,k,stride,pad,groups,launches", [
    (48, 192, "h", 40, (3, 3), (1, 1), (1, 1, 1, 1), 1, 1), (64, 64, "h", 32, (1, 3), (1, 2), (0, 1, 0, 1), 64, 1),
    (16, 32, 30, "w", (3, 3), (2, 1), (1, 0, 1, 2), 2, 1), (64, 10, "h", 96, (5, 1), (1, 1), (4, 0, 0, 0), 2, 2)])
def test_a_parallel_conv_lays_out_its_input_in_the_same_launch(c, o, h, w, k, stride, pad, groups, launches):
    """The padded input (or its phase split) of a conv on the thread pool is computed under the tiles' parallel rows,
    over a narrow input too (16 channels in groups of 8: the channel blocks then run inside each row): one launch of
    the pool a call, not two; a window of more than ROWS_LAID_OUT rows (DeepFilterNet3's 5x1) keeps its own pass. The
    same result as torch's either way."""
    import torch

    target = resolve_target("llvm")
    lanes = graph_cpu.vector_lanes(target)
    ob = graph_cpu.conv_channel_block(o // groups, lanes)
    size = {"h": 50, "w": 37}
    x_np = np.random.default_rng(3).standard_normal((1, c, size.get(h, h), size.get(w, w))).astype("f4")
    w_np = np.random.default_rng(4).standard_normal((o, c // groups, *k)).astype("f4")
    x, wp = te.placeholder(_i64(1, c, h, w)), te.placeholder(_i64(o // ob, c // groups, *k, ob))
    y = graph_cpu.conv2d_packed(x, wp, list(stride), list(pad), [1, 1], lanes, groups)
    out = te.compute(y.shape, lambda *i: te.max(y(*i), 0.0), name="relu")
    func = te.create_prim_func([x, wp, out])
    sch = graph_cpu.ConvPacked().apply(func, target, False)
    script = sch.mod["main"].script()
    assert script.count("T.parallel") == launches and any(s in script for s in graph_cpu.PADDED_INPUTS), script
    ref = torch.nn.functional.conv2d(torch.from_numpy(np.pad(x_np, [(0, 0), (0, 0), (pad[0], pad[2]), (pad[1], pad[3])])),
                                     torch.from_numpy(w_np), None, stride, groups=groups).relu().numpy()
    got = _run(graph_cpu.run_time_parallel(func, sch), target,
               [x_np, graph_cpu.pack_conv_weight(w_np, ob), np.zeros(ref.shape, "f4")])
    assert _rel_err(got, ref) < 1e-5


@pytest.mark.parametrize("c,o,w,k,stride,pad,symbolic", [(1, 258, 640, 256, 128, (0, 0), False), (129, 128, 18, 3, 1, (1, 1), False),
                                                         (16, 24, 35, 3, 2, (1, 0), False), (5, 7, 9, 1, 1, (0, 0), False),
                                                         (16, 24, 35, 3, 2, (1, 0), True)])
def test_packed_conv1d_with_epilogue_matches_numpy(c, o, w, k, stride, pad, symbolic):
    """silero's STFT (stride = hop, one input channel, 258 channels padded to whole vectors) and encoder shapes, both
    tile layouts."""
    target = resolve_target("llvm")
    rng = np.random.default_rng(2)
    x_np, w_np, b_np = (rng.standard_normal(s).astype("f4") for s in ((1, c, w), (o, c, k), (o,)))
    lanes = graph_cpu.vector_lanes(target)
    ob = graph_cpu.padded_channel_block(o, lanes)
    x, wp = te.placeholder(_i64(1, c, "w" if symbolic else w)), te.placeholder(_i64(-(-o // ob), c, k, ob))
    b = te.placeholder(_i64(o))
    y = graph_cpu.conv1d_packed(x, wp, stride, list(pad), 1, lanes, o)
    out = te.compute(y.shape, lambda n, q, j: te.max(y[n, q, j] + b[q], 0.0), name="relu")
    sch = graph_cpu.ConvPacked().apply(te.create_prim_func([x, wp, b, out]), target, False)
    assert sch is not None
    import torch

    ref = torch.nn.functional.conv1d(torch.from_numpy(np.pad(x_np, [(0, 0), (0, 0), pad])), torch.from_numpy(w_np),
                                     torch.from_numpy(b_np), stride).relu().numpy()
    got = _run(sch.mod["main"], target, [x_np, graph_cpu.pack_conv1d_weight(w_np, ob), b_np, np.zeros(ref.shape, "f4")])
    assert _rel_err(got, ref) < 1e-5


def test_symbolic_work_that_pays_at_its_smallest_has_no_run_time_test():
    """A conv whose work pays for the pool even at a symbolic width of 1 (512->512 3x3 over 128 rows: 302M
    multiply-adds a column) keeps one parallel schedule, not a copy under a test that can only pass."""
    from schedules.device import MIN_PARALLEL_WORK

    target = resolve_target("llvm")
    lanes = graph_cpu.vector_lanes(target)
    ob = graph_cpu.channel_block(512, lanes)
    x, wp = te.placeholder(_i64(1, 512, 128, "w")), te.placeholder(_i64(512 // ob, 512, 3, 3, ob))
    func = te.create_prim_func([x, wp, graph_cpu.conv2d_packed(x, wp, [1, 1], [1] * 4, [1, 1], lanes)])
    with target:
        sch = graph_cpu.ConvPacked().apply(func, target, False)
        text = graph_cpu.run_time_parallel(func, sch).script()
    assert "T.parallel" in text and str(MIN_PARALLEL_WORK) not in text


def test_symbolic_work_takes_the_thread_pool_only_where_it_pays():
    """A conv over a symbolic batch: its schedule twice under a run-time test of the work (MIN_PARALLEL_WORK), the
    pool's and the calling thread's, both correct (2 rows: 0.4M multiply-adds, 1400 rows: 277M)."""
    from tvm import tirx

    from schedules.device import MIN_PARALLEL_WORK

    target = resolve_target("llvm")
    i64 = lambda v: tirx.IntImm("int64", v)  # noqa: E731
    n, (c, o, w, k) = tirx.Var("n", "int64"), (129, 128, 4, 3)
    ob = graph_cpu.padded_channel_block(o, graph_cpu.vector_lanes(target))
    x, wp = te.placeholder((n, i64(c), i64(w))), te.placeholder(tuple(i64(d) for d in (o // ob, c, k, ob)))
    y = graph_cpu.conv1d_packed(x, wp, 1, [1, 1], 1, graph_cpu.vector_lanes(target))
    out = te.compute(y.shape, lambda b, q, j: te.max(y[b, q, j], 0.0), name="relu")
    func = te.create_prim_func([x, wp, out])
    with target:
        sch = graph_cpu.ConvPacked().apply(func, target, False)
        versioned = graph_cpu.run_time_parallel(func, sch)
    text = versioned.script()
    assert "T.parallel" in text and str(MIN_PARALLEL_WORK) in text and "else:" in text
    rng = np.random.default_rng(3)
    w_np = rng.standard_normal((o, c, k)).astype("f4")
    import torch

    for rows in (2, 1400):
        x_np = rng.standard_normal((rows, c, w)).astype("f4")
        got = _run(versioned, target, [x_np, graph_cpu.pack_conv1d_weight(w_np, ob), np.zeros((rows, o, w), "f4")])
        ref = torch.nn.functional.conv1d(torch.from_numpy(x_np), torch.from_numpy(w_np), padding=1).relu().numpy()
        assert _rel_err(got, ref) < 1e-5


@pytest.mark.parametrize("c,o,k,stride,pad", [(24, 24, 1, 1, 0), (24, 24, 3, 1, 1), (1, 24, 3, 2, 1)])
def test_symbolic_width_convs_store_whole_vectors_but_in_the_last_tile(c, o, k, stride, pad):
    """ddddocr's 24-channel convs over its symbolic image width (tiles of a vector of columns): vector_tails leaves the
    bounds test to the last tile, so the other tiles store whole vectors (a per-lane test scalarized every store and
    the epilogue) and an unpadded conv reads its input without a padded copy; the result is torch's (float64) at widths
    that end in whole, part and single-column tiles."""
    import re

    import torch

    target = resolve_target("llvm")
    lanes = graph_cpu.vector_lanes(target)
    ob = graph_cpu.conv_channel_block(o, lanes)
    x, wp, r = te.placeholder(_i64(1, c, 10, "w")), te.placeholder(_i64(o // ob, c, k, k, ob)), None
    y = graph_cpu.conv2d_packed(x, wp, [stride] * 2, [pad] * 4, [1, 1], lanes)
    r = te.placeholder(y.shape)
    out = te.compute(y.shape, lambda *i: y(*i) + r(*i), name="residual")
    func = te.create_prim_func([x, wp, r, out])
    with target:
        sch = graph_cpu.ConvPacked().apply(func, target, False)
        tails = graph_cpu.vector_tails(graph_cpu.run_time_parallel(func, sch))
    assert re.search(r"residual\w*\[[^\]]*:[^\]]*\] = ", _lowered(tails, target)), "no whole-vector store to the output"
    laid_out = any(stage in tails.script() for stage in graph_cpu.PADDED_INPUTS)
    assert laid_out == (pad > 0)  # an unpadded conv reads x itself, tested in the last tile
    rng = np.random.default_rng(5)
    w_np = rng.standard_normal((o, c, k, k)).astype("f4")
    for width in (1, 3 * lanes, 5 * lanes + 3, 160):
        x_np = rng.standard_normal((1, c, 10, width)).astype("f4")
        ref = torch.nn.functional.conv2d(torch.from_numpy(x_np).double(), torch.from_numpy(w_np).double(), None, stride, pad)
        r_np = rng.standard_normal(ref.shape).astype("f4")
        got = _run(tails, target, [x_np, graph_cpu.pack_conv_weight(w_np, ob), r_np, np.zeros(ref.shape, "f4")])
        assert _rel_err(got, ref.numpy() + r_np) < 1e-5, width


def test_a_conv_under_the_pool_threshold_lays_its_input_out_in_its_own_pass():
    """ddddocr's first conv (1 -> 24, 3x3, stride 2) over its symbolic width: the calling thread's copy
    (run_time_parallel, below MIN_PARALLEL_WORK) is ConvPacked's schedule for one thread, the phase split a pass over
    all 65 padded rows, not laid out row by row as the pool's threads do; both copies match torch (float64)."""
    import re

    import torch

    target = resolve_target("llvm")
    lanes = graph_cpu.vector_lanes(target)
    ob = graph_cpu.conv_channel_block(24, lanes)
    x, wp = te.placeholder(_i64(1, 1, 64, "w")), te.placeholder(_i64(24 // ob, 1, 3, 3, ob))
    y = graph_cpu.conv2d_packed(x, wp, [2, 2], [1] * 4, [1, 1], lanes)
    func = te.create_prim_func([x, wp, te.compute(y.shape, lambda *i: te.max(y(*i), 0.0), name="relu")])
    sch = graph_cpu.ConvPacked().apply(func, target, False)
    versioned = graph_cpu.run_time_parallel(func, sch, target)
    serial = versioned.script().split("else:")[1]
    assert re.search(r"for .*T.grid\(T.int64\(65\)", serial.split('T.sblock("phase_split")')[0]), serial[:2000]
    rng = np.random.default_rng(6)
    w_np = rng.standard_normal((24, 1, 3, 3)).astype("f4")
    for width in (160, 2600):  # the calling thread's copy, the pool's
        x_np = rng.standard_normal((1, 1, 64, width)).astype("f4")
        ref = torch.nn.functional.conv2d(torch.from_numpy(x_np).double(), torch.from_numpy(w_np).double(), None, 2, 1).relu()
        got = _run(versioned, target, [x_np, graph_cpu.pack_conv_weight(w_np, ob), np.zeros(ref.shape, "f4")])
        assert _rel_err(got, ref.numpy()) < 1e-5, width


def _dense(lead, k, n, target, *scalars):
    lanes = graph_cpu.vector_lanes(target)
    nb = graph_cpu.dense_block(n, lanes)
    x, wp = te.placeholder((*_i64(*lead), *_i64(k))), te.placeholder(_i64(-(-n // nb), k, nb))
    y = graph_cpu.dense_packed(x, wp, n, lanes)
    out = te.compute(y.shape, lambda *i: y(*i) * 2.0, name="scale")
    return graph_cpu.DensePacked().apply(te.create_prim_func([x, wp, out, *scalars]), target, False), nb


@pytest.mark.parametrize("lead,k,n", [((7, 3), 40, 48), ((13,), 64, 37), ((2, 1, 5), 16, 256), ((20,), 24, 8210),
                                      (("rows",), 64, 300), (("seq", 1), 32, 37), ((10, "batch"), 236, 25), (("batch", 10), 25, 1),
                                      (("batch", "steps"), 256, 74), ((1, "frames"), 96, 16), ((1, 1, "r", 1), 20, 33)])
def test_packed_dense_matches_numpy(lead, k, n):
    """Static and symbolic row counts (padded to whole row tiles), one and several leading dims."""
    target = resolve_target("llvm")
    rng = np.random.default_rng(1)
    shape = tuple(23 if isinstance(d, str) else d for d in lead)
    x_np, w_np = rng.standard_normal(shape + (k,)).astype("f4"), rng.standard_normal((k, n)).astype("f4")
    sch, nb = _dense(lead, k, n, target)
    assert sch is not None
    got = _run(sch.mod["main"], target, [x_np, graph_cpu.pack_dense_weight(w_np, nb), np.zeros(shape + (n,), "f4")])
    assert _rel_err(got, 2 * x_np.astype("f8") @ w_np) < 1e-5


def test_grouped_and_transposed_convs_and_einsums_get_the_packed_kernels():
    """Grouped, depthwise and transposed convs and a grouped linear einsum: no function of TVM's default legalization
    (conv2d / group_conv2d / conv2d_transpose / einsum: naive single-threaded loops) is left."""
    from tvmrnn.graph_pipeline import fused_module

    model, _ = build("separable-gru")
    target = resolve_target("llvm")
    names = [gv.name_hint for gv, f in fused_module(_relax(model, target), target).functions_items()
             if isinstance(f, tvm.tirx.PrimFunc)]
    assert sum("conv2d_packed" in n for n in names) == 4, names
    assert any("dense_packed" in n for n in names), names
    assert not any(k in n for n in names for k in ("einsum", "conv2d_transpose", "conv2d_nchw", "group_conv2d")), names


def _torch_conv(x, w, b, stride, pad, groups):
    import torch

    x = np.pad(x, [(0, 0), (0, 0), (pad[0], pad[2]), (pad[1], pad[3])])
    return torch.nn.functional.conv2d(torch.from_numpy(x), torch.from_numpy(w), torch.from_numpy(b), stride,
                                      groups=groups).relu().numpy()


def _packed_conv_with_relu(x_shape, w_shape, out_channels, groups, conv):
    """conv(x, wp, lanes) -> the conv2d_packed compute; its packed weight in channel blocks of one group's outputs, a
    bias + relu epilogue, scheduled by ConvPacked. Returns (PrimFunc, channel block)."""
    target = resolve_target("llvm")
    lanes = graph_cpu.vector_lanes(target)
    ob = graph_cpu.conv_channel_block(out_channels // groups, lanes)
    x, b = te.placeholder(_i64(*x_shape)), te.placeholder(_i64(out_channels))
    wp = te.placeholder(_i64(out_channels // ob, *w_shape[1:], ob))
    y = conv(x, wp, lanes)
    out = te.compute(y.shape, lambda n, k, i, j: te.max(y[n, k, i, j] + b[k], 0.0), name="relu")
    sch = graph_cpu.ConvPacked().apply(te.create_prim_func([x, wp, b, out]), target, False)
    assert sch is not None
    return sch.mod["main"], ob


@pytest.mark.parametrize("c,o,h,w,k,stride,pad,groups", [
    (2, 64, 6, 20, (3, 3), (1, 1), (1, 1, 1, 1), 2),  # two groups of 32 channels
    (16, 16, 5, 32, (1, 3), (1, 2), (0, 1, 0, 1), 16),  # depthwise, striding the width
    (16, 32, 4, 17, (3, 3), (2, 1), (1, 0, 1, 2), 16),  # depthwise with a multiplier of 2, an odd width
    (64, 10, 8, 24, (5, 1), (1, 1), (4, 0, 0, 0), 2)])  # groups of 5 output channels (a block of 5)
def test_grouped_conv_matches_torch(c, o, h, w, k, stride, pad, groups):
    rng = np.random.default_rng(3)
    x_np, w_np, b_np = (rng.standard_normal(s).astype("f4") for s in ((1, c, h, w), (o, c // groups) + k, (o,)))
    ref = _torch_conv(x_np, w_np, b_np, stride, pad, groups)
    func, ob = _packed_conv_with_relu((1, c, h, w), w_np.shape, o, groups, lambda x, wp, lanes: graph_cpu.conv2d_packed(
        x, wp, list(stride), list(pad), [1, 1], lanes, groups))
    got = _run(func, resolve_target("llvm"), [x_np, graph_cpu.pack_conv_weight(w_np, ob), b_np, np.zeros(ref.shape, "f4")])
    assert _rel_err(got, ref) < 1e-5


@pytest.mark.parametrize("c,o,h,w,k,stride,pad,out_pad,dilation,groups", [
    (16, 16, 5, 8, (1, 3), (1, 2), (0, 1, 0, 1), (0, 1), (1, 1), 16),  # DeepFilterNet's: depthwise, doubling the width
    (6, 8, 5, 7, (3, 3), (2, 2), (1, 1, 1, 1), (1, 0), (1, 1), 1),
    (4, 6, 4, 6, (3, 2), (2, 3), (2, 0, 1, 1), (0, 2), (2, 1), 2)])
def test_transposed_conv_matches_torch(c, o, h, w, k, stride, pad, out_pad, dilation, groups):
    import torch

    rng = np.random.default_rng(4)
    x_np, w_np, b_np = (rng.standard_normal(s).astype("f4") for s in ((1, c, h, w), (c, o // groups) + k, (o,)))
    # torch pads both sides alike, ONNX each side its own: the reference is torch's unpadded output, extended by
    # output_padding and cropped by the pads
    full = torch.nn.functional.conv_transpose2d(torch.from_numpy(x_np), torch.from_numpy(w_np), None, stride, 0, 0,
                                                groups, dilation).numpy()
    full = np.pad(full, [(0, 0), (0, 0), (0, out_pad[0]), (0, out_pad[1])])
    top, left, bottom, right = pad
    ref = np.maximum(full[:, :, top:full.shape[2] - bottom, left:full.shape[3] - right] + b_np[:, None, None], 0)
    weight = graph_cpu.transposed_conv_weight(w_np, groups)
    func, ob = _packed_conv_with_relu((1, c, h, w), weight.shape, o, groups, lambda x, wp, lanes: graph_cpu.conv2d_transpose_packed(
        x, wp, list(stride), list(pad), list(out_pad), list(dilation), lanes, groups))
    got = _run(func, resolve_target("llvm"), [x_np, graph_cpu.pack_conv_weight(weight, ob), b_np, np.zeros(ref.shape, "f4")])
    assert _rel_err(got, ref) < 1e-5


def _random_conv_case(seed: int) -> dict:
    """A conv or transposed conv of random channels, groups, window, strides, dilation and pads (a transposed conv's
    within its window, output_padding below its stride), its height static or symbolic."""
    rng = np.random.default_rng(100 + seed)
    transposed = seed % 3 == 2
    groups = int(rng.choice([1, 1, 2, 4])) if seed % 4 else int(rng.choice([8, 16]))  # every fourth depthwise-like
    c, o = groups * int(rng.integers(1, 5)), groups * int(rng.integers(1, 7))
    o = int(rng.choice([o, 32, 48])) if groups == 1 else o  # and tiles of a vector of channels
    k = [int(rng.integers(1, 4)), int(rng.integers(1, 6))]
    strides, dilation = [int(rng.integers(1, 4)) for _ in k], [int(rng.integers(1, 3)) for _ in k]
    reach = [d * (kk - 1) for d, kk in zip(dilation, k)]
    pads = [int(rng.integers(0, r + 1)) if transposed else int(rng.integers(0, 3)) for r in reach * 2]
    out_pad = [int(rng.integers(0, s)) for s in strides] if transposed else None
    h, w = int(rng.integers(max(reach[0] + 1, 3), 9)), int(rng.integers(max(reach[1] + 1, 5), 40))
    return dict(transposed=transposed, groups=groups, c=c, o=o, k=k, strides=strides, dilation=dilation, pads=pads,
                out_pad=out_pad, shape=(1, c, h, w), symbolic=bool(seed % 2))


def _conv_relu_model(case, rng):
    """The ONNX Conv (or ConvTranspose) + bias + Relu of `case` with random weights."""
    from onnx import TensorProto, helper, numpy_helper

    c, o, groups = case["c"], case["o"], case["groups"]
    w_shape = (c, o // groups, *case["k"]) if case["transposed"] else (o, c // groups, *case["k"])
    w, b = rng.standard_normal(w_shape).astype("f4"), rng.standard_normal(o).astype("f4")
    attrs = dict(kernel_shape=case["k"], strides=case["strides"], dilations=case["dilation"], pads=case["pads"], group=groups)
    if case["transposed"]:
        attrs["output_padding"] = case["out_pad"]
    dims = ["s" if case["symbolic"] and i == case.get("symbolic_axis", 2) else d for i, d in enumerate(case["shape"])]
    graph = helper.make_graph(
        [helper.make_node("ConvTranspose" if case["transposed"] else "Conv", ["x", "w", "b"], ["c"], **attrs),
         helper.make_node("Relu", ["c"], ["y"])], "conv",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, dims)], [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), w, b


def _conv_relu_float64(case, x, w, b):
    """The reference in float64 (torch): ONNX's per-side pads by padding the input, or cropping a transposed conv's
    unpadded output extended by output_padding."""
    import torch

    t = lambda a: torch.from_numpy(a.astype("f8"))  # noqa: E731
    top, left, bottom, right = case["pads"]
    if not case["transposed"]:
        padded = np.pad(x, [(0, 0), (0, 0), (top, bottom), (left, right)])
        y = torch.nn.functional.conv2d(t(padded), t(w), t(b), case["strides"], 0, case["dilation"], case["groups"]).numpy()
        return np.maximum(y, 0)
    full = torch.nn.functional.conv_transpose2d(t(x), t(w), None, case["strides"], 0, 0, case["groups"], case["dilation"]).numpy()
    full = np.pad(full, [(0, 0), (0, 0), (0, case["out_pad"][0]), (0, case["out_pad"][1])])
    return np.maximum(full[:, :, top:full.shape[2] - bottom, left:full.shape[3] - right] + b[:, None, None], 0)


@pytest.mark.parametrize("seed", range(16))
def test_random_convs_through_the_pipeline_match_float64(seed):
    """Conv / ConvTranspose + bias + Relu nodes of random shapes compiled whole (legalization, fusion of the epilogue,
    the packed kernels' schedules), against float64."""
    case = _random_conv_case(seed)
    rng = np.random.default_rng(seed)
    model, w, b = _conv_relu_model(case, rng)
    x = rng.standard_normal(case["shape"]).astype("f4")
    got = tvmrnn.compile(model, target="llvm", logs=False).run({"x": x})
    got = next(iter(got.values()))
    ref = _conv_relu_float64(case, x, w, b)
    assert got.shape == ref.shape, case
    assert _rel_err(got, ref) < 1e-5, case


@pytest.mark.parametrize("case", [
    dict(transposed=False, groups=2, c=2, o=64, k=[3, 3], strides=[1, 1], dilation=[1, 1], pads=[0, 1, 0, 1],
         out_pad=None, shape=(1, 2, 52, 96), symbolic=True),  # DeepFilterNet's encoder: 2 -> 64, a group per input
    dict(transposed=False, groups=64, c=64, o=64, k=[1, 3], strides=[1, 2], dilation=[1, 1], pads=[0, 1, 0, 1],
         out_pad=None, shape=(1, 64, 50, 96), symbolic=True),  # its depthwise convs, striding the bins
    dict(transposed=False, groups=1, c=192, o=48, k=[1, 1], strides=[1, 1], dilation=[1, 1], pads=[0, 0, 0, 0],
         out_pad=None, shape=(1, 192, 4, 40), symbolic=True, symbolic_axis=3),  # ddddocr's, its image width symbolic
    dict(transposed=False, groups=1, c=16, o=32, k=[2, 3], strides=[1, 2], dilation=[1, 2], pads=[0, 0, 0, 0],
         out_pad=None, shape=(1, 16, 5, 37), symbolic=True, symbolic_axis=3)])
def test_known_convs_match_float64(case):
    """Shapes whose schedule once failed TVM's checks (DeepFilterNet's grouped conv with its epilogue at a symbolic
    height), that read a phase split, or whose last tile's overhang reads clamped columns (tiles of a vector of
    channels over a symbolic width, no column padding), compiled whole."""
    rng = np.random.default_rng(7)
    model, w, b = _conv_relu_model(case, rng)
    x = rng.standard_normal(case["shape"]).astype("f4")
    got = next(iter(tvmrnn.compile(model, target="llvm", logs=False).run({"x": x}).values()))
    assert _rel_err(got, _conv_relu_float64(case, x, w, b)) < 1e-5


@pytest.mark.parametrize("rows", [7, "rows"])
def test_grouped_dense_matches_numpy(rows):
    """out[..., g, :] = x[..., g, :] @ B[g]: 16 groups of 32 -> 60 columns (padded to whole tiles), static and symbolic
    rows."""
    target = resolve_target("llvm")
    lanes = graph_cpu.vector_lanes(target)
    rng = np.random.default_rng(5)
    x_np, w_np = rng.standard_normal((1, 7, 16, 32)).astype("f4"), rng.standard_normal((16, 32, 60)).astype("f4")
    nb = graph_cpu.dense_block(60, lanes)
    x, wp = te.placeholder(_i64(1, rows, 16, 32)), te.placeholder(_i64(16 * -(-60 // nb), 32, nb))
    y = graph_cpu.dense_packed(x, wp, 60, lanes, groups=16)
    sch = graph_cpu.DensePacked().apply(te.create_prim_func([x, wp, y]), target, False)
    assert sch is not None
    got = _run(sch.mod["main"], target, [x_np, graph_cpu.pack_dense_weight(w_np, nb), np.zeros((1, 7, 16, 60), "f4")])
    assert _rel_err(got, np.einsum("btgi,gih->btgh", x_np.astype("f8"), w_np)) < 1e-5


@pytest.mark.parametrize("equation,order", [("btgi,gih->btgh", [0, 1, 2]), ("btgi,ghi->btgh", [0, 2, 1]),
                                            ("bti,ih->bth", [0, 1]), ("bi,hi->bh", [1, 0]), ("btgi,gih->bthg", None),
                                            ("bij,jk->bki", None), ("...i,ih->...h", None), ("bii,ih->bih", None)])
def test_einsums_that_are_linear_layers(equation, order):
    from tvmrnn.graph_pipeline import _grouped_linear_order

    assert _grouped_linear_order(equation) == order


def test_dense_rows_of_symbolic_dims_only_carry_no_bounds_check():
    """batch x steps rows (both symbolic, g2p-en's output head) are padded to whole tiles that read the last row again:
    no tile is bounds-checked (a check inside the reduction ran that head 2.4x slower)."""
    sch, _ = _dense(("batch", "steps"), 256, 74, resolve_target("llvm"))
    assert "T.where" not in sch.mod["main"].script()


def test_dense_rows_after_unit_dims_are_one_symbolic_dim():
    """Rows over [1, frames] (DeepFilterNet's batch before its frames) are the frames: padded to whole tiles, read
    without a division by the symbolic dim and with no bounds-checked tile (a copy dividing every row index by the
    frames ran its grouped linear layers 2.5x slower)."""
    script = _dense((1, "frames"), 96, 16, resolve_target("llvm"))[0].mod["main"].script()
    assert "T.where" not in script and "// frames" not in script and "% frames" not in script


def _lowered(func, target) -> str:
    mod = tvm.tirx.transform.BindTarget(target.with_host(target))(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}))
    return tvm.tirx.get_default_tir_pipeline(target)[0](mod)["main"].script()


def test_register_tiles_stay_on_the_stack_over_symbolic_extents():
    """A tile's accumulators are a constant buffer under 1 KB, which TVM's lowering puts on the stack (and LLVM then
    in registers), however symbolic the width or row count (ddddocr's are expressions of its image width); none is a
    heap workspace."""
    import re

    target = resolve_target("llvm")
    lanes = graph_cpu.vector_lanes(target)
    width = tvm.tirx.Var("image_width", "int64")
    ob = graph_cpu.channel_block(192, lanes)
    x, wp = te.placeholder(_i64(1, 48, 16, (width - 1) // 4 + 1)), te.placeholder(_i64(192 // ob, 48, 3, 3, ob))
    y = graph_cpu.conv2d_packed(x, wp, [1, 1], [1] * 4, [1, 1], lanes)
    conv = graph_cpu.ConvPacked().apply(te.create_prim_func([x, wp, y, width]), target, False)
    dense, _ = _dense(((width - 1) // 8 + 1,), 1024, 8210, target, width)
    for sch, tile in ((conv, graph_cpu.CONV_BLOCK), (dense, graph_cpu.DENSE_BLOCK)):
        text = _lowered(sch.mod["main"], target)
        sizes = re.findall(rf"{tile}\w* = T.alloc_buffer\(\((\d+),\)", text)
        assert sizes and all(4 * int(s) < 1024 for s in sizes), (tile, sizes, re.findall(rf"{tile}\w* = T.alloc\w*\(.*", text))
        assert "alloc_local" not in text


def test_a_tile_of_channels_stores_its_outputs_along_the_rows():
    """A tile of a vector of channels (ddddocr's 48 -> 192 3x3 conv over its image width) writes its epilogue to a stack
    buffer laid out channels-innermost and copies that out column after column, not lane by lane across the NCHW rows;
    the result is torch's at widths that end in whole, part and single-column tiles."""
    import re

    import torch

    target = resolve_target("llvm")
    lanes = graph_cpu.vector_lanes(target)
    ob = graph_cpu.channel_block(192, lanes)
    x, wp, b = te.placeholder(_i64(1, 48, 4, "w")), te.placeholder(_i64(192 // ob, 48, 3, 3, ob)), te.placeholder(_i64(192))
    y = graph_cpu.conv2d_packed(x, wp, [1, 1], [1] * 4, [1, 1], lanes)
    out = te.compute(y.shape, lambda n, k, i, j: te.max(y[n, k, i, j] + b[k], 0.0), name="relu")
    assert not int(y.op.input_tensors[0].op.attrs["vector_columns"])  # conv_crop's input: the tile of channels
    sch = graph_cpu.ConvPacked().apply(te.create_prim_func([x, wp, b, out]), target, False)
    assert re.search(r"relu\[v0, v1, v2, v3\] = relu_global\[v0, v2, v3, v1\]", sch.mod["main"].script())
    rng = np.random.default_rng(6)
    w_np, b_np = rng.standard_normal((192, 48, 3, 3)).astype("f4"), rng.standard_normal(192).astype("f4")
    for width in (1, 7, 40):
        x_np = rng.standard_normal((1, 48, 4, width)).astype("f4")
        ref = torch.nn.functional.conv2d(torch.from_numpy(x_np).double(), torch.from_numpy(w_np).double(),
                                         torch.from_numpy(b_np).double(), 1, 1).relu().numpy()
        got = _run(sch.mod["main"], target, [x_np, graph_cpu.pack_conv_weight(w_np, ob), b_np, np.zeros(ref.shape, "f4")])
        assert _rel_err(got, ref) < 1e-5, width


def test_crnn_builds_for_cuda_without_a_gpu(tmp_path):
    model, _ = build("captcha-crnn")
    compiled = tvmrnn.compile(model, target="cuda", logs=False)
    assert compiled.export(tmp_path / "m.so")


def _first_rule(f, target) -> str:
    from tvmrnn.graph_pipeline import _schedule_rules

    return next(type(r).__name__ for r in _schedule_rules(target) if r.apply(f, target, False) not in (None, []))


def _graph_functions(mod, target) -> dict:
    from tvmrnn.graph_pipeline import fuse_passes

    with target:
        mod = tvm.transform.Sequential(fuse_passes(target))(mod)
    return {gv.name_hint: f for gv, f in mod.functions_items() if isinstance(f, tvm.tirx.PrimFunc)
            and not (f.attrs or {}).get("tirx.is_scheduled", False)}


@pytest.mark.parametrize("name", ["captcha-crnn", "dense-head"])
def test_cuda_convs_and_dense_layers_get_dlight_matmul(name):
    """On CUDA every large conv and GEMM (with its fused epilogue) is tiled by dlight's Matmul rule (shared-memory
    reindexed operands, register tiles), not its Fallback's one-thread-per-output loops; one of few outputs goes to
    FewOutputReduction (one block per output)."""
    from tvm.s_tir import dlight as dl

    from schedules.graph_cuda import few_output_reduction

    model, _ = build(name)
    target = resolve_target("nvidia/nvidia-h100")
    heavy = {n: f for n, f in _graph_functions(_relax(model, target), target).items() if "conv2d" in n or "matmul" in n}
    assert heavy
    for fname, f in heavy.items():
        rule = _first_rule(f, target)
        assert rule == ("FewOutputReduction" if few_output_reduction(f) else "Matmul"), (fname, rule)
        sch = dl.gpu.Matmul().apply(f, target, False)
        assert sch is not None and "reindex" in sch.mod.script() and "scope=\"shared\"" in sch.mod.script(), fname


def _conv1d_model(c, length, o, k, stride, pad, seed=0, epilogue=True, batch=1):
    """Conv (with bias and Relu, or alone: Silero's STFT has neither) over [batch, c, length]; batch may be a name."""
    rng = np.random.default_rng(seed)
    w = onnx.numpy_helper.from_array(rng.standard_normal((o, c, k)).astype(np.float32), "W")
    b = onnx.numpy_helper.from_array(rng.standard_normal(o).astype(np.float32), "B")
    conv = onnx.helper.make_node("Conv", ["x", "W", "B"] if epilogue else ["x", "W"], ["c" if epilogue else "y"],
                                 strides=[stride], pads=[pad, pad], kernel_shape=[k])
    graph = onnx.helper.make_graph(
        [conv, onnx.helper.make_node("Relu", ["c"], ["y"])] if epilogue else [conv], "conv1d",
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [batch, c, length])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)], [w, b])
    return onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)], ir_version=9)


# Silero VAD's STFT and encoder convs (a chunk of 4 frames), and one with many outputs
SMALL_CONVS = [(1, 640, 258, 256, 128, 0), (129, 4, 128, 3, 1, 1), (128, 4, 64, 3, 2, 1), (64, 2, 128, 3, 1, 1)]
LARGE_CONV = (64, 512, 128, 3, 1, 1)


def test_cuda_convs_of_few_outputs_get_one_block_per_output():
    """A batch-1 conv over a few frames goes to FewOutputReduction on CUDA (and builds through NVRTC); a conv with many
    outputs stays with dlight's Matmul."""
    target = resolve_target("nvidia/nvidia-h100")
    for shape in SMALL_CONVS + [LARGE_CONV]:
        model = _conv1d_model(*shape)
        rules = {_first_rule(f, target) for n, f in _graph_functions(_relax(model, target), target).items() if "conv1d" in n}
        assert rules == {"Matmul" if shape == LARGE_CONV else "FewOutputReduction"}, (shape, rules)
    assert tvmrnn.compile(_conv1d_model(*SMALL_CONVS[0]), target="cuda", logs=False)


def _conv_rules(model, target, max_dims=None) -> set:
    """The rules that take the model's conv functions, main's symbolic dims bounded by max_dims as compile does."""
    from tvmrnn.cuda_graph import annotate
    from tvmrnn.graph_pipeline import dim_bounds_to_kernels, fuse_passes

    mod = annotate(_relax(model, target), max_dims or {})
    with target:
        mod = dim_bounds_to_kernels(tvm.transform.Sequential(fuse_passes(target))(mod))
    return {_first_rule(f, target) for gv, f in mod.functions_items() if "conv1d" in gv.name_hint}


def test_cuda_conv_without_epilogue_and_of_bounded_batch_gets_one_block_per_output():
    """Silero's STFT conv (no bias, no activation: GeneralReduction wants an injective block after the reduction, so
    the rule adds a copy) and its batch of chunks: a symbolic batch counts at its bound, and without a bound the
    conv stays with Matmul's tiles (the batch may be large)."""
    target = resolve_target("nvidia/nvidia-h100")
    stft = SMALL_CONVS[0]
    assert _conv_rules(_conv1d_model(*stft, epilogue=False), target) == {"FewOutputReduction"}
    chunks = _conv1d_model(*stft, epilogue=False, batch="chunks")
    assert _conv_rules(chunks, target, {"chunks": 8}) == {"FewOutputReduction"}
    assert _conv_rules(chunks, target, {"chunks": 64}) == {"Matmul"}  # 64 x 258 x 4 outputs: too many for a block each
    assert _conv_rules(chunks, target) == {"Matmul"}
    assert tvmrnn.compile(chunks, target="cuda", logs=False, max_dims={"chunks": 8})


@pytest.mark.gpu
@pytest.mark.parametrize("shape", SMALL_CONVS + [LARGE_CONV], ids=str)
def test_cuda_small_convs_match_onnxruntime(shape):
    model = _conv1d_model(*shape, seed=3)
    feeds = {"x": np.random.default_rng(4).standard_normal((1, shape[0], shape[1])).astype(np.float32)}
    ours = tvmrnn.compile(model, target="cuda", logs=False).run(feeds)
    assert _rel_err(list(ours.values())[0], _ort(model, feeds)[0]) < 1e-5


@pytest.mark.gpu
@pytest.mark.parametrize("chunks", [1, 3, 8])
def test_cuda_conv_without_epilogue_of_bounded_batch_matches_onnxruntime(chunks):
    model = _conv1d_model(*SMALL_CONVS[0], seed=5, epilogue=False, batch="chunks")
    module = tvmrnn.compile(model, target="cuda", logs=False, max_dims={"chunks": 8})
    feeds = {"x": np.random.default_rng(chunks).standard_normal((chunks, 1, SMALL_CONVS[0][1])).astype(np.float32)}
    assert _rel_err(list(module.run(feeds).values())[0], _ort(model, feeds)[0]) < 1e-5


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["captcha-crnn", "dense-head", "lstm150-b1", "vgg-crnn"])
def test_model_matches_onnxruntime_on_cuda(name):
    model, feeds = build(name)
    ours = tvmrnn.compile(model, target="cuda", logs=False).run(feeds)
    for got, ref in zip(ours.values(), _ort(model, feeds)):
        assert _rel_err(got, ref) < 1e-4


def test_pipeline_takes_a_tuning_database():
    """`database=` puts MetaScheduleApplyDatabase before the default rules; an empty one leaves them every function."""
    from tvm import relax
    from tvm.s_tir import meta_schedule as ms

    from tvmrnn.graph_pipeline import graph_pipeline

    model, feeds = build("dense-head")
    target = resolve_target("llvm")
    mod = relax.transform.FoldConstant()(_relax(model, target))
    ex = tvm.compile(mod, target=target, relax_pipeline=graph_pipeline(target, database=ms.database.MemoryDatabase()))
    vm = relax.VirtualMachine(ex, tvm.cpu())
    out = vm["main"](*[tvm.runtime.tensor(v) for v in feeds.values()])
    out = out[0] if not isinstance(out, tvm.runtime.Tensor) else out
    assert _rel_err(out.numpy(), _ort(model, feeds)[0]) < 1e-4


def _tiny_conv_dense():
    """Conv -> ReLU -> MaxPool -> Linear: a graph with no recurrent layer, small enough to tune in a few trials."""
    import torch

    from graph_cases import _export

    nn = torch.nn
    net = nn.Sequential(nn.Conv2d(1, 4, 3, 1, 1), nn.ReLU(), nn.MaxPool2d(2, 2), nn.Flatten(), nn.Linear(4 * 4 * 6, 10))
    return _export(torch, net, (1, 1, 8, 12), True)


def _tune_then_compile(tmp_path, target):
    """`tvmrnn tune` extracts the graph functions (conv, pool, dense), writes their records next to the recurrent ones,
    and compile runs them tuned (its metadata names them) with the same answers."""
    import onnx
    from click.testing import CliRunner

    from tvmrnn.cli import main
    from tvmrnn.tuning.logs import target_name

    model, feeds = _tiny_conv_dense()
    path, logs = tmp_path / "tiny.onnx", tmp_path / "logs"
    onnx.save(model, path)
    res = CliRunner().invoke(main, ["tune", str(path), "--target", target, "--trials", "4", "--logs", str(logs)])
    assert res.exit_code == 0, res.output
    folder = logs / target_name(resolve_target(target))
    assert (folder / "graph_tuning_record.json").read_text().splitlines(), res.output
    assert "[graph 2/2]" in res.output and "trials, best" in res.output
    compiled = tvmrnn.compile(model, target=target, logs=logs)
    tuned = compiled.metadata["graph_tuned"]
    assert any("conv2d" in n for n in tuned), tuned
    got = compiled.run(feeds)
    assert _rel_err(next(iter(got.values())), _ort(model, feeds)[0]) < 1e-4


def test_tune_writes_graph_records_that_compile_applies(tmp_path):
    _tune_then_compile(tmp_path, "llvm")


@pytest.mark.gpu
def test_tune_writes_graph_records_that_compile_applies_on_cuda(tmp_path):
    _tune_then_compile(tmp_path, "cuda")


def test_bench_model_columns_on_this_machine(tmp_path):
    """The PyTorch factory gives the architecture a graph case's file was exported from; a GPU run's ONNX Runtime
    column says it is missing where onnxruntime has no CUDA provider (never times its CPU provider as the GPU's)."""
    import onnx
    import torch

    from graph_cases import torch_net
    from tvmrnn import bench

    model, feeds = build("lstm150-b1")
    path = tmp_path / "lstm150-b1.onnx"
    onnx.save(model, path)
    assert bench.load_torch_factory("graph_cases:torch_net") is torch_net
    assert torch_net(str(tmp_path / "other.onnx")) is None
    with torch.no_grad():
        out = torch_net(str(path))(torch.from_numpy(feeds["x"]))
    assert tuple(out.shape) == _ort(model, feeds)[0].shape
    sess, missing = bench._ort_session(model, gpu=True)
    if "CUDAExecutionProvider" in ort.get_available_providers():
        assert sess is not None and missing is None
    else:
        assert sess is None and "no CUDA provider" in missing
    with pytest.raises(ValueError, match="MODULE:FACTORY"):
        bench.load_torch_factory("graph_cases")


def _magnitude_model():
    """sqrt(re^2 + im^2) over a [1, 258, 4] tensor's halves, as Silero's STFT computes its magnitude."""
    from onnx import TensorProto, helper, numpy_helper

    two = numpy_helper.from_array(np.array(2.0, np.float32), "two")
    half = [numpy_helper.from_array(np.array(v, np.int64), n) for v, n in
            (([0], "s0"), ([129], "e0"), ([129], "s1"), ([258], "e1"), ([1], "axis"))]
    nodes = [helper.make_node("Slice", ["x", "s0", "e0", "axis"], ["re"]), helper.make_node("Slice", ["x", "s1", "e1", "axis"], ["im"]),
             helper.make_node("Pow", ["re", "two"], ["re2"]), helper.make_node("Pow", ["im", "two"], ["im2"]),
             helper.make_node("Add", ["re2", "im2"], ["sum"]), helper.make_node("Sqrt", ["sum"], ["y"])]
    graph = helper.make_graph(nodes, "magnitude", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 258, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 129, 4])], [two, *half])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)


def test_whole_powers_are_products_on_cuda():
    """x ** 2 compiles to x * x, not powf: TVM builds CUDA with --use_fast_math, where powf(x, 2) is exp2(2 * log2(x)),
    NaN for every negative x (Silero's STFT magnitude was NaN on the H100)."""
    model = _magnitude_model()
    source = cuda_sources(tvmrnn.compile(model, target="nvidia/nvidia-h100", logs=False))
    assert "sqrtf(" in source and "powf(" not in source


def test_whole_powers_of_negatives_match_onnxruntime_on_llvm():
    model = _magnitude_model()
    feeds = {"x": -np.abs(np.random.default_rng(0).standard_normal((1, 258, 4))).astype(np.float32)}
    (got,) = tvmrnn.compile(model, target="llvm", logs=False).run(feeds).values()
    assert _rel_err(got, _ort(model, feeds)[0]) < 1e-6


def test_constant_relayouts_fold_with_numpy_as_fold_constant_folds_them():
    """fold_relayouts leaves no op of constants it folds (a conv bias's reshape, a weight's transpose, a cast,
    broadcast arithmetic) and gives what TVM's FoldConstant gives; a strided slice it leaves to FoldConstant."""
    from tvm import relax

    from tvmrnn.fold import fold_relayouts

    rng = np.random.default_rng(3)
    w, b, s = (relax.const(rng.standard_normal(shape).astype("f4")) for shape in ((8, 6), (6,), (2, 4)))
    x = relax.Var("x", relax.TensorType((3, 8), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            wt = bb.emit(relax.op.permute_dims(relax.op.reshape(w, (6, 8))))
            bias = bb.emit(relax.op.add(relax.op.multiply(relax.op.expand_dims(b, [0]), relax.const(np.float32(2))), b))
            cut = bb.emit(relax.op.strided_slice(s, [1], [0], [2]))
            y = bb.emit(relax.op.add(relax.op.matmul(x, wt), relax.op.astype(relax.op.reshape(bias, (1, 6)), "float32")))
            out = bb.emit_output(relax.Tuple([y, cut]))
        bb.emit_func_output(out)
    mod = bb.get()
    folded = fold_relayouts(mod)
    ops = {c.op.name for c in _calls(folded["main"])}
    assert ops == {"relax.matmul", "relax.add", "relax.strided_slice"}, ops
    tvm.ir.assert_structural_equal(relax.transform.FoldConstant()(folded), relax.transform.FoldConstant()(mod))


def _calls(func):
    found = []
    tvm.relax.analysis.post_order_visit(func, lambda e: found.append(e) if isinstance(e, tvm.relax.Call) else None)
    return found


def _depthwise_1x1_model(channels=64, multiplier=2, stride=(1, 2)):
    """x [1, C, S, 8] -> Conv(1x1, group C, C x multiplier outputs, bias): DeepFilterNet3's ERB decoder's pointwise convs."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(5)
    out = channels * multiplier
    w = numpy_helper.from_array(rng.standard_normal((out, 1, 1, 1)).astype("f4"), "w")
    b = numpy_helper.from_array(rng.standard_normal(out).astype("f4"), "b")
    conv = helper.make_node("Conv", ["x", "w", "b"], ["y"], group=channels, kernel_shape=[1, 1], strides=list(stride))
    graph = helper.make_graph([conv], "pointwise", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, channels, "S", 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [w, b])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)


def _one_feature_linear_model():
    """x [S, 1] @ W [1, 16] + b: a linear layer of one input feature (a forecaster's first layer)."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(7)
    w, b = (numpy_helper.from_array(rng.standard_normal(s).astype("f4"), n) for s, n in (((1, 16), "w"), ((16,), "b")))
    nodes = [helper.make_node("MatMul", ["x", "w"], ["xw"]), helper.make_node("Add", ["xw", "b"], ["y"])]
    graph = helper.make_graph(nodes, "linear1", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["S", 1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [w, b])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)


UNIT_REDUCTIONS = {"depthwise 1x1 conv": (_depthwise_1x1_model, (1, 64, 5, 8), "pointwise_conv2d", "group_conv2d"),
                   "depthwise 1x1 conv, x2 strided": (lambda: _depthwise_1x1_model(multiplier=2, stride=(1, 2)),
                                                      (1, 64, 5, 8), "pointwise_conv2d", "group_conv2d"),
                   "one-feature linear": (_one_feature_linear_model, (9, 1), "outer_matmul", "matmul")}


@pytest.mark.parametrize("case", ["depthwise 1x1 conv", "one-feature linear"])
def test_unit_reductions_are_products_on_cuda(case):
    """A depthwise 1x1 conv and a matmul over one feature lower to broadcast products on CUDA: TVM's reduction over
    unit extents, its bias inlined by dlight's fallback into both its init and its update, added the bias twice."""
    build_model, _, ours, theirs = UNIT_REDUCTIONS[case]
    source = cuda_sources(tvmrnn.compile(build_model(), target="nvidia/nvidia-h100", logs=False))
    assert ours in source and f"{theirs}_" not in source.replace(ours, "")


@pytest.mark.gpu
@pytest.mark.parametrize("case", list(UNIT_REDUCTIONS))
def test_unit_reductions_match_onnxruntime_on_cuda(case):
    build_model, shape, _, _ = UNIT_REDUCTIONS[case]
    model = build_model()
    feeds = {"x": np.random.default_rng(6).standard_normal(shape).astype(np.float32)}
    (got,) = tvmrnn.compile(model, target="cuda", logs=False).run(feeds).values()
    assert _rel_err(got, _ort(model, feeds)[0]) < 1e-6


@pytest.mark.parametrize("activation", ["sigmoid", "tanh"])
def test_a_pointwise_activation_after_a_reshape_moves_into_its_producer(activation):
    """Linear -> Reshape -> activation (a head as torch exports it): on CUDA the activation moves before the reshape
    (graph_pipeline.pointwise_before_reshape) and fuses into the matmul's kernel; the rewritten function computes the
    same values (both built for the CPU here)."""
    from tvm import relax

    from tvmrnn.graph_pipeline import pointwise_before_reshape

    weight = np.random.default_rng(0).standard_normal((6, 10)).astype("float32")
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((4, 6), "float32"))
    with bb.function("main", [x]):
        y = bb.emit(relax.op.matmul(x, relax.const(weight)))
        out = bb.emit(getattr(relax.op, activation)(bb.emit(relax.op.reshape(y, (2, 20)))))
        bb.emit_func_output(out)
    before = bb.get()
    after = pointwise_before_reshape(before)
    script = after["main"].script()
    assert f"R.{activation}(" in script and script.index(f"R.{activation}(") < script.index("R.reshape("), script
    feed = np.random.default_rng(1).standard_normal((4, 6)).astype("float32")
    outs = [relax.VirtualMachine(tvm.compile(m, target="llvm"), tvm.cpu())["main"](tvm.runtime.tensor(feed)).numpy()
            for m in (before, after)]
    np.testing.assert_allclose(outs[1], outs[0], rtol=1e-6)
    cuda = tvmrnn.compile(_head_model(activation), target="cuda", logs=False).executable.as_text()
    kernels = [line.split()[1] for line in cuda[cuda.index("@main_whole_call:"):].split("\n\n")[0].splitlines()
               if line.strip().startswith("call") and "builtin" not in line and "shape_func" not in line]
    assert any(activation in k and "matmul" in k for k in kernels), kernels


def _head_model(activation: str) -> onnx.ModelProto:
    from onnx import TensorProto, helper, numpy_helper

    weight = numpy_helper.from_array(np.ones((6, 10), np.float32), "w")
    shape = numpy_helper.from_array(np.array([2, 20], np.int64), "shape")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["y"]), helper.make_node("Reshape", ["y", "shape"], ["r"]),
             helper.make_node(activation.capitalize(), ["r"], ["out"])]
    graph = helper.make_graph(nodes, "head", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 6])],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, [2, 20])], [weight, shape])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
