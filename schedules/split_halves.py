"""Exact fp32 operands for fp16 tensor cores: each row of an fp32 matrix scaled by a power of two and split into two
fp16 parts, for the f16x3 projection GEMM (projection_wgmma).

A row's scale s puts its largest magnitude in [2^14, 2^15), inside fp16's range (65504) with room for a round-up.
high = fp16(x * s) keeps 11 significant bits, low = fp16(x * s - high) the next 11: 22 of fp32's 24. The GEMM sums
hi*hi + hi*lo + lo*hi of X's and W's parts in fp32 and divides by both rows' scales. The dropped lo*lo and the low
parts' rounding are each about 2^-24 of a product, as in 3xTF32. But an fp16 wgmma does twice a TF32 one's work, so
the three products cost what 1.5 TF32 products do.

Small elements: where an element's low part falls below fp16's normal range (elements under 2^-17 of the row's
largest), it keeps fewer bits. Its error stays under 2^-25 in scaled units (subnormal spacing), 2^-39 of the row's
largest magnitude: far under the 2^-22 the split leaves anyway. Scales are powers of two, so scaling and unscaling
round nothing.

Two builds of one split: `split`, plain TE, which compile folds for W at compile time (FoldConstant, as an
initializer's) and runs on the CPU for tests; and `split_on_gpu`, X's before each GEMM, one warp per row. dlight's
schedules of `split` read a row one thread at a time (three kernels), slower than the two functions here.
"""

from __future__ import annotations

import functools

from tvm import te, tirx
from tvm.backend.cuda import op as cuda_op
from tvm.script.ir_builder import IRBuilder
from tvm.script.ir_builder import tirx as T

from .recurrent_common import i64

# rows whose largest magnitude is under 2^-112 (zero rows among them) take the largest scale, 2^126: its exponent
# bits stay in range
LOWEST_EXPONENT = 15


def scale_of(amax):
    """The power of two s with amax * s in [2^14, 2^15), from amax's exponent bits E (amax in [2^(E - 127),
    2^(E - 126))): s = 2^(141 - E), whose own bits are (268 - E) << 23. Infinities and NaNs (E = 255) take 2^-114 and
    stay what they are."""
    E = tirx.max(tirx.reinterpret("uint32", amax) >> tirx.const(23, "uint32") & tirx.const(0xFF, "uint32"),
                 tirx.const(LOWEST_EXPONENT, "uint32"))
    return tirx.reinterpret("float32", (tirx.const(268, "uint32") - E) << tirx.const(23, "uint32"))


def halves_of(x):
    """A scaled element's fp16 high half (x rounded to nearest) and low half (the exact fp32 remainder, rounded)."""
    high = x.astype("float16")
    return high, (x - high.astype("float32")).astype("float16")


def warp_row_scale(scale, n: int, at, lane):
    """scale[0] := the scale of a row of n elements (scale_of its largest magnitude), read by one warp: lane l takes
    elements l, l + 32, ... (at(k): element k; past n, nothing), a butterfly shuffle gives every lane the result. All 32
    lanes must run it. X's split (split_on_gpu) and the f16x3 steps' rows of R (step_halves.row_scales) share it."""
    T.buffer_store(scale, tirx.const(0, "float32"), [0])
    with T.serial(0, i64(-(-n // 32))) as j:
        k = j * i64(32) + lane
        x = tirx.abs(at(k)) if n % 32 == 0 else \
            tirx.if_then_else(k < i64(n), tirx.abs(at(tirx.min(k, i64(n - 1)))), tirx.const(0, "float32"))
        T.buffer_store(scale, tirx.max(scale[0], x), [0])
    T.buffer_store(scale, scale_of(cuda_op.cuda_warp_max(scale[0])), [0])


def split(rows, K: int) -> tirx.PrimFunc:
    """PrimFunc(A [rows, K] fp32, P [rows, 2K] fp16, S [rows] fp32): each row's scale (scale_of its largest
    magnitude), then its scaled high parts and low parts. rows may be symbolic. One function: W's is one call to fold."""
    A = te.placeholder((rows, K), "float32", name="A")
    k = te.reduce_axis((0, K), name="k")
    amax = te.compute((rows,), lambda r: te.max(tirx.abs(A[r, k]), axis=k), name="amax")
    S = te.compute((rows,), lambda r: scale_of(amax[r]), name="S")

    def part(r, c):
        high, low = halves_of(A[r, tirx.indexmod(c, K)] * S[r])
        return tirx.Select(c < K, high, low)

    return te.create_prim_func([A, te.compute((rows, 2 * K), part, name="P"), S])


def split_on_gpu(K: int, warps: int = 8) -> tirx.PrimFunc:
    """CUDA: split(M, K) for any row count M, one warp per row (`warps` rows a block). The lanes read the row 32
    columns at a time (128 bytes a warp) for its largest magnitude, a butterfly shuffle shares it, then they read the
    row again (from L1) and write its halves: X read twice, its halves written once, each in whole sectors."""
    M = tirx.Var("M", "int64")
    with IRBuilder() as ib:
        with T.prim_func():
            T.func_name("split_halves")
            T.func_attr({"tirx.noalias": True, "tirx.is_scheduled": True})
            A = T.arg("A", T.Buffer((M, K), "float32"))
            P = T.arg("P", T.Buffer((M, 2 * K), "float16"))
            S = T.arg("S", T.Buffer((M,), "float32"))
            with T.sblock("root"):  # Relax's passes read a one-input function's body as a block (reshape detection)
                with T.thread_binding(0, tirx.ceildiv(M, i64(warps)), "blockIdx.x") as bx:
                    with T.thread_binding(0, i64(32 * warps), "threadIdx.x") as tx:
                        row, lane = bx * i64(warps) + tx // i64(32), tx % i64(32)
                        amax = T.alloc_buffer((1,), "float32", scope="local")
                        with T.If(row < M):  # warp-uniform: the shuffles see every lane
                            with T.Then():
                                warp_row_scale(amax, K, lambda k: A[row, k], lane)  # now the row's scale
                                with T.If(lane == i64(0)):
                                    with T.Then():
                                        T.buffer_store(S, amax[0], [row])
                                with T.serial(0, i64(K // 32)) as j:
                                    high, low = halves_of(A[row, j * i64(32) + lane] * amax[0])
                                    T.buffer_store(P, high, [row, j * i64(32) + lane])
                                    T.buffer_store(P, low, [row, i64(K) + j * i64(32) + lane])
    return ib.get()


@functools.cache
def _on_cpu(rows: int, K: int):
    import tvm

    return tvm.compile(tvm.IRModule({"main": split(rows, K)}), target="llvm")


def split_on_cpu(a):
    """numpy fp32 [rows, K] -> (P fp16 [rows, 2K], S fp32 [rows]), by the same function on the CPU (built once a shape):
    for tests and benchmarks that run the GEMM alone."""
    import numpy as np
    import tvm

    a = np.ascontiguousarray(a, "float32")
    p = tvm.runtime.tensor(np.empty((a.shape[0], 2 * a.shape[1]), "float16"))
    s = tvm.runtime.tensor(np.empty(a.shape[0], "float32"))
    _on_cpu(*a.shape)["main"](tvm.runtime.tensor(a), p, s)
    return p.numpy(), s.numpy()
