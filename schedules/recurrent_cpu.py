"""The recurrent kernel for CPUs (LLVM): the whole sequence in one function, steps as parallel loops.

Per step and phase, work items are (direction, batch row, chunk of JC hidden units) and run on
TVM's thread pool. An item accumulates all gates of its chunk with the inner loop running over
contiguous rows of R^T (axpy form, so it vectorizes without fast-math), then applies the cell's
gate program to each unit. Hidden state is double-buffered across steps; the cell state stays
in the Yc output, which only its own unit reads.
"""

from __future__ import annotations

from tvm import tirx
from tvm.script.ir_builder import tirx as T

from tvmrnn.cells import Cell
from tvmrnn.layer import RNNLayerSpec

from .recurrent_common import KernelArgs, i64, recurrent_prim_func, unit_padding, unit_step

F32 = "float32"
TRANSPOSED_R = True  # the inner loop runs along units: R^T rows are contiguous there


def chunk_size(hidden: int, widest: int = 32) -> int:
    """Units per work item: the widest power of two up to `widest` dividing H (no tail loop)."""
    c = widest
    while hidden % c:
        c //= 2
    return c


def recurrent_kernel_cpu(spec: RNNLayerSpec, cell: Cell, chunk: int | None = None) -> tirx.PrimFunc:
    H, D = spec.hidden_size, spec.num_directions
    JC = chunk or chunk_size(H)
    chunks = H // JC

    def body(a):
        n_ = a.batch
        hbuf = T.alloc_buffer((2, D, n_, H), F32)
        scratch = {v: T.alloc_buffer((D, n_, H), F32) for v in cell.stored_values}

        # initial states
        with T.parallel(0, i64(D) * n_) as dn:
            d, n = dn // n_, dn % n_
            with T.serial(0, i64(H)) as j:
                T.buffer_store(hbuf, a.initial("h", d, n, j), [i64(0), d, n, j])
                if a.Yc is not None:
                    T.buffer_store(a.Yc, a.initial("c", d, n, j), a.state_index(d, n, j))

        with T.serial(0, a.seq) as s:
            cur, nxt = s % 2, (s + 1) % 2
            for pi, phase in enumerate(cell.phases):
                last = pi == len(cell.phases) - 1
                operand = hbuf if phase.operand == "h" else scratch[phase.operand]
                with T.parallel(0, i64(D * chunks) * n_) as item:
                    d = item // (n_ * chunks)
                    n = item // chunks % n_
                    j0 = item % chunks * JC
                    valid = s < a.length(n)
                    with T.If(valid):
                        with T.Then():
                            t = a.time_index(d, n, s)
                            _phase_chunk(a, phase, last, operand, hbuf, scratch, cur, nxt, d, n, t, j0, JC)
                        if last:
                            with T.Else():  # padding: Y is zero there, the state carries over
                                with T.serial(0, i64(JC)) as jj:
                                    unit_padding(a, hbuf, cur, nxt, d, n, s, j0 + jj)

        with T.parallel(0, i64(D) * n_) as dn:
            d, n = dn // n_, dn % n_
            final = a.seq % 2
            with T.serial(0, i64(H)) as j:
                T.buffer_store(a.Yh, hbuf[final, d, n, j], a.state_index(d, n, j))

    return recurrent_prim_func(spec, cell, TRANSPOSED_R, body)


def _phase_chunk(a: KernelArgs, phase, last, operand, hbuf, scratch, cur, nxt, d, n, t, j0, JC):
    H = a.spec.hidden_size
    ops = operand if phase.operand != "h" else None
    gp = len(phase.gates)
    acc = T.alloc_buffer((gp, JC), F32, scope="local")
    with T.serial(0, i64(gp)) as gi:
        with T.vectorized(0, i64(JC)) as jj:
            T.buffer_store(acc, tirx.const(0.0, F32), [gi, jj])
    with T.serial(0, i64(H)) as k:
        hk = operand[cur, d, n, k] if ops is None else ops[d, n, k]
        for gi, g in enumerate(phase.gates):
            with T.vectorized(0, i64(JC)) as jj:
                T.buffer_store(acc, acc[i64(gi), jj] + a.RT[d, k, i64(g * H) + j0 + jj] * hk, [i64(gi), jj])
    with T.serial(0, i64(JC)) as jj:
        unit_step(a, phase, hbuf, scratch, cur, nxt, d, n, t, j0 + jj, lambda gi: acc[i64(gi), jj])
