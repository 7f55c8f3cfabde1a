"""The input-projection GEMMs alone (XW = X @ W^T + bias for all steps), and how compile picks and builds them: each
GEMM against float64 on fresh inputs with its output poisoned (NaN) first, so any element it fails to write shows;
the CUDA sources and ptxas reports of the tensor-core ones (through NVRTC: no GPU needed); whole models on each.
"""

from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest
import tvm

import tvmrnn

from compiled import cuda_sources, target_of
from onnx_cases import Case
from schedules.projection_cuda import projection_cuda
from schedules.projection_mma import projection_mma
from schedules.projection_staged import StagedConfig, projection_staged
from schedules.projection_staged import supported as projection_staged_supported
from schedules.projection_wgmma import DEFAULT as WGMMA_DEFAULT, HALF_128 as WGMMA_HALF_128, TF32X3_SMALL_K as WGMMA_TF32X3_SMALL_K
from schedules.projection_wgmma import F16X3
from schedules.projection_wgmma import WgmmaConfig, operands_for, projection_wgmma, weights_for
from schedules.ptxas import kernel_source


@pytest.mark.gpu
@pytest.mark.parametrize("M, K, cols", [(1, 8, 4), (333, 40, 2400), (1100, 64, 1020), (6000, 800, 3200)])
def test_projection_cuda_matches_float64(M, K, cols):
    """Our fp32 projection GEMM, skinny (M < 1024) and tiled, partial row and column tiles included, output poisoned first."""
    _check_projection(projection_cuda(K, cols), M, K, cols, "f4", 1e-5)


@pytest.mark.parametrize("mcpu, cols, expected", [("rocketlake", 256, (6, 64)), ("znver5", 256, (8, 32)), ("", 240, (8, 48)),
                                                   ("znver5", 240, (8, 16)), ("rocketlake", 96, (8, 48)), ("", 160, (8, 32)),
                                                   ("rocketlake", 24, (8, 8)), ("znver5", 6, (8, 8)),
                                                   ("znver5", 25, (8, 16)), ("rocketlake", 36, (8, 16))])
def test_cpu_projection_tile_by_cpu_against_float64(mcpu, cols, expected):
    """The CPU GEMM's tile: 6 x 64 where 64 columns divide the gates, else 8 x 48 (three 16-lane vectors: LLVM does not
    vectorize 48 lanes whole), else 8 x 32 (on AMD's Zen always 8 x 32, where it ran faster), 16 or 8 columns where 32
    does not divide, else 16 (8 up to 8 columns) with W's last panel padded; each against float64 with the output
    poisoned, M = 1, 7 and 13 (partial row tiles), W packed in the tile's panels as compile packs it."""
    from schedules.projection_cpu import panel_width, projection_cpu, tile, w_panels

    assert tile(cols, mcpu) == expected and panel_width(cols, mcpu) == expected[1]
    K, nr = 40, expected[1]
    lib = tvm.compile(tvm.IRModule({"main": projection_cpu(K, cols, mcpu)}), target=target_of("llvm"))
    rng = np.random.default_rng(cols)
    w, b = rng.standard_normal((cols, K)).astype("f4"), rng.standard_normal(cols).astype("f4")
    padded = np.concatenate([w, np.zeros((w_panels(cols, nr) * nr - cols, K), "f4")])
    panels = np.ascontiguousarray(padded.reshape(-1, nr, K).transpose(0, 2, 1))
    for M in (1, 7, 13):
        x = rng.standard_normal((M, K)).astype("f4")
        out = tvm.runtime.tensor(np.full((M, cols), np.nan, "f4"))
        lib["main"](tvm.runtime.tensor(x), tvm.runtime.tensor(panels), tvm.runtime.tensor(b), out)
        np.testing.assert_allclose(out.numpy(), x.astype("f8") @ w.T.astype("f8") + b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("rows, expected", [(1, (1, 32)), (3, (3, 32)), (8, (8, 32)), (300, (8, 32)), (None, (8, 32))])
def test_cpu_projection_tile_has_no_more_rows_than_the_gemm(rows, expected):
    """Where the model fixes the GEMM's rows (seq * batch), the tile computes no more (one step at batch 1: 1 x 32),
    against float64 with the output poisoned."""
    from schedules.projection_cpu import projection_cpu, tile

    assert tile(512, "znver5", rows) == expected
    K, cols, nr = 24, 512, expected[1]
    lib = tvm.compile(tvm.IRModule({"main": projection_cpu(K, cols, "znver5", expected)}), target=target_of("llvm"))
    rng = np.random.default_rng(5)
    w, b = rng.standard_normal((cols, K)).astype("f4"), rng.standard_normal(cols).astype("f4")
    panels = np.ascontiguousarray(w.reshape(cols // nr, nr, K).transpose(0, 2, 1))
    for M in {rows or 5, 1, 4}:
        x = rng.standard_normal((M, K)).astype("f4")
        out = tvm.runtime.tensor(np.full((M, cols), np.nan, "f4"))
        lib["main"](tvm.runtime.tensor(x), tvm.runtime.tensor(panels), tvm.runtime.tensor(b), out)
        np.testing.assert_allclose(out.numpy(), x.astype("f8") @ w.T.astype("f8") + b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("K, cols, tested", [(128, 512, True), (512, 4096, False)])
def test_cpu_projection_over_rows_known_at_run_time_takes_the_pool_only_where_they_pay(K, cols, tested, monkeypatch):
    """Rows known only at run time: the pool's loop and the calling thread's under a test of the work against
    MIN_PARALLEL_WORK (2^20 here, to keep the GEMMs small), unless one tile's rows already pay (8 rows of 512 x 4096:
    the test could only pass); each branch against float64 with the output poisoned."""
    from schedules import device, projection_cpu as module
    from schedules.projection_cpu import projection_cpu, tile

    MIN_PARALLEL_WORK = 1 << 20
    monkeypatch.setattr(device, "MIN_PARALLEL_WORK", MIN_PARALLEL_WORK)
    monkeypatch.setattr(module, "MIN_PARALLEL_WORK", MIN_PARALLEL_WORK)

    mr, nr = tile(cols, "znver5")
    func = projection_cpu(K, cols, "znver5")
    script = func.script()
    assert "T.parallel" in script and (str(MIN_PARALLEL_WORK) in script) == tested
    lib = tvm.compile(tvm.IRModule({"main": func}), target=target_of("llvm"))
    rng = np.random.default_rng(K)
    w, b = rng.standard_normal((cols, K)).astype("f4"), rng.standard_normal(cols).astype("f4")
    panels = np.ascontiguousarray(w.reshape(cols // nr, nr, K).transpose(0, 2, 1))
    for M in (3, -(-MIN_PARALLEL_WORK // (K * cols)) + 5):  # below and above the bound
        x = rng.standard_normal((M, K)).astype("f4")
        out = tvm.runtime.tensor(np.full((M, cols), np.nan, "f4"))
        lib["main"](tvm.runtime.tensor(x), tvm.runtime.tensor(panels), tvm.runtime.tensor(b), out)
        expected = x.astype("f8") @ w.T.astype("f8") + b
        assert np.abs(out.numpy() - expected).max() / np.abs(expected).max() < 1e-5  # NaN (a row not written) fails


def _check_projection(func, M, K, cols, dtype, tol, target=None, xw_dtype="f4"):
    """Run a projection PrimFunc(X [M, K], W [cols, K], bias, XW) on fresh inputs, output poisoned first, against float64."""
    lib = tvm.compile(tvm.IRModule({"main": func}), target=target or target_of("cuda"))
    rng = np.random.default_rng(M)
    x, w = (rng.standard_normal(s).astype(dtype) for s in ((M, K), (cols, K)))
    b = rng.standard_normal(cols).astype("f4")
    dev = tvm.cuda(0)
    out = tvm.runtime.tensor(np.full((M, cols), np.nan, xw_dtype), dev)
    lib["main"](*[tvm.runtime.tensor(v, dev) for v in (*operands_for(func, x, w), b)], out)
    expected = x.astype("f8") @ w.astype("f8").T + b
    got = out.numpy().astype("f8")
    assert not np.isnan(got).any(), f"{np.isnan(got).sum()} elements never written"
    assert np.abs(got - expected).max() / np.abs(expected).max() < tol


@pytest.mark.gpu
@pytest.mark.parametrize("mode, tol", [("float16", 1e-5), ("tf32", 3e-3)])
@pytest.mark.parametrize("M, K, cols", [(1, 32, 2), (333, 64, 2400), (1100, 800, 1022), (6400, 1024, 4096)])
def test_projection_mma_matches_float64(M, K, cols, mode, tol):
    """Our tensor-core projection against float64: fp16 on the same fp16 inputs (fp32 accumulation: exact to
    rounding), TF32 on fp32 inputs (operands rounded to 10 bits); output poisoned first; partial tiles included."""
    _check_projection(projection_mma(mode, K, cols), M, K, cols, "f2" if mode == "float16" else "f4", tol)


@pytest.mark.gpu
@pytest.mark.parametrize("mode, tol, config", [(m, tol, c) for m, tol in [("float16", 1e-5), ("tf32", 3e-3), ("tf32x3", 1e-5)]
                                               for c in (StagedConfig(), StagedConfig(mt=2), StagedConfig(warps_m=4, warps_n=2, mt=2),
                                                         StagedConfig(warps_m=1, warps_n=8, mt=2, nt=2),  # 32 rows: guarded copies
                                                         StagedConfig(mt=2, chunk_acc=True),
                                                         # the cp.async ring: 64 x 64 warp tiles; guarded copies with a group
                                                         # that does not divide the M tiles; chunk_acc
                                                         StagedConfig(warps_m=2, warps_n=2, mt=4, nt=8, stages=4, group=8),
                                                         StagedConfig(warps_m=1, warps_n=8, mt=2, nt=2, stages=3, group=3),
                                                         StagedConfig(mt=2, chunk_acc=True, stages=3, group=8))
                                               if projection_staged_supported(m, 32, 2, c)], ids=str)  # fp32's 128 x 128 is over 48 KB
@pytest.mark.parametrize("M, K, cols", [(1, 32, 2), (333, 64, 2400), (1100, 800, 1022), (6400, 1024, 4096)])
def test_projection_staged_matches_float64(M, K, cols, mode, tol, config):
    """The shared-memory-staged tensor-core projection against float64, output poisoned first, partial row and column
    tiles and odd chunk counts (K = 800: 25 chunks) included; 3xTF32 as accurate as fp32. The cp.async ring at 1 and 2
    chunks (K = 32, 64: all in the prologue) and at 25."""
    _check_projection(projection_staged(mode, K, cols, config), M, K, cols, "f2" if mode == "float16" else "f4", tol)


# WgmmaConfig's defaults; 256 columns; one warpgroup of 64 columns with a group that does not divide the M tiles; two
# chunks per buffer (K = 800's 25 chunks: a partial last buffer) with the next buffer's wgmma's issued before the last
# one's finish, at 128 columns and at 256 (compile's DEFAULT); one chunk per buffer with that overlap; four warpgroups
# over 128 columns (256 x 128 blocks, partial M tiles at 333 and 1100 rows); compile's 128-column half-precision point
WGMMA_CONFIGS = [WgmmaConfig(), WgmmaConfig(bn=256, stages=3), WgmmaConfig(bn=64, warpgroups=1, stages=2, group=3),
                 WgmmaConfig(k_chunks=2, stages=4, overlap=1), WgmmaConfig(bn=256, stages=6, overlap=1), WGMMA_DEFAULT,
                 WgmmaConfig(bn=128, warpgroups=4, k_chunks=2, stages=4, overlap=1), WGMMA_HALF_128]
# the epilogue's stores four columns at a time (store_cols=4: a shuffle between lane pairs) at 256 and 128 columns
# (compile's DEFAULT stores two, WGMMA_CONFIGS' others one)
WGMMA_STORE_CONFIGS = [dataclasses.replace(WGMMA_DEFAULT, store_cols=4), WgmmaConfig(bn=128, stages=6, overlap=1, store_cols=4)]


# 3xTF32 with X split in registers and W's low parts beside W (lo_w): 128 x 128 with 2 and 4 buffers (K = 800's 25
# chunks: an odd count), two chunks per buffer (a partial last buffer: compile's point above K = 1600), one warpgroup of
# 64 columns, and compile's point up to K = 1600 (64 x 128, two blocks an SM)
WGMMA_REGS_CONFIGS = [WgmmaConfig(bn=128, stages=2, store_cols=2, lo_w=1), WgmmaConfig(bn=128, stages=4, store_cols=2, lo_w=1),
                      WgmmaConfig(bn=128, k_chunks=2, stages=2, lo_w=1), WgmmaConfig(bn=64, warpgroups=1, stages=4, group=3, lo_w=1),
                      WGMMA_TF32X3_SMALL_K]


@pytest.mark.gpu
# bfloat16 differs from float16 in the instruction's type only: compile's DEFAULT covers it; fp32's rows take twice the bytes
@pytest.mark.parametrize("mode, config", [("float16", c) for c in WGMMA_CONFIGS + WGMMA_STORE_CONFIGS] + [("bfloat16", WGMMA_DEFAULT)]
                         + [("tf32", c) for c in WGMMA_CONFIGS + WGMMA_STORE_CONFIGS if c.smem_bytes("tf32") <= 227 * 1024]
                         + [("tf32x3", c) for c in (WgmmaConfig(bn=128, stages=3), WgmmaConfig(bn=64, warpgroups=1, stages=2, group=3),
                                                    WgmmaConfig(bn=128, stages=2, overlap=1), WgmmaConfig(bn=64, warpgroups=1, stages=2, group=3, overlap=1),
                                                    WgmmaConfig(bn=128, stages=2, store_cols=4))]
                         + [("tf32x3", c) for c in WGMMA_REGS_CONFIGS], ids=str)
@pytest.mark.parametrize("M, K, cols", [(1, 32, 256), (333, 64, 2560), (1100, 800, 1024), (6400, 1024, 4096)])
def test_projection_wgmma_matches_float64(M, K, cols, mode, config):
    """The warpgroup (wgmma) projection against float64 on the same inputs, output poisoned first: a partial last row
    tile, one and two chunks (all in the ring's prologue), 25 chunks (K = 800), a raster group that does not divide the M
    tiles. Half precision exact to fp32 accumulation; TF32 (fp32 in the 128-byte swizzle, operands truncated to 10
    mantissa bits by the tensor cores) within TF32's error; 3xTF32 (each chunk split into high and low parts, its three
    products summed apart and added in fp32; with overlap one chunk's products run while the next is split) within
    fp32's 1e-5."""
    import ml_dtypes

    dtype = {"float16": "f2", "bfloat16": ml_dtypes.bfloat16, "tf32": "f4", "tf32x3": "f4"}[mode]
    _check_projection(projection_wgmma(mode, K, cols, config), M, K, cols, dtype, 3e-3 if mode == "tf32" else 1e-5,
                      tvm.target.Target({"kind": "cuda", "arch": "sm_90a"}))


# the GEMMs a half layer's XW comes from, storing it in the layer's dtype: wgmma's DEFAULT (pairs) and 128-column point,
# its scalar and four-column stores, bf16; projection_staged's cp.async ring and its register-staged small tiles
HALF_XW = [("float16", WGMMA_DEFAULT), ("float16", WGMMA_HALF_128), ("float16", WgmmaConfig(bn=256, stages=6, overlap=1)),
           ("float16", dataclasses.replace(WGMMA_DEFAULT, store_cols=4)), ("bfloat16", WGMMA_DEFAULT),
           ("float16", StagedConfig(warps_m=2, warps_n=2, mt=4, nt=8, stages=4, group=8)),
           ("bfloat16", StagedConfig(warps_m=1, warps_n=8, mt=2, nt=2))]


@pytest.mark.gpu
@pytest.mark.parametrize("mode, config", HALF_XW, ids=str)
@pytest.mark.parametrize("M, K, cols", [(333, 64, 2560), (1100, 800, 1024)])
def test_projection_writes_half_xw(M, K, cols, mode, config):
    """XW in the layer's half dtype, rounded once from the fp32 sums: against float64 within that rounding (fp16 2^-11,
    bf16 2^-8 of each value), every element written (poisoned first), partial row tiles included."""
    import ml_dtypes

    dtype = {"float16": "f2", "bfloat16": ml_dtypes.bfloat16}[mode]
    build = projection_wgmma if isinstance(config, WgmmaConfig) else projection_staged
    _check_projection(build(mode, K, cols, config, xw_dtype=mode), M, K, cols, dtype, 1e-3 if mode == "float16" else 8e-3,
                      tvm.target.Target({"kind": "cuda", "arch": "sm_90a"}), xw_dtype=dtype)


def test_half_xw_builds_without_a_gpu():
    """A half layer's GEMMs store XW in its dtype: wgmma's epilogue packs pairs of fp32 sums into half2 / bfloat162 (and
    two such pairs into 8 bytes), projection_staged's rounds each pair; split K, which adds into XW, keeps fp32 XW."""
    from schedules.projection_staged import supported

    for mode, pair in (("float16", "__floats2half2_rn"), ("bfloat16", "__floats2bfloat162_rn")):
        for cols in (2, 4):
            src = kernel_source(projection_wgmma(mode, 800, 1024, dataclasses.replace(WGMMA_DEFAULT, store_cols=cols), xw_dtype=mode))
            assert f"tvmrnn_store{cols}_{mode}(" in src and pair in src and "float2*>(out)" not in src, (mode, cols)
    assert "half* __restrict__ XW" in kernel_source(projection_staged("float16", 800, 1024, xw_dtype="float16"))
    split = StagedConfig(warps_m=1, warps_n=8, mt=2, nt=2, split_k=2)
    assert supported("float16", 64, 256, split) and not supported("float16", 64, 256, split, xw_dtype="float16")


def test_projection_wgmma_builds_without_a_gpu():
    """It compiles through NVRTC for sm_90a: wgmma m64nBNk16 (TF32: k8) from two shared-memory descriptors, a proxy fence
    between the cp.async copies landing and the barrier, and is refused where it cannot run (exact fp32, sm_90 without
    the a, a partial column tile, a ring larger than shared memory)."""
    from schedules.projection_wgmma import supported

    for cfg in WGMMA_CONFIGS:
        src = kernel_source(projection_wgmma("float16", 800, 1024, cfg))
        assert f"wgmma.mma_async.sync.aligned.m64n{cfg.bn}k16.f32.f16.f16" in src and "fence.proxy.async.shared::cta" in src
        assert src.count("ptx_wgmma_encode_matrix_descriptor(") >= 4
    # TF32: k8, four wgmma's per 32-column chunk (128-byte rows), no transpose operands
    tf32 = WgmmaConfig(bn=256, stages=3, overlap=1)
    src = kernel_source(projection_wgmma("tf32", 800, 1024, tf32))
    assert "wgmma.mma_async.sync.aligned.m64n256k8.f32.tf32.tf32" in src and src.count("ptx_wgmma_encode_matrix_descriptor(") >= 8
    assert supported("float16", 800, 1024, "sm_90a") and supported("tf32", 800, 1024, "sm_90a", tf32)
    assert not supported("tf32", 800, 1024, "sm_90a", WGMMA_DEFAULT)  # 128 x 256 with two chunks per buffer: 384 KB of fp32
    assert supported("tf32", 800, 1024, "sm_90a") and supported("tf32", 800, 3200, "sm_90a")  # TF32's own: 256, 128 columns
    assert supported("tf32x3", 800, 3200, "sm_90a") and not supported("tf32x3", 800, 3280, "sm_90a")  # 3280: no 128, 160 or 96
    # 3xTF32: three k8 wgmma's per 32 bytes of a row into a chunk sum started at zero, the parts split between the
    # copies landing and the barrier (one barrier more per chunk, not one per store)
    x3 = WgmmaConfig(bn=128, stages=3)
    src = kernel_source(projection_wgmma("tf32x3", 800, 1024, x3))
    assert src.count("wgmma_tf32_ss_mma_async_sync_aligned_m64n128k8_f32_tf32_tf32_1_1(") == 1 + 12  # the helper, its calls
    assert src.count("__syncthreads()") == 2
    assert not supported("tf32x3", 800, 1024, "sm_90a", tf32) and not supported("tf32x3", 800, 1024, "sm_90a", WgmmaConfig(bn=128, stages=4))
    # with overlap: chunks in pairs, the first one's products running (into a chunk sum of its own, waited for with
    # wait_group 1) while the second is split; 25 chunks: twelve pairs in the loop, the last chunk after it; the sums
    # fenced in place around the waits; the ring's barrier and the parts' one, as without
    piped = WgmmaConfig(bn=128, stages=2, overlap=1)
    src = kernel_source(projection_wgmma("tf32x3", 800, 1024, piped))
    assert src.count("wgmma_tf32_ss_mma_async_sync_aligned_m64n128k8_f32_tf32_tf32_1_1(") == 1 + 3 * 12
    assert src.count("__syncthreads()") == 2 * 3 and "wgmma.wait_group.sync.aligned 1" in src and "tvmrnn_fence_operand(" in src
    assert not supported("tf32x3", 800, 1024, "sm_90a", WgmmaConfig(bn=128, k_chunks=2, stages=2, overlap=1))
    # X split in registers (lo_w): the rs form (A from four registers) three times per k8, one barrier per chunk (the
    # ring's), W [2 * cols, K]; not with overlap, nor outside 3xTF32
    regs = WgmmaConfig(bn=128, stages=4, lo_w=1)
    func = projection_wgmma("tf32x3", 800, 1024, regs)
    src = kernel_source(func)
    assert src.count("wgmma_tf32_rs_mma_async_sync_aligned_m64n128k8_f32_tf32_tf32_1_1(") == 1 + 12 and "_ss_" not in src
    assert src.count("__syncthreads()") == 1 and tuple(func.params[1].shape) == (2048, 800)
    assert regs.smem_bytes("tf32x3") == 4 * (128 + 2 * 128) * 128 and supported("tf32x3", 800, 1024, "sm_90a", regs)
    assert not supported("tf32x3", 800, 1024, "sm_90a", WgmmaConfig(bn=128, stages=4, overlap=1, lo_w=1))
    assert not supported("tf32", 800, 1024, "sm_90a", WgmmaConfig(bn=128, stages=4, lo_w=1))
    # compile's 3xTF32 point by K: 64 x 128 (one warpgroup, two blocks an SM) up to 1600, 128 x 128 with two chunks a
    # buffer above
    from schedules.projection_wgmma import TF32X3, default_config
    assert default_config("tf32x3", 6400, 1600) is WGMMA_TF32X3_SMALL_K and default_config("tf32x3", 10240, 2560) is TF32X3
    assert WGMMA_TF32X3_SMALL_K.smem_bytes("tf32x3") * 2 <= 227 * 1024
    assert not supported("float32", 800, 1024, "sm_90a") and not supported("float16", 800, 1024, "sm_90")
    assert not supported("float16", 800, 1000, "sm_90a") and not supported("float16", 80, 1024, "sm_90a")
    assert not supported("float16", 800, 1024, "sm_90a", WgmmaConfig(stages=2, overlap=1))  # no buffer left to copy into


# exact fp32 as three fp16 products of scaled halves (f16x3): compile's points (one warpgroup over 160, 128 or 96
# columns, two chunks a buffer: K = 800's 25 chunks leave a partial last buffer), 128 x 128 with one chunk a buffer and
# four buffers, and 64 x 64 with a raster group that does not divide the M tiles, storing four columns at a time
WGMMA_HALVES_CONFIGS = [*F16X3.values(), WgmmaConfig(bn=128, stages=4, store_cols=2), WgmmaConfig(bn=64, warpgroups=1, stages=3, group=3, store_cols=4)]


@pytest.mark.gpu
@pytest.mark.parametrize("config", WGMMA_HALVES_CONFIGS, ids=str)
@pytest.mark.parametrize("M, K, cols", [(1, 32, 1920), (333, 64, 1920), (1100, 800, 1920), (6000, 800, 3840)])
def test_projection_wgmma_halves_match_float64(M, K, cols, config):
    """The f16x3 GEMM (X's and W's rows scaled and split into fp16 halves by split_halves, hi*hi + hi*lo + lo*hi)
    against float64, output poisoned first, within fp32's 1e-5 of the largest value; partial row tiles, one chunk to
    25."""
    _check_projection(projection_wgmma("f16x3", K, cols, config), M, K, cols, "f4", 1e-5, tvm.target.Target({"kind": "cuda", "arch": "sm_90a"}))


@pytest.mark.gpu
def test_projection_wgmma_halves_keep_each_row_exact():
    """Each row keeps fp32's accuracy whatever its magnitude: rows of X and W scaled by 2^-100 to 2^100 (far outside
    fp16's range, as each row's scale brings them into it), a row of zeros, mixed signs: every element within 2^-20 of
    its own dot product's magnitude (|X| @ |W|^T, the bound a float32 dot product keeps), and the zero row exactly the
    bias."""
    M, K, cols = 700, 256, 512
    rng = np.random.default_rng(11)
    x = (rng.standard_normal((M, K)) * np.exp2(rng.integers(-100, 100, (M, 1)))).astype("f4")
    w = (rng.standard_normal((cols, K)) * np.exp2(rng.integers(-20, 20, (cols, 1)))).astype("f4")
    x[5] = 0
    b = rng.standard_normal(cols).astype("f4")
    func = projection_wgmma("f16x3", K, cols, rows=M)
    lib = tvm.compile(tvm.IRModule({"main": func}), target=tvm.target.Target({"kind": "cuda", "arch": "sm_90a"}))
    dev = tvm.cuda(0)
    out = tvm.runtime.tensor(np.full((M, cols), np.nan, "f4"), dev)
    lib["main"](*[tvm.runtime.tensor(v, dev) for v in (*operands_for(func, x, w), b)], out)
    got, x8, w8 = out.numpy().astype("f8"), x.astype("f8"), w.astype("f8")
    bound = np.abs(x8) @ np.abs(w8).T
    assert (np.abs(got - (x8 @ w8.T + b)) <= np.exp2(-20) * bound + np.abs(b) * np.exp2(-23)).all()
    assert np.array_equal(got[5], b)


@pytest.mark.gpu
@pytest.mark.parametrize("M, K", [(1, 32), (333, 800), (1000, 2560)])
def test_split_on_gpu_matches_the_folded_split(M, K):
    """X's split on the GPU (one warp per row) gives the bits W's split gives at compile time (split, on the CPU):
    fresh rows of mixed magnitudes, a zero row, an infinity; M not a multiple of the block's 8 rows; outputs poisoned."""
    from schedules.split_halves import split_on_cpu, split_on_gpu

    rng = np.random.default_rng(M)
    a = (rng.standard_normal((M, K)) * np.exp2(rng.integers(-60, 60, (M, 1)))).astype("f4")
    a[M // 2] = 0
    a[-1, -1] = np.inf
    lib = tvm.compile(tvm.IRModule({"main": split_on_gpu(K)}), target=tvm.target.Target({"kind": "cuda", "arch": "sm_90a"}))
    dev = tvm.cuda(0)
    p, s = tvm.runtime.tensor(np.full((M, 2 * K), np.nan, "f2"), dev), tvm.runtime.tensor(np.full(M, np.nan, "f4"), dev)
    lib["main"](tvm.runtime.tensor(a, dev), p, s)
    want_p, want_s = split_on_cpu(a)
    assert np.array_equal(s.numpy(), want_s)
    assert np.array_equal(p.numpy(), want_p, equal_nan=True)  # value for value (the infinity's low half is NaN in both)


def test_split_halves_rebuild_each_row():
    """split_halves (run on the CPU): each row's scale a power of two that puts its largest magnitude in [2^14, 2^15),
    high + low rebuilding each element within 2^-23 of the row's largest (22 bits and the rounding of the low half), a
    row of fp32 subnormals and a zero row given the largest scale (2^126) without overflow, an infinity left non-finite
    (its low half is NaN, as 3xTF32's was)."""
    from schedules.split_halves import split_on_cpu

    rng = np.random.default_rng(5)
    a = (rng.standard_normal((6, 96)) * np.exp2(np.array([0, -30, 40, -126, 0, 0]))[:, None]).astype("f4")
    a[4], a[5, 3] = 0, np.inf
    parts, scales = split_on_cpu(a)
    assert parts.dtype == np.float16 and parts.shape == (6, 192)
    assert (np.frexp(scales)[0] == 0.5).all()  # powers of two
    high, low = parts[:, :96].astype("f8"), parts[:, 96:].astype("f8")
    top = np.abs(high[:3]).max(axis=1)  # row 3 (under 2^-112) takes the largest scale, 2^126, and stays below
    assert ((top >= 2**14) & (top <= 2**15)).all() and scales[3] == scales[4] == 2.0**126
    rebuilt = (high + low) / scales[:, None]
    scale = np.abs(a[:4].astype("f8")).max(axis=1, keepdims=True)
    assert (np.abs(rebuilt[:4] - a[:4]) <= np.exp2(-23) * scale).all()
    assert not rebuilt[4].any() and np.isfinite(scales).all() and not np.isfinite(rebuilt[5, 3])


@pytest.mark.gpu
@pytest.mark.parametrize("bn", [160, 96])
@pytest.mark.parametrize("M", [333, 6000])
def test_projection_wgmma_narrow_gates_match_float64(M, bn):
    """Where 128 columns do not divide the gates (a GRU's 3 x 800), compile's 3xTF32 GEMM takes one warpgroup over 160
    or 96 columns: against float64 on a poisoned output, a partial row tile at M = 333, 25 chunks of K."""
    from schedules.projection_wgmma import TF32X3_NARROW

    _check_projection(projection_wgmma("tf32x3", 800, 2400, TF32X3_NARROW[bn]), M, 800, 2400, "f4", 1e-5,
                      tvm.target.Target({"kind": "cuda", "arch": "sm_90a"}))


def test_narrow_gates_pick_the_widest_tile_that_divides_them():
    """compile's 3xTF32 point where 128 columns do not divide the gates: 160 where it divides them, else 96; ptxas
    (no GPU) keeps the 160-column point's 160 registers of sums and accumulators unspilled and its wgmma's unserialized."""
    from schedules.projection_wgmma import TF32X3_NARROW, default_config, supported
    from schedules.ptxas import ptxas

    assert default_config("tf32x3", 2400, 800) is TF32X3_NARROW[160] and default_config("tf32x3", 672, 800) is TF32X3_NARROW[96]
    assert supported("tf32x3", 800, 2400, "sm_90a") and not supported("tf32x3", 800, 2400, "sm_90a", dataclasses.replace(TF32X3_NARROW[160], lo_w=0))
    report = ptxas(kernel_source(projection_wgmma("tf32x3", 800, 2400, rows=6000)), "sm_90a")
    assert report.spill_stores == 0 and not report.serialized, report


def test_wgmma_low_parts_complete_what_the_tensor_cores_read():
    """W's low parts (lo_w's second block of W, made by compile through low_parts): W's rows unchanged, then each
    element's remainder past its top 19 bits (what wgmma reads of an fp32 operand), itself a TF32 value, so that the
    truncated high part plus the low part is W within 2^-21 of its magnitude; zeros, signs, large and tiny exponents."""
    rng = np.random.default_rng(7)
    w = (rng.standard_normal((64, 32)) * np.exp2(rng.integers(-60, 60, (64, 32)))).astype("f4")
    w[0, :3] = [0.0, -0.0, 1.0]
    w2 = weights_for(projection_wgmma("tf32x3", 32, 64, WgmmaConfig(bn=64, warpgroups=1, stages=4, lo_w=1)), w)
    high, low = (w.view("u4") & 0xFFFFE000).view("f4"), w2[64:]
    assert w2.shape == (128, 32) and np.array_equal(w2[:64], w)
    assert not (low.view("u4") & 0x1FFF).any()  # TF32: nothing the tensor cores would drop
    assert (np.abs(high.astype("f8") + low - w) <= np.exp2(-21) * np.abs(w)).all()


def test_projection_wgmma_wide_stores_build_without_a_gpu():
    """The epilogue's stores of four columns (a shuffle between lane pairs) through its device function, the ring filled
    by every thread's cp.async; ptxas keeps the kernel unserialized and spill-free."""
    from schedules.projection_wgmma import supported
    from schedules.ptxas import ptxas

    for mode in ("float16", "tf32"):
        for cfg in WGMMA_STORE_CONFIGS:
            if not supported(mode, 800, 1024, "sm_90a", cfg):
                continue
            src = kernel_source(projection_wgmma(mode, 800, 1024, cfg, rows=1100))
            kernel = src[re.search(r'extern "C" __global__[^;{]*\{', src).start():]  # the definition's, not the declaration's
            assert {c: f"tvmrnn_store{c}_float32(" in kernel for c in (2, 4)} == {2: False, 4: True} and "cp_async" in kernel, cfg
            report = ptxas(src, "sm_90a")
            assert not report.serialized and report.spill_stores == 0, (mode, cfg, report)


# each mode compile picks in the default run; the other configurations (ptxas of each, ~10 s on 2 cores) are slow
@pytest.mark.parametrize("mode, config", [("float16", WGMMA_DEFAULT), ("tf32", None), ("tf32x3", None), ("f16x3", None)] + [
    pytest.param(mode, config, marks=pytest.mark.slow) for mode, config in
    [("float16", WGMMA_HALF_128), ("tf32x3", WgmmaConfig(bn=128, stages=2, overlap=1))] + [("tf32x3", c) for c in WGMMA_REGS_CONFIGS]], ids=str)
def test_wgmma_gemms_keep_their_pipeline(mode, config):
    """ptxas (through NVRTC, no GPU) keeps compile's wgmma GEMMs asynchronous and in registers: it does not serialize
    their wgmma's (C7514, which it does where accumulators are read while a wgmma writing them may be in flight) and
    spills nothing, at blog-a's shape and at a partial row tile with 25 chunks. The pipelined 3xTF32 point (not yet
    compile's) is held to the first only: with the odd last chunk it spills 4 bytes at 255 registers."""
    from schedules.ptxas import ptxas

    for M, K, cols in ((12800, 2560, 10240), (1100, 800, 1024)):
        src = kernel_source(projection_wgmma(mode, K, cols, config, rows=M, xw_dtype=mode if mode == "float16" else "float32"))  # compile's
        report = ptxas(src, "sm_90a")
        assert not report.serialized and (config is not None and config.overlap and mode == "tf32x3" or report.spill_stores == 0), (M, K, cols, report)


# (model dtype, compile's precision, hidden size: 4x the gates' columns) -> the wgmma GEMM's mode and its block, the
# instruction in its CUDA source
WGMMA_MODELS = {("float16", "exact", 64): ("float16", "128x256", "m64n256k16.f32.f16.f16"),
                ("float16", "exact", 32): ("float16", "128x128", "m64n128k16.f32.f16.f16"),  # 256 columns do not divide 128
                ("float32", "exact", 64): ("f16x3", "64x128", "m64n128k16.f32.f16.f16"),  # exact fp32 as scaled fp16 halves
                ("float32", "tf32", 64): ("tf32", "128x256", "m64n256k8.f32.tf32.tf32"),
                ("float32", "tf32", 32): ("tf32", "128x128", "m64n128k8.f32.tf32.tf32")}


@pytest.mark.parametrize("arch", ["sm_90a", pytest.param("sm_90", marks=pytest.mark.slow)])  # sm_90: projection_staged's builds
@pytest.mark.parametrize("dtype, precision, hidden", list(WGMMA_MODELS), ids=str)
def test_models_project_with_wgmma_on_sm90a(dtype, precision, hidden, arch):
    """A layer whose gates fill the mode's column tiles projects with the warpgroup GEMM on sm_90a (the H100 tag's
    arch): half precision in its dtype, fp32 exact as three fp16 products of scaled halves (f16x3) and with
    precision="tf32" as TF32, each on its widest tile that divides the gates; on sm_90, which has no wgmma, with
    projection_staged in the same mode (exact fp32 there as 3xTF32)."""
    mode, block, instruction = WGMMA_MODELS[dtype, precision, hidden]
    case = Case(op="LSTM", hidden=hidden, input_size=32, dtype=dtype)
    module = tvmrnn.compile(case.model(), target={"kind": "cuda", "arch": arch}, logs=False, precision=precision)
    src = cuda_sources(module)
    assert (f"wgmma.mma_async.sync.aligned.{instruction}" in src) == (arch == "sm_90a")
    xw = "" if dtype == "float32" else f", XW in {dtype}"  # a half layer's GEMM writes XW in its dtype
    # f16x3 reads X's halves at every row count (no small-row branch); on sm_90 exact fp32 is 3xTF32 on mma.sync
    wgmma = (f"wgmma {mode} {block}, X and W as scaled fp16 halves" if mode == "f16x3" else
             f"wgmma {mode} {block} (staged mma.sync up to 512 rows){xw}")
    assert module.metadata["layers"][0]["projection"] == (wgmma if arch == "sm_90a" else f"staged mma.sync {'tf32x3' if mode == 'f16x3' else mode}{xw}")
    assert "mma.sync.aligned.m16n8k" in src  # the recurrent kernels, and the small-row branch of either projection


@pytest.mark.parametrize("T, N, projection", [(300, 2, "wgmma f16x3 64x128, X and W as scaled fp16 halves"),
                                               (5, 1, "staged mma.sync tf32x3")])
def test_fixed_rows_pick_the_exact_fp32_gemm_by_count(T, N, projection):
    """A model that fixes its rows (seq x batch) builds its exact-fp32 GEMM for them: above the staged GEMM's 512 rows
    the f16x3 wgmma GEMM (a function of its own for the count), at or below them 3xTF32 in the staged GEMM's small tiles."""
    model = Case(op="LSTM", hidden=32, input_size=32).model()
    for dim, value in zip(model.graph.input[0].type.tensor_type.shape.dim, (T, N)):
        dim.dim_value = value
    module = tvmrnn.compile(model, target={"kind": "cuda", "arch": "sm_90a"}, logs=False)
    assert module.metadata["layers"][0]["projection"] == projection
    assert (f"projection_wgmma_f16x3_m{T * N}_32x128_kernel" in cuda_sources(module)) == (T * N > 512)


@pytest.mark.parametrize("weights_as_inputs", [False, True])
def test_w_halves_fold_at_compile_time(weights_as_inputs):
    """compile's exact-fp32 wgmma GEMM (f16x3) reads X's and W's scaled fp16 halves: W's are computed at compile time
    where W is an initializer (no kernel for them in the module), by kernels of their own at run time where it is a
    graph input; X's always at run time, for any row count."""
    case = Case(op="LSTM", hidden=64, input_size=32, weights_as_inputs=weights_as_inputs)
    src = cuda_sources(tvmrnn.compile(case.model(), target={"kind": "cuda", "arch": "sm_90a"}, logs=False))
    assert "wgmma_f16_ss_mma_async" in src and "split_halves_32_kernel" in src
    assert ("halves_256x32_kernel" in src) == weights_as_inputs


@pytest.mark.parametrize("arch, projection", [("sm_80", "TVM matmul"), ("sm_90a", "staged mma.sync float16")])
def test_half_layers_read_xw_in_their_dtype(arch, projection):
    """A half layer's recurrent kernel takes XW in its dtype, whichever GEMM makes it: one of ours stores it so (24 input
    columns are not whole 32-column chunks on sm_80, so TVM's matmul runs there, its fp32 result cast)."""
    case = Case(op="GRU", hidden=48, input_size=24 if arch == "sm_80" else 32, dtype="float16")
    module = tvmrnn.compile(case.model(), target={"kind": "cuda", "arch": arch}, logs=False)
    assert module.metadata["layers"][0]["projection"].startswith(projection)
    assert module.metadata["layers"][0]["projection"].endswith(", XW in float16")
    src = cuda_sources(module)
    assert "half* __restrict__ XW_ptr" in src and "float* __restrict__ XW_ptr" not in src


@pytest.mark.gpu
@pytest.mark.parametrize("dtype, precision", [("float16", "exact"), ("bfloat16", "exact"), ("float32", "exact"), ("float32", "tf32")], ids=str)
@pytest.mark.parametrize("T, N", [(300, 2), (5, 1)])  # 600 rows: the wgmma branch; 5: projection_staged's small tiles
@pytest.mark.parametrize("hidden", [64, 32])  # 256 and 128 gate columns: each mode's 256- and 128-column tiles
def test_model_with_wgmma_projection_matches_float64(dtype, precision, T, N, hidden):
    """A whole model with the wgmma projection, against the float64 reference on the same weights and inputs: half
    precision within 1e-2 (bfloat16 rounds them again: 2^-8, within 3e-2), exact fp32 (3xTF32) within 1e-5 of the
    largest value, TF32 within 1e-2."""
    # ONNX has no bfloat16 LSTM: an fp32 model, converted (compile's dtype; it leaves an fp16 model fp16), against the
    # reference on its fp32 values
    case = Case(op="LSTM", hidden=hidden, input_size=32, dtype="float16" if dtype == "float16" else "float32", optional=("initial_h", "initial_c"))
    module = tvmrnn.compile(case.model(), target="cuda", logs=False, dtype=dtype, precision=precision)
    src = cuda_sources(module)
    assert "wgmma.mma_async" in src  # "cuda" on the H100: its own arch, sm_90a
    assert re.search(rf"tvmrnn_store[24]_{dtype}\(", src)  # XW in the layer's dtype (half layers' too)
    feeds = case.feeds(np.random.default_rng(T), T, N)
    ref = case.reference(feeds)
    for name, value in module.run(feeds).items():
        value, want = np.asarray(value, "f8"), np.asarray(ref[name], "f8")
        if dtype == "float32" and precision == "exact":
            assert np.abs(value - want).max() / np.abs(want).max() < 1e-5, name
        else:
            tol = 3e-2 if dtype == "bfloat16" else 1e-2
            np.testing.assert_allclose(value, want, rtol=tol, atol=tol, err_msg=name)


SMALL_TILES = StagedConfig(warps_m=1, warps_n=8, mt=2, nt=2)


@pytest.mark.gpu
@pytest.mark.parametrize("mode, tol", [("float16", 1e-5), ("tf32", 3e-3), ("tf32x3", 1e-5)])
@pytest.mark.parametrize("M, K, cols, config", [
    (100, 1024, 4096, None), (512, 512, 2048, None), (513, 1024, 2048, None), (1, 64, 2, None),  # picked by M at run time
    (100, 1024, 4096, dataclasses.replace(SMALL_TILES, split_k=4)), (37, 256, 1022, dataclasses.replace(SMALL_TILES, split_k=2)),
], ids=str)
def test_projection_staged_tiles_by_rows_and_split_k(M, K, cols, config, mode, tol):
    """Without a fixed row count the kernel dispatches on M: the small tiles up to SMALL_M rows, the large ones above
    (both sides of the boundary). split_k: K split 4 and 2 ways, partial sums added into the bias with atomicAdd."""
    if config is not None and mode == "tf32x3":
        config = dataclasses.replace(config, chunk_acc=True)
    _check_projection(projection_staged(mode, K, cols, config), M, K, cols, "f2" if mode == "float16" else "f4", tol)


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [100, 12800])
def test_projection_staged_exact_fp32_over_a_long_reduction(rows):
    """3xTF32's default (chunk_acc) stays within fp32's 1e-5 at blog-a's K = 2560, where one accumulator across all 80
    chunks measured 1.35e-5 on the H100 (the tensor cores' accumulation does not round to nearest)."""
    _check_projection(projection_staged("tf32x3", 2560, 1024, rows=rows), rows, 2560, 1024, "f4", 1e-5)


@pytest.mark.parametrize("mode, shape", [("float16", "m16n8k16"), ("bfloat16", "m16n8k16"), ("tf32", "m16n8k8"), ("tf32x3", "m16n8k8")])
def test_projection_staged_builds_without_a_gpu(mode, shape):
    """It compiles through NVRTC with one barrier per 32-column chunk, and 3xTF32 issues three TF32 mma's per tile. The
    default at many rows, the cp.async ring: 16-byte async copies, waits that leave stages - 2 chunks in flight, no
    barrier but the loop's. The register-staged double buffer: no extra barrier between a chunk's reads of one shared
    buffer and its stores into the other."""
    target = tvm.target.Target({"kind": "cuda", "arch": "sm_90"})
    build = lambda m, **kw: tvm.compile(tvm.IRModule({"main": projection_staged(m, 800, 3200, **kw)}), target=target).mod.imports[0].inspect_source()  # noqa: E731
    ring = build(mode, rows=6400)
    assert f"mma.sync.aligned.{shape}" in ring
    assert "cp.async.cg.shared.global" in ring and "cp.async.wait_group 2;" in ring
    assert ring.count("__syncthreads()") == 1
    if mode == "tf32x3":
        assert ring.count("mma.sync") == 3 * build("tf32", rows=6400).count("mma.sync")
    # 25 chunks: one barrier after the first copy, two in the loop (two chunks per iteration), one for the odd last chunk
    assert build(mode, cfg=StagedConfig(mt=2)).count("__syncthreads()") == 4


def test_projection_staged_picks_tiles_by_rows_and_can_split_k():
    """A dynamic row count builds both tile shapes behind a dispatch on M; split_k builds a bias fill and atomicAdd's of
    the partial sums (no default splits: measured no faster in whole models)."""
    from schedules.projection_staged import SMALL_M, default_config

    target = tvm.target.Target({"kind": "cuda", "arch": "sm_90"})
    assert default_config("tf32x3", 100).block == (32, 128) and default_config("tf32x3", 100).stages == 0
    assert default_config("tf32x3", 6400).block == (128, 64) and default_config("float16", 6400).block == (128, 128)
    assert default_config("tf32x3", 6400).stages == default_config("float16", 6400).stages == 4
    func = projection_staged("tf32x3", 1024, 4096)
    assert f"    if M <= T.int64({SMALL_M}):" in func.script()
    src = lambda cfg: tvm.compile(tvm.IRModule({"main": projection_staged("tf32x3", 1024, 4096, cfg)}),  # noqa: E731
                                  target=target).mod.imports[0].inspect_source()
    split = src(StagedConfig(warps_m=1, warps_n=8, mt=2, nt=2, split_k=4))
    assert "blockIdx.z" in split and "atomicAdd" in split
    whole = src(StagedConfig(warps_m=1, warps_n=8, mt=2, nt=2))
    assert "blockIdx.z" not in whole and "atomicAdd" not in whole


@pytest.mark.parametrize("mode, shape", [("float16", "m16n8k16"), ("bfloat16", "m16n8k16"), ("tf32", "m16n8k8")])
def test_projection_mma_builds_without_a_gpu(mode, shape):
    """The tensor-core projection compiles through NVRTC (the CI machine has no GPU)."""
    lib = tvm.compile(tvm.IRModule({"main": projection_mma(mode, 64, 48)}), target=tvm.target.Target({"kind": "cuda", "arch": "sm_90"}))
    assert f"mma.sync.aligned.{shape}" in lib.mod.imports[0].inspect_source()
