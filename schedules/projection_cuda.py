"""The fp32 input projection of all time steps on CUDA: XW = X @ W^T + bias as one exact-fp32 SIMT GEMM.

TVM's default pipeline schedules this matmul with dlight's Matmul rule, a third of cuBLAS's throughput, and at
large batch the projection is near half a layer's time (docs/decisions.md). This is the classic register-blocked GEMM: a block computes a 128 x 128 tile of XW with 256
threads, 8 x 8 accumulators each; per round it stages an 8-column slice of X and W in shared
memory, transposed so a thread reads its 8 rows and 8 columns as four float4 loads, while the next
slice is already loading into registers.

M = seq * batch is a runtime size. Below SKINNY_M rows the 128-row tiles leave most SMs idle, so
there warps of many blocks each compute a few columns for 16 rows at a time with warp_gates, the
recurrent kernels' GEMV (at 100 rows TVM's default schedule is faster still: small M wants a
dispatch to it, not done yet). fp16/bf16 projections keep the default
pipeline's tensor-core path.
"""

from __future__ import annotations

from tvm import tirx
from tvm.script.ir_builder import tirx as T

from .recurrent_common import block_sync, i64, projection_prim_func
from .warp_gemv import warp_gates

F32 = "float32"
BM, BN, BK = 128, 128, 8  # block tile: rows of X, columns of XW, reduction columns per round
TM = TN = 8  # accumulators per thread: rows x columns, as two groups of 4 half a tile apart
THREADS = (BM // TM) * (BN // TN)  # 256
PAD = 4  # floats after each staged k-row: the transposing stores of two k-rows land in different banks
SKINNY_M = 512  # fewer rows run the skinny kernel (it won at 100 rows, the tiles at 800)
SKINNY_ROWS, SKINNY_WARPS = 16, 4  # rows per pass (each weight load serves them all), warps per block (a column each)


def supported(K: int, cols: int) -> bool:
    """Shapes this kernel covers (whole rounds of K, float4 columns); others keep the default schedule."""
    return K % BK == 0 and cols % 4 == 0


def projection_cuda(K: int, cols: int) -> tirx.PrimFunc:
    """PrimFunc(X [M, K], W [cols, K], bias [cols], XW [M, cols]), all fp32, M symbolic."""
    assert supported(K, cols), (K, cols)

    def body(X, W, bias, XW, M):
        with T.If(M < i64(SKINNY_M)):
            with T.Then():
                _skinny(X, W, bias, XW, M, K, cols)
            with T.Else():
                _tiled(X, W, bias, XW, M, K, cols)

    return projection_prim_func("projection", F32, K, cols, (cols, K), body)


def _skinny(X, W, bias, XW, M, K, cols):
    V = 4 if K % 4 == 0 else 1
    with T.thread_binding(0, i64(-(-cols // SKINNY_WARPS)), "blockIdx.x") as bx:
        with T.thread_binding(0, tirx.ceildiv(M, i64(SKINNY_ROWS)), "blockIdx.y") as by:
            with T.thread_binding(0, i64(SKINNY_WARPS), "threadIdx.y") as ty:
                with T.thread_binding(0, i64(32), "threadIdx.x") as lane:
                    c, m0 = bx * i64(SKINNY_WARPS) + ty, by * i64(SKINNY_ROWS)

                    def finish(_u, b, rec):
                        with T.If(tirx.all(m0 + i64(b) < M, c < i64(cols))):
                            with T.Then():
                                T.buffer_store(XW, rec(0) + bias[c], [m0 + i64(b), c])

                    warp_gates(lane, K, (0,), 1, SKINNY_ROWS, V,
                               h_at=lambda _u, b, k: X[tirx.min(m0 + i64(b), M - i64(1)), k],
                               w_at=lambda _u, _g, k: W[tirx.min(c, i64(cols - 1)), k], finish=finish)


def _tiled(X, W, bias, XW, M, K, cols):
    stride_a, stride_b = BM + PAD, BN + PAD
    with T.thread_binding(0, tirx.ceildiv(M, i64(BM)), "blockIdx.x") as bx:
        with T.thread_binding(0, i64(-(-cols // BN)), "blockIdx.y") as by:
            with T.thread_binding(0, i64(BM // TM), "threadIdx.y") as ty:
                with T.thread_binding(0, i64(BN // TN), "threadIdx.x") as tx:
                    m0, n0 = bx * i64(BM), by * i64(BN)
                    tid = ty * i64(BN // TN) + tx
                    # flat, so buffer compaction keeps the padded stride
                    As = T.alloc_buffer((BK * stride_a,), F32, scope="shared")
                    Bs = T.alloc_buffer((BK * stride_b,), F32, scope="shared")
                    xr = T.alloc_buffer((4,), F32, scope="local")  # this thread's share of the next round
                    wr = T.alloc_buffer((4,), F32, scope="local")
                    a = T.alloc_buffer((TM,), F32, scope="local")
                    b = T.alloc_buffer((TN,), F32, scope="local")
                    acc = T.alloc_buffer((TM, TN), F32, scope="local")
                    # each thread loads one float4 of X's and one of W's slice: row tid // 2, k tid % 2 * 4
                    r, k4 = tid // i64(2), tid % i64(2) * i64(4)

                    def load(k0):
                        with T.vectorized(0, i64(4)) as v:
                            T.buffer_store(xr, X[tirx.min(m0 + r, M - i64(1)), k0 + k4 + v], [v])
                        with T.vectorized(0, i64(4)) as v:
                            T.buffer_store(wr, W[tirx.min(n0 + r, i64(cols - 1)), k0 + k4 + v], [v])

                    for i in range(TM):
                        for j in range(TN):
                            T.buffer_store(acc, tirx.const(0.0, F32), [i64(i), i64(j)])
                    load(i64(0))
                    with T.serial(0, i64(K // BK)) as kb:
                        for v in range(4):  # transposed: k-rows of the tile, rows of X (columns of XW) along them
                            T.buffer_store(As, xr[i64(v)], [(k4 + i64(v)) * i64(stride_a) + r])
                            T.buffer_store(Bs, wr[i64(v)], [(k4 + i64(v)) * i64(stride_b) + r])
                        block_sync()
                        with T.If(kb + i64(1) < i64(K // BK)):
                            with T.Then():
                                load((kb + i64(1)) * i64(BK))
                        with T.unroll(0, i64(BK)) as k:
                            for half in range(2):
                                with T.vectorized(0, i64(4)) as v:
                                    T.buffer_store(a, As[k * i64(stride_a) + i64(half * BM // 2) + ty * i64(4) + v], [i64(half * 4) + v])
                                with T.vectorized(0, i64(4)) as v:
                                    T.buffer_store(b, Bs[k * i64(stride_b) + i64(half * BN // 2) + tx * i64(4) + v], [i64(half * 4) + v])
                            for i in range(TM):
                                for j in range(TN):
                                    T.buffer_store(acc, acc[i64(i), i64(j)] + a[i64(i)] * b[i64(j)], [i64(i), i64(j)])
                        block_sync()
                    for i in range(TM):
                        m = m0 + i64(i // 4 * BM // 2 + i % 4) + ty * i64(4)
                        for jh in range(2):
                            n = n0 + i64(jh * BN // 2) + tx * i64(4)
                            with T.If(tirx.all(m < M, n < i64(cols))):
                                with T.Then():
                                    with T.vectorized(0, i64(4)) as v:
                                        T.buffer_store(XW, acc[i64(i), i64(jh * 4) + v] + bias[n + v], [m, n + v])
