"""The input projection on Hopper's warpgroup tensor cores (wgmma, sm_90a): XW = X @ W^T + bias, fp32 out (a
half-precision layer's XW in its dtype). Modes: fp16/bf16; fp32 as TF32 (precision="tf32"); exact fp32 as f16x3 (X and
W as fp16 halves of rows scaled by powers of two, schedules.split_halves: hi*hi + hi*lo + lo*hi on fp16 wgmma's, the
epilogue unscaling), compile's default; and exact fp32 as 3xTF32 (each operand's TF32 high and low parts; at compile's
points W comes with its low parts beside it and each warpgroup splits its rows of X in registers, the rs form).
Choices and their numbers: docs/decisions.md (Kernels, CUDA projections).

Each warpgroup (4 warps) multiplies 64 rows of X by a block's BN rows of W with wgmma.mma_async m64nBNk16, both
operands read from shared memory through matrix descriptors, the fp32 accumulators in registers (BN / 2 per thread).
The block's threads fill a cp.async ring of `stages` buffers of k_chunks 32-column chunks each (mma_tiles.cp_async_ring),
one barrier per buffer; with `overlap` a buffer's wgmma's still run while the warpgroup moves on to the next barrier.
Blocks walk XW in raster groups. The epilogue adds bias and stores XW 1, 2 or 4 columns per instruction.

Shared layout per chunk: the block's 64 * warpgroups rows of X, then BN rows of W, each row the chunk's 32 columns
(64 bytes in half precision, 128 in fp32), in the swizzle wgmma reads (the canonical K-major SW64 / SW128 layout): a
row's 16-byte segments are permuted by XOR with the bits of its byte offset from 128 up, and each 8-row group is one
swizzle atom. A descriptor names the first row of a 64-row (A) or BN-row (B) block, 8-row groups one atom apart; each
further wgmma of the chunk starts 32 bytes in.

Accumulator i of a thread (warp w of its warpgroup, lane l) holds XW row 16w + l / 4 + 8 * (i % 4 >= 2)
and column 8 * (i // 4) + 2 * (l % 4) + i % 2 of the warpgroup's 64 x BN tile (PTX ISA, wgmma D fragments).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from tvm import te, tirx
from tvm.script.ir_builder import tirx as T

from .mma_tiles import KC, cp_async_ring, itemsize, to_tf32
from .projection_staged import raster
from .recurrent_common import block_sync, emit_if, i64, projection_prim_func, shared_dyn

# an accumulator register redefined in place (CUTLASS's warpgroup_fence_operand): reads of it after this cannot be moved
# above it, nor above the wgmma.wait_group before it, which NVVM otherwise does with an asynchronous wgmma's outputs
FENCE_OPERAND = "tvmrnn_fence_operand"
FENCE_OPERAND_SRC = f'__forceinline__ __device__ void {FENCE_OPERAND}(float& r) {{ asm volatile("" : "+f"(r) :: "memory"); }}'

# mode -> (storage dtype, PTX operand type, k per wgmma): each wgmma takes 32 bytes of every row's chunk
# (tf32x3: exact fp32 as three TF32 products, hi*hi + hi*lo + lo*hi, of each operand's TF32 high and low parts)
# (f16x3: exact fp32 as three fp16 products of each operand's scaled high and low halves, schedules.split_halves)
MODES = {"float16": ("float16", "f16", 16), "bfloat16": ("bfloat16", "bf16", 16), "tf32": ("float32", "tf32", 8),
         "tf32x3": ("float32", "tf32", 8), "f16x3": ("float16", "f16", 16)}
SWIZZLE = {64: 2, 128: 3}  # a chunk row's bytes -> tirx.cuda.wgmma_encode_matrix_descriptor's swizzle code (SW64, SW128)


def row_bytes(mode: str) -> int:
    """A 32-column chunk's row in shared memory: 64 bytes in half precision, 128 in fp32 (TF32)."""
    return KC * itemsize(MODES[mode][0])


@dataclass(frozen=True)
class WgmmaConfig:
    bn: int = 128  # W rows (XW columns) per block: the wgmma's N
    warpgroups: int = 2  # 64 X rows each
    stages: int = 4  # buffers of the cp.async ring
    group: int = 8  # M tiles per raster group (projection_staged.raster)
    k_chunks: int = 1  # 32-column chunks per buffer (wgmma's per barrier: 2 per chunk)
    # 1: a buffer's wgmma's still run while the warpgroup waits for the next buffer (wgmma.wait_group 1): the copies go
    # stages - 2 buffers ahead. In tf32x3 with one chunk a buffer: chunks in pairs, one's products running while the next
    # is split (no faster: compile's 3xTF32 points have none)
    overlap: int = 0
    # the epilogue's columns per load of bias and store of XW: 1, 2 (ld/st.global.v2: whole 32-byte sectors) or 4 (v4,
    # after a shuffle between lane pairs)
    store_cols: int = 1
    # tf32x3 only. 1: W comes with its TF32 low parts beside it (W [2 * cols, K], low_parts, folded at compile time),
    # and each warpgroup splits its own rows of X in registers: no parts buffers, no split pass through shared memory
    lo_w: int = 0

    @property
    def block(self) -> tuple[int, int]:
        return 64 * self.warpgroups, self.bn

    @property
    def threads(self) -> int:
        return 128 * self.warpgroups

    def ring_blocks(self, mode: str) -> tuple[int, int]:
        """The blocks of rows the ring holds per chunk from X (of BM rows) and from W (of BN): one each; with lo_w W's
        low parts too; in f16x3 both operands' high and low halves."""
        return (2, 2) if mode == "f16x3" else (1, 1 + self.lo_w)

    def chunk_rows(self, mode: str) -> int:
        """A chunk's rows in the ring: its X blocks, then its W blocks."""
        (xb, wb), (bm, bn) = self.ring_blocks(mode), self.block
        return xb * bm + wb * bn

    def smem_bytes(self, mode: str = "float16") -> int:
        """The ring; in tf32x3 split in shared memory also two buffers of each chunk's high and low parts."""
        parts = 4 if mode == "tf32x3" and not self.lo_w else 0
        return (self.stages + parts) * self.k_chunks * self.chunk_rows(mode) * row_bytes(mode)


# compile's points per mode, each the best measured on the H100 (docs/decisions.md). fp16/bf16: 128 x 256 blocks, two
# chunks a buffer, four buffers, overlapped, pairs of columns stored
DEFAULT = WgmmaConfig(bn=256, k_chunks=2, stages=4, overlap=1, store_cols=2)
# ... where 256 columns do not divide the gates: 128 x 128, four one-chunk buffers (two blocks an SM), four columns a store
HALF_128 = WgmmaConfig(bn=128, stages=4, overlap=1, store_cols=4)
# TF32: 128 x 256 with four one-chunk buffers, or 128 x 128 with six where 256 columns do not divide the gates
TF32 = {256: WgmmaConfig(bn=256, stages=4, overlap=1, store_cols=2), 128: WgmmaConfig(bn=128, stages=6, overlap=1, store_cols=2)}
# 3xTF32: X split in registers, W's low parts beside W, two chunks a buffer summed together, two buffers
TF32X3 = WgmmaConfig(bn=128, k_chunks=2, stages=2, store_cols=2, lo_w=1)
# ... and up to SMALL_K reduction columns 64 x 128 blocks of one warpgroup (two blocks share an SM, one's waits and
# epilogue beside the other's wgmma's)
TF32X3_SMALL_K = WgmmaConfig(bn=128, warpgroups=1, stages=2, store_cols=2, lo_w=1)
SMALL_K = 1600
# where 128 columns do not divide the gates (a GRU's 3 * 800): one warpgroup over 160 or 96 columns (lo_w's sums and
# accumulators take 160 registers at 160 columns: 213 in all, two blocks an SM), widest first
TF32X3_NARROW = {160: WgmmaConfig(bn=160, warpgroups=1, stages=2, store_cols=2, lo_w=1),
                 96: WgmmaConfig(bn=96, warpgroups=1, stages=2, store_cols=2, lo_w=1)}


# f16x3: both operands' high and low halves in the ring, one chunk sum per item (acc and sum: BN registers); one
# warpgroup over the widest of 160, 128, 96 columns that divides the gates, two chunks a buffer, two buffers; raster
# groups of 12 (160 columns) or 16 M tiles, so a wave reads fewer of W's rows from HBM (W's halves do not fit L2)
F16X3 = {bn: WgmmaConfig(bn=bn, warpgroups=1, k_chunks=2, stages=2, store_cols=2, group=12 if bn == 160 else 16) for bn in (160, 128, 96)}


def default_config(mode: str, cols: int, K: int | None = None) -> WgmmaConfig:
    """compile's point for the mode: the widest tile that divides the gates; in 3xTF32 by the reduction's length K."""
    if mode == "f16x3":
        return next((c for bn, c in F16X3.items() if cols % bn == 0), F16X3[128])
    if mode == "tf32x3":
        if cols % 128:
            return next((c for bn, c in TF32X3_NARROW.items() if cols % bn == 0), TF32X3)
        return TF32X3_SMALL_K if K is not None and K <= SMALL_K else TF32X3
    if mode == "tf32":
        return TF32[256 if cols % 256 == 0 else 128]
    return DEFAULT if cols % 256 == 0 else HALF_128


def supported(mode: str, K: int, cols: int, arch: str, cfg: WgmmaConfig | None = None) -> bool:
    """fp16/bf16 storage, or fp32 as TF32 (mode "tf32") or 3xTF32 (mode "tf32x3": at most 128 columns, overlap only with
    one chunk per buffer), on
    sm_90a; whole 32-column chunks and whole BN-column tiles (BN a multiple of 32 rows per warpgroup, so W's copies take
    whole passes of the block's threads); the ring in shared memory, with a buffer free to copy into. cfg None: the
    mode's default_config."""
    cfg = cfg or default_config(mode, cols, K)
    return (mode in MODES and arch == "sm_90a" and K % KC == 0 and cols % cfg.bn == 0 and cfg.bn % (32 * cfg.warpgroups) == 0
            and cfg.bn <= 256 and cfg.smem_bytes(mode) <= 227 * 1024 and cfg.store_cols in (1, 2, 4) and cfg.stages - (0 if mode == "tf32x3" else cfg.overlap) >= 2
            # chunk sums: twice the registers (with overlap, three times: one chunk per buffer)
            and not (mode == "tf32x3" and (cfg.bn > (160 if cfg.lo_w else 128) or (cfg.overlap and cfg.k_chunks > 1)))
            # W's low parts beside it: X split in registers, one chunk's products summed before the next chunk's
            and not (cfg.lo_w and (mode != "tf32x3" or cfg.overlap))
            # halves: one chunk sum beside the accumulators, copies by every thread (cp.async)
            and not (mode == "f16x3" and (cfg.bn > 160 or cfg.overlap)))


def low_parts(rows: int, K: int) -> tirx.PrimFunc:
    """PrimFunc(W [rows, K] fp32, W2 [2 * rows, K]): W's rows, then each element's remainder past the TF32 the tensor
    cores read of it (its top 19 bits), rounded to TF32: W as a lo_w GEMM takes it. compile emits it on the layer's
    W; where W is a constant (an initializer) FoldConstant evaluates it at compile time."""
    W = te.placeholder((rows, K), "float32", name="W")

    def at(i, k):
        x = W[tirx.indexmod(i, rows), k]
        read = tirx.reinterpret("float32", tirx.reinterpret("uint32", x) & tirx.const(0xFFFFE000, "uint32"))
        return tirx.Select(i < rows, x, to_tf32(x - read))

    return te.create_prim_func([W, te.compute((2 * rows, K), at, name="W2")])


def takes_halves(func: tirx.PrimFunc) -> bool:
    """Whether a projection PrimFunc takes its operands as scaled halves (f16x3: X, x_scale, W, w_scale, bias, XW)."""
    return len(func.params) == 6


def reads_low_parts(func: tirx.PrimFunc) -> bool:
    """Whether a projection PrimFunc (X, W, bias, XW) takes W with its low parts beside it (lo_w): W has twice XW's
    columns in rows. Read off the PrimFunc, so its callers follow what was built, not a guess at the point."""
    return not takes_halves(func) and int(func.params[1].shape[0]) == 2 * int(func.params[-1].shape[1])


@functools.cache
def _low_parts_on_cpu(rows: int, K: int):
    import tvm

    return tvm.compile(tvm.IRModule({"main": low_parts(rows, K)}), target="llvm")


def weights_for(func: tirx.PrimFunc, w):
    """W (numpy [cols, K]) as a projection PrimFunc (X, W, bias, XW) takes it, for callers that run the GEMM alone
    (tests, benchmarks): as it is, or where the GEMM reads W's low parts beside it, W2 by low_parts, run on the CPU
    (built once a shape)."""
    import numpy as np
    import tvm

    if not reads_low_parts(func):
        return w
    out = tvm.runtime.tensor(np.empty((2 * w.shape[0], w.shape[1]), "float32"))
    _low_parts_on_cpu(*w.shape)["main"](tvm.runtime.tensor(np.ascontiguousarray(w, "float32")), out)
    return out.numpy()


def operands_for(func: tirx.PrimFunc, x, w) -> list:
    """The GEMM's inputs before bias for numpy X [M, K] and W [cols, K]: (X, weights_for W), or for an f16x3 GEMM each
    one's scaled halves and scales (split_halves, on the CPU)."""
    if not takes_halves(func):
        return [x, weights_for(func, w)]
    from .split_halves import split_on_cpu

    return [*split_on_cpu(x), *split_on_cpu(w)]


def projection_wgmma(mode: str, K: int, cols: int, cfg: WgmmaConfig | None = None, rows: int | None = None,
                     xw_dtype: str = "float32") -> tirx.PrimFunc:
    """PrimFunc(X [M, K], W [cols, K] in the mode's storage dtype, bias [cols] fp32, XW [M, cols] xw_dtype (fp32, or
    in half precision the mode's dtype: the epilogue rounds the fp32 sums once), M symbolic. TF32
    reads fp32 operands' top 19 bits (wgmma truncates; projection_staged's TF32 rounds first: blog-a's GEMM was 5.2e-4
    off float64 here, 1.9e-4 there, the whole TF32 model 9.5e-4 and 6.7e-4 off cuDNN's fp32). Without cfg: the mode's
    default_config, and where the model does not fix M (rows None) projection_staged's small-row tiles up to its
    SMALL_M rows, picked by M at run time (a 128-row block tile leaves most SMs idle at batch 1)."""
    from .projection_staged import SMALL_M, by_rows, gemm
    from .projection_staged import default_config as staged_default

    point = cfg or default_config(mode, cols, K)
    halves = mode == "f16x3"  # its operands as split_halves makes them; no small-row branch (those GEMMs read fp32)
    assert supported(mode, K, cols, "sm_90a", point), (mode, K, cols, point)
    assert xw_dtype in ("float32", MODES[mode][0]), (mode, xw_dtype)
    BM, BN = point.block

    def warpgroup_tiles(X, W, bias, XW, M, scales=None):
        m_tiles, n_tiles = tirx.ceildiv(M, i64(BM)), i64(cols // BN)
        with T.thread_binding(0, m_tiles * n_tiles, "blockIdx.x") as b:
            bx, by = raster(b, m_tiles, n_tiles, point.group)
            with T.thread_binding(0, i64(point.threads), "threadIdx.x") as tid:
                _tile(mode, K, cols, point, X, W, bias, XW, M, bx * i64(BM), by * i64(BN), tid, point.chunk_rows(mode) * KC, K // KC,
                      scales)

    def body(X, W, bias, XW, M, scales=None):
        if cfg is not None or rows is not None or halves:
            warpgroup_tiles(X, W, bias, XW, M, scales)
        else:
            by_rows(M, lambda: gemm(mode, K, cols, staged_default(mode, SMALL_M), X, W, bias, XW, M),
                    lambda: warpgroup_tiles(X, W, bias, XW, M))

    w_shape = (cols, 2 * K) if halves else (point.ring_blocks(mode)[1] * cols, K)
    return projection_prim_func(f"projection_wgmma_{mode}", MODES[mode][0], K, cols, w_shape, body, xw_dtype, scaled=halves)


def _tile(mode, K, cols, cfg, X, W, bias, XW, M, mb, nb, tid, size, chunks, scales=None):
    """One block's BM x BN tile of XW: the ring's loop (cp.async copies, wgmma's per landed item), then the epilogue."""
    tile = _Tile(mode, K, cols, cfg, X, W, M, mb, nb, tid, size, chunks)
    tile.run()
    _epilogue(cfg, cols, bias, XW, M, mb, nb, tile.wg, tile.t, tile.acc, scales)


class _Tile:
    """A block's tile as it is emitted: its shapes, its buffers (allocated in this order when built) and the steps of
    the ring's loop, each a method: the copies (issue), what a thread does once its copies landed (landed), and the
    wgmma's of an item (consume, or consume_pipelined in tf32x3 with overlap)."""

    def __init__(self, mode, K, cols, cfg, X, W, M, mb, nb, tid, size, chunks):
        self.mode, self.K, self.cols, self.cfg, self.X, self.W, self.M, self.mb, self.nb = mode, K, cols, cfg, X, W, M, mb, nb
        self.tid, self.size, self.chunks = tid, size, chunks
        self.BM, self.BN = cfg.block
        self.KCH = cfg.k_chunks
        self.dtype, self.ptx, self.kstep = MODES[mode]
        self.split = mode == "tf32x3"
        self.halves = mode == "f16x3"  # X's and W's scaled high and low halves (split_halves), each a block of the ring's rows
        self.xb = cfg.ring_blocks(mode)[0]
        self.in_regs = self.split and bool(cfg.lo_w)  # X split in registers, W's low parts copied beside W (WgmmaConfig.lo_w)
        self.split_smem = self.split and not self.in_regs  # both operands split by the threads into the parts buffers
        rb = self.rb = row_bytes(mode)
        # per row: 16-byte copies; elements per copy, per wgmma
        self.segs, self.vec, self.per_k = rb // 16, 16 * KC // rb, 32 * KC // rb
        self.x_passes = self.xb * self.BM * self.segs // cfg.threads  # X's rows take whole passes of the block's threads
        self.wg, self.t = tid // i64(128), tid % i64(128)
        self._allocate()

    def _allocate(self):
        cfg, KCH, size, BM, BN, dtype = self.cfg, self.KCH, self.size, self.BM, self.BN, self.dtype
        self.sm = shared_dyn((cfg.stages * KCH * size,), dtype)
        # tf32x3: each landed chunk's high and low parts, in two buffers by item parity, high planes then low ones
        self.parts = shared_dyn((2 * 2 * KCH * size,), dtype) if self.split_smem else None
        self.acc = T.alloc_buffer((BN // 2,), "float32", scope="local")
        # tf32x3 with overlap: two chunk sums, one item's wgmma's running while the next item is split
        self.pipelined = self.split and bool(cfg.overlap)
        self.sums = [T.alloc_buffer((BN // 2,), "float32", scope="local") for _ in range(1 + self.pipelined)] \
            if self.split or self.halves else None
        # a chunk's own copies
        self.staged = T.alloc_buffer(((BM + BN) * KC // cfg.threads,), "float32", scope="local") if self.split_smem else None
        # in_regs: an item's A fragments of this thread's rows of X, per chunk TF32 high parts then low ones (4 registers
        # per k8): all loaded before the item's first wgmma, which would otherwise still read them while the next are written
        self.a_regs = T.alloc_buffer((KCH * 2 * 4 * (self.rb // 32),), "uint32", scope="local") if self.in_regs else None
        self.desc = T.alloc_buffer((2,), "uint64", scope="local")
        for i in range(BN // 2):
            T.buffer_store(self.acc, tirx.const(0, "float32"), [i])

    def run(self):
        """The ring's loop over the items (KCH chunks each), and the last wgmma's waited for."""
        items = -(-self.chunks // self.KCH)
        if self.pipelined:  # the wgmma's read the parts, not the ring: its buffers are free once split (lag 1)
            cp_async_ring(items, self.cfg.stages, self.issue, self.consume_pipelined, self.landed, lag=1, unroll=2)
            if items % 2:  # the last item, alone after the pairs
                T.evaluate(T.ptx.wgmma.wait_group.sync.aligned(0))
                self.add_sum(self.sums[0])
            return
        cp_async_ring(items, self.cfg.stages, self.issue, self.consume, self.landed, lag=1 + self.cfg.overlap)
        if self.cfg.overlap:  # the last item's wgmma's
            T.evaluate(T.ptx.wgmma.wait_group.sync.aligned(0))

    def each_plane(self, item, body):
        """body(j, ck) for the chunks of ring item `item` (a partial last item skips the chunks past K)."""
        for j in range(self.KCH):
            ck = item * i64(self.KCH) + i64(j)
            emit_if(ck < i64(self.chunks), lambda j=j, ck=ck: body(j, ck), self.chunks % self.KCH == 0)

    def at(self, buf, j):
        """Chunk j of the item in ring buffer buf."""
        return (buf * i64(self.KCH) + i64(j)) * i64(self.size)

    # ---- the copies
    def own_segments(self):
        """(pass, row in a plane, its 16-byte segment, the segment's place in the plane) of this thread's copies: segment
        seg of row r lands at seg XOR (bits 7.. of r's byte offset), the canonical SW64 / SW128 K-major atom."""
        cfg, segs, tid = self.cfg, self.segs, self.tid
        for i in range(cfg.chunk_rows(self.mode) * segs // cfg.threads):
            r = i64(i * cfg.threads // segs) + tid // i64(segs)
            seg = tid % i64(segs)
            swz = (r * i64(self.rb) // i64(128)) % i64(segs)
            yield i, r, seg, r * i64(KC) + tirx.bitwise_xor(seg, swz) * i64(self.vec)

    def source(self, i, r):
        """The operand and the element offset of the row that row r of a plane holds, copied in pass i (a pass's rows
        are in one block: BM and BN are whole passes). X's BM rows (past M the last one's), in f16x3 its high halves
        then its low ones, K columns on in X [M, 2K]; then W's BN rows: with lo_w then the same rows' low parts, cols
        rows on in W [2 * cols, K]; in f16x3 its high halves, then its low ones, K columns on in W [cols, 2K]."""
        K, BM, BN = self.K, self.BM, self.BN
        first, stride = i * self.cfg.threads // self.segs, i64(2 * K if self.halves else K)
        if i < self.x_passes:
            block = first // BM
            return self.X, tirx.min(self.mb + r - i64(block * BM), self.M - i64(1)) * stride + i64(block * K)
        block = (first - self.xb * BM) // BN
        row = self.nb + r - i64(self.xb * BM + block * BN)
        return self.W, row * stride + i64(block * K) if self.halves else (row + i64(block * self.cols)) * stride

    def issue(self, item, buf):
        """This thread's 16-byte copies of the item's chunks' X rows, then W rows (and their low parts), into buffer
        buf, in the swizzled layout."""
        def plane(j, ck):
            for i, r, seg, at in self.own_segments():
                operand, row_off = self.source(i, r)
                T.evaluate(T.s_tir.cp_async_raw(self.dtype, self.sm.data, self.at(buf, j) + at, operand.data,
                                                row_off + ck * i64(KC) + seg * i64(self.vec), 16))

        self.each_plane(item, plane)

    # ---- tf32x3 split in shared memory: each thread splits its own copies into the parts buffers
    def part_plane(self, item, j, low: int):
        """Where chunk j of `item`'s high (low=0) or low parts start in `parts`."""
        return ((item % i64(2) * i64(2) + i64(low)) * i64(self.KCH) + i64(j)) * i64(self.size)

    def read_own(self, item, j):
        """This thread's own copies of chunk j of the item (landed: no barrier needed) into registers."""
        vec = self.vec
        for n, (_, _, _, at) in enumerate(self.own_segments()):
            for v in range(vec):
                T.buffer_store(self.staged, self.sm[self.at(item % i64(self.cfg.stages), j) + at + i64(v)], [n * vec + v])

    def write_parts(self, item, j):
        """Those copies' TF32 high and low parts, to where this item's wgmma's read them."""
        vec = self.vec
        for n, (_, _, _, at) in enumerate(self.own_segments()):
            for v in range(vec):
                x = self.staged[n * vec + v]
                T.buffer_store(self.parts, to_tf32(x), [self.part_plane(item, j, 0) + at + i64(v)])
                T.buffer_store(self.parts, to_tf32(x - to_tf32(x)), [self.part_plane(item, j, 1) + at + i64(v)])

    @staticmethod
    def proxy_fence():
        # the chunk was written through the generic proxy (cp.async, the parts) and is read through the async proxy (wgmma)
        T.evaluate(T.ptx.fence.proxy.async_.shared__cta())

    def landed(self, item):
        if self.pipelined:  # only the reads: the parts are written after the ring's barrier (consume)
            self.read_own(item, 0)
            return
        if self.split_smem:  # this thread's own copies of the item, split into TF32 high and low parts
            def plane(j, ck):
                # all reads, then all writes: the shared.dyn buffers are merged into one before TVM plans barriers, and
                # it wants one between a read and a later write of that one buffer. Ours, here, once (its planner put
                # one after every store, and cannot put one inside by_rows' condition where M is not fixed)
                self.read_own(item, j)
                block_sync()
                self.write_parts(item, j)

            self.each_plane(item, plane)
        self.proxy_fence()

    # ---- the wgmma's
    def wgmma(self, into, buf, a_at, b_at, accumulate):
        rb, desc, BN, ptx = self.rb, self.desc, self.BN, self.ptx
        for d, at in enumerate((a_at, b_at)):
            T.evaluate(T.cuda.wgmma.encode_matrix_descriptor(desc.access_ptr("w", offset=d), buf.access_ptr("r", offset=at),
                                                             1, 8 * rb // 16, SWIZZLE[rb]))
        transposes = (0, 0) if ptx != "tf32" else ()  # K-major A and B; TF32 has no transpose operands
        T.evaluate(T.ptx[f"wgmma.mma_async.sync.aligned.m64n{BN}k{self.kstep}.f32.{ptx}.{ptx}"](
            *[into[i] for i in range(BN // 2)], desc[0], desc[1], tirx.const(accumulate, "bool"), 1, 1, *transposes))

    def load_a(self, base, j):
        """in_regs: this thread's A fragments of the item's chunk j at `base` (its warp's 16 rows of the warpgroup's
        64, in PTX's tf32 A layout: registers 0..3 hold (row g, k t), (g + 8, t), (g, t + 4), (g + 8, t + 4) of each k8,
        g = lane / 4, t = lane % 4), read from the ring's swizzled X rows and split: high = X rounded to TF32, low =
        the rest rounded. Conflict-free: a load's 8 rows g sit in 8 different 16-byte segments of the swizzle."""
        rb, t, segs, vec = self.rb, self.t, self.segs, self.vec
        lane = t % i64(32)
        for kk in range(rb // 32):
            for slot in range(4):
                r = self.wg * i64(64) + t // i64(32) * i64(16) + lane // i64(4) + i64(8 * (slot % 2))
                seg = i64(kk * self.per_k // vec + slot // 2)  # k = kk * 8 + t + 4 * (slot // 2): segment, then t in it
                x = self.sm[base + r * i64(KC) + tirx.bitwise_xor(seg, r % i64(segs)) * i64(vec) + lane % i64(4)]
                at = j * 8 * (rb // 32) + kk * 4 + slot
                T.buffer_store(self.a_regs, tirx.reinterpret("uint32", to_tf32(x)), [at])
                T.buffer_store(self.a_regs, tirx.reinterpret("uint32", to_tf32(x - to_tf32(x))), [at + 4 * (rb // 32)])

    def register_products(self, into, base, j):
        """in_regs: chunk j's three products per k8 into `into` (started at zero by the item's first): A's high and low
        parts from registers, W's rows (the tensor cores read their top 19 bits: its truncated TF32) and its low parts
        from the ring: hi*W, hi*W_lo, lo*W."""
        rb, BM, BN, desc = self.rb, self.BM, self.BN, self.desc
        for kk in range(rb // 32):
            for d, rows in enumerate((BM, BM + BN)):  # W's rows, its low parts' rows
                T.evaluate(T.cuda.wgmma.encode_matrix_descriptor(desc.access_ptr("w", offset=d),
                                                                 self.sm.access_ptr("r", offset=base + i64(rows * KC + kk * self.per_k)),
                                                                 1, 8 * rb // 16, SWIZZLE[rb]))
            for n, (part, d) in enumerate(((0, 0), (0, 1), (1, 0))):
                regs = [self.a_regs[(2 * j + part) * 4 * (rb // 32) + kk * 4 + slot] for slot in range(4)]
                T.evaluate(T.ptx[f"wgmma.mma_async.sync.aligned.m64n{BN}k{self.kstep}.f32.tf32.tf32"](
                    *[into[i] for i in range(BN // 2)], *regs, desc[d], tirx.const(j > 0 or kk > 0 or n > 0, "bool"), 1, 1))

    def split_products(self, into, item, j):
        """The chunk's three products (hi*hi, hi*lo, lo*hi per k8) into a sum of its own, started at zero by its first
        wgmma and added in fp32 after: the tensor cores' accumulation truncates (over K = 2560 one sum drifted 1.3e-5)."""
        hi, lo = self.part_plane(item, j, 0), self.part_plane(item, j, 1)
        for kk in range(self.rb // 32):
            a, b = self.wg * i64(64 * KC) + i64(kk * self.per_k), i64(self.BM * KC + kk * self.per_k)
            for n, (pa, pb) in enumerate(((hi, hi), (hi, lo), (lo, hi))):
                self.wgmma(into, self.parts, pa + a, pb + b, kk > 0 or n > 0)
        T.evaluate(T.ptx.wgmma.commit_group.sync.aligned())

    def add_sum(self, chunk_sum):
        for i in range(self.BN // 2):
            T.buffer_store(self.acc, self.acc[i] + chunk_sum[i], [i])

    def fence_operands(self, regs):
        for i in range(self.BN // 2):
            T.evaluate(T.cuda.func_call(FENCE_OPERAND, regs[i], source_code=FENCE_OPERAND_SRC))

    def consume_pipelined(self, item, _buf, parity):
        """Items in pairs: the first one's products run while the second lands and is split, and are waited for (and
        their sum added) after the second one's are issued; both are done before the pair ends. (Groups in flight
        across the loop's back edge, with the other sum read meanwhile, made ptxas serialize every wgmma: C7514.)
        After the ring's barrier the wgmma's of two items back are done everywhere, so this item's parts' buffer is
        free: write the parts, a barrier, then its products into the sum of its parity. NVVM moves register reads
        and writes across the asm that waits on the wgmma's, so each sum is fenced in place around them, and the
        running sum after the adds (CUTLASS's warpgroup_fence_operand)."""
        sums = self.sums
        self.write_parts(item, 0)
        self.proxy_fence()
        block_sync()
        self.fence_operands(sums[parity])
        T.evaluate(T.ptx.wgmma.fence.sync.aligned())
        self.split_products(sums[parity], item, 0)
        self.fence_operands(sums[parity])
        if parity == 1:
            for left, done in ((1, 0), (0, 1)):
                T.evaluate(T.ptx.wgmma.wait_group.sync.aligned(left))
                self.fence_operands(sums[done])
                self.add_sum(sums[done])
                self.fence_operands(self.acc)

    def halves_products(self, base, j):
        """f16x3: chunk j's three products per k16 into the item's sum, from the ring's blocks: X's high halves times
        W's high and low ones, X's low halves times W's high ones (the sum started at zero by the item's first)."""
        BM, BN, per_k = self.BM, self.BN, self.per_k
        for kk in range(self.rb // 32):
            for n, (xh, wh) in enumerate(((0, 0), (0, 1), (1, 0))):
                self.wgmma(self.sums[0], self.sm, base + self.wg * i64(64 * KC) + i64(xh * BM * KC + kk * per_k),
                           base + i64((self.xb * BM + wh * BN) * KC + kk * per_k), j > 0 or kk > 0 or n > 0)

    def consume(self, item, buf):
        T.evaluate(T.ptx.wgmma.fence.sync.aligned())
        if self.halves:  # as in 3xTF32, the item's products into a sum of their own, added in fp32
            self.each_plane(item, lambda j, ck: self.halves_products(self.at(buf, j), j))
            self._sum_item()
            return
        if self.in_regs:  # the item's products into one sum (64 columns of K at most in the tensor cores' accumulation)
            self.each_plane(item, lambda j, ck: self.load_a(self.at(buf, j), j))
            T.evaluate(T.ptx.wgmma.fence.sync.aligned())  # A's registers were written: before the wgmma's read them
            self.each_plane(item, lambda j, ck: self.register_products(self.sums[0], self.at(buf, j), j))
            self._sum_item()
            return
        self.each_plane(item, lambda j, ck: self.consume_chunk(item, buf, j))
        T.evaluate(T.ptx.wgmma.commit_group.sync.aligned())
        # before the barrier that frees a buffer for the next copies: this item's wgmma's (or, overlapping, the last one's)
        T.evaluate(T.ptx.wgmma.wait_group.sync.aligned(self.cfg.overlap))

    def _sum_item(self):
        """The item's products, issued into sums[0]: committed, waited for and added into the accumulators in fp32."""
        T.evaluate(T.ptx.wgmma.commit_group.sync.aligned())
        T.evaluate(T.ptx.wgmma.wait_group.sync.aligned(0))
        self.add_sum(self.sums[0])

    def consume_chunk(self, item, buf, j):
        """One chunk's wgmma's straight into the accumulators, or in tf32x3 split in shared memory its parts' products
        into a sum of its own."""
        base, BM, per_k = self.at(buf, j), self.BM, self.per_k
        if not self.split:
            for kk in range(self.rb // 32):
                self.wgmma(self.acc, self.sm, base + self.wg * i64(64 * KC) + i64(kk * per_k), base + i64(BM * KC + kk * per_k), True)
            return
        self.split_products(self.sums[0], item, j)
        T.evaluate(T.ptx.wgmma.wait_group.sync.aligned(0))
        self.add_sum(self.sums[0])
        T.evaluate(T.ptx.wgmma.fence.sync.aligned())  # the sum's registers were read: before the next wgmma writes them


# the epilogue's stores of 2 and 4 columns (store_cols), bias added on the way. Four: lanes l and l ^ 1 hold columns
# c, c + 1 (c = 2 * (l % 4)) of two 8-column groups; each sends the other one pair, so the even lane stores columns
# c..c + 3 of the first group and the odd one c + 6..c + 9 (8 + c - 2..) of the second, each 16-byte aligned (8 in half
# precision). The shuffle comes before the row's guard, which both lanes of a pair share (the same row). Per XW dtype:
# the vector a pair of columns packs into, how it packs two fp32 sums, and the 4-column store of two such pairs
_HALF_QUAD = ("uint2", "make_uint2(*reinterpret_cast<unsigned*>(&p), *reinterpret_cast<unsigned*>(&q))")  # two 4-byte pairs
_PACK = {"float32": ("float", "float2", "make_float2", "float4", "make_float4(p.x, p.y, q.x, q.y)"),
         "float16": ("half", "__half2", "__floats2half2_rn", *_HALF_QUAD),
         "bfloat16": ("nv_bfloat16", "__nv_bfloat162", "__floats2bfloat162_rn", *_HALF_QUAD)}


def store_call(cols: int, xw_dtype: str) -> tuple[str, str]:
    """The epilogue's store of `cols` (2 or 4) columns into XW of xw_dtype: the device function's name and source."""
    elem, pair, pack, quad, both = _PACK[xw_dtype]
    name = f"tvmrnn_store{cols}_{xw_dtype}"
    if cols == 2:
        return name, (f"__forceinline__ __device__ void {name}(bool keep, {elem}* out, const float* bias, float a0, float a1) {{ if (keep) {{ "
                      f"float2 c = *reinterpret_cast<const float2*>(bias); *reinterpret_cast<{pair}*>(out) = {pack}(a0 + c.x, a1 + c.y); }} }}")
    return name, (f"__forceinline__ __device__ void {name}(bool keep, {elem}* out, const float* bias, float a0, float a1, float b0, float b1) {{ "
                  "bool odd = threadIdx.x & 1; float r0 = __shfl_xor_sync(0xffffffffu, odd ? a0 : b0, 1); "
                  "float r1 = __shfl_xor_sync(0xffffffffu, odd ? a1 : b1, 1); if (!keep) return; int at = odd ? 6 : 0; "
                  "float4 c = *reinterpret_cast<const float4*>(bias + at); float4 v = odd ? make_float4(r0, r1, b0, b1) : make_float4(a0, a1, r0, r1); "
                  f"{pair} p = {pack}(v.x + c.x, v.y + c.y), q = {pack}(v.z + c.z, v.w + c.w); "
                  f"*reinterpret_cast<{quad}*>(out + at) = {both}; }}")


def _epilogue(cfg, cols, bias, XW, M, mb, nb, wg, t, acc, scales=None):
    """The accumulators plus bias into XW, rows past M skipped, store_cols columns per load and store (n is even, and
    XW's rows hold a multiple of 8 columns: whole 8- and 16-byte pieces). With scales (f16x3: X's rows' and W's rows'
    powers of two) each sum divided by its row's and column's first (exact: reciprocals of powers of two)."""
    def value(i, m, n):
        """Accumulator i of row m, column n."""
        if scales is None:
            return acc[i]
        x_scale, w_scale = scales
        one = tirx.const(1, "float32")
        return acc[i] * (one / x_scale[tirx.min(m, M - i64(1))]) * (one / w_scale[n])

    w, lane = t // i64(32), t % i64(32)
    step = max(2, 2 * cfg.store_cols)  # accumulators per store call: 4 columns take two 8-column groups' pairs
    name, source = store_call(cfg.store_cols, str(XW.dtype)) if cfg.store_cols > 1 else (None, None)
    for i0 in range(0, cfg.bn // 2, step):
        for i in range(i0, i0 + min(step, 4), 2):  # the two rows' column pairs (i % 4: 0 row r, 2 row r + 8)
            m = mb + wg * i64(64) + w * i64(16) + lane // i64(4) + i64(8 * (i % 4 >= 2))
            n = nb + i64(8 * (i // 4)) + i64(2) * (lane % i64(4))
            if cfg.store_cols == 1:
                with T.If(m < M):
                    with T.Then():
                        for v in range(2):
                            T.buffer_store(XW, (value(i + v, m, n + i64(v)) + bias[n + i64(v)]).astype(XW.dtype), [m, n + i64(v)])
                continue
            # accumulator i + v: column n + v % 2 of its 8-column group, the next group's at v = 4, 5
            values = [value(i + v, m, n + i64(8 * (v // 4) + v % 2)) for v in ((0, 1) if cfg.store_cols == 2 else (0, 1, 4, 5))]
            T.evaluate(T.cuda.func_call(name, m < M, XW.access_ptr("w", offset=tirx.min(m, M - i64(1)) * i64(cols) + n),
                                        bias.access_ptr("r", offset=n), *values, source_code=source))
