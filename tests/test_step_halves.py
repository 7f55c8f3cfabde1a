"""Exact fp32 steps on fp16 tensor cores (f16x3, schedules.step_halves): where the default runs them, what they build,
and (on the GPU) that they keep fp32's accuracy whatever the magnitudes of R's rows and of h0."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import tvm

from compiled import target_of
from onnx_cases import Case
from schedules import cooperative, point_kernel, recurrent_kernel
from schedules.cells import cell_for, state_bound
from schedules.device import Device
from schedules.recurrent_mma import MmaConfig
from schedules.recurrent_persistent_mma import fits
from schedules.space import KernelConfig, default_config, knob_space
from test_kernels import _check_kernel, _source

SM90 = tvm.target.Target({"kind": "cuda", "arch": "sm_90"})


def _spec(case, **changes):
    return dataclasses.replace(case.spec(), **changes)


@pytest.mark.parametrize("op, activations, alpha, bound", [
    ("LSTM", None, None, 1.0),
    ("LSTM", ("Sigmoid", "ScaledTanh", "ScaledTanh"), (2.0, 3.0), 3.0),  # o in [0, 1] times |h(c)| <= 3
    ("LSTM", ("Tanh", "Tanh", "Softsign"), None, 1.0),
    ("LSTM", ("Sigmoid", "Tanh", "Relu"), None, None),
    ("GRU", None, None, 1.0),
    ("GRU", ("HardSigmoid", "ScaledTanh"), (0.2, 4.0), 4.0),
    ("GRU", ("Tanh", "Tanh"), None, None),  # z outside [0, 1]: h is no convex combination
    ("RNN", None, None, 1.0),
    ("RNN", ("Relu",), None, None),
])
def test_state_bound_follows_the_activations(op, activations, alpha, bound):
    """cells.state_bound: the bound on |h| the cell's activations give, None where they give none."""
    case = Case(op=op, hidden=16, input_size=4, activations=activations, activation_alpha=alpha)
    assert state_bound(_spec(case)) == bound


@pytest.mark.parametrize("case", [
    Case(op="LSTM", direction="bidirectional", optional=("sequence_lens", "initial_h", "initial_c"), hidden=24, input_size=7),
    Case(op="GRU", direction="reverse", optional=("sequence_lens", "initial_h"), hidden=33, input_size=5, layout=1),
    Case(op="GRU", hidden=64, input_size=5, linear_before_reset=1),
], ids=lambda c: f"{c.op}-{c.optional}")
def test_f16x3_kernels_build_inside_the_batch_dispatch(case):
    """A layer's kernel is a dispatch over batch buckets, and TVM's barrier planner cannot add a barrier inside its
    branches: every barrier the f16x3 prologue needs (row scales, the halves' copy, h0's largest magnitude) is its own.
    The whole dispatch builds for the H100 through NVRTC, its persistent_mma branches running f16x3."""
    spec = _spec(case)
    target = tvm.target.Target({"kind": "cuda", "arch": "sm_90a"})
    kernel = recurrent_kernel(spec, cell_for(spec), target, "persistent_mma")
    assert kernel.plan.describe().count("halves=1") == len(kernel.plan.branches) > 1
    src = tvm.tirx.build(kernel.func, target=target, pipeline=cooperative.register()).imports[0].inspect_source()
    assert "mma.sync.aligned.m16n8k16" in src and "m16n8k8" not in src


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_a_branch_after_one_with_operand_copies_writes_none(dtype):
    """A tuned plan may follow a persistent_mma branch (f16x3's scaled halves of h in fp32, its half copy in fp16) with a
    kind that keeps no copies: that branch builds, and stores no halves (the copies live in the branch that made them)."""
    from schedules import Branch, _prim_func

    spec = _spec(Case(op="GRU", hidden=64, input_size=8, optional=("initial_h",), dtype=dtype))
    cell = cell_for(spec)
    first = Branch(8, default_config("persistent_mma", spec, cell, SM90, 8), False)

    def source(branches):
        func, _ = _prim_func(spec, cell, SM90, branches)
        return tvm.tirx.build(func.with_attr("tirx.is_scheduled", True), target=SM90, pipeline=cooperative.register()).imports[0].inspect_source()

    alone = source([first]).count("(half)")
    assert alone > 0
    for kind in ("stepwise", "tiled"):
        assert source([first, Branch(None, default_config(kind, spec, cell, SM90, 64), False)]).count("(half)") == alone, kind


def test_exact_fp32_default_runs_f16x3_steps_where_h_is_bounded():
    """The exact-fp32 persistent_mma default runs f16x3 (halves=1): fp16 m16n8k16 mma's and no TF32 ones, R's halves
    made in the kernel from fp32 R (its argument stays fp32). Not where h is unbounded (a Relu cell), in TF32 or fp16
    (there is no 3xTF32 to replace), or with chunks of R streamed from L2 into registers (without the ring, which carries
    the streamed chunks' halves)."""
    lstm = _spec(Case(op="LSTM", direction="bidirectional", optional=("initial_h",), hidden=96, input_size=8))
    cell = cell_for(lstm)
    for batch in (6, 16, 64):
        assert default_config("persistent_mma", lstm, cell, SM90, batch)["halves"] == 1, batch
    assert knob_space("persistent_mma", lstm, cell, SM90)["halves"] == (0, 1)
    point = default_config("persistent_mma", lstm, cell, SM90, 16)
    src = _source(SM90, lstm, point)
    assert "mma.sync.aligned.m16n8k16" in src and "m16n8k8" not in src and "float* __restrict__ R" in src
    plain = _source(SM90, lstm, KernelConfig.of("persistent_mma", **{**dict(point.knobs), "halves": 0}))
    assert "m16n8k8" in plain and "m16n8k16" not in plain
    relu = _spec(Case(op="RNN", hidden=96, input_size=8, activations=("Relu",)))
    for spec in (relu, dataclasses.replace(lstm, precision="tf32"), dataclasses.replace(lstm, dtype="float16")):
        assert default_config("persistent_mma", spec, cell_for(spec), SM90, 16)["halves"] == 0
        assert "halves" not in knob_space("persistent_mma", spec, cell_for(spec), SM90)
        assert not fits(spec, cell_for(spec), Device.cuda("sm_90"), MmaConfig(halves=1))
    assert fits(lstm, cell, Device.cuda("sm_90"), MmaConfig(halves=1)) and not fits(lstm, cell, Device.cuda("sm_90"), MmaConfig(halves=1, streamed=1))
    assert fits(lstm, cell, Device.cuda("sm_90"), MmaConfig(halves=1, streamed=1, ring=2, k_warps=2, depth=1))


@pytest.mark.parametrize("hidden, direction", [(1024, "forward"), (800, "bidirectional")])
def test_every_point_of_the_space_fits_with_the_row_scales(hidden, direction):
    """The f16x3 row scales take shared memory beside R: every combination of persistent_mma's knobs (halves among them)
    still fits one wave, at the H100's largest resident layers (b64-h1024-l2's, ds2-5l-bi's)."""
    import itertools

    spec = _spec(Case(op="LSTM", direction=direction, hidden=hidden, input_size=64))
    cell = cell_for(spec)
    space = knob_space("persistent_mma", spec, cell, SM90)
    assert space["halves"] == (0, 1)
    for values in itertools.product(*space.values()):
        assert fits(spec, cell, Device.cuda("sm_90"), MmaConfig(**dict(zip(space, values)))), dict(zip(space, values))


@dataclasses.dataclass(frozen=True)
class Magnitudes(Case):
    """A case whose R rows are scaled by powers of two from 2^-12 to 2 and whose h0 is 8 times the usual (up to about 30,
    so h's scale comes from h0, not from the cell's bound of 1)."""

    def weights(self) -> dict:
        w = super().weights()
        rows = w["R"].shape[1]
        factors = 2.0 ** np.random.default_rng(1).integers(-12, 2, rows)
        w["R"] = (w["R"] * factors[None, :, None]).astype(self.dtype)
        return w

    def feeds(self, rng, T, N) -> dict:
        f = super().feeds(rng, T, N)
        f["initial_h"] = (f["initial_h"] * 8).astype(self.dtype)
        return f


@pytest.mark.gpu
@pytest.mark.parametrize("case", [
    Magnitudes(op="LSTM", direction="bidirectional", optional=("sequence_lens", "initial_h", "initial_c"), hidden=96, input_size=7),
    Magnitudes(op="GRU", direction="reverse", optional=("sequence_lens", "initial_h"), hidden=72, input_size=5, layout=1),
], ids=lambda c: c.op)
def test_f16x3_steps_keep_fp32_accuracy_across_magnitudes(case):
    """f16x3 steps against float64 on poisoned outputs: rows of R 2^13 apart in magnitude (each scaled on its own) and h0
    far above the cell's bound (the launch's scale of h comes from max |h0|), at batches under and over one pass; every
    output within 1e-5 of the largest reference element, as the 3xTF32 steps on the same inputs."""
    spec = case.spec()
    cell, target = cell_for(spec), target_of("cuda")
    base = default_config("persistent_mma", spec, cell, target, 16)
    assert base["halves"] == 1
    errors = {}
    for halves in (1, 0):
        point = KernelConfig.of("persistent_mma", **{**dict(base.knobs), "halves": halves})
        # elementwise, as loose as the large rec terms of step 0 need; the bound that matters is the one below
        outs = _check_kernel("cuda", case, spec, point_kernel(spec, cell, target, point), "rows", batches=(6, 37), note=point.describe(),
                             tol=(1e-3, 1e-4))
        rng = np.random.default_rng(7)  # _check_kernel's inputs, again
        worst = 0.0
        for got, N in zip(outs, (6, 37)):
            ref = case.reference(case.feeds(rng, 9, N))
            worst = max(worst, *(np.abs(g - ref[n]).max() / np.abs(ref[n]).max() for g, n in zip(got, ref)))
        errors[halves] = worst
    assert errors[1] < 1e-5 and errors[1] <= 4 * errors[0], errors


# streamed chunks through the ring in f16x3 (recurrent_persistent_mma.streaming_config, the exact-fp32 default there):
# rows of R 2^13 apart, h0 8 times the usual; a round of whole chunks, a partial last round, h's chunks in the ring, 20
# units a block (8-row groups holding two gates' rows), a GRU's two phases
STREAMED = [
    (Magnitudes(op="LSTM", direction="bidirectional", optional=("sequence_lens", "initial_h", "initial_c"), hidden=96, input_size=7),
     dict(units=8, n_tiles=1, n_warps=2, k_warps=2, depth=1, prefetch=1, streamed=2, ring=2)),
    (Magnitudes(op="GRU", direction="reverse", optional=("sequence_lens", "initial_h"), hidden=128, input_size=5, layout=1),
     dict(units=8, n_tiles=2, n_warps=2, k_warps=2, depth=2, prefetch=1, streamed=3, ring=2, ring_h=1)),
    (Magnitudes(op="LSTM", direction="forward", optional=("sequence_lens", "initial_h", "initial_c"), hidden=160, input_size=7),
     dict(units=20, n_tiles=2, n_warps=2, k_warps=2, depth=1, prefetch=0, streamed=4, ring=3, ring_h=1)),
]


def test_streamed_f16x3_points_build_without_a_gpu():
    """blog-a's streaming default runs f16x3 steps (its streamed chunks' halves written once per launch, read through the
    ring with h's) and compiles through NVRTC: fp16 mma's only, no spills; without the ring it does not fit."""
    from schedules.ptxas import ptxas

    spec = _spec(Case(op="LSTM", hidden=2560, input_size=8, optional=("initial_h",)))
    cell, target = cell_for(spec), tvm.target.Target({"kind": "cuda", "arch": "sm_90a"})
    point = default_config("persistent_mma", spec, cell, target, 64)
    assert point["streamed"] > 0 and point["halves"] == 1
    cfg = MmaConfig(**dict(point.knobs))
    assert fits(spec, cell, Device.cuda("sm_90a"), cfg) and not fits(spec, cell, Device.cuda("sm_90a"), dataclasses.replace(cfg, ring=0, ring_h=0))
    src = tvm.tirx.build(point_kernel(spec, cell, target, point, 4, 64), target=target, pipeline=cooperative.register()).imports[0].inspect_source()
    assert "mma.sync.aligned.m16n8k16" in src and "m16n8k8" not in src
    report = ptxas(src, "sm_90a")
    assert report.spill_stores == report.spill_loads == 0, report.describe()
    for case, knobs in STREAMED:  # the GPU test's points
        spec = _spec(case)
        point = KernelConfig.of("persistent_mma", **knobs, halves=1)
        assert fits(spec, cell_for(spec), Device.cuda("sm_90"), MmaConfig(**dict(point.knobs))), point.describe()
        assert "m16n8k8" not in _source(SM90, spec, point), point.describe()


@pytest.mark.gpu
@pytest.mark.parametrize("case, knobs", STREAMED, ids=lambda c: str(c) if isinstance(c, dict) else f"{c.op}-h{c.hidden}")
def test_streamed_f16x3_steps_are_fp32_accurate(case, knobs):
    """Streamed chunks in f16x3 against float64 on poisoned outputs, within 1e-5 of the largest reference element and 4x
    the 3xTF32 steps' error on the same inputs, at a batch under one pass and one over it."""
    spec = case.spec()
    cell, target = cell_for(spec), target_of("cuda")
    errors = {}
    for halves in (1, 0):
        point = KernelConfig.of("persistent_mma", **knobs, halves=halves)
        outs = _check_kernel("cuda", case, spec, point_kernel(spec, cell, target, point), "rows", batches=(6, 37), note=point.describe(),
                             tol=(1e-3, 1e-4))
        rng = np.random.default_rng(7)
        errors[halves] = max(np.abs(g - ref).max() / np.abs(ref).max()
                             for got, N in zip(outs, (6, 37)) for g, ref in zip(got, case.reference(case.feeds(rng, 9, N)).values()))
    assert errors[1] < 1e-5 and errors[1] <= 4 * errors[0], errors
