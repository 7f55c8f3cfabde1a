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
from tvm.script.ir_builder import IRBuilder
from tvm.script.ir_builder import tirx as T

from tvmrnn.cells import Cell
from tvmrnn.layer import RNNLayerSpec

from .recurrent_common import KernelArgs, i64, unit_padding, unit_step

F32 = "float32"


@dataclass(frozen=True)
class StepwiseConfig:
    units_per_block: int = 32  # JB: threads along hidden units (a warp: coalesced weight rows)
    k_split: int = 8  # KS: threads splitting the reduction over H
    batch_tile: int = 4  # NB: batch rows per block, reusing each weight read NB times

    def __post_init__(self):
        if self.batch_tile > self.k_split:
            raise ValueError("batch_tile must not exceed k_split (the epilogue uses one thread row per batch row)")


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
    JB, KS, NB = config.units_per_block, config.k_split, config.batch_tile
    a = KernelArgs(spec, cell)
    with IRBuilder() as ib:
        with T.prim_func():
            T.func_name("rnn_recurrent")
            T.func_attr({"tirx.noalias": True})
            a.declare()
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
    H, N = a.spec.hidden_size, a.batch
    JB, KS, NB = cfg.units_per_block, cfg.k_split, cfg.batch_tile
    gp = len(phase.gates)
    kper = (H + KS - 1) // KS

    def h_at(d, n, k):
        return operand[cur, d, n, k] if phase.operand == "h" else operand[d, n, k]

    with T.thread_binding(0, i64((H + JB - 1) // JB), "blockIdx.x") as bx:
        with T.thread_binding(0, i64(a.spec.num_directions), "blockIdx.y") as d:
            with T.thread_binding(0, tirx.ceildiv(N, i64(NB)), "blockIdx.z") as bz:
                with T.thread_binding(0, i64(KS), "threadIdx.y") as ty:
                    with T.thread_binding(0, i64(JB), "threadIdx.x") as tx:
                        part = T.alloc_buffer((KS, gp, NB, JB), F32, scope="shared")
                        acc = T.alloc_buffer((gp, NB), F32, scope="local")
                        j = bx * i64(JB) + tx
                        jr = tirx.min(j, i64(H - 1))  # clamped: threads past H compute garbage they never store
                        n0 = bz * i64(NB)
                        for gi in range(gp):
                            for b in range(NB):
                                T.buffer_store(acc, tirx.const(0.0, F32), [i64(gi), i64(b)])
                        with T.serial(0, i64(kper)) as kk:
                            k = kk * i64(KS) + ty
                            with T.If(k < i64(H)):
                                with T.Then():
                                    for gi, g in enumerate(phase.gates):
                                        w = a.RT[d, k, i64(g * H) + jr]
                                        for b in range(NB):
                                            n = tirx.min(n0 + i64(b), N - 1)
                                            T.buffer_store(acc, acc[i64(gi), i64(b)] + w * h_at(d, n, k), [i64(gi), i64(b)])
                        for gi in range(gp):
                            for b in range(NB):
                                T.buffer_store(part, acc[i64(gi), i64(b)], [ty, i64(gi), i64(b), tx])
                        _sync()
                        n = n0 + ty
                        with T.If(tirx.all(ty < i64(NB), n < N, j < i64(H))):
                            with T.Then():
                                _epilogue(a, phase, last, hbuf, scratch, s, cur, nxt, d, n, j, ty, tx, part, KS, gp)


def _epilogue(a, phase, last, hbuf, scratch, s, cur, nxt, d, n, j, b, tx, part, KS, gp):
    tot = T.alloc_buffer((gp,), F32, scope="local")
    for gi in range(gp):
        T.buffer_store(tot, part[i64(0), i64(gi), b, tx], [i64(gi)])
        for r in range(1, KS):
            T.buffer_store(tot, tot[i64(gi)] + part[i64(r), i64(gi), b, tx], [i64(gi)])
    with T.If(s < a.length(n)):
        with T.Then():
            unit_step(a, phase, hbuf, scratch, cur, nxt, d, n, a.time_index(d, n, s), j, lambda gi: tot[i64(gi)])
        if last:
            with T.Else():
                unit_padding(a, hbuf, cur, nxt, d, n, s, j)
