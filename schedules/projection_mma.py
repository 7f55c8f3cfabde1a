"""The input projection of all time steps on CUDA tensor cores: XW = X @ W^T + bias, fp32 results.

For fp16/bf16 layers, and fp32 ones compiled with precision="tf32" (mma_tiles.MODES).

TVM's default pipeline schedules this matmul with dlight's tensor-core rule; this kernel runs the rows'
shapes over twice as fast (docs/decisions.md). Every warp
owns a 64 x 32 tile of XW (4 x 4 mma.sync m16n8k16 tiles, fp32 accumulators) and streams its rows
of X and W through registers 32 columns at a time (mma_tiles); the 2 x 2 warps of a block share
rows and columns, so most of their loads hit L1. The bias is added as the tile is stored.
M = seq * batch is a runtime size; rows and columns past the edges are clamped on load and skipped on store.
"""

from __future__ import annotations

from tvm import tirx
from tvm.backend.cuda import op as cuda_op
from tvm.script.ir_builder import tirx as T

from .mma_tiles import KC, MODES, WarpTiles, chunk_rounds
from .recurrent_common import i64, projection_prim_func

F32 = "float32"
MT, NT = 4, 4  # a warp's tile: 4 m16 tiles of X rows by 4 n8 tiles of W rows (64 x 32)
WARPS_M, WARPS_N = 2, 2  # a block's warps: 128 x 64 of XW
DEPTH = 2  # chunks each warp loads at once (mma_tiles.WarpTiles)


def supported(mode: str | None, K: int, cols: int) -> bool:
    """A tensor-core mode (mma_tiles.MODES), whole 32-column chunks (16-byte loads stay aligned), column pairs (8-byte stores)."""
    return mode in MODES and K % KC == 0 and cols % 2 == 0


def projection_mma(mode: str, K: int, cols: int) -> tirx.PrimFunc:
    """PrimFunc(X [M, K], W [cols, K] in the mode's storage dtype, bias [cols] fp32, XW [M, cols] fp32), M symbolic."""
    assert supported(mode, K, cols), (mode, K, cols)
    dtype = MODES[mode].storage
    bm, bn = WARPS_M * MT * 16, WARPS_N * NT * 8

    def body(X, W, bias, XW, M):
        with T.thread_binding(0, tirx.ceildiv(M, i64(bm)), "blockIdx.x") as bx:
            with T.thread_binding(0, i64(-(-cols // bn)), "blockIdx.y") as by:
                with T.thread_binding(0, i64(WARPS_M * WARPS_N), "threadIdx.y") as wy:
                    with T.thread_binding(0, i64(32), "threadIdx.x") as lane:
                        m0 = bx * i64(bm) + wy // i64(WARPS_N) * i64(MT * 16)
                        n0 = by * i64(bn) + wy % i64(WARPS_N) * i64(NT * 8)
                        tiles = WarpTiles(lane, MT, NT, mode, dtype, dtype, DEPTH)

                        def load(ck, slot):
                            k = ck * i64(KC)
                            tiles.load(lambda mt, half, kk: X[tirx.min(m0 + i64(mt * 16 + 8 * half) + tiles.g, M - i64(1)), k + kk],
                                       lambda nt, kk: W[tirx.min(n0 + i64(nt * 8) + tiles.g, i64(cols - 1)), k + kk], True, slot)

                        chunk_rounds(K // KC, 1, DEPTH, i64(0), load, tiles.multiply)
                        store_xw(tiles, XW, bias, M, cols, m0, n0)

    return projection_prim_func("projection_mma", dtype, K, cols, (cols, K), body)


def add_xw(tiles: WarpTiles, XW, M, cols: int, m0, n0):
    """A warp's accumulators added into XW (rows m0.., columns n0..) with atomicAdd, edges skipped: a split-K block's
    partial sums (projection_staged split_k; XW holds the bias first). fp32 XW only: adding many partial sums into
    half precision would round each time."""
    assert XW.dtype == "float32", XW.dtype
    for ci in tiles.accumulators():
        m, n = m0 + tiles.row(ci), n0 + tiles.col(ci)
        with T.If(tirx.all(m < M, n < i64(cols))):
            with T.Then():
                T.evaluate(cuda_op.cuda_atomic_add(tirx.op.address_of(XW[m, n]), tiles.c[tuple(ci)]))


def store_xw(tiles: WarpTiles, XW, bias, M, cols: int, m0, n0):
    """A warp's accumulators plus the bias into XW (rows m0.., columns n0..), two columns per store, edges skipped; in
    XW's dtype (rounded once from the fp32 sum)."""
    for ci in tiles.accumulators():
        if int(ci[2]) % 2:
            continue  # stored with its left neighbour
        m, n = m0 + tiles.row(ci), n0 + tiles.col(ci)
        with T.If(tirx.all(m < M, n < i64(cols))):
            with T.Then():
                with T.vectorized(0, i64(2)) as v:
                    T.buffer_store(XW, (tiles.c[ci[0], ci[1], ci[2] + v] + bias[n + v]).astype(XW.dtype), [m, n + v])
