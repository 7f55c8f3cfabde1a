"""The input projection of all time steps on CPUs: XW[m, :] = X[m, :] @ W^T + bias, one GEMM for the whole sequence.

TVM 0.27 has no CPU matmul schedule (dlight's CPU rules cover GEMV and reductions), and the
legalized matmul runs as naive loops, 10x slower than the recurrence it feeds. This kernel
is a small register-blocked GEMM: work items of MR rows x NR columns run on TVM's thread
pool; each keeps an MR x NR accumulator tile in registers while k streams over W, packed at
compile time as panels [cols / NR, K, NR] so a work item reads its columns as one contiguous run
(W^T's rows were `cols` floats apart: at power-of-two widths those reads alias in the cache).
M = seq * batch is a runtime size.
"""

from __future__ import annotations

from tvm import tirx
from tvm.script.ir_builder import tirx as T

from .device import MIN_PARALLEL_WORK, parallel_pays
from .recurrent_common import i64, projection_prim_func

F32 = "float32"
# rows x columns of fp32 accumulators per work item, by CPU (docs/decisions.md): AMD's Zen 8 x 32 (16 AVX-512
# registers); others 6 x 64 (24 registers, 10 loads per 24 FMAs), where 64 columns do not divide the gates 8 x 48,
# else 8 x 32
ZEN_TILE, WIDE_TILES = (8, 32), ((6, 64), (8, 48))


def tile(Ncols: int, mcpu: str = "", rows: int | None = None) -> tuple[int, int]:
    """(rows, columns) per work item for a GEMM of Ncols columns on the LLVM target's mcpu: the first of the CPU's tiles
    whose columns divide Ncols, else 8 rows of 16 or 8 columns where they divide, else of 16 (8 up to 8 columns) with
    W's last panel padded (madmom's RNN of 25 units took panels of 1 column: scalar code, 13 us for 10 rows); no
    more rows than a GEMM of `rows` rows has, where the model fixes them (the tail's rows are computed, never stored:
    one LSTM step at batch 1 did 8 rows' multiply-adds)."""
    narrow = (ZEN_TILE[0], next((c for c in (16, 8) if Ncols % c == 0), 8 if Ncols <= 8 else 16))
    mr, nr = next(((mr, nr) for mr, nr in ((ZEN_TILE,) if mcpu.startswith("znver") else WIDE_TILES + (ZEN_TILE,))
                   if Ncols % nr == 0), narrow)
    return (min(mr, rows) if rows else mr), nr


def w_panels(Ncols: int, nr: int) -> int:
    """W's panels of nr columns: the last one padded with zero columns where nr does not divide Ncols."""
    return -(-Ncols // nr)


def panel_width(Ncols: int, mcpu: str = "") -> int:
    """Columns per packed panel of W (and per work item)."""
    return tile(Ncols, mcpu)[1]


def projection_cpu(K: int, Ncols: int, mcpu: str = "", tile_shape: tuple[int, int] | None = None,
                   rows: int | None = None) -> tirx.PrimFunc:
    """PrimFunc(X [M, K], WP [ceil(Ncols / nr), K, nr] (W packed in panels, the last padded), bias [Ncols], XW [M,
    Ncols]), M symbolic; the tile (MR rows x nr columns) is tile(Ncols, mcpu) unless given; `rows`: M where the model
    fixes it."""
    MR, nr = tile_shape or tile(Ncols, mcpu)
    col_tiles, tail = w_panels(Ncols, nr), Ncols % nr

    def body(X, WP, bias, XW, M):
        # the model fixes the rows, or one tile's rows pay already: no test (its serial branch, where it can hold only
        # for no rows, made TVM fold a division by zero)
        if rows or parallel_pays(K * Ncols * MR):
            tiles(T.parallel if parallel_pays(K * Ncols * (rows or MR)) else T.serial, X, WP, bias, XW, M)
            return
        # rows known only at run time: the pool where they pay, tested there (Silero's sequence model, 3 chunks of
        # 0.2M multiply-adds, waited 4 ms a call for the pool's worker on a loaded machine)
        with T.If(M * i64(K * Ncols) >= i64(MIN_PARALLEL_WORK)):
            with T.Then():
                tiles(T.parallel, X, WP, bias, XW, M)
            with T.Else():
                tiles(T.serial, X, WP, bias, XW, M)

    def tiles(loop, X, WP, bias, XW, M):
        lanes = nr if nr & (nr - 1) == 0 else 16  # LLVM vectorizes powers of two whole; 48 lanes ran 36x slower unsplit
        row_tiles = tirx.ceildiv(M, i64(MR))
        # rows vary fastest: a thread's consecutive items reuse one K x nr panel of W from its L2
        with loop(0, row_tiles * i64(col_tiles)) as item:
            m0, jt = item % row_tiles * i64(MR), item // row_tiles
            j0 = jt * i64(nr)
            acc = T.alloc_buffer((MR, nr), F32, scope="local")
            for r in range(MR):
                with T.vectorized(0, i64(nr)) as v:  # a padded column's sum starts from the last bias, never stored
                    T.buffer_store(acc, bias[tirx.min(j0 + v, i64(Ncols - 1)) if tail else j0 + v], [i64(r), v])
            with T.serial(0, i64(K)) as k:
                for r in range(MR):
                    xv = X[tirx.min(m0 + i64(r), M - i64(1)), k]  # the M tail recomputes the last row, never stored
                    for c0 in range(0, nr, lanes):
                        with T.vectorized(0, i64(lanes)) as vv:
                            v = vv + i64(c0)
                            T.buffer_store(acc, acc[i64(r), v] + xv * WP[jt, k, v], [i64(r), v])
            for r in range(MR):
                with T.If(m0 + i64(r) < M):
                    with T.Then():
                        store_row(XW, acc, m0 + i64(r), r, jt, j0)

    def store_row(XW, acc, m, r, jt, j0):
        """Row r of the tile's sums into XW's row m: of the last panel, where it is padded, the columns that exist."""
        def store(width):
            with T.vectorized(0, i64(width)) as v:
                T.buffer_store(XW, acc[i64(r), v], [m, j0 + v])

        if not tail:
            store(nr)
            return
        with T.If(jt < i64(col_tiles - 1)):
            with T.Then():
                store(nr)
            with T.Else():
                store(tail)

    return projection_prim_func("projection", F32, K, Ncols, (col_tiles, K, nr), body)
