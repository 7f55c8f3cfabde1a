"""The input projection on tensor cores with block tiles staged through shared memory: XW = X @ W^T + bias, fp32 results
(a half-precision layer's XW in its dtype).

projection_mma streams each warp's rows of X and W from global memory into registers and relies on
L1 for the reuse between the 2 x 2 warps of a block (a 128 x 64 block tile): every 16-byte load serves 42 MACs
of the block, and L2 cannot feed more on large GEMMs. Here a block of warps_m x warps_n warps owns a tile and copies each
32-column chunk of its rows of X and W into shared memory once; its warps read their fragments from
there (the same WarpTiles registers and mma.sync shapes as every tensor-core kernel of ours, so fp16,
bf16, TF32 and 3xTF32, the exact fp32 mode, all work). Two ways to stage the chunks:
- the cp.async ring (stages >= 2, the default above SMALL_M rows): `stages` buffers in dynamic shared
  memory, the copies of the next stages - 1 chunks in flight while the warps multiply one, nothing
  staged in registers, so 64 x 64 warp tiles fit (half the shared-memory reads per mma of 32 x 32);
  blocks walk XW in raster groups of `group` M tiles, so a wave's X and W rows stay in L2;
- the register-staged double buffer (stages = 0; 32 x 128 tiles for the few rows of batch 1-5, where
  larger tiles leave SMs idle): each thread's 16-byte loads of chunk c+1 are in flight into registers
  while the warps multiply chunk c, stored to the other buffer after the mma's.
Either way one barrier per chunk.

Shared layout: rows of 32 elements, X's BM rows then W's BN rows. In half precision a row is 64
bytes, so the 8 lanes of a quarter-warp (rows g, g+1; their 16 bytes at 8t) cover 128 consecutive
bytes: no bank conflict. In fp32 a row is 128 bytes and odd rows swap the 16-byte halves of each
lane's 32 bytes (the XOR swizzle of recurrent_persistent_mma), so those lanes hit distinct banks.

3xTF32 accumulates each chunk apart (chunk_acc): the tensor cores' accumulation truncates, and one accumulator
drifted past 1e-5 at K = 2560. Timings: docs/decisions.md (CUDA projections).
"""

from __future__ import annotations

from dataclasses import dataclass

from tvm import tirx
from tvm.script.ir_builder import tirx as T

from .device import SMEM_LIMIT
from .mma_tiles import KC, MODES, WarpTiles, cp_async_ring, itemsize, shared_element
from .projection_mma import add_xw, store_xw
from .recurrent_common import block_sync, each_element, i64, projection_prim_func, shared_dyn

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
    # stages >= 2: the chunks go global -> shared with cp.async into a ring of `stages` buffers in dynamic shared
    # memory (stages - 1 chunks in flight while the warps multiply one; no register staging, so larger warp tiles fit).
    # 0: the register-staged double buffer
    stages: int = 0
    # M tiles per raster group (0: none, blockIdx.x walks M): the blocks of a wave share a few M tiles and a few W tiles,
    # so both come from L2 (a large GEMM's X and W do not fit L2 together, and walking all of M for each column of
    # tiles reads X from HBM once per column tile)
    group: int = 0

    @property
    def block(self) -> tuple[int, int]:
        return self.warps_m * self.mt * 16, self.warps_n * self.nt * 8

    @property
    def threads(self) -> int:
        return 32 * self.warps_m * self.warps_n

    def smem_bytes(self, dtype: str) -> int:
        """Every buffer: static shared memory for the double buffer, dynamic for the cp.async ring."""
        bm, bn = self.block
        return max(2, self.stages) * (bm + bn) * KC * itemsize(dtype)

    @property
    def smem_limit(self) -> int:
        return SMEM_LIMIT["sm_90"] if self.stages else 48 * 1024


SMALL_M = 512  # up to this many rows (batch 1-5 at T = 100) 32-row tiles, so more blocks share the few rows


def default_config(mode: str, rows: int | None = None) -> StagedConfig:
    """The measured best of StagedConfig's points (docs/decisions.md): 32 x 128 register-staged tiles up to SMALL_M
    rows; above, the cp.async ring of 4 chunks with 8 M tiles per raster group: in fp16/bf16 128 x 128 blocks of four
    64 x 64 warp tiles, in fp32 (3xTF32, TF32) 128 x 64 blocks of four 64 x 32 warp tiles, the widest whose 3xTF32
    fragments fit the registers. 3xTF32 accumulates chunk by chunk (chunk_acc). K is not split (split_k: no faster)."""
    exact = mode == "tf32x3"
    if rows is not None and rows <= SMALL_M:
        return StagedConfig(warps_m=1, warps_n=8, mt=2, nt=2, chunk_acc=exact)
    if MODES[mode].storage == F32:
        return StagedConfig(warps_m=2, warps_n=2, mt=4, nt=4, chunk_acc=exact, stages=4, group=8)
    return StagedConfig(warps_m=2, warps_n=2, mt=4, nt=8, stages=4, group=8)


def _configs(mode: str, cfg: StagedConfig | None, rows: int | None) -> list[StagedConfig]:
    """The configurations a projection builds: the one given, the default for a fixed row count, or without one both
    tile shapes (up to SMALL_M rows, and above), picked by M at run time."""
    if cfg is not None:
        return [cfg]
    return [default_config(mode, rows)] if rows is not None else [default_config(mode, SMALL_M), default_config(mode)]


def supported(mode: str | None, K: int, cols: int, cfg: StagedConfig | None = None, rows: int | None = None,
              xw_dtype: str = F32) -> bool:
    """A tensor-core mode, whole 32-column chunks, column pairs (8-byte stores), both buffers in 48 KB; split K only
    into fp32 XW (its blocks add into it)."""
    if mode not in MODES or K % KC or cols % 2:
        return False
    return all(c.smem_bytes(MODES[mode].storage) <= c.smem_limit and (K // KC) % c.split_k == 0 and not (c.stages and c.split_k > 1)
               and (c.split_k == 1 or xw_dtype == F32) for c in _configs(mode, cfg, rows))


def projection_staged(mode: str, K: int, cols: int, cfg: StagedConfig | None = None, rows: int | None = None,
                      xw_dtype: str = F32) -> tirx.PrimFunc:
    """PrimFunc(X [M, K], W [cols, K] in the mode's storage dtype, bias [cols] fp32, XW [M, cols] xw_dtype), M symbolic.
    rows: M where the model fixes it, for the default tile shape; else the kernel picks by M at run time (the small-M
    tiles up to SMALL_M rows, so a dynamic-batch model at batch 1 does not run its few rows on large tiles)."""
    configs = _configs(mode, cfg, rows)
    assert supported(mode, K, cols, cfg, rows, xw_dtype), (mode, K, cols, configs, xw_dtype)

    def body(X, W, bias, XW, M):
        if len(configs) == 1:
            gemm(mode, K, cols, configs[0], X, W, bias, XW, M)
        else:
            by_rows(M, *[lambda c=c: gemm(mode, K, cols, c, X, W, bias, XW, M) for c in configs])

    return projection_prim_func(f"projection_staged_{mode}", MODES[mode].storage, K, cols, (cols, K), body, xw_dtype)


def by_rows(M, small, large):
    """small() up to SMALL_M rows, large() above: the run-time pick of a GEMM's tiles where the model does not fix M."""
    with T.If(M <= i64(SMALL_M)):
        with T.Then():
            small()
        with T.Else():
            large()


def _fill_bias(XW, bias, M, cols: int):
    """XW[m, n] = bias[n]: the sums split_k blocks add into start from the bias."""
    each_element(M * i64(cols), lambda e: T.buffer_store(XW, bias[e % i64(cols)], [e // i64(cols), e % i64(cols)]))


def gemm(mode: str, K: int, cols: int, cfg: StagedConfig, X, W, bias, XW, M):
    """One configuration's launches: (with split_k) the bias fill, then the tiled GEMM, split_k blocks per tile."""
    BM, BN = cfg.block
    chunks = K // KC // cfg.split_k  # per block
    if cfg.stages:
        m_tiles, n_tiles = tirx.ceildiv(M, i64(BM)), i64(-(-cols // BN))
        with T.thread_binding(0, m_tiles * n_tiles, "blockIdx.x") as b:
            bx, by = raster(b, m_tiles, n_tiles, cfg.group)
            _tile_async(mode, K, cols, cfg, X, W, bias, XW, M, bx, by, chunks)
        return
    if cfg.split_k > 1:
        _fill_bias(XW, bias, M, cols)
    with T.thread_binding(0, tirx.ceildiv(M, i64(BM)), "blockIdx.x") as bx:
        with T.thread_binding(0, i64(-(-cols // BN)), "blockIdx.y") as by:
            if cfg.split_k == 1:
                _tile(mode, K, cols, cfg, X, W, bias, XW, M, bx, by, i64(0), chunks)
            else:
                with T.thread_binding(0, i64(cfg.split_k), "blockIdx.z") as bz:
                    _tile(mode, K, cols, cfg, X, W, bias, XW, M, bx, by, bz * i64(chunks), chunks)


def raster(b, m_tiles, n_tiles, group: int):
    """(M tile, column tile) of block b: without a group M fastest; with one, blocks walk `group` M tiles (fewer in the
    last group), then the next column tile, so a wave covers a compact patch of XW."""
    if not group:
        return b % m_tiles, b // m_tiles
    per_group = i64(group) * n_tiles
    first = b // per_group * i64(group)
    size = tirx.min(i64(group), m_tiles - first)
    inside = b % per_group
    return first + inside % size, inside // size


def _copies(cfg: StagedConfig, vec: int):
    """This thread's 16-byte copies of one chunk: (slot, rows, first shared row) for X's BM rows, then W's BN rows (a
    copy past the rows is skipped where the block's threads do not divide them evenly)."""
    BM, BN = cfg.block
    segs = KC // vec
    return [(i, rows, first) for rows, first in ((BM, 0), (BN, BM)) for i in range(-(-rows * segs // cfg.threads))]


def _each_copy(plan, cfg: StagedConfig, segs: int, tid, body):
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


def _multiply_chunk(tiles: WarpTiles, cfg: StagedConfig, sm, base, wm, wn, swizzle: bool):
    """The warp's fragments of one staged chunk (X rows, then W rows from shared row BM) and their mma's."""
    BM = cfg.block[0]
    tiles.load_a(lambda mt, half, v0, v: shared_element(tiles, sm, base, wm * i64(cfg.mt * 16) + i64(mt * 16 + 8 * half) + tiles.g,
                                                         v0, v, swizzle), True)
    tiles.load_b_parts(lambda nt, v0, v: shared_element(tiles, sm, base, i64(BM) + wn * i64(cfg.nt * 8) + i64(nt * 8) + tiles.g,
                                                         v0, v, swizzle), True)
    tiles.multiply()


def _tile_async(mode: str, K: int, cols: int, cfg: StagedConfig, X, W, bias, XW, M, bx, by, chunks: int):
    """One block's BM x BN tile of XW through a cp.async ring of cfg.stages chunk buffers: chunk ck + stages - 1 is
    copied while chunk ck is multiplied; one barrier per chunk (after it, the buffer the last chunk used is free)."""
    dtype = MODES[mode].storage
    BM, BN = cfg.block
    vec = WarpTiles.width(dtype)
    segs, size, swizzle = KC // vec, (BM + BN) * KC, dtype == F32
    plan = _copies(cfg, vec)
    with T.thread_binding(0, i64(cfg.warps_m * cfg.warps_n), "threadIdx.y") as wy:
        with T.thread_binding(0, i64(32), "threadIdx.x") as lane:
            tid = wy * i64(32) + lane
            mb, nb = bx * i64(BM), by * i64(BN)
            wm, wn = wy // i64(cfg.warps_n), wy % i64(cfg.warps_n)
            sm = shared_dyn((cfg.stages * size,), dtype)
            tiles = WarpTiles(lane, cfg.mt, cfg.nt, mode, dtype, dtype, 1, chunk_acc=cfg.chunk_acc)

            def issue(ck, buf):
                def copy(slot, row, seg, r):
                    k = ck * i64(KC) + seg * i64(vec)
                    src, off = (X, tirx.min(mb + r, M - i64(1)) * i64(K) + k) if plan[slot][2] == 0 else \
                        (W, tirx.min(nb + r, i64(cols - 1)) * i64(K) + k)
                    pos = tirx.bitwise_xor(seg, row % i64(2)) if swizzle else seg  # odd rows: halves swapped
                    T.evaluate(T.s_tir.cp_async_raw(dtype, sm.data, buf * i64(size) + row * i64(KC) + pos * i64(vec), src.data, off, 16))

                _each_copy(plan, cfg, segs, tid, copy)

            cp_async_ring(chunks, cfg.stages, issue, lambda ck, buf: _multiply_chunk(tiles, cfg, sm, buf * i64(size), wm, wn, swizzle))
            tiles.finish()
            store_xw(tiles, XW, bias, M, cols, mb + wm * i64(cfg.mt * 16), nb + wn * i64(cfg.nt * 8))


def _tile(mode: str, K: int, cols: int, cfg: StagedConfig, X, W, bias, XW, M, bx, by, k0, chunks: int):
    """One block: its BM x BN tile of XW over `chunks` chunks of K from chunk k0, through two register-staged buffers."""
    dtype = MODES[mode].storage
    BM, BN = cfg.block
    vec = WarpTiles.width(dtype)  # elements per 16-byte copy
    segs = KC // vec  # copies per 32-element row
    plan = _copies(cfg, vec)
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

            def fetch(ck):
                def copy(slot, row, seg, r):
                    k = (k0 + ck) * i64(KC) + seg * i64(vec)
                    with T.vectorized(0, i64(vec)) as v:
                        val = X[tirx.min(mb + r, M - i64(1)), k + v] if plan[slot][2] == 0 else \
                            W[tirx.min(nb + r, i64(cols - 1)), k + v]
                        T.buffer_store(staged, val, [i64(slot), v])

                _each_copy(plan, cfg, segs, tid, copy)

            def store(buf):
                def copy(slot, row, seg, r):
                    pos = tirx.bitwise_xor(seg, row % i64(2)) if swizzle else seg  # odd rows: halves swapped
                    with T.vectorized(0, i64(vec)) as v:
                        T.buffer_store(sm[buf], staged[i64(slot), v], [row * i64(KC) + pos * i64(vec) + v])

                _each_copy(plan, cfg, segs, tid, copy)

            def step(ck, cur: int):
                """Multiply chunk ck from buffer `cur` while chunk ck + 1 is fetched, then store that in the other
                buffer (the one every warp finished reading before the last barrier)."""
                fetch(tirx.min(ck + i64(1), i64(chunks - 1)))  # in flight during the mma's (the last one idle)
                _multiply_chunk(tiles, cfg, sm[cur], i64(0), wm, wn, swizzle)
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
