"""The persistent kernel's step synchronization by tagged words (knob sync=1, schedules.step_sync) in place of a grid
barrier a step: against float64 on poisoned outputs (tests/test_kernels.py's check), relaunched on the workspace an
earlier launch left its tags in, one step long; a standalone kernel that only passes values between blocks; and,
without a GPU, that every such kernel builds through NVRTC and ptxas for sm_90a."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import tvm
from tvm import tirx
from tvm.backend.cuda import op as cuda_op
from tvm.script.ir_builder import IRBuilder
from tvm.script.ir_builder import tirx as T

from compiled import target_of
from onnx_cases import Case
from schedules import cooperative, point_kernel, step_sync
from schedules.ptxas import ptxas
from schedules.recurrent_common import i64
from schedules.space import KernelConfig, default_config, knob_space
from test_kernels import _check_kernel
from schedules.cells import cell_for

SM90A = tvm.target.Target({"kind": "cuda", "arch": "sm_90a"})


def _layer(op, hidden, direction="bidirectional", dtype="float32", lbr=0, lens=True):
    """A layer with initial states (and sequence_lens; B where linear_before_reset, so Rb_h is not zero), in `dtype`,
    unless R would not fit a wave of the persistent kernel's blocks in fp32 (LSTM H1024 in both directions): then in
    fp16."""
    optional = ("B",) * bool(lbr) + ("sequence_lens",) * lens + ("initial_h",) + (("initial_c",) if op == "LSTM" else ())
    case = Case(op=op, direction=direction, optional=optional, hidden=hidden, input_size=16, linear_before_reset=lbr)
    spec = dataclasses.replace(case.spec(), dtype=dtype)
    if dtype == "float32" and op == "LSTM" and hidden == 1024 and direction == "bidirectional":
        spec = dataclasses.replace(spec, dtype="float16")
    return dataclasses.replace(case, dtype=spec.dtype), spec


def _synced(spec, target, **knobs) -> KernelConfig:
    """The persistent kind's default point with sync=1 (and `knobs`)."""
    base = default_config("persistent", spec, cell_for(spec), target)
    return KernelConfig.of("persistent", **{**dict(base.knobs), "sync": 1, **knobs})


def _kernel(spec, target, **knobs):
    config = _synced(spec, target, **knobs)
    return point_kernel(spec, cell_for(spec), target, config), config.describe()


@pytest.mark.gpu
@pytest.mark.parametrize("direction", ["forward", "bidirectional"])
@pytest.mark.parametrize("hidden", [256, 512, 1024])
@pytest.mark.parametrize("op", ["LSTM", "GRU"])
def test_sync_matches_float64(op, hidden, direction):
    """Batch 1 and 4, sequence_lens shorter than the sequence (padded steps carry h and still publish it), GRU's two
    phases (r*h published within the step), both directions at once."""
    case, spec = _layer(op, hidden, direction)
    func, note = _kernel(spec, target_of("cuda"))
    _check_kernel("cuda", case, spec, func, "rows", batches=(1, 4), note=note)


OTHER_KNOBS = [(("LSTM", "float32", 0), {"stage_h": 1}), (("GRU", "float32", 0), {"stage_h": 0, "batch_tile": 2}),
               (("GRU", "float32", 0), {"stage_h": 1, "batch_tile": 4, "prefetch": 1}), (("GRU", "float32", 1), {"stage_h": 1}),
               (("GRU", "float32", 1), {"stage_h": 0}),
               (("LSTM", "float16", 0), {"stage_h": 0, "batch_tile": 2}), (("LSTM", "float32", 0), {"warps": 4, "blocks": 66}),
               (("GRU", "float16", 0), {"warps": 4, "blocks": 66, "stage_h": 1})]


@pytest.mark.gpu
@pytest.mark.parametrize("layer, knobs", OTHER_KNOBS, ids=lambda v: "-".join(map(str, v)) if isinstance(v, tuple) else str(v))
def test_sync_with_every_other_knob(layer, knobs):
    """h polled by each warp or staged by the block, batch tiles wider than the batch's rest, a smaller grid (blocks
    with several units a warp), GRU with one phase (linear_before_reset) and fp16 weights."""
    op, dtype, lbr = layer
    case, spec = _layer(op, 256, dtype=dtype, lbr=lbr)
    func, note = _kernel(spec, target_of("cuda"), **knobs)
    _check_kernel("cuda", case, spec, func, "rows", batches=(1, 7), note=note)


@pytest.mark.gpu
@pytest.mark.parametrize("op", ["LSTM", "GRU"])
def test_relaunch_never_reads_stale_tags(op):
    """One module launched four times in a row at one batch (so the workspace holding the words is likely the same
    memory): a 1-step launch leaves tag 1 in h's slot 1, which a launch that did not clear its tags would take for
    step 1's h; then 9, 2 and 9 steps, each on fresh inputs and twice."""
    case, spec = _layer(op, 256)
    func, note = _kernel(spec, target_of("cuda"))
    _check_kernel("cuda", case, spec, func, "rows", batches=(4, 4, 4, 4), steps=(1, 9, 2, 9), note=note)


@pytest.mark.gpu
@pytest.mark.parametrize("hidden", [256, 1024])
def test_one_step(hidden):
    """T = 1: the initial state is the only operand ever polled, Y_h is the first step's h."""
    case, spec = _layer("GRU", hidden)
    func, note = _kernel(spec, target_of("cuda"))
    _check_kernel("cuda", case, spec, func, "rows", batches=(1, 4), steps=1, note=note)


def relay_kernel(width: int = 256, units: int = 32) -> tirx.PrimFunc:
    """relay(x0 [width], out [steps, width]): blocks of `units` threads, one value each; every step each thread polls
    all `width` words of the last step (float4 at a time) and keeps the one `units` places on (read again alone), so
    out[s, j] = x0[(j + (s + 1) * units) % width] + s + 1 exactly, every block having waited on every other."""
    steps = tirx.Var("steps", "int64")
    f32 = "float32"
    with IRBuilder() as ib:
        with T.prim_func():
            T.func_name("relay")
            x0 = T.arg("x0", T.Buffer((width,), f32))
            out = T.arg("out", T.Buffer((steps, width), f32))
            words = step_sync.alloc_words((2, width))
            with T.thread_binding(0, i64(width // units), "blockIdx.x") as bx:
                with T.thread_binding(0, i64(units), "threadIdx.x") as tx:
                    j = bx * i64(units) + tx
                    step_sync.publish(words, [i64(0), j], x0[j], step_sync.tag_of(0))
                    step_sync.publish(words, [i64(1), j], tirx.const(0.0, f32), step_sync.invalid())
                    T.evaluate(cuda_op.cuda_grid_sync())
                    src = (j + i64(units)) % i64(width)
                    with T.serial(0, steps) as s:
                        acc = T.alloc_buffer((1,), f32, scope="local")
                        quad = T.alloc_buffer((4,), f32, scope="local")
                        T.buffer_store(acc, tirx.const(0.0, f32), [0])
                        with T.serial(0, i64(width // 4)) as k4:
                            T.buffer_store(quad, step_sync.wait(words, [s % 2, k4 * 4], step_sync.tag_of(s), 4), [tirx.Ramp(i64(0), i64(1), 4)])
                            for v in range(4):
                                T.buffer_store(acc, acc[0] + tirx.Select(k4 * 4 + v == src, quad[v], tirx.const(0.0, f32)), [0])
                        once = step_sync.wait(words, [s % 2, src], step_sync.tag_of(s))  # the same value by the scalar poll
                        half = tirx.const(0.5, f32)
                        T.buffer_store(out, acc[0] * half + once * half + tirx.const(1.0, f32), [s, j])
                        step_sync.publish(words, [(s + 1) % 2, j], out[s, j], step_sync.tag_of(s + 1))
    return ib.get()


@pytest.mark.gpu
def test_relay_kernel_passes_every_value():
    lib = tvm.compile(tvm.IRModule({"main": relay_kernel()}), target=target_of("cuda"), tir_pipeline=cooperative.register())
    dev = tvm.cuda(0)
    for steps in (1, 50, 2, 50):
        x0 = np.random.default_rng(steps).permutation(256).astype("f4")
        out = tvm.runtime.tensor(np.full((steps, 256), np.nan, "f4"), dev)
        lib["main"](tvm.runtime.tensor(x0, dev), out)
        s = np.arange(steps)[:, None]
        expected = x0[(np.arange(256)[None, :] + (s + 1) * 32) % 256] + s + 1
        np.testing.assert_array_equal(out.numpy(), expected.astype("f4"))


def _source(func) -> str:
    return tvm.tirx.build(func, target=SM90A, pipeline=cooperative.register()).imports[0].inspect_source()


@pytest.mark.parametrize("layer", [("LSTM", 256, "float32", 0, 0), ("GRU", 1024, "float32", 0, 1), ("GRU", 33, "float16", 1, 0),
                                   ("LSTM", 1024, "float16", 0, 1)], ids=lambda v: "-".join(map(str, v)))
def test_sync_builds_without_a_gpu(layer):
    """sync=1 compiles through NVRTC and ptxas for sm_90a (the inline PTX assembles, nothing spills) with one grid
    barrier, the one after the initial states, and polls with relaxed loads; h polled by each warp or staged (last
    field); H 33 takes the scalar poll (no float4 of h)."""
    op, hidden, dtype, lbr, stage_h = layer
    _, spec = _layer(op, hidden, dtype=dtype, lbr=lbr)
    synced = _source(_kernel(spec, SM90A, stage_h=stage_h, batch_tile=2, blocks=132)[0])
    assert synced.count("tvm_builtin_cuda_grid_sync();") == 1
    assert "ld.relaxed.gpu" in synced and ("tvmrnn_wait_tagged4(" in synced) == (hidden % 4 == 0)
    report = ptxas(synced, "sm_90a")
    assert report.spill_stores == 0, report.describe()


def test_grid_barrier_kernel_polls_nothing():
    """sync=0 (the default) keeps a grid barrier after every phase and publishes nothing."""
    _, spec = _layer("GRU", 256)
    plain = _source(point_kernel(spec, cell_for(spec), SM90A, default_config("persistent", spec, cell_for(spec), SM90A)))
    assert "tvmrnn_wait_tagged" not in plain and "tvmrnn_publish_tagged" not in plain
    assert plain.count("tvm_builtin_cuda_grid_sync();") == 1 + len(cell_for(spec).phases)


def test_relay_kernel_builds_without_a_gpu():
    src = _source(relay_kernel())
    assert "tvmrnn_wait_tagged4(" in src and "tvmrnn_wait_tagged(" in src and ptxas(src, "sm_90a").spill_stores == 0


def test_sync_is_a_knob_whose_default_is_the_grid_barrier():
    """sync is searched; the default stays 0 until measured, and a logged point without it is the sync=0 point."""
    _, spec = _layer("LSTM", 256)
    cell = cell_for(spec)
    assert knob_space("persistent", spec, cell, SM90A)["sync"] == (0, 1)
    assert default_config("persistent", spec, cell, SM90A)["sync"] == 0
    old = KernelConfig.from_dict({"kind": "persistent", "blocks": 132, "warps": 8, "batch_tile": 1, "stage_h": 0})
    assert old == KernelConfig.of("persistent", blocks=132, warps=8, batch_tile=1, stage_h=0, sync=0) and old["sync"] == 0
