"""Exact fp32 steps on fp16 tensor cores (f16x3) in the persistent tensor-core kernel: the scales of R's rows and of h.

The step multiplies R's rows by h. As in the f16x3 projection (split_halves), each row of R is scaled by a power of two
that puts its largest magnitude in [2^14, 2^15) and split into fp16 high and low halves, here once per launch, as each
block copies its rows into shared memory (row_scales gives the scales, the copy splits). h has no rows to scale ahead:
it changes every step. But the cell bounds it (cells.state_bound: LSTM |h| <= 1 with its default activations; GRU's h
is a convex combination of its candidate and the last h), so one power of two for the whole launch, from
max(bound, max |h0|), keeps every scaled element of h and of GRU's r*h under 2^15 (HScale). Each value is split as it
is stored (recurrent_common.split_operands), once, not by each block that reads it. Products then carry both scales,
powers of two, which the epilogue divides out exactly.
"""

from __future__ import annotations

import math

from tvm import tirx
from tvm.backend.cuda import op as cuda_op
from tvm.script.ir_builder import tirx as T

from .cells import state_bound

from .recurrent_common import KernelArgs, block_sync, emit_if, i64
from .split_halves import scale_of, warp_row_scale

F32 = "float32"


def applies(spec) -> bool:
    """Whether the cell bounds h, so that f16x3 steps can scale it (else they stay 3xTF32)."""
    return state_bound(spec) is not None


def shared_floats(cell, units: int, warps: int) -> int:
    """The shared fp32 values the scales take: each of the block's rows' scale and inverse, and a max per warp."""
    return 2 * cell.gates * units + warps


def row_scales(a: KernelArgs, row_of, units: int, d, warps: int, wy, lane, rscale, rinv):
    """Each of the block's rows of R (row q of phase pi's rows at q0[pi] + q; row_of(pi, q) is its row of R): its
    scale (scale_of its largest magnitude) into rscale and the inverse into rinv, one warp per row."""
    H = a.spec.hidden_size
    amax = T.alloc_buffer((1,), F32, scope="local")
    q0 = 0
    for pi, phase in enumerate(a.cell.phases):
        rows = len(phase.gates) * units
        with T.serial(0, i64(-(-rows // warps))) as it:
            q = it * i64(warps) + wy
            with T.If(q < i64(rows)):  # warp-uniform: the shuffles see every lane
                with T.Then():
                    row = row_of(pi, q)
                    warp_row_scale(amax, H, lambda k, row=row: a.R[d, row, k], lane)

                    def store(q=q, pos=i64(q0) + q):
                        T.buffer_store(rscale, amax[0], [pos])
                        T.buffer_store(rinv, tirx.const(1, F32) / amax[0], [pos])  # a power of two: exact

                    emit_if(lane == i64(0), store)
        q0 += rows


class HScale:
    """h's scale for one launch, which must be known before h0 is stored (its halves with it): h0_max leaves each
    block's largest |h0| in a global slot and waits at a grid barrier, after() then reads every block's into the scale
    and its inverse. Without initial_h, the bound alone: a constant, and no barrier."""

    def __init__(self, a: KernelArgs, blocks: int):
        self.a, self.blocks = a, blocks
        self.bound = state_bound(a.spec)
        assert self.bound is not None, a.spec
        self.slots = T.alloc_buffer((blocks,), F32) if a.h0 is not None else None  # global: each block's max |h0|

    def h0_max(self, bx, d, u0, units: int, warps: int, wy, lane, tid, wmax):
        """This block's largest |h0| (its units, every batch row) into its slot, then the grid barrier after which every
        slot is written; wmax: `warps` shared floats."""
        if self.slots is None:
            return
        from .recurrent_persistent import _each_unit_row, _grid_sync

        a, m = self.a, T.alloc_buffer((1,), F32, scope="local")
        T.buffer_store(m, tirx.const(0, F32), [0])
        _each_unit_row(a, u0, units, 32 * warps, tid,
                       lambda n, j: T.buffer_store(m, tirx.max(m[0], tirx.abs(a.initial("h", d, n, j))), [0]))
        T.buffer_store(m, cuda_op.cuda_warp_max(m[0]), [0])
        # TVM may give wmax the shared bytes of the rows' scales, which the copy of R has just read: a barrier of our
        # own first (its planner cannot insert one inside the batch dispatch's branches)
        block_sync()
        emit_if(lane == i64(0), lambda: T.buffer_store(wmax, m[0], [wy]))
        block_sync()

        def total():
            best = wmax[0]
            for w in range(1, warps):
                best = tirx.max(best, wmax[w])
            T.buffer_store(self.slots, best, [bx])

        emit_if(tid == i64(0), total)
        _grid_sync()

    def after(self, lane):
        """(scale, inverse) as local values, every thread's: each warp reads the blocks' slots and shares their max."""
        if self.slots is None:  # bound * scale in [2^14, 2^15), as scale_of gives, worked out here
            scale = 2.0 ** (15 - math.frexp(max(self.bound, 2.0 ** -100))[1])
            return tirx.const(scale, F32), tirx.const(1 / scale, F32)
        hs = T.alloc_buffer((2,), F32, scope="local")
        bound = tirx.const(max(self.bound, 2.0 ** -100), F32)
        T.buffer_store(hs, tirx.const(0, F32), [0])
        for i in range(-(-self.blocks // 32)):
            idx = i64(i * 32) + lane
            x = tirx.if_then_else(idx < i64(self.blocks), self.slots[tirx.min(idx, i64(self.blocks - 1))], tirx.const(0, F32))
            T.buffer_store(hs, tirx.max(hs[0], x), [0])
        bound = tirx.max(cuda_op.cuda_warp_max(hs[0]), bound)
        T.buffer_store(hs, scale_of(bound), [0])
        T.buffer_store(hs, tirx.const(1, F32) / hs[0], [1])
        return hs[0], hs[1]
