"""The inner building block of our CUDA recurrent kernels: one warp computes all gates of a few hidden units.

Lanes split the reduction over k (V consecutive elements each, 16-byte loads for fp32), every
weight element read is reused for NB batch rows, and a butterfly shuffle leaves every sum in
every lane, so lane u*NB + b then finishes unit u of batch row b (the gate program) in parallel.
The stepwise kernel feeds it weights from global memory, the persistent one from shared memory.
"""

from __future__ import annotations

import itertools

from tvm import tirx
from tvm.backend.cuda import op as cuda_op
from tvm.script.ir_builder import tirx as T

from .recurrent_common import i64

F32 = "float32"


def _grid(*extents):
    return [[i64(i) for i in idx] for idx in itertools.product(*(range(e) for e in extents))]


def _maybe(cond, b, emit):
    if cond is None:
        emit()
        return
    with T.If(cond(b)):
        with T.Then():
            emit()


def _load_row(hv, h_at, b, k0, V, h_vec=None):
    # h is fp32: at most float4 per load (CUDA has no float8; TVM's codegen cannot always split one)
    for v0 in range(0, V, 4):
        width = min(4, V)
        if h_vec is not None:
            at = tirx.Ramp(i64(v0), i64(1), width) if width > 1 else i64(v0)
            T.buffer_store(hv, h_vec(b, k0 + i64(v0), width), [i64(b), at])
            continue
        with T.vectorized(0, i64(width)) as v:
            T.buffer_store(hv, h_at(0, b, k0 + i64(v0) + v), [i64(b), i64(v0) + v])


def _fma_row(acc, wv, hv, u, gi, b, V):
    idx = [i64(u), i64(gi), i64(b)]
    for v in range(V):
        prod = wv[i64(v)] * hv[i64(b), i64(v)]
        T.buffer_store(acc, acc[tuple(idx)] + prod, idx)


def warp_gates(lane, H, gates, UW, NB, V, h_at, w_at, finish, row_valid=None, segments=None, h_vec=None, in_parallel=False):
    """Accumulate sum_k w_at(u, g, k) * h_at(u, b, k) for UW units, the given gates and NB batch rows.

    h_at(u, b, k) / w_at(u, g, k): loads (callers clamp indices so every load is in bounds); h must not
    depend on u (all units of a warp multiply the same vector), so it is loaded once for them all;
    finish(u, b, rec): called in lane u*NB + b with rec(gi) the sum of the gi-th gate.
    row_valid(b): optional warp-uniform condition; rows where it is false skip their arithmetic
    (a tile wider than the batch then costs almost nothing).
    segments: [(K, h_at, w_at), ...] summed one after another in place of (H, h_at, w_at): a stacked layer's input
    and its own state (recurrent_wavefront), or weights from registers and from shared memory (recurrent_cluster); V
    must divide every K. A segment (K, h_at, w_at, True) runs its loop unrolled (w_at may then index registers by it).
    h_vec(b, k, width): optional, `width` (1 or 4) consecutive elements of h from k as one value, loaded in place of
    h_at's (the persistent kernel's tagged words, schedules.step_sync).
    in_parallel: finish is emitted once, for lanes u*NB + b at once (u = lane // NB, b = lane % NB, each lane's sums
    picked by selects), instead of once per (u, b) in a branch of its own, which a warp runs one after another.
    """
    gp = len(gates)
    acc = T.alloc_buffer((UW, gp, NB), F32, scope="local")
    # h is fp32 state, the same vector for all the warp's units: loaded once for them all
    hv = T.alloc_buffer((NB, V), F32, scope="local")
    wv = T.alloc_buffer((V,), F32, scope="local")  # widened to fp32 as it is loaded
    for idx in _grid(UW, gp, NB):
        T.buffer_store(acc, tirx.const(0.0, F32), idx)
    for K, h_at_k, w_at_k, *unrolled in segments or [(H, h_at, w_at)]:
        # a serial loop: unrolled, the stepwise kernel ran slower (docs/decisions.md)
        with (T.unroll if unrolled and unrolled[0] else T.serial)(0, i64((K + 32 * V - 1) // (32 * V))) as it:
            k0 = (it * i64(32) + lane) * i64(V)
            with T.If(k0 < i64(K)):
                with T.Then():
                    for b in range(NB):
                        _maybe(row_valid, b, lambda b=b, h_at_k=h_at_k: _load_row(hv, h_at_k, b, k0, V, h_vec))
                    for u, (gi, g) in itertools.product(range(UW), enumerate(gates)):
                        with T.vectorized(0, i64(V)) as v:
                            T.buffer_store(wv, w_at_k(u, g, k0 + v).astype(F32), [v])
                        for b in range(NB):
                            _maybe(row_valid, b, lambda b=b, u=u, gi=gi: _fma_row(acc, wv, hv, u, gi, b, V))
    for idx in _grid(UW, gp, NB):
        T.buffer_store(acc, cuda_op.cuda_warp_sum(acc[tuple(idx)]), idx)
    if in_parallel:
        _finish_in_parallel(acc, lane, UW, NB, finish)
        return
    for u, b in itertools.product(range(UW), range(NB)):
        with T.If(lane == i64(u * NB + b)):
            with T.Then():
                finish(u, b, lambda gi, u=u, b=b: acc[i64(u), i64(gi), i64(b)])


def _finish_in_parallel(acc, lane, UW, NB, finish):
    """finish(u, b, rec) once, in lanes u*NB + b of every (unit, row) together; rec(gi) selects the lane's own sum."""
    def rec(gi):
        value = acc[i64(0), i64(gi), i64(0)]
        for u, b in list(itertools.product(range(UW), range(NB)))[1:]:
            value = tirx.Select(lane == i64(u * NB + b), acc[i64(u), i64(gi), i64(b)], value)
        return value

    with T.If(lane < i64(UW * NB)):
        with T.Then():
            finish(lane // i64(NB), lane % i64(NB), rec)
