"""The recurrent kernel for CPUs (LLVM): the whole sequence in one function, steps as parallel loops.

Per step and phase, work items are (direction, batch row, chunk of JC hidden units) and run on
TVM's thread pool. An item accumulates all gates of its chunk with the inner loop running over
contiguous rows of R^T (axpy form, so it vectorizes without fast-math), then applies the cell's
gate program to each unit. Hidden state is double-buffered across steps; the cell state stays
in the Yc output, which only its own unit reads.
"""

from __future__ import annotations

from dataclasses import dataclass

from tvm import tirx
from tvm.script.ir_builder import tirx as T

from tvmrnn.cells import Cell
from tvmrnn.layer import RNNLayerSpec

from .recurrent_common import KernelArgs, i64, recurrent_prim_func, unit_padding, unit_step

F32 = "float32"
TRANSPOSED_R = True  # the inner loop runs along units: R^T rows are contiguous there
ROW_TILE = 4  # batch rows per R^T load at batch >= ROW_TILE (8 ran no faster and compiled 6x slower)
ROW_TILE_UNITS = 16  # units per work item in the row-tiled path (ROW_TILE x gates x this accumulators)
ROW_UNITS = 64  # units per work item at small batch: measured 1.5x faster than 32 at H=512 (longer R^T streams)


def chunk_size(hidden: int, widest: int = 32) -> int:
    """Units per work item: the widest power of two up to `widest` dividing H (no tail loop)."""
    c = widest
    while hidden % c:
        c //= 2
    return c


@dataclass(frozen=True)
class CpuConfig:
    rows: int = ROW_TILE  # batch rows per R^T load (each load serves them all)
    units: int = 16  # hidden units per work item: rows x gates x units accumulators; must divide H


def cpu_prim_func(spec: RNNLayerSpec, cell: Cell, emit_steps, seq=None, batch=None) -> tirx.PrimFunc:
    """The CPU kernel: initial states, emit_steps(a) (the time loop, one schedule per batch bucket), final state."""
    H, D = spec.hidden_size, spec.num_directions

    def body(a):
        n_ = a.batch
        a.hbuf = T.alloc_buffer((2, D, n_, H), F32)
        a.scratch = {v: T.alloc_buffer((D, n_, H), F32) for v in cell.stored_values}

        # initial states
        with T.parallel(0, i64(D) * n_) as dn:
            d, n = dn // n_, dn % n_
            with T.serial(0, i64(H)) as j:
                T.buffer_store(a.hbuf, a.initial("h", d, n, j), [i64(0), d, n, j])
                if a.Yc is not None:
                    T.buffer_store(a.Yc, a.initial("c", d, n, j), a.state_index(d, n, j))

        emit_steps(a)

        with T.parallel(0, i64(D) * n_) as dn:
            d, n = dn // n_, dn % n_
            final = a.seq % 2
            with T.serial(0, i64(H)) as j:
                T.buffer_store(a.Yh, a.hbuf[final, d, n, j], a.state_index(d, n, j))

    return recurrent_prim_func(spec, cell, TRANSPOSED_R, body, seq=seq, batch=batch)


def cpu_steps(a: KernelArgs, cfg: CpuConfig):
    """The time loop: per step and phase, parallel work items of `cfg.units` units x `cfg.rows` batch rows."""
    H, D, cell = a.spec.hidden_size, a.spec.num_directions, a.cell
    rows, jc = cfg.rows, cfg.units
    if H % jc:
        raise ValueError(f"units={jc} must divide hidden size {H}")
    chunks = H // jc
    with T.serial(0, a.seq) as s:
        cur, nxt = s % 2, (s + 1) % 2
        for pi, phase in enumerate(cell.phases):
            last = pi == len(cell.phases) - 1
            operand = a.hbuf if phase.operand == "h" else a.scratch[phase.operand]
            tiles = tirx.ceildiv(a.batch, i64(rows))
            with T.parallel(0, i64(D * chunks) * tiles) as item:
                d = item // (tiles * chunks)
                n0 = item // chunks % tiles * i64(rows)
                j0 = item % chunks * jc
                _phase_tile(a, phase, last, operand, a.hbuf, a.scratch, s, cur, nxt, d, n0, rows, j0, jc)


def _phase_tile(a: KernelArgs, phase, last, operand, hbuf, scratch, s, cur, nxt, d, n0, rows, j0, JC):
    """Gates of units j0..j0+JC for batch rows n0..n0+rows, then each valid row's gate program (or padding)."""
    H, N = a.spec.hidden_size, a.batch
    gp = len(phase.gates)
    acc = T.alloc_buffer((rows, gp, JC), F32, scope="local")
    for r in range(rows):
        for gi in range(gp):
            with T.vectorized(0, i64(JC)) as jj:
                T.buffer_store(acc, tirx.const(0.0, F32), [i64(r), i64(gi), jj])
    with T.serial(0, i64(H)) as k:
        for r in range(rows):
            n = tirx.min(n0 + i64(r), N - 1)  # rows past the batch compute a copy, never stored
            hk = operand[cur, d, n, k] if phase.operand == "h" else operand[d, n, k]
            for gi, g in enumerate(phase.gates):
                with T.vectorized(0, i64(JC)) as jj:
                    idx = [i64(r), i64(gi), jj]
                    T.buffer_store(acc, acc[tuple(idx)] + a.RT[d, k, i64(g * H) + j0 + jj] * hk, idx)
    for r in range(rows):
        n = n0 + i64(r)
        with T.If(n < N):
            with T.Then():
                with T.If(s < a.length(n)):
                    with T.Then():
                        t = a.time_index(d, n, s)
                        with T.serial(0, i64(JC)) as jj:
                            unit_step(a, phase, hbuf, scratch, cur, nxt, d, n, t, j0 + jj, lambda gi, r=r: acc[i64(r), i64(gi), jj])
                    if last:
                        with T.Else():  # padding: Y is zero there, the state carries over
                            with T.serial(0, i64(JC)) as jj:
                                unit_padding(a, hbuf, cur, nxt, d, n, s, j0 + jj)
