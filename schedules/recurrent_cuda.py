"""The recurrent kernel for CUDA, stepwise: per step and phase one fused launch (recurrent GEMV/GEMM + gate program).

The host loops over steps and launches; each launch covers (unit blocks, directions, batch
tiles). A warp owns `units_per_warp` hidden units with all their gates (warp_gemv): lanes split
the reduction over k with 16-byte loads of R straight from L2/HBM, each weight read serves
`batch_tile` batch rows, and a butterfly shuffle leaves the sums in every lane, so the gate
program (the epilogue) runs in the lanes that own (unit, row). Hidden state is double-buffered
across steps; the cell state lives in the Yc output. Both directions run in the same launch.
The config fields are the knobs the tuner searches.
"""

from __future__ import annotations

from dataclasses import dataclass

from tvm import tirx
from tvm.script.ir_builder import tirx as T

from .cells import Cell
from .layer import RNNLayerSpec

from .recurrent_common import KernelArgs, i64, recurrent_prim_func, step_phases, store_operand, unit_padding, unit_step
from . import vector_math
from .warp_gemv import warp_gates

F32 = "float32"
R_LAYOUT = "rows"  # lanes of a warp read along k: ONNX's row-major R is coalesced


@dataclass(frozen=True)
class StepwiseConfig:
    warps: int = 4  # warps per block; each owns `units_per_warp` hidden units (all their gates)
    # 1 unit per warp: 2 (each h load serving both) leaves fewer blocks in flight, and ran slower at batch 8-20
    units_per_warp: int = 1
    batch_tile: int = 8  # NB: batch rows per block, reusing each weight read NB times


def _elementwise(a: KernelArgs, total, body):
    """A simple grid-stride-free elementwise launch over `total` items."""
    with T.thread_binding(0, tirx.ceildiv(total, i64(256)), "blockIdx.x") as bx:
        with T.thread_binding(0, i64(256), "threadIdx.x") as tx:
            idx = bx * i64(256) + tx
            with T.If(idx < total):
                with T.Then():
                    body(idx)


def xw_dtype(spec: RNNLayerSpec) -> str:
    """The dtype a CUDA kernel reads the layer's XW in: the layer's own (a half layer's XW in half precision; the
    projection GEMM writes it so, and lowering reads it back)."""
    return spec.dtype


def cuda_prim_func(spec: RNNLayerSpec, cell: Cell, emit_body, seq=None, batch=None) -> tirx.PrimFunc:
    """Every CUDA kernel's PrimFunc: R and XW in the layer's storage dtype."""
    return recurrent_prim_func(spec, cell, R_LAYOUT, emit_body, weight_dtype=spec.dtype, seq=seq, batch=batch, xw_dtype=xw_dtype(spec))


def weight_bytes(spec: RNNLayerSpec) -> int:
    """Bytes per element of R at the layer's storage dtype."""
    return 4 if spec.dtype == "float32" else 2


def vector_width(spec: RNNLayerSpec, H: int) -> int:
    """Elements of R per 16-byte load (4 fp32, 8 fp16/bf16), or 1 when H does not divide."""
    v = 16 // weight_bytes(spec)
    return v if H % v == 0 else 1


def recurrent_kernel_cuda(spec: RNNLayerSpec, cell: Cell, config: StepwiseConfig = StepwiseConfig()) -> tirx.PrimFunc:
    return cuda_prim_func(spec, cell, lambda a: stepwise_body(a, config))


def stepwise_body(a: KernelArgs, config: StepwiseConfig):
    step_launches(a, lambda *args: _phase_launch(*args, config))


def step_launches(a: KernelArgs, launch):
    """Initial states, then per step and phase one launch, then the final hidden state: the host loop
    both launch-per-step kernels share. launch(a, phase, last, operand, hbuf, scratch, s, cur, nxt)."""
    spec, cell = a.spec, a.cell
    H, D = spec.hidden_size, spec.num_directions
    hbuf = T.alloc_buffer((2, D, a.batch, H), F32)
    scratch = {v: T.alloc_buffer((D, a.batch, H), F32) for v in cell.stored_values}
    initial_launch(a, hbuf)
    step_phases(a, hbuf, scratch, lambda _pi, phase, last, operand, s, cur, nxt:
                launch(a, phase, last, operand, hbuf, scratch, s, cur, nxt))
    final_launch(a, hbuf)


def _each_state(a: KernelArgs, body):
    """A launch over every (direction, batch row, unit): body(d, n, j)."""
    N, H = a.batch, a.spec.hidden_size
    _elementwise(a, i64(a.spec.num_directions * H) * N, lambda idx: body(idx // (N * H), idx // H % N, idx % H))


def initial_launch(a: KernelArgs, hbuf):
    """The initial h into hbuf's first half (and its copies), the initial c into Yc, where the cell's state lives."""
    def init(d, n, j):
        store_operand(a, "h", hbuf, a.initial("h", d, n, j), [i64(0), d, n, j])
        if a.Yc is not None:
            T.buffer_store(a.Yc, a.initial("c", d, n, j), a.state_index(d, n, j))

    _each_state(a, init)


def final_launch(a: KernelArgs, hbuf):
    """Yh from the half of hbuf the last step wrote."""
    _each_state(a, lambda d, n, j: T.buffer_store(a.Yh, hbuf[a.seq % 2, d, n, j], a.state_index(d, n, j)))


def _phase_launch(a: KernelArgs, phase, last, operand, hbuf, scratch, s, cur, nxt, cfg: StepwiseConfig):
    """One step of one phase: blocks of warps over (units, direction, batch tile); weights from global memory."""
    H, N = a.spec.hidden_size, a.batch
    W, UW, NB = cfg.warps, cfg.units_per_warp, cfg.batch_tile
    V = vector_width(a.spec, H)

    with T.thread_binding(0, i64((H + W * UW - 1) // (W * UW)), "blockIdx.x") as bx:
        with T.thread_binding(0, i64(a.spec.num_directions), "blockIdx.y") as d:
            with T.thread_binding(0, tirx.ceildiv(N, i64(NB)), "blockIdx.z") as bz:
                with T.thread_binding(0, i64(W), "threadIdx.y") as ty:
                    with T.thread_binding(0, i64(32), "threadIdx.x") as lane:
                        u0 = (bx * i64(W) + ty) * i64(UW)
                        n0 = bz * i64(NB)

                        def h_at(u, b, k):
                            n = tirx.min(n0 + i64(b), N - 1)  # rows past N compute garbage, never stored
                            return operand_at(operand, phase, cur, d, n, k)

                        def w_at(u, g, k):
                            return a.R[d, i64(g * H) + tirx.min(u0 + i64(u), i64(H - 1)), k]

                        def finish(u, b, rec):
                            j, n = u0 + i64(u), n0 + i64(b)
                            with T.If(tirx.all(n < N, j < i64(H))):
                                with T.Then():
                                    epilogue(a, phase, last, hbuf, scratch, s, cur, nxt, d, n, j, rec)

                        # no row_valid skip here: on the H100 its branches cost more than the rows they save
                        warp_gates(lane, H, phase.gates, UW, NB, V, h_at, w_at, finish)


def operand_index(phase, cur, d, n, k):
    """The index of element k of batch row n in the vector a phase multiplies: the double-buffered h [2, D, N, H], or a
    value an earlier phase stored [D, N, H]."""
    return [cur, d, n, k] if phase.operand == "h" else [d, n, k]


def operand_at(operand, phase, cur, d, n, k):
    """Element k of the vector a phase multiplies (operand_index)."""
    return operand[tuple(operand_index(phase, cur, d, n, k))]


def accurate_math(spec) -> bool:
    """Whether a layer's CUDA epilogue computes sigmoid and tanh itself, with vector_math's float32 formulas (within
    1.5e-7 of float64): exact fp32 layers. TVM 0.27 compiles CUDA with --use_fast_math, which turns tanhf into the
    tanh.approx.f32 instruction (2^-11 relative error at worst), expf into ex2.approx of a rounded x*log2(e), and 1/x
    into an approximate reciprocal, for the whole module; the additions, products and fused multiply-adds the formulas
    use stay exact IEEE operations under fast math (only denormals flush). Half-precision storage and TF32 round far
    more than the fast-math functions do, so they keep them."""
    return spec.dtype == "float32" and spec.precision == "exact"


def epilogue(a, phase, last, hbuf, scratch, s, cur, nxt, d, n, j, rec, x=None, activated=None, state=None):
    """The gate program for a valid step, or (after the last phase) the padding rule past the sequence's end.
    x(gi): the gates' input projections where the kernel loaded them ahead, activated: the gates it activated ahead
    (recurrent_common.unit_results), state: the carried states it loaded ahead (recurrent_common.carried_states)."""
    with T.If(s < a.length(n)):
        with T.Then():
            unit_step(a, phase, hbuf, scratch, cur, nxt, d, n, a.time_index(d, n, s), j, rec,
                      temps=vector_math.RegisterTemps() if accurate_math(a.spec) else None, x=x, activated=activated,
                      state=state)
        if last:
            with T.Else():
                unit_padding(a, hbuf, cur, nxt, d, n, s, j)
