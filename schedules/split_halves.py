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

Both functions are plain TE: compile folds W's at compile time (FoldConstant, as an initializer's), and dlight
schedules X's, which runs before each GEMM.
"""

from __future__ import annotations

import functools

from tvm import te, tirx

LOWEST_EXPONENT = 15  # rows of zeros (or smaller than 2^-112) take the scale of 2^-112: exponent bits stay in range


def scale_of(amax):
    """The power of two s with amax * s in [2^14, 2^15), built from amax's exponent bits E (amax in [2^(E - 127), 2^(E - 126))): s = 2^(141 - E),
    whose own bits are (268 - E) << 23. Infinities and NaNs (E = 255) take 2^-114 and stay what they are."""
    E = tirx.max(tirx.reinterpret("uint32", amax) >> tirx.const(23, "uint32") & tirx.const(0xFF, "uint32"),
                 tirx.const(LOWEST_EXPONENT, "uint32"))
    return tirx.reinterpret("float32", (tirx.const(268, "uint32") - E) << tirx.const(23, "uint32"))


def row_scales(rows, K: int) -> tirx.PrimFunc:
    """PrimFunc(A [rows, K] fp32, S [rows] fp32): each row's scale (scale_of its largest magnitude). rows may be symbolic."""
    A = te.placeholder((rows, K), "float32", name="A")
    k = te.reduce_axis((0, K), name="k")
    amax = te.compute((rows,), lambda r: te.max(tirx.abs(A[r, k]), axis=k), name="amax")
    return te.create_prim_func([A, te.compute((rows,), lambda r: scale_of(amax[r]), name="S")])


def halves(rows, K: int) -> tirx.PrimFunc:
    """PrimFunc(A [rows, K] fp32, S [rows] fp32, P [rows, 2K] fp16): each scaled row's high parts, then its low parts."""
    A, S = te.placeholder((rows, K), "float32", name="A"), te.placeholder((rows,), "float32", name="S")

    def part(r, c):
        x = A[r, tirx.indexmod(c, K)] * S[r]
        high = x.astype("float16")
        return tirx.Select(c < K, high, (x - high.astype("float32")).astype("float16"))

    return te.create_prim_func([A, S, te.compute((rows, 2 * K), part, name="P")])


@functools.cache
def _on_cpu(rows: int, K: int):
    import tvm

    target = "llvm"
    return (tvm.compile(tvm.IRModule({"main": row_scales(rows, K)}), target=target),
            tvm.compile(tvm.IRModule({"main": halves(rows, K)}), target=target))


def split_on_cpu(a):
    """numpy fp32 [rows, K] -> (P fp16 [rows, 2K], S fp32 [rows]), by the same functions on the CPU (built once a shape):
    for tests and benchmarks that run the GEMM alone."""
    import numpy as np
    import tvm

    a = np.ascontiguousarray(a, "float32")
    scales_fn, halves_fn = _on_cpu(*a.shape)
    s = tvm.runtime.tensor(np.empty(a.shape[0], "float32"))
    p = tvm.runtime.tensor(np.empty((a.shape[0], 2 * a.shape[1]), "float16"))
    scales_fn["main"](tvm.runtime.tensor(a), s)
    halves_fn["main"](tvm.runtime.tensor(a), s, p)
    return p.numpy(), s.numpy()
