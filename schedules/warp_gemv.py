"""The inner building block of our CUDA recurrent kernels: one warp computes all gates of a few hidden units.

Lanes split the reduction over k (V consecutive elements each, 16-byte loads for fp32), every
weight element read is reused for NB batch rows, and a butterfly shuffle leaves every sum in
every lane, so lane u*NB + b then finishes unit u of batch row b (the gate program) in parallel.
The stepwise kernel feeds it weights from global memory, the persistent one from shared memory.
The cluster kernel has the sums reduce-scattered instead (lane_activation): each gate's sum ends
in lanes of its own, which compute its activation side by side with the other gates'.
"""

from __future__ import annotations

import itertools

from tvm import tirx
from tvm.backend.cuda import op as cuda_op
from tvm.script.ir_builder import tirx as T

from .recurrent_common import i64
from .vector_math import RegisterTemps

_register = RegisterTemps().bind  # a value into a register of its own, its load returned

F32 = "float32"

SHFL_XOR, SHFL = "tvmrnn_shfl_xor", "tvmrnn_shfl"
SHFL_XOR_SRC = f"__forceinline__ __device__ float {SHFL_XOR}(float v, int m) {{ return __shfl_xor_sync(0xffffffffu, v, m); }}"
SHFL_SRC = f"__forceinline__ __device__ float {SHFL}(float v, int src) {{ return __shfl_sync(0xffffffffu, v, src); }}"


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


def warp_gates(lane, H, gates, UW, NB, V, h_at, w_at, finish, row_valid=None, segments=None, h_vec=None, in_parallel=False,
               lane_activation=None):
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
    lane_activation: (own, act): where scattered_slot applies, the sums are scattered (_reduce_scatter) instead of
    summed in every lane; each lane then computes act(total) for its own (unit, gate, row), and finish(u, b, rec,
    activated) gets activated[gi] of the gates in `own` and rec(gi) of the others, both moved in by shuffles.
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
    if lane_activation is not None and scattered_slot(lane, UW, gp, NB) is not None:
        _finish_scattered(acc, lane, UW, gp, NB, finish, *lane_activation)
        return
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


def _shfl_xor(value, mask: int):
    return T.cuda.func_call(SHFL_XOR, value, tirx.IntImm("int32", mask), source_code=SHFL_XOR_SRC, return_type=F32)


def _shfl(value, src):
    return T.cuda.func_call(SHFL, value, src.astype("int32"), source_code=SHFL_SRC, return_type=F32)


def _scatter_width(UW, gp, NB) -> int:
    """The warp's sums padded to a power of two, or 0 where they outnumber the lanes."""
    n = 1 << (UW * gp * NB - 1).bit_length()
    return n if n <= 32 else 0


def scattered_slot(lane, UW, gp, NB):
    """(u, gi, b) whose sum _reduce_scatter leaves in this lane (lanes of a group of 32 / n hold the same one; a lane
    past the warp's sums gets a clamped slot), or None where the sums outnumber the lanes."""
    n = _scatter_width(UW, gp, NB)
    if not n:
        return None
    v = tirx.min(lane // i64(32 // n), i64(UW * gp * NB - 1))
    return v // i64(gp * NB), v // i64(NB) % i64(gp), v % i64(NB)


def _reduce_scatter(acc, lane, UW, gp, NB):
    """Each of the warp's sums whole in the lanes of its group (lane // (32 / n), n the sums padded to a power of two):
    at masks 16, 8, ... a lane keeps the half of its values that its bit picks and adds the partner's copy of it,
    then a butterfly within the group. LSTM's 4 gates take 6 shuffles, against 20 for a butterfly each."""
    n = _scatter_width(UW, gp, NB)
    vals = [acc[tuple(idx)] for idx in _grid(UW, gp, NB)] + [tirx.const(0.0, F32)] * (n - UW * gp * NB)
    mask = 16
    while len(vals) > 1:
        half, upper = len(vals) // 2, lane // i64(mask) % i64(2) == i64(1)
        vals = [_register(tirx.Select(upper, vals[half + i], vals[i])
                          + _shfl_xor(tirx.Select(upper, vals[i], vals[half + i]), mask)) for i in range(half)]
        mask //= 2
    total = vals[0]
    while mask:
        total = _register(total + _shfl_xor(total, mask))
        mask //= 2
    return total, 32 // n


def _finish_scattered(acc, lane, UW, gp, NB, finish, own, act):
    """finish in lanes u*NB + b with the activations of the gates in `own` computed in the lanes holding their sums
    (act(total): all lanes at once, so the gates' functions run side by side), and the other gates' sums."""
    total, group = _reduce_scatter(acc, lane, UW, gp, NB)
    activated = _register(act(total)) if own else None
    u, b = lane // i64(NB), lane % i64(NB)
    src = lambda gi: i64(group) * ((tirx.min(u, i64(UW - 1)) * i64(gp) + i64(gi)) * i64(NB) + b)  # noqa: E731
    acts = {gi: _register(_shfl(activated, src(gi))) for gi in own}
    sums = {gi: _register(_shfl(total, src(gi))) for gi in range(gp) if gi not in own}
    with T.If(lane < i64(UW * NB)):
        with T.Then():
            finish(u, b, lambda gi: sums[gi], acts)
