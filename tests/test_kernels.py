"""The recurrent kernels alone, called with outputs poisoned (NaN) first, so any element a kernel fails to write shows.

Cases use no bias and no peepholes, so the kernel's inputs are plain: XW = X @ W^T for all steps
and directions, R as ONNX lays it out (or transposed, as the kernel asks). Padded steps
(sequence_lens) must come out as zeros, and repeated runs must agree to the last bit.
"""

from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest
import tvm

from compiled import target_of
from onnx_cases import Case
from schedules import cooperative, plan_kernel, point_kernel, recurrent_kernel, step_sync
from schedules.cells import cell_for
from schedules.device import Device
from schedules.recurrent_common import PANEL
from schedules.space import KernelConfig, default_config, knob_space
from tvmrnn.frontend.inspect import find_rnn_layers

TARGETS = [pytest.param(("llvm", "auto"), id="llvm")] + [
    pytest.param(("cuda", choice), id=f"cuda-{choice}", marks=pytest.mark.gpu)
    for choice in ("stepwise", "persistent", "tiled", "persistent_mma", "auto")]
CASES = [
    Case(op="LSTM", direction="bidirectional", optional=("sequence_lens", "initial_h", "initial_c"), hidden=24, input_size=7),
    Case(op="GRU", direction="reverse", optional=("sequence_lens", "initial_h"), hidden=33, input_size=5, layout=1),
    Case(op="GRU", direction="bidirectional", optional=("sequence_lens",), hidden=16, input_size=3),
    Case(op="RNN", direction="forward", optional=("sequence_lens",), hidden=130, input_size=9),
]


def _lay_out_r(R, layout, gates):
    """ONNX's R [D, G*H, H] as a kernel of this layout reads it (schedules.recurrent_common's docstring)."""
    if layout == "rows":
        return R
    if layout == "transposed":
        return R.transpose(0, 2, 1).copy()
    D, H = R.shape[0], R.shape[2]
    padded = -(-H // PANEL) * PANEL  # the last panel's missing units: zero rows
    R = np.pad(R.reshape(D, gates, H, H), ((0, 0), (0, 0), (0, padded - H), (0, 0)))
    return R.reshape(D, gates, padded // PANEL, PANEL, H).transpose(0, 2, 4, 1, 3).copy()


@pytest.mark.parametrize("kind", TARGETS)
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c.op}-{c.direction}-layout{c.layout}")
def test_kernel_writes_every_element(kind, case):
    kind, choice = kind
    target = target_of(kind)
    spec = case.spec()
    kernel = recurrent_kernel(spec, cell_for(spec), target, choice)
    # batches 3 and 5/40 take auto's persistent and stepwise branches (these layers are below TILED_MIN_HIDDEN; cuda-tiled runs tiled)
    _check_kernel(kind, case, spec, kernel.func, kernel.r_layout, batches=(5, 40, 3))


def _kind_and_spec(kind, spec):
    """'mma-fp16' -> ("mma", the layer in fp16); '-tf32': fp32 with precision tf32; no suffix: as the case has it
    (exact fp32: the tensor-core kinds run 3xTF32)."""
    kind, _, math = kind.partition("-")
    if math == "fp16":
        spec = dataclasses.replace(spec, dtype="float16")
    elif math == "tf32":
        spec = dataclasses.replace(spec, dtype="float32", precision="tf32")
    return kind, spec


TENSOR_KINDS = ["mma", "mma-fp16", "mma-tf32", "persistent_mma", "persistent_mma-fp16", "persistent_mma-tf32"]


@pytest.mark.parametrize("units, rows, hidden", [(8, 1, 64), (16, 4, 64), (32, 1, 64), (64, 2, 64), (16, 1, 40),
                                                  (48, 1, 40), (48, 4, 40)])
def test_cpu_kernel_reads_r_in_panels(units, rows, hidden):
    """The CPU kernel reads R in panels of 16 units (half a panel at 8 units a work item, several at 32 and 64; at
    H=40 the last panel padded, whose item runs the gate program on 8 units or, at 48 a work item, 40), against
    float64 with poisoned outputs."""
    from schedules.recurrent_cpu import r_layout

    case = Case(op="LSTM", direction="bidirectional", optional=("sequence_lens", "initial_h"), hidden=hidden, input_size=5)
    spec = case.spec()
    assert r_layout(spec) == "panels"
    func = point_kernel(spec, cell_for(spec), target_of("llvm"), KernelConfig.of("cpu", rows=rows, units=units))
    _check_kernel("llvm", case, spec, func, "panels", batches=(3, 5), note=f"units={units} rows={rows}")


def test_cpu_row_tiles_take_the_widest_units_whose_accumulators_fit():
    """At batch >= ROW_TILE the CPU default takes 16 units per work item for an LSTM (4 rows x 4 gates x 16 = 256
    accumulator floats) and 32 for a GRU or an RNN (384 and 128), narrower where H needs it; the GRU's point against
    float64 with poisoned outputs, a partial row tile among its batches."""
    from schedules.recurrent_cpu import row_tile_units

    assert (row_tile_units(800, 4), row_tile_units(800, 3), row_tile_units(800, 1), row_tile_units(48, 3)) == (16, 32, 32, 16)
    case = Case(op="GRU", hidden=64, input_size=5, optional=("initial_h",))
    spec = case.spec()
    config = default_config("cpu", spec, cell_for(spec), target_of("llvm"), batch=20)
    assert dict(config.knobs) == {"rows": 4, "units": 32, "serpentine": 1}
    _check_kernel("llvm", case, spec, point_kernel(spec, cell_for(spec), target_of("llvm"), config), "panels", batches=(6, 9),
                  note=config.describe())


@pytest.mark.parametrize("op, units", [("GRU", 32), ("LSTM", 16)])
def test_cpu_batches_below_a_row_tile_run_one_tile_of_their_rows(op, units):
    """Batch 1 runs single rows; batches 2 and 3 each a branch of one tile of exactly their rows (one read of R a step
    for every row, as wide as a tile of 4 rows is); then tiles of 4. The rows=3 point against float64 with poisoned
    outputs at batches 2 (a partial tile), 3 (a whole one) and 5."""
    case = Case(op=op, hidden=64, input_size=5, optional=("initial_h",))
    spec = find_rnn_layers(case.model())[0].spec
    plan = plan_kernel(spec, cell_for(spec), target_of("llvm"))
    assert [(b.up_to, b.config["rows"]) for b in plan.branches] == [(1, 1), (2, 2), (3, 3), (None, 4)], plan.describe()
    three = plan.branch_at(3).config
    assert dict(three.knobs) == {"rows": 3, "units": units, "serpentine": 1}
    _check_kernel("llvm", case, spec, point_kernel(spec, cell_for(spec), target_of("llvm"), three), "panels",
                  batches=(2, 3, 5), note=three.describe())


def test_cpu_lstm_takes_five_rows_where_they_make_fewer_whole_tiles():
    """An LSTM's default row tile is 5 rows where 5 divides the batch into fewer tiles than 4 rows do (batch 20: four
    passes over each item's weights, not five), 4 elsewhere and for a GRU at 32 units (480 accumulator floats); the
    5-row point against float64, outputs poisoned, at batches of whole and partial tiles."""
    from schedules.recurrent_cpu import row_tile_rows

    assert [row_tile_rows(b, 4, 16) for b in (20, 10, 15, 8, 16, 40, None)] == [5, 5, 5, 4, 4, 5, 4]
    assert row_tile_rows(20, 3, 32) == 4 and row_tile_rows(20, 4, 8) == 5
    case = Case(op="LSTM", hidden=64, input_size=5, optional=("initial_h", "initial_c"))
    spec = case.spec()
    config = default_config("cpu", spec, cell_for(spec), target_of("llvm"), batch=20)
    assert dict(config.knobs) == {"rows": 5, "units": 16, "serpentine": 1}
    _check_kernel("llvm", case, spec, point_kernel(spec, cell_for(spec), target_of("llvm"), config), "panels", batches=(10, 7),
                  note=config.describe())


@pytest.mark.parametrize("build_threads", [1, 2, 3, 8])
def test_cpu_serpentine_order_is_correct_whatever_the_pool(monkeypatch, build_threads):
    """With serpentine each thread takes its share of a phase's items in reverse every other step, the shares as the
    build sees the pool; where the pool that runs it has another size the order differs, the result may not: against
    float64 with poisoned outputs over 9 steps (odd and even), a bidirectional layer with lengths (padded steps)."""
    monkeypatch.setenv("TVM_NUM_THREADS", str(build_threads))
    case = Case(op="LSTM", direction="bidirectional", optional=("sequence_lens", "initial_h"), hidden=64, input_size=5)
    spec = case.spec()
    func = point_kernel(spec, cell_for(spec), target_of("llvm"), KernelConfig.of("cpu", rows=2, units=16, serpentine=1))
    assert "if_then_else" in func.script() or "T.if_then_else" in func.script()
    _check_kernel("llvm", case, spec, func, "panels", batches=(3, 5), note=f"serpentine, built for {build_threads} threads")


def test_cpu_kernel_with_one_work_item_runs_on_the_calling_thread():
    """A static-shape point whose phases have one work item (batch 1 in a 4-row tile, all 32 units in one chunk: a tuner
    sample) has no parallel loop once TVM simplifies it; it builds without the thread-pool launch and stays correct."""
    case = Case(op="LSTM", hidden=32, input_size=8, optional=("sequence_lens",))
    spec = case.spec()
    func = point_kernel(spec, cell_for(spec), target_of("llvm"), KernelConfig.of("cpu", rows=4, units=32), seq=9, batch=1)
    _check_kernel("llvm", case, spec, func, "panels", batches=(1,))


def test_cpu_kernel_takes_the_pool_only_for_a_batch_that_pays():
    """A kernel built for any batch tests a step's work at run time: TVM's pool (one launch, a barrier per phase) from
    2^18 multiply-adds a step (an LSTM at H=128: 4 rows), the calling thread below; both against float64 with
    poisoned outputs."""
    from schedules.device import MIN_PARALLEL_STEP_WORK
    from schedules.recurrent_cpu import r_layout

    case = Case(op="LSTM", hidden=128, input_size=5, optional=("initial_h", "initial_c"))
    spec = find_rnn_layers(case.model())[0].spec
    kernel = recurrent_kernel(spec, cell_for(spec), target_of("llvm"))
    script = kernel.func.script()
    assert "pragma_parallel_launch_point" in script and str(MIN_PARALLEL_STEP_WORK) in script
    _check_kernel("llvm", case, spec, kernel.func, r_layout(spec), batches=(1, 17), steps=3)


def test_cpu_kernel_whose_one_row_step_pays_takes_the_pool_untested():
    """Where one batch row's step is already 2^18 multiply-adds (ddddocr's bidirectional LSTM(512)), every batch takes
    the pool and the kernel holds no run-time test (whose batch-0 branch made TVM fold a division by zero)."""
    from schedules.device import MIN_PARALLEL_STEP_WORK
    from schedules.recurrent_cpu import r_layout

    case = Case(op="LSTM", hidden=512, input_size=8, direction="bidirectional", optional=("initial_h", "initial_c"))
    spec = find_rnn_layers(case.model())[0].spec
    kernel = recurrent_kernel(spec, cell_for(spec), target_of("llvm"))
    script = kernel.func.script()
    assert "pragma_parallel_launch_point" in script and str(MIN_PARALLEL_STEP_WORK) not in script
    _check_kernel("llvm", case, spec, kernel.func, r_layout(spec), batches=(1,), steps=2)


@pytest.mark.parametrize("op, hidden", [("LSTM", 64), ("GRU", 24)])
def test_cpu_kernel_reads_half_r_exactly(op, hidden):
    """An fp16 layer's R stays fp16 in the CPU kernel (half the bytes a step reads) and is widened where it is read: the
    weights are exact in fp32, so the result matches float64 to fp32's tolerance, not half precision's (panels at H=64,
    R^T at 24)."""
    from schedules.recurrent_cpu import r_layout

    case = Case(op=op, direction="bidirectional", optional=("sequence_lens", "initial_h"), hidden=hidden, input_size=5, dtype="float16")
    spec = case.spec()
    assert spec.dtype == "float16"
    kernel = recurrent_kernel(spec, cell_for(spec), target_of("llvm"))
    assert "float16" in kernel.func.script()  # R's argument in the storage dtype
    _check_kernel("llvm", case, spec, kernel.func, r_layout(spec), batches=(1, 5), tol=(1e-4, 1e-5))


@pytest.mark.gpu
@pytest.mark.parametrize("case", CASES[:2], ids=lambda c: f"{c.op}-{c.direction}-layout{c.layout}")
@pytest.mark.parametrize("kind", ["stepwise", "persistent", "tiled"] + TENSOR_KINDS)
def test_sampled_points_are_correct(kind, case):
    """Every point of a space must be a correct kernel (the tuner may pick any): three per kind, fixed seed."""
    target = target_of("cuda")
    kind, spec = _kind_and_spec(kind, case.spec())
    case = dataclasses.replace(case, dtype=spec.dtype)
    cell = cell_for(spec)
    space = knob_space(kind, spec, cell, target)
    rng = np.random.default_rng(len(kind) * 7 + spec.hidden_size)
    for _ in range(3):
        config = KernelConfig.of(kind, **{k: int(rng.choice(v)) for k, v in space.items()})
        func = point_kernel(spec, cell, target, config)  # symbolic seq and batch
        _check_kernel("cuda", case, spec, func, "rows", batches=(6, 37), note=config.describe())


# about 18 NVRTC builds a case: the second case (GRU, layout 1) runs with the slow ones
@pytest.mark.parametrize("case", [CASES[0], pytest.param(CASES[1], marks=pytest.mark.slow)],
                         ids=lambda c: f"{c.op}-{c.direction}-layout{c.layout}")
def test_cuda_points_build_without_a_gpu(case):
    """What the tuner may pick compiles for CUDA through NVRTC (no GPU needed): each CUDA kind's default
    point and two sampled ones, with odd hidden sizes (partial k-chunks, unit and row tiles)."""
    target = tvm.target.Target({"kind": "cuda", "arch": "sm_90"})
    rng = np.random.default_rng(11)
    for kind in ["stepwise", "persistent", "tiled"] + TENSOR_KINDS:
        kind, spec = _kind_and_spec(kind, case.spec())
        cell = cell_for(spec)
        space = knob_space(kind, spec, cell, target)
        configs = [default_config(kind, spec, cell, target, 6)]
        configs += [KernelConfig.of(kind, **{k: int(rng.choice(v)) for k, v in space.items()}) for _ in range(2)]
        for config in configs:
            src = tvm.tirx.build(point_kernel(spec, cell, target, config), target=target, pipeline=cooperative.register()).imports[0].inspect_source()
            assert "__global__" in src, config.describe()
            if "mma" in kind:  # 3xTF32 issues three TF32 mma's per tile, f16x3 (halves) three fp16 ones: never plain TF32
                assert ("m16n8k16" in src) == (spec.dtype == "float16" or bool(dict(config.knobs).get("halves"))), config.describe()


@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_streaming_points_build_without_a_gpu(dtype):
    """blog-a's layer (H=2560, R larger than the H100's shared memory): the default at batch 64 and two sampled points
    of the streaming space compile through NVRTC as cooperative kernels that read part of R from global memory."""
    case = Case(op="LSTM", hidden=2560, input_size=8, dtype=dtype)
    spec = case.spec()
    cell, target, rng = cell_for(spec), tvm.target.Target({"kind": "cuda", "arch": "sm_90"}), np.random.default_rng(5)
    space = knob_space("persistent_mma", spec, cell, target)
    configs = [default_config("persistent_mma", spec, cell, target, 64)]
    configs += [KernelConfig.of("persistent_mma", **{k: int(rng.choice(v)) for k, v in space.items()}) for _ in range(2)]
    for config in configs:
        assert config["streamed"] > 0, config.describe()
        mod = tvm.tirx.build(point_kernel(spec, cell, target, config, 4, 64), target=target, pipeline=cooperative.register())
        assert "__global__" in mod.imports[0].inspect_source(), config.describe()


def _numpy_dtype(dtype):
    import ml_dtypes

    return ml_dtypes.bfloat16 if str(dtype) == "bfloat16" else str(dtype)


def _biases(cell, w, D, H):
    """B as [D, 2 (Wb, Rb), G, H] in fp32, zeros where the case has none."""
    return w["B"].astype("f4").reshape(D, 2, cell.gates, H) if "B" in w else np.zeros((D, 2, cell.gates, H), "f4")


def _folded_bias(cell, w, D, H):
    """What the projection adds to XW [.., D*G*H]: Wb, plus Rb of the gates where it folds (lowering does the same)."""
    b = _biases(cell, w, D, H)
    folded = np.isin(np.arange(cell.gates), cell.folded_rbias).astype("f4")[None, :, None]
    return (b[:, 0] + b[:, 1] * folded).reshape(-1)


def _cell_params(cell, w, D, H):
    """The kernel's params [D, NP, H] in cell.params order: GRU's Rb_h (linear_before_reset), or LSTM's peepholes."""
    if cell.params == ("Rb_h",):
        return np.ascontiguousarray(_biases(cell, w, D, H)[:, 1, 2:3])
    return w["P"].astype("f4").reshape(D, 3, H)


def _check_kernel(kind, case, spec, func, r_layout, batches, note="", tol=None, steps=9):
    """Run a recurrent PrimFunc on fresh inputs per batch (seeded: the same every call), outputs poisoned, twice each;
    check against float64 (tol: (rtol, atol), else by the layer's math) and return the outputs of every batch.
    steps: the sequence length, or one per batch (the launches run in that order on one compiled module)."""
    cell = cell_for(spec)
    runs = []
    target = target_of(kind)
    lib = tvm.compile(tvm.IRModule({"main": func}), target=target, tir_pipeline=cooperative.register())
    dev = tvm.device("cpu" if kind == "llvm" else "cuda", 0)
    rng = np.random.default_rng(7)
    H, D = spec.hidden_size, spec.num_directions
    w = case.weights()
    # fresh inputs each time (a race shows as an error that moves)
    for trial, N in enumerate(batches):
        T = steps[trial] if isinstance(steps, tuple) else steps
        feeds = case.feeds(rng, T, N)
        x = feeds["X"]
        xw = x.astype("f4") @ w["W"].astype("f4").reshape(D * cell.gates * H, -1).T + _folded_bias(cell, w, D, H)
        r = _lay_out_r(w["R"], r_layout, cell.gates)
        args = [xw.astype(_numpy_dtype(func.params[0].dtype)), r]  # XW as the kernel reads it (a half layer's CUDA kernels: its dtype)
        # the kernel's state inputs are fp32 whatever R's storage dtype
        args += [feeds[n] if n == "sequence_lens" else feeds[n].astype("f4")
                 for n in ("sequence_lens", "initial_h", "initial_c") if n in feeds and (n != "initial_c" or "c" in cell.states)]
        args += [_cell_params(cell, w, D, H)] if cell.params else []
        expected = case.reference(feeds)
        state_shape = (D, N, H) if spec.layout == 0 else (N, D, H)
        outs = [np.full((T, D, N, H) if spec.layout == 0 else (N, T, D, H), np.nan, "f4")]
        outs += [np.full(state_shape, np.nan, "f4") for _ in cell.states]
        dev_args = [tvm.runtime.tensor(np.ascontiguousarray(v), dev) for v in args + outs]
        results = []
        runs.append(results)
        for _ in range(2):
            lib["main"](*dev_args)
            results.append([t.numpy() for t in dev_args[len(args):]])
        for got_first, got_again in zip(*results):
            np.testing.assert_array_equal(got_first, got_again)  # deterministic: same bits twice
        for name, got in zip(("Y", "Y_h", "Y_c"), results[0]):
            assert not np.isnan(got).any(), f"{name}: {np.isnan(got).sum()} elements never written"
            exact = spec.dtype == "float32" and spec.precision == "exact"
            tol = tol or ((1e-4, 1e-5) if exact else (1e-2, 1e-2))  # half storage or TF32: h rounds to it on tensor cores
            np.testing.assert_allclose(got, expected[name], rtol=tol[0], atol=tol[1], err_msg=f"{name}, batch {N} {note}")
    return [r[0] for r in runs]



def test_tf32_is_opt_in():
    """fp32 layers stay exact fp32 unless the user asks for TF32 (exact ones reach tensor cores only as 3xTF32)."""
    from schedules.recurrent_mma import mode

    import tvmrnn

    model = Case(op="LSTM", hidden=64, input_size=32).model()
    exact = tvmrnn.compile(model, target="cuda", logs=False)
    tf32 = tvmrnn.compile(model, target="cuda", logs=False, precision="tf32")
    assert exact.metadata["layers"][0]["precision"] == "exact" and tf32.metadata["layers"][0]["precision"] == "tf32"
    assert "mma(" in tf32.metadata["layers"][0]["kernel"]
    with pytest.raises(tvmrnn.UnsupportedModelError, match="precision='fp8' is not supported"):
        tvmrnn.compile(model, target="cuda", precision="fp8")
    cpu = tvmrnn.compile(model, target="llvm", logs=False, precision="tf32")  # CPU kernels have no TF32: exact
    assert cpu.metadata["layers"][0]["precision"] == "exact"
    spec = find_rnn_layers(model)[0].spec
    assert mode(spec) == "tf32x3" and mode(dataclasses.replace(spec, precision="tf32")) == "tf32"
    assert mode(spec, exact=False) is None  # what picks the projection and the per-step kind: SIMT for exact fp32


def _with_knobs(case, dtype, **knobs):
    """persistent_mma's default point for the case's layer in `dtype`, and the same point with `knobs` set."""
    target = tvm.target.Target({"kind": "cuda", "arch": "sm_90"})
    spec = dataclasses.replace(case.spec(), dtype=dtype)
    base = default_config("persistent_mma", spec, cell_for(spec), target, 24)  # three 8-row tiles at the grid barrier
    if knobs.get("streamed"):  # f16x3 steps (the exact-fp32 default's halves) and flat sums keep all of R resident
        knobs = {"halves": 0, "flat_sums": 0, **knobs}
    return target, spec, [base, KernelConfig.of("persistent_mma", **{**dict(base.knobs), **knobs})]


def _source(target, spec, config):
    return tvm.tirx.build(point_kernel(spec, cell_for(spec), target, config), target=target, pipeline=cooperative.register()).imports[0].inspect_source()


@pytest.mark.parametrize("case", CASES[:2], ids=lambda c: f"{c.op}-{c.direction}-layout{c.layout}")
def test_prefetch_loads_xw_before_the_reduction(case):
    """persistent_mma's prefetch knob: the epilogue's XW values are read before the first mma (else after), and the
    kernel builds through NVRTC."""
    target, spec, (base, _) = _with_knobs(case, "float16")
    order = []
    for config in [KernelConfig.of("persistent_mma", **{**dict(base.knobs), "prefetch": p}) for p in (0, 1)]:
        src = _source(target, spec, config)
        body = src[src.index("{", src.index("__global__")):]
        order.append(body.index("XW_ptr[") < body.index("mma.sync"))
    assert order == [False, True]


@pytest.mark.parametrize("case", CASES[:2], ids=lambda c: f"{c.op}-{c.direction}-layout{c.layout}")
def test_persistent_prefetch_loads_xw_before_the_warp_sums(case):
    """The SIMT persistent kernel's prefetch knob: XW is read before the warp's shuffle reduction (else after it), the
    kernel builds through NVRTC, and a logged point without the knob (logs older than it) is the prefetch=0 point."""
    target = tvm.target.Target({"kind": "cuda", "arch": "sm_90"})
    spec = case.spec()
    base = default_config("persistent", spec, cell_for(spec), target)
    order = []
    for p in (0, 1):
        src = _source(target, spec, KernelConfig.of("persistent", **{**dict(base.knobs), "prefetch": p}))
        body = src[src.index("{", src.index("__global__")):]
        order.append(body.index("XW_ptr[") < body.index("warp_reduce_sum_32("))
    assert order == [False, True]
    old = KernelConfig.from_dict({"kind": "persistent", "blocks": 132, "warps": 8, "batch_tile": 1, "stage_h": 0})
    assert old == KernelConfig.of("persistent", blocks=132, warps=8, batch_tile=1, stage_h=0, prefetch=0) and old["prefetch"] == 0


@pytest.mark.gpu
@pytest.mark.parametrize("knobs", [{"prefetch": 1}, {"prefetch": 1, "batch_tile": 4}, {"prefetch": 1, "stage_h": 1, "batch_tile": 2}],
                         ids=str)
@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("case", CASES[:2], ids=lambda c: f"{c.op}-{c.direction}-layout{c.layout}")
def test_persistent_prefetch_is_correct(case, dtype, knobs):
    """prefetch against float64 on poisoned outputs, at batches that leave tiles partly empty (6, 37 rows in tiles of
    1, 2, 4) and with reversed, shortened sequences (the clamped loads of padded steps must never be used)."""
    target = target_of("cuda")
    spec = dataclasses.replace(case.spec(), dtype=dtype)
    cell = cell_for(spec)
    point = KernelConfig.of("persistent", **{**dict(default_config("persistent", spec, cell, target).knobs), **knobs})
    _check_kernel("cuda", dataclasses.replace(case, dtype=dtype), spec, point_kernel(spec, cell, target, point), "rows",
                  batches=(6, 37), note=point.describe())


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_exact_fp32_epilogue_calls_no_fast_math_function(dtype):
    """TVM builds CUDA with --use_fast_math (tanhf becomes tanh.approx.f32, expf a rounded ex2.approx): every CUDA kind's
    exact-fp32 epilogue computes sigmoid and tanh itself (floorf of the exp range reduction shows it), fp16 keeps the
    library calls, and each builds through NVRTC."""
    target = tvm.target.Target({"kind": "cuda", "arch": "sm_90"})
    spec = dataclasses.replace(CASES[0].spec(), dtype=dtype)
    for kind in ["stepwise", "persistent", "tiled", "mma", "persistent_mma"]:
        src = _source(target, spec, default_config(kind, spec, cell_for(spec), target, 6))
        body = src[src.index("{", src.index("__global__")):]
        own = "tanhf(" not in body and "expf(" not in body and "floorf(" in body
        assert own == (dtype == "float32"), (kind, dtype)


@pytest.mark.parametrize("halves", [0, 1])
def test_split_accumulators_keep_three_mmas_per_tile(halves):
    """split_acc (exact fp32's 3xTF32 and f16x3 only): the cross products accumulate apart, so the same number of mma's,
    but not all into one accumulator set; the knob is not offered where there is no split."""
    target, spec, (base, split) = _with_knobs(CASES[0], "float32", split_acc=1, halves=halves)
    base = KernelConfig.of("persistent_mma", **{**dict(base.knobs), "halves": halves})
    one, two = _source(target, spec, base), _source(target, spec, split)
    shape = "m16n8k16" if halves else "m16n8k8"
    assert one != two and one.count(f"mma.sync.aligned.{shape}") == two.count(f"mma.sync.aligned.{shape}") > 0
    half = dataclasses.replace(spec, dtype="float16")
    assert "split_acc" not in knob_space("persistent_mma", half, cell_for(half), target)


def test_chunk_accumulators_add_each_chunk_in_fp32():
    """chunk_acc (3xTF32 only, off by default): each chunk's mma's run into a zeroed accumulator set that is added into the
    sum, so the same mma's and more adds; a logged point without the knob is the chunk_acc=0 point; not offered in fp16."""
    target, spec, (base, chunked) = _with_knobs(CASES[0], "float32", chunk_acc=1, halves=0)
    base = KernelConfig.of("persistent_mma", **{**dict(base.knobs), "halves": 0})
    one, two = _source(target, spec, base), _source(target, spec, chunked)
    assert one.count("mma.sync.aligned.m16n8k8") == two.count("mma.sync.aligned.m16n8k8") > 0
    assert two.count(" + ") > one.count(" + ")
    assert KernelConfig.of("persistent_mma", **dict(base.knobs), chunk_acc=0) == base  # old logs' points stay valid
    half = dataclasses.replace(spec, dtype="float16")
    assert "chunk_acc" not in knob_space("persistent_mma", half, cell_for(half), target)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype, knobs", [("float32", {"prefetch": 1}), ("float16", {"prefetch": 1}), ("float32", {"split_acc": 1}),
                                          ("float32", {"prefetch": 1, "split_acc": 1}), ("float32", {"chunk_acc": 1}),
                                          ("float32", {"chunk_acc": 1, "split_acc": 1}), ("float16", {"streamed": 1}),
                                          ("float32", {"streamed": 1}), ("float32", {"streamed": 9}), ("float32", {"halves": 0}),
                                          ("float32", {"halves": 1, "chunk_acc": 1, "split_acc": 1}), ("float16", {"flat_sums": 0}),
                                          ("float32", {"flat_sums": 0}), ("float16", {"flat_sums": 1, "n_tiles": 4}),
                                          ("float32", {"flat_sums": 1, "n_tiles": 1, "n_warps": 1, "k_warps": 16, "prefetch": 1})], ids=str)
@pytest.mark.parametrize("case", CASES[:2], ids=lambda c: f"{c.op}-{c.direction}-layout{c.layout}")
def test_persistent_mma_knobs_are_correct(case, dtype, knobs):
    """The knobs against float64 on poisoned outputs (prefetch: set by the batch <= 8 default and GRU's above; split_acc,
    chunk_acc and streamed: by no default; halves: the exact-fp32 default's, 0 its 3xTF32 steps; flat_sums: the
    default's up to 32 rows, 0 the tree, and flat in a 64-row pass and across 16 k-warps). streamed=1 reads the last
    chunk of R from L2 (GRU h33: the partial one; LSTM h24: its only one), 9 all of them."""
    _, spec, (_, point) = _with_knobs(case, dtype, **knobs)
    _check_kernel("cuda", dataclasses.replace(case, dtype=dtype), spec, point_kernel(spec, cell_for(spec), target_of("cuda"), point),
                  "rows", batches=(6, 37), note=point.describe())


# single-phase layers whose h persistent_mma may poll as tagged half words (sync 1): whole 32-column chunks
SYNC_CASES = [
    Case(op="LSTM", direction="bidirectional", optional=("sequence_lens", "initial_h", "initial_c"), hidden=96, input_size=7),
    Case(op="RNN", direction="reverse", optional=("sequence_lens", "initial_h"), hidden=64, input_size=5, layout=1),
    Case(op="GRU", direction="forward", optional=("sequence_lens", "initial_h"), hidden=64, input_size=5, linear_before_reset=1),
]


def test_polled_steps_meet_at_one_grid_barrier():
    """persistent_mma's sync knob: offered and built only for fp16 single-phase layers in whole chunks; with it
    the kernel meets at the start's grid barrier alone and each step polls h's tagged words, without it at one a step."""
    target = tvm.target.Target({"kind": "cuda", "arch": "sm_90"})
    half = dataclasses.replace(SYNC_CASES[0].spec(), dtype="float16")
    assert knob_space("persistent_mma", half, cell_for(half), target)["sync"] == (0, 1)
    refused = [dataclasses.replace(SYNC_CASES[0].spec(), dtype=dtype) for dtype in ("float32", "bfloat16")]
    refused += [dataclasses.replace(case.spec(), dtype="float16") for case in CASES[:2]]  # H 24, GRU
    for spec in refused:
        assert knob_space("persistent_mma", spec, cell_for(spec), target)["sync"] == (0,)
    base = default_config("persistent_mma", half, cell_for(half), target, 16)
    barriers, polls = [], []
    for sync in (0, 1):
        src = _source(target, half, KernelConfig.of("persistent_mma", **{**dict(base.knobs), "sync": sync}))
        body = src[src.index("{", src.index("__global__")):]
        barriers.append(body.count("tvm_builtin_cuda_grid_sync()"))
        polls.append(body.count(step_sync.SETTLE))
    assert barriers[1] == 1 < barriers[0] and polls[0] == 0 < polls[1]


@pytest.mark.gpu
@pytest.mark.parametrize("case", SYNC_CASES, ids=lambda c: f"{c.op}-{c.direction}")
def test_polled_steps_match_the_barrier(case, dtype="float16"):
    """sync 1 against float64, and bit for bit against the grid barrier's steps on the same inputs, at the default's
    batch-16 point (two 8-row tiles, four chunks a round): batches of one pass and of three (37 rows in 16-row passes,
    the last partial), rows of several lengths (their padded steps publish h too)."""
    spec = dataclasses.replace(case.spec(), dtype=dtype)
    target = target_of("cuda")
    base = default_config("persistent_mma", spec, cell_for(spec), target, 16)
    runs = [_check_kernel("cuda", dataclasses.replace(case, dtype=dtype), spec,
                          point_kernel(spec, cell_for(spec), target, KernelConfig.of("persistent_mma", **{**dict(base.knobs), "sync": sync})),
                          "rows", batches=(6, 37), note=f"sync {sync}") for sync in (0, 1)]
    for barrier, polled in zip(*runs):
        for b, p in zip(barrier, polled):
            np.testing.assert_array_equal(b, p)


# persistent_mma's A kept in registers (r_regs): one round of chunks a step at the default's batch-8 point (8 ways, four
# chunks a round: H96's 3 chunks leave slots empty); polled (fp16 single-phase), two phases (ONNX's GRU), 3xTF32
REGISTER_CASES = [
    (SYNC_CASES[0], "float16", {}),
    (SYNC_CASES[2], "float16", {}),
    (Case(op="GRU", direction="reverse", optional=("sequence_lens", "initial_h"), hidden=64, input_size=5, layout=1), "float16", {}),
    (SYNC_CASES[0], "float32", {"halves": 0}),
]


def test_a_in_registers_only_where_one_round_covers_r():
    """r_regs needs R resident, no f16x3 halves and a warp's chunks in one round (chunks <= k_warps x depth)."""
    from schedules.recurrent_mma import MmaConfig
    from schedules.recurrent_persistent_mma import fits

    device = Device.cuda("sm_90")
    half = dataclasses.replace(Case(op="LSTM", hidden=1024, input_size=1024).spec(), dtype="float16")
    cell = cell_for(half)
    point = MmaConfig(units=8, n_tiles=1, n_warps=1, k_warps=8, depth=4, flat_sums=1, r_regs=1)
    assert fits(half, cell, device, point)
    assert not fits(half, cell, device, dataclasses.replace(point, depth=2))  # 32 chunks, 16 a round
    exact = dataclasses.replace(half, dtype="float32")
    assert not fits(exact, cell, device, dataclasses.replace(point, halves=1))


def test_fp16_defaults_keep_a_in_registers_up_to_batch_16():
    """persistent_mma's default keeps A in registers in fp16 up to batch 16 where one round of chunks covers R (the
    polled points' four chunks a round by 8 k-warps cover H1024), bidirectional layers' blocks of 16 units too, not in
    fp32 nor at the barrier's two chunks a round; the batch-16 points (two tiles, A in 64 or 128 registers a lane)
    spill nothing."""
    from schedules.ptxas import ptxas

    target = tvm.target.Target({"kind": "cuda", "arch": "sm_90"})

    def point(op, dtype, batch, **options):
        spec = Case(op=op, hidden=1024, input_size=8, dtype=dtype, **options).spec()
        return spec, default_config("persistent_mma", spec, cell_for(spec), target, batch)

    assert [point("LSTM", "float16", b)[1]["r_regs"] for b in (1, 8, 16, 17, 64)] == [1, 1, 1, 0, 0]
    assert [point("GRU", "float16", b, linear_before_reset=1)[1]["r_regs"] for b in (1, 16)] == [1, 1]
    assert point("GRU", "float16", 1)[1]["r_regs"] == 0  # two phases meet at the barrier, two chunks a round
    assert [point("LSTM", "float16", b, direction="bidirectional")[1]["r_regs"] for b in (1, 16, 17)] == [1, 1, 0]  # 16 units
    assert [point("LSTM", "float32", b)[1]["r_regs"] for b in (1, 16)] == [0, 0]
    for options in ({}, {"direction": "bidirectional"}):  # 8 and 16 units a block
        spec, config = point("LSTM", "float16", 16, **options)
        report = ptxas(_source(target, spec, config), "sm_90a")
        assert report.spill_stores == 0 and report.spill_loads == 0, report.describe()


@pytest.mark.gpu
@pytest.mark.parametrize("case, dtype, knobs", REGISTER_CASES, ids=lambda v: f"{v.op}-{v.direction}" if isinstance(v, Case) else str(v))
def test_a_in_registers_matches_shared_memory(case, dtype, knobs):
    """r_regs 1 against float64, and bit for bit against A read from shared memory each step, at the default's batch-8
    point: batches of one pass and of five (37 rows in 8-row passes), rows of several lengths."""
    spec = dataclasses.replace(case.spec(), dtype=dtype)
    target = target_of("cuda")
    base = {**dict(default_config("persistent_mma", spec, cell_for(spec), target, 8).knobs), **knobs}
    runs = [_check_kernel("cuda", dataclasses.replace(case, dtype=dtype), spec,
                          point_kernel(spec, cell_for(spec), target, KernelConfig.of("persistent_mma", **{**base, "r_regs": r_regs})),
                          "rows", batches=(6, 37), note=f"r_regs {r_regs}") for r_regs in (0, 1)]
    for shared, registers in zip(*runs):
        for a, b in zip(shared, registers):
            np.testing.assert_array_equal(a, b)


# layers whose streamed chunks pass through persistent_mma's cp.async ring: H a multiple of 32 (whole chunks); rounds of
# k_warps x depth chunks: one round (the prologue copies it), two with a partial last one, four with the copies issued
# inside the loop; GRU's two phases have rows of different widths
RING_CASES = [
    (Case(op="LSTM", direction="bidirectional", optional=("sequence_lens", "initial_h", "initial_c"), hidden=96, input_size=7),
     "float32", dict(streamed=2, ring=2, k_warps=2, depth=1)),
    (Case(op="LSTM", direction="bidirectional", optional=("sequence_lens", "initial_h", "initial_c"), hidden=96, input_size=7),
     "float16", dict(streamed=3, ring=2, k_warps=2, depth=1)),
    (Case(op="GRU", direction="reverse", optional=("sequence_lens", "initial_h"), hidden=128, input_size=5, layout=1),
     "float32", dict(streamed=3, ring=2, k_warps=2, depth=2)),
    (Case(op="GRU", direction="reverse", optional=("sequence_lens", "initial_h"), hidden=256, input_size=5, layout=1),
     "float16", dict(streamed=7, ring=3, k_warps=2, depth=1)),
    (Case(op="GRU", direction="forward", optional=("sequence_lens",), hidden=256, input_size=5),
     "float32", dict(streamed=7, ring=3, k_warps=2, depth=1, n_tiles=2, n_warps=2)),
    # ring_h: B (h, and GRU's r*h in its second phase) copied into the ring beside A
    (Case(op="LSTM", direction="bidirectional", optional=("sequence_lens", "initial_h", "initial_c"), hidden=96, input_size=7),
     "float16", dict(streamed=3, ring=2, ring_h=1, k_warps=2, depth=1)),
    (Case(op="GRU", direction="reverse", optional=("sequence_lens", "initial_h"), hidden=256, input_size=5, layout=1),
     "float32", dict(streamed=7, ring=3, ring_h=1, k_warps=2, depth=1, n_tiles=2, n_warps=2)),
    # 20 units per block (blog-a: 128 blocks instead of 24 units' 107): 8-row groups that hold two gates' rows; H = 160
    # whole blocks, H = 96 a last block of 16 units
    (Case(op="LSTM", direction="bidirectional", optional=("sequence_lens", "initial_h", "initial_c"), hidden=160, input_size=7),
     "float16", dict(units=20, streamed=3, ring=2, ring_h=1, k_warps=2, depth=1)),
    (Case(op="LSTM", direction="forward", optional=("sequence_lens", "initial_h", "initial_c"), hidden=160, input_size=7),
     "float32", dict(units=20, streamed=4, ring=3, ring_h=1, k_warps=2, depth=1, n_tiles=2, n_warps=2)),
    (Case(op="LSTM", direction="reverse", optional=("initial_h",), hidden=96, input_size=7),
     "float16", dict(units=20, streamed=2, ring=2, k_warps=2, depth=1)),
]


def test_units_not_a_multiple_of_8_need_whole_groups_and_the_ring():
    """persistent_mma with 20 units per block: an LSTM's 80 rows are whole 8-row groups and build through NVRTC; a GRU's
    one-gate phase (20 rows) is not; streamed chunks without the ring (read from R by fragment, whose gate is the
    group's first row's) are refused."""
    from schedules.recurrent_mma import MmaConfig
    from schedules.recurrent_persistent_mma import fits

    target = tvm.target.Target({"kind": "cuda", "arch": "sm_90"})
    case, dtype, knobs = RING_CASES[-3]
    _, spec, (_, point) = _with_knobs(case, dtype, **knobs)
    cfg = MmaConfig(**dict(point.knobs))
    assert cfg.units == 20 and fits(spec, cell_for(spec), Device.cuda("sm_90"), cfg)
    assert "cp.async.cg.shared.global" in _source(target, spec, point)
    assert not fits(spec, cell_for(spec), Device.cuda("sm_90"), dataclasses.replace(cfg, ring=0, ring_h=0))
    gru = Case(op="GRU", hidden=160, input_size=7, dtype=dtype).spec()
    assert not fits(gru, cell_for(gru), Device.cuda("sm_90"), cfg)
    assert fits(gru, cell_for(gru), Device.cuda("sm_90"), dataclasses.replace(cfg, units=24))


def test_streamed_ring_copies_with_cp_async():
    """persistent_mma's ring (cfg.ring buffers of streamed chunks in shared memory, filled with cp.async): the kernel copies
    R's streamed chunks with cp.async from the launch's copy of them in the ring's order (streamed_r: R itself is not read
    in the step loop) and waits on it there, where the ring is off it does neither and reads R; with ring_h it copies B
    too; the ring's bytes count against shared memory (more chunks stream to make room); it needs whole chunks
    (H % 32 == 0), 2+ buffers, and something streamed, and ring_h needs the ring."""
    from schedules.recurrent_mma import MmaConfig
    from schedules.recurrent_persistent_mma import fewest_streamed, fits, ring_bytes, smem_bytes, sums_in_ring

    target = tvm.target.Target({"kind": "cuda", "arch": "sm_90"})
    case, dtype, knobs = RING_CASES[1]
    _, spec, (base, _) = _with_knobs(case, dtype)
    cell = cell_for(spec)
    ring, plain = (KernelConfig.of("persistent_mma", **{**dict(base.knobs), **knobs, "ring": r, "flat_sums": 0}) for r in (2, 0))
    for config, copies in ((ring, True), (plain, False)):
        src = _source(target, spec, config)
        loop = src[re.search(r"for \(int64_t \w+ = \(int64_t\)0; \w+ < seq;", src).start():]
        assert ("cp.async.cg.shared.global" in src and "cp_async_wait_group" in loop) == copies, config.describe()
        assert ("R_ptr" in loop) != copies, config.describe()
    cfg = MmaConfig(**dict(ring.knobs))
    # the partial sums move into the ring's A buffers where those hold them (sums_in_ring)
    sums = cfg.smem_bytes(cell.gates) if sums_in_ring(spec, cell, cfg) else 0
    assert smem_bytes(spec, cell, cfg) - smem_bytes(spec, cell, MmaConfig(**dict(plain.knobs))) == ring_bytes(spec, cell, cfg) - sums > 0
    assert fits(spec, cell, Device.cuda("sm_90"), cfg)
    # ring_h: B's chunks (the pass's batch rows) through the ring too: more copies in the step loop, more shared memory
    with_h = KernelConfig.of("persistent_mma", **dict(ring.knobs), ring_h=1)
    counts = [(lambda src: src[re.search(r"for \(int64_t \w+ = \(int64_t\)0; \w+ < seq;", src).start():].count("ptx_cp_async_legacy"))(_source(target, spec, c))
              for c in (ring, with_h)]
    assert counts[1] > counts[0] > 0, counts
    h_cfg = MmaConfig(**dict(with_h.knobs))
    assert ring_bytes(spec, cell, h_cfg) - ring_bytes(spec, cell, cfg) == 2 * cfg.k_warps * cfg.depth * cfg.rows * 32 * 2  # two buffers, fp16
    for bad in (dict(ring=1), dict(streamed=0), dict(ring=0, ring_h=1)):
        assert not fits(spec, cell, Device.cuda("sm_90"), dataclasses.replace(cfg, **bad)), bad
    odd = Case(op="LSTM", hidden=72, input_size=8, dtype=dtype).spec()
    assert not fits(odd, cell_for(odd), Device.cuda("sm_90"), cfg)  # a partial last chunk
    big = Case(op="LSTM", hidden=2560, input_size=8, dtype=dtype).spec()
    wide = MmaConfig(units=24, n_tiles=4, n_warps=2, k_warps=4, depth=1, prefetch=1)
    # with h's chunks too the ring outgrows the partial sums it now holds (sums_in_ring)
    assert fewest_streamed(big, cell_for(big), Device.cuda("sm_90"), dataclasses.replace(wide, ring=2, ring_h=1)) > fewest_streamed(big, cell_for(big), Device.cuda("sm_90"), wide)


@pytest.mark.gpu
@pytest.mark.parametrize("case, dtype, knobs", RING_CASES, ids=lambda c: str(c) if isinstance(c, (str, dict)) else f"{c.op}-h{c.hidden}")
def test_streamed_ring_is_correct(case, dtype, knobs):
    """Streamed chunks through the cp.async ring against float64 on poisoned outputs, at a batch under one pass of batch
    tiles and one over it (the ring refilled for every pass, phase and step)."""
    _, spec, (_, point) = _with_knobs(case, dtype, **knobs)
    _check_kernel("cuda", dataclasses.replace(case, dtype=dtype), spec, point_kernel(spec, cell_for(spec), target_of("cuda"), point),
                  "rows", batches=(6, 37), note=point.describe())


@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_streaming_default_takes_the_fewest_units_that_make_one_wave(dtype):
    """Where R does not fit on chip, the default streams part of it with the fewest units per block that cover H in one
    wave of the H100's 132 SMs, a multiple of 8 only where a phase's rows need it: blog-a's LSTM (H=2560) takes 20 units
    (128 blocks), a GRU 24 (its candidate phase multiplies one gate); without the ring where H is not whole 32-column
    chunks (the ring copies whole ones); every default fits, and none fits with fewer units."""
    from schedules.recurrent_persistent_mma import blocks, fits, streaming_config

    expected = {("LSTM", 2560): (20, 2), ("GRU", 2560): (24, 2), ("LSTM", 3000): (24, 0), ("GRU", 3000): (24, 0)}
    for (op, hidden), (units, ring) in expected.items():
        spec = Case(op=op, hidden=hidden, input_size=8, dtype=dtype).spec()
        cell = cell_for(spec)
        cfg = streaming_config(spec, cell, Device.cuda("sm_90"))
        assert (cfg.units, cfg.ring) == (units, ring) and fits(spec, cell, Device.cuda("sm_90"), cfg), (op, hidden, cfg)
        assert cfg.prefetch == int(len(cell.phases) > 1) and blocks(spec, cfg.units) <= 132
        assert not any(fits(spec, cell, Device.cuda("sm_90"), dataclasses.replace(cfg, units=u)) for u in range(8, units))
    small = Case(op="LSTM", hidden=1024, input_size=8, dtype=dtype).spec()
    assert streaming_config(small, cell_for(small), Device.cuda("sm_90")) is None  # R fits on chip: nothing streams


def test_partial_sums_share_the_ring():
    """The k_warps' partial sums live in the ring's A buffers (idle between reductions; grown where the sums are
    larger): blog-a's exact-fp32 default then keeps 72 of 80 chunks streamed (76 with a buffer of their own), fp16 50
    (58), and both fit."""
    from schedules import recurrent_persistent_mma as rpm

    def default(dtype):
        spec = Case(op="LSTM", hidden=2560, input_size=8, dtype=dtype).spec()
        cell = cell_for(spec)
        cfg = rpm.streaming_config(spec, cell, Device.cuda("sm_90"))
        assert rpm.fits(spec, cell, Device.cuda("sm_90"), cfg), cfg
        return cfg.streamed, rpm.sums_in_ring(spec, cell, cfg)

    assert default("float32") == (72, True) and default("float16") == (50, True)


@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_streamed_chunks_read_r_from_global_memory(dtype):
    """persistent_mma with `streamed` chunks: a layer whose R does not fit on chip (blog-a's H=2560 LSTM) fits one wave
    with the fewest chunks streamed, and builds; streamed chunks are read from R in global memory inside the step loop,
    the resident ones from shared memory; 0 streamed is the all-resident kernel."""
    from schedules.recurrent_mma import MmaConfig
    from schedules.recurrent_persistent_mma import fewest_streamed, fits, resident_chunks

    target = tvm.target.Target({"kind": "cuda", "arch": "sm_90"})
    big = Case(op="LSTM", hidden=2560, input_size=8, dtype=dtype).spec()
    cfg = MmaConfig(units=24, n_tiles=2, n_warps=2, k_warps=4, depth=1)
    assert not fits(big, cell_for(big), Device.cuda("sm_90"), cfg)
    n = fewest_streamed(big, cell_for(big), Device.cuda("sm_90"), cfg)
    assert 0 < n < 80 and fits(big, cell_for(big), Device.cuda("sm_90"), dataclasses.replace(cfg, streamed=n))
    assert not fits(big, cell_for(big), Device.cuda("sm_90"), dataclasses.replace(cfg, streamed=n - 1))
    assert fewest_streamed(big, cell_for(big), Device.cuda("sm_90"), dataclasses.replace(cfg, units=8)) is None  # 320 blocks: no wave
    spec = Case(op="LSTM", hidden=72, input_size=8, dtype=dtype).spec()  # 3 chunks, the last partial
    sources = {}
    for streamed in (0, 1, 3):
        config = KernelConfig.of("persistent_mma", units=8, n_tiles=2, n_warps=2, k_warps=4, depth=1, streamed=streamed)
        assert resident_chunks(spec, MmaConfig(**dict(config.knobs))) == 3 - streamed
        src = _source(target, spec, config)
        loop = src[re.search(r"for \(int64_t \w+ = \(int64_t\)0; \w+ < seq;", src).start():]  # the step loop
        sources[streamed] = (loop.count("R_ptr"), loop.count("mma.sync"))
    assert sources[0][0] == 0 and sources[1][0] > 0 and sources[3][0] > 0, sources
    # a reduction loop for the L2 chunks, one for the shared ones: two with 1 of 3 chunks streamed, one with all
    assert sources[1][1] == 2 * sources[0][1] == 2 * sources[3][1] > 0, sources


@pytest.mark.parametrize("kind", ["mma", "persistent_mma"])
@pytest.mark.parametrize("op", ["LSTM", "GRU"])
def test_half_operand_reads_a_half_copy_of_b(op, kind):
    """half_operand (fp16/bf16 on tensor cores): B (h; GRU's r*h too) loads 8 halves at a time from a half-precision
    copy, not 4 floats at a time from the fp32 state; the knob is only offered where the mma rounds B to half anyway."""
    target = tvm.target.Target({"kind": "cuda", "arch": "sm_90"})
    spec = Case(op=op, hidden=64, input_size=8, dtype="float16").spec()  # whole chunks: vector loads
    cell = cell_for(spec)
    base = default_config(kind, spec, cell, target, 24)
    assert base["half_operand"] == 1
    on, off = (_source(target, spec, c) for c in (base, KernelConfig.of(kind, **{**dict(base.knobs), "half_operand": 0})))
    # loads into registers: R's name R_ptr or shared memory; the state buffers are the unnamed _ptr's
    assert "= *(uint4*)(_ptr" in on and "= *(float4*)(_ptr" not in on
    assert "= *(uint4*)(_ptr" not in off and "= *(float4*)(_ptr" in off
    for s in (dataclasses.replace(spec, dtype="float32"), dataclasses.replace(spec, dtype="float32", precision="tf32")):
        assert "half_operand" not in knob_space(kind, s, cell_for(s), target)


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["mma", "persistent_mma"])
@pytest.mark.parametrize("case", CASES[:2], ids=lambda c: f"{c.op}-{c.direction}-layout{c.layout}")
def test_half_operand_gives_the_same_bits(case, kind):
    """B from the half copy or rounded from the fp32 state: both correct against float64, and bit-identical."""
    target = target_of("cuda")
    spec = dataclasses.replace(case.spec(), dtype="float16")
    case = dataclasses.replace(case, dtype="float16")
    base = default_config(kind, spec, cell_for(spec), target, 16)
    outs = [_check_kernel("cuda", case, spec, point_kernel(spec, cell_for(spec), target, c), "rows", batches=(6, 37), note=c.describe())
            for c in (base, KernelConfig.of(kind, **{**dict(base.knobs), "half_operand": 0}))]
    for batch_a, batch_b in zip(*outs):
        for got_a, got_b in zip(batch_a, batch_b):
            np.testing.assert_array_equal(got_a, got_b)


@pytest.mark.parametrize("kind", ["mma", "persistent_mma"])
def test_exact_fp32_issues_three_tf32_mmas_per_tile(kind):
    """Exact fp32 on tensor cores is 3xTF32 (or f16x3, persistent_mma's halves: test_step_halves): the same point issues
    three times the TF32 mma's of precision='tf32' (high x high, and both high x low cross terms), never a single rounded
    product."""
    target = tvm.target.Target({"kind": "cuda", "arch": "sm_90"})
    spec = Case(op="LSTM", hidden=64, input_size=8).spec()
    counts = {}
    config = default_config(kind, spec, cell_for(spec), target, 16)  # one point for both (their defaults differ)
    if kind == "persistent_mma":
        config = KernelConfig.of(kind, **{**dict(config.knobs), "halves": 0})
    for s in (spec, dataclasses.replace(spec, precision="tf32")):
        src = tvm.tirx.build(point_kernel(s, cell_for(s), target, config), target=target, pipeline=cooperative.register()).imports[0].inspect_source()
        counts[s.precision] = src.count("mma.sync.aligned.m16n8k8")
    assert counts["tf32"] > 0 and counts["exact"] == 3 * counts["tf32"], counts


@pytest.mark.parametrize("kind", ["tiled", "mma"])
def test_every_point_fits_a_block(kind):
    """What the tuner may sample launches: at most 1024 threads and 48 KB of static shared memory per block, for
    the most gates a phase has (LSTM's four)."""
    import itertools

    from schedules.recurrent_mma import MmaConfig
    from schedules.recurrent_tiled import TiledConfig

    case = Case(op="LSTM", hidden=64, input_size=8, dtype="float16" if kind == "mma" else "float32")
    spec = case.spec()
    space = knob_space(kind, spec, cell_for(spec), tvm.target.Target({"kind": "cuda", "arch": "sm_90"}))
    for values in itertools.product(*space.values()):
        knobs = dict(zip(space, values))
        if kind == "mma":
            cfg = MmaConfig(**knobs)
            threads = 32 * cfg.n_warps * cfg.k_warps
        else:
            cfg = TiledConfig(**knobs)
            threads = cfg.units * cfg.row_threads
        assert threads <= 1024 and cfg.smem_bytes(4) <= 48 * 1024, knobs


@pytest.mark.parametrize("op, hidden, directions, dtype", [("LSTM", 64, 1, "float32"), ("LSTM", 1024, 1, "float32"), ("LSTM", 800, 2, "float32"),
                                                          ("GRU", 800, 2, "float16"), ("LSTM", 2560, 1, "float16"), ("LSTM", 2560, 1, "float32"),
                                                          ("LSTM", 4096, 2, "float32")])
def test_every_persistent_mma_point_fits_one_wave(op, hidden, directions, dtype):
    """Every point of the persistent tensor-core space launches cooperatively: one block per SM at most, R's resident
    chunks and the partial sums within shared memory, at most 16 warps. Where R is larger than a wave's shared memory
    (H=2560: 52 MB in fp16) the space streams part of R, its default among its points; empty where no wave of blocks
    covers H (4096 x 2 directions at 32 units per block is 256 blocks)."""
    import itertools

    from schedules.recurrent_mma import MmaConfig
    from schedules.recurrent_persistent_mma import blocks, smem_bytes

    case = Case(op=op, hidden=hidden, input_size=8, dtype=dtype, direction="bidirectional" if directions == 2 else "forward")
    spec = case.spec()
    cell = cell_for(spec)
    target = tvm.target.Target({"kind": "cuda", "arch": "sm_90"})
    space = knob_space("persistent_mma", spec, cell, target)
    assert bool(space) == (hidden < 4096)
    assert space.get("streamed", (0,))[0] > 0 if hidden == 2560 else "streamed" not in space
    if space:  # the defaults the tuner measures first are points of the space, but where R leaves little room (bi-800 fp32)
        from schedules.space import default_config, in_space

        in_it = [in_space(default_config("persistent_mma", spec, cell, target, b), spec, cell, target) for b in (8, 24, 64)]
        # bi-800 fp32: only n_tiles=1 fits every way; resident exact fp32 at batch 8 splits the reduction 16 ways, which
        # only one batch warp allows (a product space of the knobs cannot hold it: 2 x 16 warps would be too many)
        resident_exact = dtype == "float32" and hidden != 2560
        assert in_it == [not resident_exact] + [not (hidden == 800 and dtype == "float32")] * 2, in_it
    for values in itertools.product(*space.values()) if space else ():
        cfg = MmaConfig(**dict(zip(space, values)))
        assert blocks(spec, cfg.units) <= 132 and smem_bytes(spec, cell, cfg) <= 227 * 1024 and cfg.n_warps * cfg.k_warps <= 16, cfg


@pytest.mark.parametrize("dtype, hidden, directions, arch, plan", [
    # three 8-row persistent_mma tiles up to batch 24, 32 rows per pass up to 32, 64 above (exact fp32)
    # at batch 1 a grid of clusters (R in 64 CTAs' registers and shared memory; none fits H800 with at most 24 units a CTA)
    ("float32", 1024, 1, "sm_90", [("cluster", 1), ("persistent", 4), ("persistent_mma", 8), ("persistent_mma", 24), ("persistent_mma", 32),
                                   ("persistent_mma", None)]),
    # half precision: the polled 8-row point from batch 1 (POLLED_MIN_HIDDEN), 64-row passes above batch 32 from H 1024
    # (ROUNDED_PASSES_MIN_HIDDEN), the per-step mma above it below
    ("float16", 1024, 1, "sm_90", [("persistent_mma", 8), ("persistent_mma", 16), ("persistent_mma", 24), ("persistent_mma", 32),
                                   ("persistent_mma", None)]),
    ("float16", 768, 1, "sm_90", [("persistent_mma", 8), ("persistent_mma", 16), ("persistent_mma", 24), ("persistent_mma", 32),
                                  ("mma", None)]),
    ("float16", 256, 1, "sm_90", [("persistent_mma", 8), ("persistent_mma", 16), ("persistent_mma", 24), ("persistent_mma", 32),
                                  ("mma", None)]),
    # below POLLED_MIN_HIDDEN (polled unmeasured) and CLUSTER_MIN_HIDDEN: persistent to batch 4, the barrier's tiles above
    ("float16", 48, 1, "sm_90", [("persistent", 4), ("persistent_mma", 8), ("persistent_mma", 24), ("persistent_mma", 32),
                                 ("mma", None)]),
    ("float32", 800, 2, "sm_90", [("persistent", 4), ("persistent_mma", 8), ("persistent_mma", 24), ("persistent_mma", None)]),
    # exact fp32 at H <= EXACT_MMA_MAX_HIDDEN: the per-step mma above the resident tiles (persistent_mma's blocks are few)
    # and up to batch 8 as clusters side by side, one row each
    ("float32", 256, 1, "sm_90", [("cluster", 1), ("cluster", 4), ("cluster", 8), ("persistent_mma", 24),
                                  ("persistent_mma", 32), ("mma", None)]),
    ("float32", 1100, 1, "sm_90", [("persistent", 4), ("stepwise", 32), ("tiled", None)]),  # 138 blocks of 8 units: no wave
    # R is 52 MB (fp16) or 105 MB (fp32): persistent_mma streams part of it from L2 at batch 33-64
    ("float16", 2560, 1, "sm_90", [("mma", 32), ("persistent_mma", 64), ("mma", None)]),
    ("float32", 2560, 1, "sm_90", [("stepwise", 32), ("persistent_mma", 64), ("tiled", None)]),
    ("float16", 1024, 1, "sm_75", [("persistent", 4), ("stepwise", 32), ("tiled", None)]),  # no m16n8k16 / TF32 mma before sm_80
])
def test_default_kernel_per_batch(dtype, hidden, directions, arch, plan):
    """The untuned rule on the H100 and H200: persistent_mma's polled points to batch 16 in fp16 LSTM from H64, else cluster
    at batch 1 (to batch 8 at H256 and below), persistent up to batch 4; persistent_mma where R fits in shared memory across
    one wave (above batch 32 in 64-row passes, or handing over to mma: choice.EXACT_MMA_MAX_HIDDEN,
    ROUNDED_PASSES_MIN_HIDDEN), else the per-step kinds, with persistent_mma
    streaming part of R from L2 at batch 33-64 where R is larger than a wave's shared memory."""
    from schedules import KernelError

    case = Case(op="LSTM", hidden=hidden, input_size=8, dtype=dtype, direction="bidirectional" if directions == 2 else "forward")
    spec = case.spec()
    target = tvm.target.Target({"kind": "cuda", "arch": arch})
    got = plan_kernel(spec, cell_for(spec), target)
    assert [(b.config.kind, b.up_to) for b in got.branches] == plan, got.describe()
    if arch == "sm_75":
        with pytest.raises(KernelError, match="sm_80 and newer; the target is sm_75"):
            plan_kernel(spec, cell_for(spec), target, "mma")


@pytest.mark.parametrize("op, hidden, options, above", [
    ("LSTM", 1024, {"dtype": "float16"}, "persistent_mma"), ("LSTM", 1024, {"precision": "tf32"}, "persistent_mma"),
    ("LSTM", 768, {"dtype": "float16"}, "mma"), ("LSTM", 1000, {"dtype": "float16"}, "mma"), ("GRU", 1024, {"dtype": "float16"}, "mma"),
    ("GRU", 1024, {"dtype": "float16", "linear_before_reset": 1}, "mma"), ("RNN", 1024, {"dtype": "float16"}, "mma")])
def test_rounded_layers_above_batch_32(op, hidden, options, above):
    """In half precision and TF32 above batch 32 with R resident: persistent_mma's 64-row passes for LSTM from
    ROUNDED_PASSES_MIN_HIDDEN, where they measured faster than the per-step mma; the per-step mma elsewhere (GRU lost,
    RNN unmeasured)."""
    from schedules import plan_kernel

    options = dict(options)
    precision = options.pop("precision", "exact")
    spec = dataclasses.replace(Case(op=op, hidden=hidden, input_size=8, **options).spec(), precision=precision)
    last = plan_kernel(spec, cell_for(spec), tvm.target.Target({"kind": "cuda", "arch": "sm_90"})).branches[-1].config
    assert last.kind == above and (above == "mma" or last["n_tiles"] * last["n_warps"] == 8), last


@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_partial_sums_meet_flat_below_64_rows(dtype):
    """persistent_mma's default adds the k-warps' partial sums flat (a slot each, one block barrier) in passes of up to
    32 rows and as a tree in the 64-row ones, where flat measured slower; flat takes fewer barriers in the step loop
    and k_warps slots, and is a knob of the resident space, not of the streamed one."""
    from schedules.recurrent_mma import MmaConfig

    target = tvm.target.Target({"kind": "cuda", "arch": "sm_90"})
    wide = Case(op="LSTM", hidden=1024, input_size=8, dtype=dtype).spec()
    flat = {b: default_config("persistent_mma", wide, cell_for(wide), target, b)["flat_sums"] for b in (1, 8, 24, 32, 33, 64)}
    assert flat == {1: 1, 8: 1, 24: 1, 32: 1, 33: 0, 64: 0}, flat
    small = Case(op="LSTM", hidden=64, input_size=8, dtype=dtype).spec()
    point = default_config("persistent_mma", small, cell_for(small), target, 8)
    tree = KernelConfig.of("persistent_mma", **{**dict(point.knobs), "flat_sums": 0})
    barriers = [_source(target, small, c).split("< seq;", 1)[1].count("__syncthreads()") for c in (point, tree)]
    k_warps = point["k_warps"]
    assert barriers[1] - barriers[0] == 2 * (k_warps.bit_length() - 1), barriers  # the tree's 2 log2(k) + 1, flat's 1
    cfgs = [MmaConfig(**dict(c.knobs)) for c in (point, tree)]
    assert [c.sum_slots for c in cfgs] == [k_warps, k_warps // 2] and cfgs[0].smem_bytes(4) == 2 * cfgs[1].smem_bytes(4)
    assert knob_space("persistent_mma", small, cell_for(small), target)["flat_sums"] == (0, 1)
    streamed = Case(op="LSTM", hidden=2560, input_size=8, dtype=dtype).spec()
    assert "flat_sums" not in knob_space("persistent_mma", streamed, cell_for(streamed), target)


def test_small_batches_poll_h_where_they_may():
    """persistent_mma's default polls h's tagged words (sync) up to batch 16 in fp16 LSTM layers and PyTorch's GRU, where it
    measured faster than the grid barrier (batch 9-16 in two 8-row tiles), and meets at the barrier from batch 17 (three
    tiles and wider passes were slower polled), in fp32, and in RNN layers (unmeasured) and GRU layers of two phases
    (linear_before_reset 0: they cannot poll). The polled points stage four chunks a round, a depth the knob space offers
    where a layer may poll."""
    target = tvm.target.Target({"kind": "cuda", "arch": "sm_90"})

    def knobs(op, dtype, batch, **options):
        spec = Case(op=op, hidden=1024, input_size=8, dtype=dtype, **options).spec()
        return dict(default_config("persistent_mma", spec, cell_for(spec), target, batch).knobs)

    assert [knobs("LSTM", "float16", b).get("sync", 0) for b in (1, 8, 9, 16, 17, 24, 32, 64)] == [1, 1, 1, 1, 0, 0, 0, 0]
    assert [knobs("GRU", "float16", b, linear_before_reset=1).get("sync", 0) for b in (1, 8, 9, 16, 17)] == [1, 1, 1, 1, 0]
    assert [knobs("LSTM", "float16", b)["depth"] for b in (1, 8, 16, 17)] == [4, 4, 4, 2]
    assert [knobs("LSTM", "float16", b)["n_tiles"] for b in (8, 16, 17)] == [1, 2, 3]
    for op, dtype in (("RNN", "float16"), ("GRU", "float16"), ("LSTM", "float32")):  # the barrier, and three tiles from 9
        assert [(knobs(op, dtype, b).get("sync", 0), knobs(op, dtype, b)["n_tiles"]) for b in (8, 16)] == [(0, 1), (0, 3)]
    half, exact = (Case(op="LSTM", hidden=1024, input_size=8, dtype=dtype).spec() for dtype in ("float16", "float32"))
    assert knob_space("persistent_mma", half, cell_for(half), target)["depth"] == (1, 2, 4)
    assert knob_space("persistent_mma", exact, cell_for(exact), target)["depth"] == (1, 2)
    # auto runs the polled points from H64 at batch 1-16 for PyTorch's GRU too, ahead of the cluster kernel
    gru = Case(op="GRU", hidden=128, input_size=8, dtype="float16", linear_before_reset=1).spec()
    first, second = plan_kernel(gru, cell_for(gru), target).branches[:2]
    assert [(b.config.kind, b.up_to, dict(b.config.knobs).get("sync")) for b in (first, second)] == [("persistent_mma", 8, 1), ("persistent_mma", 16, 1)]


def test_polled_points_split_chunks_evenly_over_k_warps():
    """The polled points take the most k-warps (up to the tile's 8) that share R's 32-column chunks evenly at three
    chunks each at most (H384: 4 k-warps of 3, not 8 of 1-2; H1024: 8 of 4, no split even within 3); the barrier's
    points keep theirs. Every such point at batch 16 (two tiles, A in registers) spills nothing."""
    from schedules.ptxas import ptxas

    target = tvm.target.Target({"kind": "cuda", "arch": "sm_90"})

    def point(hidden, batch, op="LSTM", dtype="float16", **options):
        spec = Case(op=op, hidden=hidden, input_size=8, dtype=dtype, **options).spec()
        return spec, default_config("persistent_mma", spec, cell_for(spec), target, batch)

    hiddens = (64, 128, 192, 256, 320, 384, 448, 512, 768, 1024)
    assert {h: point(h, 1)[1]["k_warps"] for h in hiddens} == {64: 2, 128: 4, 192: 2, 256: 8, 320: 8, 384: 4, 448: 8, 512: 8,
                                                             768: 8, 1024: 8}
    assert [point(384, b)[1]["k_warps"] for b in (1, 16, 17)] == [4, 4, 8]  # batch 17: three tiles at the barrier
    assert point(384, 1, op="GRU", linear_before_reset=1)[1]["k_warps"] == 4 and point(384, 1, dtype="float32")[1]["k_warps"] == 16
    for hidden in (64, 192, 384):
        spec, config = point(hidden, 16)
        assert config["r_regs"] == 1 and config["sync"] == 1, config.describe()
        report = ptxas(_source(target, spec, config), "sm_90a")
        assert report.spill_stores == 0 and report.spill_loads == 0, (hidden, report.describe())


# the polled points whose chunks split over fewer than 8 k-warps: the default's (None; test above) and k-warps that are
# not a power of two, which only flat sums take (the tree halves k_warps), one or two chunks each where no power of two
# splits R's chunks evenly (H96: 3, H320: 10, H448: 14)
K_WARP_CASES = [(Case(op="LSTM", direction="bidirectional", optional=("sequence_lens", "initial_h", "initial_c"), hidden=384, input_size=7), None),
                (Case(op="GRU", direction="reverse", optional=("sequence_lens", "initial_h"), hidden=192, input_size=5, linear_before_reset=1), None),
                (Case(op="LSTM", direction="forward", optional=("initial_h", "initial_c"), hidden=128, input_size=5), None)]
ODD_K_WARPS = [(Case(op="LSTM", direction="bidirectional", optional=("sequence_lens", "initial_h", "initial_c"), hidden=96, input_size=7), 3),
               (Case(op="GRU", direction="reverse", optional=("sequence_lens", "initial_h"), hidden=320, input_size=5, linear_before_reset=1), 5),
               (Case(op="LSTM", direction="forward", optional=("initial_h", "initial_c"), hidden=448, input_size=5), 7)]


def _k_warp_point(case, k_warps, target, batch=16):
    """The fp16 default point at `batch`, with `k_warps` where given."""
    spec = dataclasses.replace(case.spec(), dtype="float16")
    base = default_config("persistent_mma", spec, cell_for(spec), target, batch)
    return spec, base if k_warps is None else KernelConfig.of("persistent_mma", **{**dict(base.knobs), "k_warps": k_warps})


def test_flat_sums_take_k_warps_that_are_not_a_power_of_two():
    """persistent_mma's polled point with 3, 5 or 7 k-warps and flat sums builds for sm_90a and spills nothing (A in
    registers, two tiles); the tree of partial sums still refuses them."""
    from schedules.ptxas import ptxas

    target = tvm.target.Target({"kind": "cuda", "arch": "sm_90"})
    for case, k_warps in ODD_K_WARPS:
        spec, config = _k_warp_point(case, k_warps, target)
        assert config["flat_sums"] == 1 and config["r_regs"] == 1, config.describe()
        report = ptxas(_source(target, spec, config), "sm_90a")
        assert report.spill_stores == 0 and report.spill_loads == 0, (case.hidden, report.describe())
    spec, config = _k_warp_point(*ODD_K_WARPS[0], target)
    with pytest.raises(AssertionError):
        _source(target, spec, KernelConfig.of("persistent_mma", **{**dict(config.knobs), "flat_sums": 0}))


@pytest.mark.gpu
@pytest.mark.parametrize("batch", [1, 16])
@pytest.mark.parametrize("case, k_warps", K_WARP_CASES + ODD_K_WARPS,
                         ids=lambda v: f"{v.op}-h{v.hidden}" if isinstance(v, Case) else f"k{v or 'default'}")
def test_polled_k_warp_splits_match_float64(case, k_warps, batch):
    """The polled point at `batch` (the default's fewer k-warps, or 3, 5 or 7 with flat sums) against float64 in fp16:
    batches of one pass and of 37 rows (rows of several lengths where sequence_lens), each k-warp's chunks summed once."""
    target = target_of("cuda")
    spec, config = _k_warp_point(case, k_warps, target, batch)
    assert config["k_warps"] < 8 and config["sync"] == 1, config.describe()
    _check_kernel("cuda", dataclasses.replace(case, dtype="float16"), spec, point_kernel(spec, cell_for(spec), target, config),
                  "rows", batches=(batch, 37), note=config.describe())


@pytest.mark.parametrize("kind, batch", [("persistent_mma", 8), ("persistent_mma", 24), ("persistent_mma", 64), ("persistent", 4)])
def test_grid_barrier_kernels_are_bounded_to_one_block_an_sm(kind, batch):
    """A kernel that waits at a grid barrier is launched one block an SM, so its bound says so: __launch_bounds__(threads,
    1) lets ptxas take the registers two blocks would share (the 32-row passes spilled without it)."""
    target = tvm.target.Target({"kind": "cuda", "arch": "sm_90"})
    spec = Case(op="LSTM", hidden=1024, input_size=8, dtype="float16").spec()
    src = _source(target, spec, default_config(kind, spec, cell_for(spec), target, batch))
    assert "grid_sync" in src or "cooperative_groups" in src, src[:400]
    assert re.search(r"__launch_bounds__\(\d+, 1\) \w*rnn_", src), re.findall(r"__launch_bounds__\([^)]*\)", src)


@pytest.mark.parametrize("threads, hidden, directions, units", [("2", 512, 1, 128), ("16", 512, 1, 32), ("16", 512, 2, 64),
                                                                ("2", 24, 1, 16), ("64", 512, 1, 8),
                                                                ("2", 150, 1, 80), ("2", 128, 2, 128)])
def test_small_batch_units_keep_every_thread_busy(threads, hidden, directions, units):
    """The CPU kernel's default work item at batch < 4: as wide as ROW_UNITS while each thread still gets one, in
    whole panels (H = 24 and 150 padded to 32 and 160) or, where 16 divides H, half of one."""
    from schedules.recurrent_cpu import small_batch_units

    assert small_batch_units(hidden, directions, int(threads)) == units


def test_small_persistent_layers_run_one_block_per_direction():
    """A layer whose R of a direction fits ONE_BLOCK_MAX_R_BYTES gets one block per direction by default, a warp per
    unit up to ONE_BLOCK_WARPS, and its steps wait at a block barrier, not a grid barrier; a larger one keeps one block
    per SM and the grid barrier."""
    from schedules.recurrent_persistent import ONE_BLOCK_MAX_R_BYTES, ONE_BLOCK_WARPS

    target = tvm.target.Target({"kind": "cuda", "arch": "sm_90"})
    for case in CASES:
        spec = case.spec()
        point = default_config("persistent", spec, cell_for(spec), target)
        small = spec.gates * spec.hidden_size ** 2 * 4 <= ONE_BLOCK_MAX_R_BYTES
        assert point["blocks"] == (spec.num_directions if small else 132), (case.op, case.hidden, point.describe())
        assert point["warps"] == (min(ONE_BLOCK_WARPS, spec.hidden_size) if small else 8), (case.op, case.hidden)
        assert ("this_grid().sync()" in _source(target, spec, point)) != small, (case.op, case.hidden)


def test_dynamic_shared_arrays_of_one_name_have_one_type():
    """A module's kernels share one translation unit, where extern shared arrays of one name but other types do not
    compile (NVRTC of CUDA 13: "declaration is incompatible"): an fp32 model in half storage at batch 1-16 builds
    cluster kernels (fp32 rows) beside persistent_mma ones (half weights) and f16 projections (H240: not whole
    32-column chunks, so no polled points); each name has one type."""
    import re

    import tvmrnn

    model = Case(op="LSTM", hidden=240, input_size=16).model()
    module = tvmrnn.compile(model, target="cuda", dtype="float16", max_dims={"seq": 8, "batch": 16}, logs=False)
    kinds = {b["config"]["kind"] for b in module.metadata["layers"][0]["schedule"]}
    assert {"cluster", "persistent_mma"} <= kinds, kinds
    src = module.executable.mod.imports[0].imports[0].inspect_source()  # the VM executable > host code > CUDA
    arrays = set(re.findall(r"extern __shared__ __align__\(\d+\) (\w+) (\w+)\[\];", src))
    names = [name for _, name in arrays]
    assert arrays and len(names) == len(set(names)), sorted(arrays)
