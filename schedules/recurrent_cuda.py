"""The recurrent kernel for CUDA, stepwise: per step and phase one fused kernel (recurrent GEMM + gate program).

The host loops over steps and launches; each launch computes, for JB hidden units of one
direction and NB batch rows, all of the phase's gates:

    thread (tx, ty): unit j = bx*JB + tx, reduction slice k = ty, ty+KS, ...;
                     NB x gates accumulators in registers; R^T rows read coalesced along j,
                     h[k] broadcast within a warp
    shared memory:   the KS partial sums, then thread (tx, ty < NB) finishes batch row ty
                     and runs the cell's gate program (the epilogue) for it.

Grid: (ceil(H/JB), D, ceil(N/NB)), so both directions run in the same launch. Hidden state is
double-buffered across steps; the cell state lives in the Yc output. JB, KS, NB are the
knobs the tuner searches.
"""

from __future__ import annotations

from dataclasses import dataclass

from tvm import tirx
from tvm.backend.cuda import op as cuda_op
from tvm.script.ir_builder import IRBuilder
from tvm.script.ir_builder import tirx as T

from tvmrnn.cells import Cell
from tvmrnn.layer import RNNLayerSpec

from .recurrent_common import KernelArgs, i64, unit_padding, unit_step

F32 = "float32"
TRANSPOSED_R = False  # lanes of a warp read along k: ONNX's row-major R is coalesced


@dataclass(frozen=True)
class StepwiseConfig:
    warps: int = 4  # warps per block; each owns `units_per_warp` hidden units (all their gates)
    units_per_warp: int = 1
    batch_tile: int = 8  # NB: batch rows per block, reusing each weight read NB times
    vector: int = 4  # elements of k each lane loads at once (16-byte loads for fp32)


def _sync():
    T.evaluate(tirx.op.tvm_storage_sync("shared"))


def _elementwise(a: KernelArgs, total, body):
    """A simple grid-stride-free elementwise launch over `total` items."""
    with T.thread_binding(0, tirx.ceildiv(total, i64(256)), "blockIdx.x") as bx:
        with T.thread_binding(0, i64(256), "threadIdx.x") as tx:
            idx = bx * i64(256) + tx
            with T.If(idx < total):
                with T.Then():
                    body(idx)


def recurrent_kernel_cuda(spec: RNNLayerSpec, cell: Cell, config: StepwiseConfig = StepwiseConfig()) -> tirx.PrimFunc:
    H, D = spec.hidden_size, spec.num_directions
    a = KernelArgs(spec, cell)
    with IRBuilder() as ib:
        with T.prim_func():
            T.func_name("rnn_recurrent")
            T.func_attr({"tirx.noalias": True})
            a.declare(transposed_r=TRANSPOSED_R)
            N = a.batch
            hbuf = T.alloc_buffer((2, D, N, H), F32)
            scratch = {v: T.alloc_buffer((D, N, H), F32) for v in cell.stored_values}
            DNH = i64(D * H) * N

            def split(idx):
                return idx // (N * H), idx // H % N, idx % H

            def init(idx):
                d, n, j = split(idx)
                T.buffer_store(hbuf, a.initial("h", d, n, j), [i64(0), d, n, j])
                if a.Yc is not None:
                    T.buffer_store(a.Yc, a.initial("c", d, n, j), a.state_index(d, n, j))

            _elementwise(a, DNH, init)

            with T.serial(0, a.seq) as s:
                cur, nxt = s % 2, (s + 1) % 2
                for pi, phase in enumerate(cell.phases):
                    last = pi == len(cell.phases) - 1
                    operand = hbuf if phase.operand == "h" else scratch[phase.operand]
                    _phase_launch(a, phase, last, operand, hbuf, scratch, s, cur, nxt, config)

            def finish(idx):
                d, n, j = split(idx)
                T.buffer_store(a.Yh, hbuf[a.seq % 2, d, n, j], a.state_index(d, n, j))

            _elementwise(a, DNH, finish)
    return ib.get()


def _phase_launch(a: KernelArgs, phase, last, operand, hbuf, scratch, s, cur, nxt, cfg: StepwiseConfig):
    """One step of one phase: warp-per-unit GEMV over k (lanes split k), butterfly sums, fused epilogue."""
    H, N = a.spec.hidden_size, a.batch
    W, UW, NB = cfg.warps, cfg.units_per_warp, cfg.batch_tile
    V = cfg.vector if H % cfg.vector == 0 else 1
    gp = len(phase.gates)
    iters = (H + 32 * V - 1) // (32 * V)

    def h_at(d, n, k):
        return operand[cur, d, n, k] if phase.operand == "h" else operand[d, n, k]

    with T.thread_binding(0, i64((H + W * UW - 1) // (W * UW)), "blockIdx.x") as bx:
        with T.thread_binding(0, i64(a.spec.num_directions), "blockIdx.y") as d:
            with T.thread_binding(0, tirx.ceildiv(N, i64(NB)), "blockIdx.z") as bz:
                with T.thread_binding(0, i64(W), "threadIdx.y") as ty:
                    with T.thread_binding(0, i64(32), "threadIdx.x") as lane:
                        acc = T.alloc_buffer((UW, gp, NB), F32, scope="local")
                        hv = T.alloc_buffer((NB, V), F32, scope="local")
                        wv = T.alloc_buffer((V,), F32, scope="local")
                        u0 = (bx * i64(W) + ty) * i64(UW)
                        n0 = bz * i64(NB)
                        for idx in _grid(UW, gp, NB):
                            T.buffer_store(acc, tirx.const(0.0, F32), idx)
                        with T.serial(0, i64(iters)) as it:
                            k0 = (it * i64(32) + lane) * i64(V)
                            with T.If(k0 < i64(H)):
                                with T.Then():
                                    for b in range(NB):
                                        n = tirx.min(n0 + i64(b), N - 1)  # rows past N compute garbage, never stored
                                        with T.vectorized(0, i64(V)) as v:
                                            T.buffer_store(hv, h_at(d, n, k0 + v), [i64(b), v])
                                    for u in range(UW):
                                        j = tirx.min(u0 + i64(u), i64(H - 1))
                                        for gi, g in enumerate(phase.gates):
                                            with T.vectorized(0, i64(V)) as v:
                                                T.buffer_store(wv, a.R[d, i64(g * H) + j, k0 + v], [v])
                                            for b in range(NB):
                                                for v in range(V):
                                                    idx = [i64(u), i64(gi), i64(b)]
                                                    T.buffer_store(acc, acc[tuple(idx)] + wv[i64(v)] * hv[i64(b), i64(v)], idx)
                        for idx in _grid(UW, gp, NB):
                            T.buffer_store(acc, cuda_op.cuda_warp_sum(acc[tuple(idx)]), idx)
                        # every lane now holds every sum: lane (u, b) finishes unit u of batch row b
                        for u in range(UW):
                            for b in range(NB):
                                j, n = u0 + i64(u), n0 + i64(b)
                                with T.If(tirx.all(lane == i64(u * NB + b), n < N, j < i64(H))):
                                    with T.Then():
                                        _epilogue(a, phase, last, hbuf, scratch, s, cur, nxt, d, n, j,
                                                  lambda gi, u=u, b=b: acc[i64(u), i64(gi), i64(b)])


def _grid(*extents):
    import itertools

    return [[i64(i) for i in idx] for idx in itertools.product(*(range(e) for e in extents))]


def _epilogue(a, phase, last, hbuf, scratch, s, cur, nxt, d, n, j, rec):
    with T.If(s < a.length(n)):
        with T.Then():
            unit_step(a, phase, hbuf, scratch, cur, nxt, d, n, a.time_index(d, n, s), j, rec)
        if last:
            with T.Else():
                unit_padding(a, hbuf, cur, nxt, d, n, s, j)
