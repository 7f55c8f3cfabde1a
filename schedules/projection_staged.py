"""The input projection on tensor cores with block tiles staged through shared memory: XW = X @ W^T + bias, fp32 results.

projection_mma streams each warp's rows of X and W from global memory into registers and relies on
L1 for the reuse between the 2 x 2 warps of a block (a 128 x 64 block tile). On the H100 that ran
blog-a's GEMM (12800 x 2560 x 10240, fp16) at 125 TFLOP/s, 5.3 of the model's 15.8 ms
(benchmarks/results/2026-11-23-h100-knob-variants.md's profile): every 16-byte load serves 42 MACs of
the block, and L2 cannot feed more. Here a block of warps_m x warps_n warps owns a tile (default_config:
64 x 128 or 128 x 64; 32 x 128 for the few rows of batch 1-5, where larger tiles leave SMs idle) and
copies each 32-column chunk of its rows of X and W into shared memory once; its warps read their fragments from there (the same WarpTiles
registers and mma.sync shapes as every tensor-core kernel of ours, so fp16, bf16, TF32 and 3xTF32,
the exact fp32 mode, all work). Two shared buffers: while the warps multiply chunk c, each thread's
16-byte loads of chunk c+1 are in flight into registers, stored to the other buffer after the
mma's; one barrier per chunk.

Shared layout: rows of 32 elements, X's BM rows then W's BN rows. In half precision a row is 64
bytes, so the 8 lanes of a quarter-warp (rows g, g+1; their 16 bytes at 8t) cover 128 consecutive
bytes: no bank conflict. In fp32 a row is 128 bytes and odd rows swap the 16-byte halves of each
lane's 32 bytes (the XOR swizzle of recurrent_persistent_mma), so those lanes hit distinct banks.

On the H100 (benchmarks/results/2026-11-23-h100-projection-staged.md) this is the model build's projection
wherever a tensor-core mode applies: blog-a fp16 3.64 ms against projection_mma's 5.35 (cuBLAS: 1.00); exact
fp32 as 3xTF32 with chunk_acc 14.4 ms against the SIMT GEMM's 15.0 (cuBLAS without TF32: 13.0) and, at
lat-b1-h1024's 100 rows, 31 against 83 us. Without chunk_acc 3xTF32 was off by 1.3e-5 at K = 2560; with it 4.1e-7.
"""

from __future__ import annotations

from dataclasses import dataclass

from tvm import tirx
from tvm.script.ir_builder import tirx as T

from .mma_tiles import KC, MODES, WarpTiles
from .projection_mma import add_xw, store_xw
from .recurrent_common import block_sync, each_element, i64, projection_prim_func

F32 = "float32"


@dataclass(frozen=True)
class StagedConfig:
    warps_m: int = 2  # warps along X's rows
    warps_n: int = 4  # warps along W's rows (XW's columns)
    mt: int = 4  # m16 tiles per warp
    nt: int = 4  # n8 tiles per warp
    chunk_acc: bool = False  # each 32-k chunk into a zeroed accumulator, added in fp32 (mma_tiles.WarpTiles: 3xTF32's accuracy at large K)
    # blocks splitting the reduction (grid z): each adds its partial sums into XW, which a first launch fills with the
    # bias, with atomicAdd. Meant for the few rows of small batches, where each block walks all of K chunk after chunk;
    # no default uses it (default_config says why)
    split_k: int = 1

    @property
    def block(self) -> tuple[int, int]:
        return self.warps_m * self.mt * 16, self.warps_n * self.nt * 8

    @property
    def threads(self) -> int:
        return 32 * self.warps_m * self.warps_n

    def smem_bytes(self, dtype: str) -> int:
        """Both buffers: static shared memory, at most 48 KB a block."""
        bm, bn = self.block
        return 2 * (bm + bn) * KC * (4 if dtype == F32 else 2)


SMALL_M = 512  # up to this many rows (batch 1-5 at T = 100) 32-row tiles, so more blocks share the few rows


def default_config(mode: str, rows: int | None = None) -> StagedConfig:
    """The measured best of StagedConfig's points on the H100 (benchmarks/results/2026-11-23-h100-projection-staged.md):
    32 x 128 tiles up to SMALL_M rows; above, 64 x 128 in fp16/bf16 (blog-a 3.64 ms against 128 x 128's 5.42) and
    3xTF32, 128 x 64 in TF32. 3xTF32 accumulates chunk by chunk (chunk_acc). K is not split (split_k): in whole batch-1
    models it ran 0.97-1.05x the time of K whole in fp32 and 1.03-1.04x in fp16
    (benchmarks/results/2026-11-24-h100-projection-split-ab.md)."""
    exact = mode == "tf32x3"
    if rows is not None and rows <= SMALL_M:
        return StagedConfig(warps_m=1, warps_n=8, mt=2, nt=2, chunk_acc=exact)
    if mode == "tf32":
        return StagedConfig(warps_m=4, warps_n=2, mt=2)
    return StagedConfig(mt=2, chunk_acc=exact)


def _configs(mode: str, cfg: StagedConfig | None, rows: int | None) -> list[StagedConfig]:
    """The configurations a projection builds: the one given, the default for a fixed row count, or without one both
    tile shapes (up to SMALL_M rows, and above), picked by M at run time."""
    if cfg is not None:
        return [cfg]
    return [default_config(mode, rows)] if rows is not None else [default_config(mode, SMALL_M), default_config(mode)]


def supported(mode: str | None, K: int, cols: int, cfg: StagedConfig | None = None, rows: int | None = None) -> bool:
    """A tensor-core mode, whole 32-column chunks, column pairs (8-byte stores), both buffers in 48 KB."""
    if mode not in MODES or K % KC or cols % 2:
        return False
    return all(c.smem_bytes(MODES[mode].storage) <= 48 * 1024 and (K // KC) % c.split_k == 0 for c in _configs(mode, cfg, rows))


def projection_staged(mode: str, K: int, cols: int, cfg: StagedConfig | None = None, rows: int | None = None) -> tirx.PrimFunc:
    """PrimFunc(X [M, K], W [cols, K] in the mode's storage dtype, bias [cols] fp32, XW [M, cols] fp32), M symbolic.
    rows: M where the model fixes it, for the default tile shape; else the kernel picks by M at run time (the small-M
    tiles up to SMALL_M rows: in a dynamic-batch model at batch 1, lat-b1-h1024's 100 rows had run on 64 blocks of
    64 x 128; lat-b1-h512-l2 fp32 0.446 against 0.475 ms, lat-b1-h1024 0.315 against 0.321, fp16 within 2%)."""
    configs = _configs(mode, cfg, rows)
    assert supported(mode, K, cols, cfg, rows), (mode, K, cols, configs)

    def body(X, W, bias, XW, M):
        if len(configs) == 1:
            _gemm(mode, K, cols, configs[0], X, W, bias, XW, M)
            return
        with T.If(M <= i64(SMALL_M)):
            with T.Then():
                _gemm(mode, K, cols, configs[0], X, W, bias, XW, M)
            with T.Else():
                _gemm(mode, K, cols, configs[1], X, W, bias, XW, M)

    return projection_prim_func(f"projection_staged_{mode}", MODES[mode].storage, K, cols, (cols, K), body)


def _fill_bias(XW, bias, M, cols: int):
    """XW[m, n] = bias[n]: the sums split_k blocks add into start from the bias."""
    each_element(M * i64(cols), lambda e: T.buffer_store(XW, bias[e % i64(cols)], [e // i64(cols), e % i64(cols)]))


def _gemm(mode: str, K: int, cols: int, cfg: StagedConfig, X, W, bias, XW, M):
    """One configuration's launches: (with split_k) the bias fill, then the tiled GEMM, split_k blocks per tile."""
    BM, BN = cfg.block
    chunks = K // KC // cfg.split_k  # per block
    if cfg.split_k > 1:
        _fill_bias(XW, bias, M, cols)
    with T.thread_binding(0, tirx.ceildiv(M, i64(BM)), "blockIdx.x") as bx:
        with T.thread_binding(0, i64(-(-cols // BN)), "blockIdx.y") as by:
            if cfg.split_k == 1:
                _tile(mode, K, cols, cfg, X, W, bias, XW, M, bx, by, i64(0), chunks)
            else:
                with T.thread_binding(0, i64(cfg.split_k), "blockIdx.z") as bz:
                    _tile(mode, K, cols, cfg, X, W, bias, XW, M, bx, by, bz * i64(chunks), chunks)


def _tile(mode: str, K: int, cols: int, cfg: StagedConfig, X, W, bias, XW, M, bx, by, k0, chunks: int):
    """One block: its BM x BN tile of XW over `chunks` chunks of K from chunk k0."""
    dtype = MODES[mode].storage
    BM, BN = cfg.block
    vec = WarpTiles.width(dtype)  # elements per 16-byte copy
    segs = KC // vec  # copies per 32-element row
    # 16-byte copies per thread per chunk: X's rows, then W's (a copy past the rows is skipped where the block's threads
    # do not divide them evenly)
    plan = [(i, rows, first) for rows, first in ((BM, 0), (BN, BM)) for i in range(-(-rows * segs // cfg.threads))]
    swizzle = dtype == F32
    size = (BM + BN) * KC  # one buffer
    with T.thread_binding(0, i64(cfg.warps_m * cfg.warps_n), "threadIdx.y") as wy:
        with T.thread_binding(0, i64(32), "threadIdx.x") as lane:
            tid = wy * i64(32) + lane
            mb, nb = bx * i64(BM), by * i64(BN)
            wm, wn = wy // i64(cfg.warps_n), wy % i64(cfg.warps_n)
            # two buffers, not halves of one: TVM's sync planner tells accesses apart by buffer, so a step's
            # stores into one after reading the other need no barrier between them
            sm = [T.alloc_buffer((size,), dtype, scope="shared") for _ in range(2)]
            staged = T.alloc_buffer((len(plan), vec), dtype, scope="local")
            tiles = WarpTiles(lane, cfg.mt, cfg.nt, mode, dtype, dtype, 1, chunk_acc=cfg.chunk_acc)

            def each_copy(body):
                """body(slot, row in the shared tile, 16-byte segment, source row index) for this thread's copies."""
                for slot, (i, rows, first) in enumerate(plan):
                    e = i64(i * cfg.threads) + tid
                    r, seg = e // i64(segs), e % i64(segs)
                    if (i + 1) * cfg.threads <= rows * segs:
                        body(slot, i64(first) + r, seg, r)
                    else:
                        with T.If(r < i64(rows)):
                            with T.Then():
                                body(slot, i64(first) + r, seg, r)

            def fetch(ck):
                def copy(slot, row, seg, r):
                    k = (k0 + ck) * i64(KC) + seg * i64(vec)
                    with T.vectorized(0, i64(vec)) as v:
                        val = X[tirx.min(mb + r, M - i64(1)), k + v] if plan[slot][2] == 0 else \
                            W[tirx.min(nb + r, i64(cols - 1)), k + v]
                        T.buffer_store(staged, val, [i64(slot), v])

                each_copy(copy)

            def store(buf):
                def copy(slot, row, seg, r):
                    pos = tirx.bitwise_xor(seg, row % i64(2)) if swizzle else seg  # odd rows: halves swapped
                    with T.vectorized(0, i64(vec)) as v:
                        T.buffer_store(sm[buf], staged[i64(slot), v], [row * i64(KC) + pos * i64(vec) + v])

                each_copy(copy)

            def element(buf, row, v0, v):
                """Element v0 + v of the lane's 8 k (8t..8t+7) of shared row `row` (row % 2 == g % 2)."""
                flip = (tiles.g % i64(2)) * i64(4)  # v0 XOR flip, spelled affine so the load stays one vector
                col = tiles.t * i64(8) + ((flip if v0 == 0 else i64(4) - flip) if swizzle else i64(v0))
                return sm[buf][row * i64(KC) + col + v]

            def step(ck, cur: int):
                """Multiply chunk ck from buffer `cur` while chunk ck + 1 is fetched, then store that in the other
                buffer (the one every warp finished reading before the last barrier)."""
                fetch(tirx.min(ck + i64(1), i64(chunks - 1)))  # in flight during the mma's (the last one idle)
                tiles.load_a(lambda mt, half, v0, v: element(cur, wm * i64(cfg.mt * 16) + i64(mt * 16 + 8 * half) + tiles.g, v0, v), True)
                tiles.load_b_parts(lambda nt, v0, v: element(cur, i64(BM) + wn * i64(cfg.nt * 8) + i64(nt * 8) + tiles.g, v0, v), True)
                tiles.multiply()
                store(1 - cur)
                block_sync()

            fetch(i64(0))
            store(0)
            block_sync()
            # two chunks per iteration, so each step names its buffers at compile time
            with T.serial(0, i64(chunks // 2)) as pair:
                step(pair * i64(2), 0)
                step(pair * i64(2) + i64(1), 1)
            if chunks % 2:
                step(i64(chunks - 1), 0)
            tiles.finish()
            m0, n0 = mb + wm * i64(cfg.mt * 16), nb + wn * i64(cfg.nt * 8)
            if cfg.split_k == 1:
                store_xw(tiles, XW, bias, M, cols, m0, n0)
            else:
                add_xw(tiles, XW, M, cols, m0, n0)
