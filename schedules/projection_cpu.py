"""The input projection of all time steps on CPUs: XW[m, :] = X[m, :] @ W^T + bias, one GEMM for the whole sequence.

TVM 0.27 has no CPU matmul schedule (dlight's CPU rules cover GEMV and reductions), and the
legalized matmul runs as naive loops, 10x slower than the recurrence it feeds. This kernel
is a small register-blocked GEMM: work items of MR rows x NR columns run on TVM's thread
pool; each keeps an MR x NR accumulator tile in registers while k streams over W, packed at
compile time as panels [cols / NR, K, NR] so a work item reads its columns as one contiguous run
(W^T's rows were `cols` floats apart: at power-of-two widths those reads alias in the cache, and
the projections of lat-b1-h512, lat-b1-h1024 and b64-h1024 ran 1.3-1.8x slower,
benchmarks/results/2026-11-23-cpu-projection-panels.txt). M = seq * batch is a runtime size.
"""

from __future__ import annotations

from tvm import tirx
from tvm.script.ir_builder import tirx as T

from .recurrent_common import i64, projection_prim_func

F32 = "float32"
# rows x columns per tile: 8 x 32 fp32 accumulators, 16 AVX-512 registers. On this VM (znver5) 8 x 32 beat 4 x 64
# on every projection shape of the benchmark rows, 1.03-1.24x (benchmarks/results/2026-11-23-cpu-projection-tiles.txt)
MR, NR = 8, 32


def panel_width(Ncols: int) -> int:
    """Columns per packed panel of W (and per work item): NR, or the widest power of two dividing Ncols."""
    return NR if Ncols % NR == 0 else next(c for c in (32, 16, 8, 4, 2, 1) if Ncols % c == 0)


def projection_cpu(K: int, Ncols: int) -> tirx.PrimFunc:
    """PrimFunc(X [M, K], WP [Ncols / nr, K, nr] (W packed in panels, nr = panel_width), bias [Ncols], XW [M, Ncols]),
    M symbolic."""
    nr = panel_width(Ncols)

    def body(X, WP, bias, XW, M):
        col_tiles = Ncols // nr
        row_tiles = tirx.ceildiv(M, i64(MR))
        # rows vary fastest: a thread's consecutive items reuse one K x nr panel of W from its L2
        with T.parallel(0, row_tiles * i64(col_tiles)) as item:
            m0, jt = item % row_tiles * i64(MR), item // row_tiles
            j0 = jt * i64(nr)
            acc = T.alloc_buffer((MR, nr), F32, scope="local")
            for r in range(MR):
                with T.vectorized(0, i64(nr)) as v:
                    T.buffer_store(acc, bias[j0 + v], [i64(r), v])
            with T.serial(0, i64(K)) as k:
                for r in range(MR):
                    xv = X[tirx.min(m0 + i64(r), M - i64(1)), k]  # the M tail recomputes the last row, never stored
                    with T.vectorized(0, i64(nr)) as v:
                        T.buffer_store(acc, acc[i64(r), v] + xv * WP[jt, k, v], [i64(r), v])
            for r in range(MR):
                with T.If(m0 + i64(r) < M):
                    with T.Then():
                        with T.vectorized(0, i64(nr)) as v:
                            T.buffer_store(XW, acc[i64(r), v], [m0 + i64(r), j0 + v])

    return projection_prim_func("projection", F32, K, Ncols, (Ncols // nr, K, nr), body)
