"""A warp's grid of tensor-core tiles (mma.sync, fp32 accumulators), fed straight from memory.

Both tensor-core kernels are built from it: the recurrent step (recurrent_mma: A = gate rows of R,
B = batch rows of h) and the input projection (projection_mma: A = rows of X, B = rows of W).
Two instruction shapes, three kinds of math (MODES):
    fp16 / bf16   m16n8k16, operands in half precision (fp32 h is rounded to it)
    tf32          m16n8k8, fp32 operands rounded to TF32 (10-bit mantissa): the opt-in precision="tf32"
    tf32x3        m16n8k8 three times: each fp32 operand split into a TF32 high part and a TF32 low part
                  (x - high), and a*b = al*bh + ah*bl + ah*bh; the dropped al*bl is 2^-22 relative,
                  so the result is within a few times SIMT fp32's error (exact fp32 layers on tensor cores)
    f16x3         m16n8k16 three times on fp16 high and low halves of operands scaled by powers of two
                  (schedules.split_halves): the same three products and the same 22 bits, in half the mma's.
                  Both operands come already split (each half loaded apart: a_at's and b_at's `part`); the
                  sums carry both scales, which the caller divides out

Per 32-column chunk of the reduction a lane loads 8 consecutive k of each of its A rows (g and g+8
of every m-tile, g = lane / 4) and of its B row (g of every n-tile): 16-byte loads. Those 8 k are
the fragment columns of several mma's: {2t, 2t+1, 2t+8, 2t+9} (t = lane % 4) of two m16n8k16, or
{t, t+4} of four m16n8k8. The order of k inside an mma is free as long as A and B agree, so operands
need no shuffles, ldmatrix or shared-memory staging. Accumulator i of tile (mt, nt) holds row
mt*16 + g + 8*(i // 2) and column nt*8 + 2t + i % 2 of the warp's tile.
"""

from __future__ import annotations

from dataclasses import dataclass

from tvm import tirx
from tvm.backend.cuda.op import ptx_legacy_mma
from tvm.script.ir_builder import tirx as T

from .recurrent_common import block_sync, emit_if, i64

F32 = "float32"
KC = 32  # reduction columns per chunk: 8 consecutive k per lane


def itemsize(dtype: str) -> int:
    """Bytes per element of our kernels' storage dtypes: fp32, or half precision (fp16/bf16)."""
    return 4 if dtype == F32 else 2


@dataclass(frozen=True)
class Mode:
    """One mma.sync instruction shape: operand storage, k each lane holds per mma, and which (row half, k of those)
    fills each A-fragment register (PTX ISA fragment layouts)."""

    storage: str  # dtype the fragments hold
    ptx: str  # PTX operand type
    shape: str
    per_lane: int  # k of one row per lane per mma
    a_slots: tuple
    split: bool = False  # 3xTF32: high and low parts, three mma's per tile

    @property
    def mmas(self) -> int:
        return 8 // self.per_lane  # per chunk


_TF32_SLOTS = ((0, 0), (1, 0), (0, 1), (1, 1))  # a0..a3: (g, t), (g+8, t), (g, t+4), (g+8, t+4)
_HALF_SLOTS = ((0, 0), (0, 1), (1, 0), (1, 1), (0, 2), (0, 3), (1, 2), (1, 3))  # rows g, g+8; k pairs {2t,2t+1}, {2t+8,2t+9}
MODES = {
    "float16": Mode("float16", "fp16", "m16n8k16", 4, _HALF_SLOTS),
    "bfloat16": Mode("bfloat16", "bf16", "m16n8k16", 4, _HALF_SLOTS),
    "tf32": Mode(F32, "tf32", "m16n8k8", 2, _TF32_SLOTS),
    "tf32x3": Mode(F32, "tf32", "m16n8k8", 2, _TF32_SLOTS, split=True),
    "f16x3": Mode("float16", "fp16", "m16n8k16", 4, _HALF_SLOTS, split=True),
}


def to_tf32(x):
    """Round fp32 to TF32's 10-bit mantissa (to nearest, ties away), as cvt.rna.tf32.f32 does; the tensor cores would
    otherwise drop the low 13 bits."""
    bits = tirx.reinterpret("uint32", x)
    return tirx.reinterpret(F32, (bits + tirx.const(0x1000, "uint32")) & tirx.const(0xFFFFE000, "uint32"))


class WarpTiles:
    """MT x NT accumulator tiles of one warp, and the registers one chunk of A and B pass through.
    mode: a MODES key; a_dtype / b_dtype: the dtypes A and B are loaded in (fp32 h is converted)."""

    def __init__(self, lane, mt: int, nt: int, mode: str, a_dtype: str, b_dtype: str, depth: int = 1, split_acc: bool = False,
                 chunk_acc: bool = False, ra=None):
        self.MT, self.NT, self.mode, self.a_dtype, self.b_dtype = mt, nt, MODES[mode], a_dtype, b_dtype
        m = self.mode
        self.halves = mode == "f16x3"  # both operands' halves loaded apart
        assert not self.halves or a_dtype == b_dtype == "float16", (a_dtype, b_dtype)
        self.g, self.t = lane // i64(4), lane % i64(4)
        # `depth` chunks staged at once: their loads are in flight together, so a warp waits on memory once per
        # `depth` chunks (the kernels are latency-bound: a chunk's mma's take far less than an L2 or HBM round trip)
        # A: chunk, tile, row half, 8 k; ra given: another WarpTiles' A, staged once for every use (load_a not called)
        self.ra = T.alloc_buffer((depth, mt, 2, 8), a_dtype, scope="local") if ra is None else ra
        self.ra_lo = T.alloc_buffer((depth, mt, 2, 8), a_dtype, scope="local") if self.halves else None  # A's low halves
        self.rb = T.alloc_buffer((depth, nt, 8), b_dtype, scope="local")  # B: chunk, tile, 8 k
        self.rb_lo = T.alloc_buffer((depth, nt, 8), b_dtype, scope="local") if self.halves else None  # B's low halves
        self.fa = T.alloc_buffer((mt, m.mmas, 2 * m.per_lane), m.storage, scope="local")  # A fragments: tile, mma, registers
        self.fb = T.alloc_buffer((nt, m.mmas, m.per_lane), m.storage, scope="local")  # B fragments
        if m.split:  # the low parts (x - high) of both operands
            self.fa_lo = T.alloc_buffer((mt, m.mmas, 2 * m.per_lane), m.storage, scope="local")
            self.fb_lo = T.alloc_buffer((nt, m.mmas, m.per_lane), m.storage, scope="local")
        self.c = T.alloc_buffer((mt, nt, 4), F32, scope="local")
        # 3xTF32 with split_acc: the two cross products go to accumulators of their own, so each tile runs two
        # dependent mma chains instead of one three times as long; finish() adds them in
        self.c_lo = T.alloc_buffer((mt, nt, 4), F32, scope="local") if m.split and split_acc else None
        # chunk_acc: each chunk's mma's run into a zeroed accumulator of their own, added into c with an fp32 add. The
        # tensor cores add into their accumulator without rounding to nearest (their alignment drops low bits), and
        # over a long reduction (K = 2560) that error grows with K; a chunk's 32 k keep it to one chunk's partial sum.
        # With split_acc too, only the large products go chunk by chunk: the cross products are 2^-11 of them, and so
        # is what their accumulator's truncation costs
        self.c_chunk = T.alloc_buffer((mt, nt, 4), F32, scope="local") if chunk_acc else None
        for idx in self.accumulators():
            T.buffer_store(self.c, tirx.const(0.0, F32), idx)
            if self.c_lo is not None:
                T.buffer_store(self.c_lo, tirx.const(0.0, F32), idx)

    def accumulators(self):
        return [[i64(m), i64(n), i64(i)] for m in range(self.MT) for n in range(self.NT) for i in range(4)]

    def row(self, idx):
        """The warp-tile row (A's row) accumulator idx holds."""
        return i64(int(idx[0]) * 16 + 8 * (int(idx[2]) // 2)) + self.g

    def col(self, idx):
        """The warp-tile column (B's row) accumulator idx holds."""
        return i64(int(idx[1]) * 8 + int(idx[2]) % 2) + self.t * i64(2)

    def load(self, a_at, b_at, vector: bool, slot: int = 0):
        """Stage one chunk in staging slot `slot`: a_at(mt, half, k) / b_at(nt, k) give A's row g + 8*half of m-tile mt
        and B's row g of n-tile nt at k = 8t + (0..7) of the chunk, or None for an A row that is padding (zeros)."""
        k0 = self.t * i64(8)
        self.load_a(lambda mt, half, v0, v: a_at(mt, half, k0 + i64(v0) + v), vector, slot)
        self.load_b(b_at, vector, slot)

    @staticmethod
    def width(dtype) -> int:
        return 16 // itemsize(dtype)  # elements per 16-byte load (float4 is the widest fp32 vector)

    def load_a(self, a_at, vector: bool, slot: int = 0):
        """Stage A's part of one chunk: a_at(mt, half, v0, v) gives element v0 + v (v0 a multiple of width(a_dtype),
        v the vector lane) of the lane's 8 k of row g + 8*half of m-tile mt, or None for a padding row (zeros); in
        f16x3 a_at(mt, half, v0, v, part) gives its high (part 0) or low (part 1) half."""
        lanes = T.vectorized if vector else T.unroll  # CUDA has no half8 select: a guarded tail loads scalars
        w = self.width(self.a_dtype)
        for part, ra in enumerate((self.ra, self.ra_lo) if self.halves else (self.ra,)):
            for mt in range(self.MT):
                for half in range(2):
                    for v0 in range(0, 8, w):
                        with lanes(0, i64(w)) as v:
                            val = a_at(mt, half, v0, v, *([part] if self.halves else []))
                            T.buffer_store(ra, tirx.const(0, self.a_dtype) if val is None else val, [i64(slot), i64(mt), i64(half), i64(v0) + v])

    def load_b(self, b_at, vector: bool, slot: int = 0):
        """Stage B's part of one chunk: b_at(nt, k), k = 8t + (0..7) of the chunk (in f16x3 b_at(nt, k, part))."""
        k0 = self.t * i64(8)
        self.load_b_parts(lambda nt, v0, v, *part: b_at(nt, k0 + i64(v0) + v, *part), vector, slot)

    def load_b_parts(self, b_at, vector: bool, slot: int = 0):
        """Stage B's part of one chunk: b_at(nt, v0, v) gives element v0 + v (v0 a multiple of width(b_dtype), v the
        vector lane) of the lane's 8 k of row g of n-tile nt (the form a swizzled shared layout needs, as load_a's);
        in f16x3 b_at(nt, v0, v, part), its high (0) or low (1) half."""
        lanes = T.vectorized if vector else T.unroll
        w = self.width(self.b_dtype)
        for part, rb in enumerate((self.rb, self.rb_lo) if self.halves else (self.rb,)):
            for nt in range(self.NT):
                for v0 in range(0, 8, w):
                    with lanes(0, i64(w)) as v:
                        T.buffer_store(rb, b_at(nt, v0, v, *([part] if self.halves else [])), [i64(slot), i64(nt), i64(v0) + v])

    def multiply(self, slot: int = 0):
        """The mma's of the chunk in staging slot `slot` (per_lane of each lane's 8 k each), on every tile."""
        m = self.mode
        convert = to_tf32 if m.ptx == "tf32" else (lambda x: x.astype(m.storage))

        def fragment(hi, lo, x, idx):
            T.buffer_store(hi, convert(x), idx)
            if m.split:  # x - high is exact in fp32; its TF32 rounding leaves 2^-22 of x
                T.buffer_store(lo, convert(x - hi[tuple(idx)]), idx)

        for j in range(m.mmas):
            for mt in range(self.MT):
                for i, (half, kk) in enumerate(m.a_slots):
                    at = [i64(slot), i64(mt), i64(half), i64(j * m.per_lane + kk)]
                    if self.halves:  # A's halves as loaded
                        T.buffer_store(self.fa, self.ra[tuple(at)], [i64(mt), i64(j), i64(i)])
                        T.buffer_store(self.fa_lo, self.ra_lo[tuple(at)], [i64(mt), i64(j), i64(i)])
                    else:
                        fragment(self.fa, getattr(self, "fa_lo", None), self.ra[tuple(at)], [i64(mt), i64(j), i64(i)])
            for nt in range(self.NT):
                for i in range(m.per_lane):
                    at, idx = (i64(slot), i64(nt), i64(j * m.per_lane + i)), [i64(nt), i64(j), i64(i)]
                    if self.halves:  # B's halves as loaded
                        T.buffer_store(self.fb, self.rb[at], idx)
                        T.buffer_store(self.fb_lo, self.rb_lo[at], idx)
                    else:
                        fragment(self.fb, getattr(self, "fb_lo", None), self.rb[at], idx)
        # 3xTF32: the small products first, so the large one does not swamp them in the accumulator
        c = self.c if self.c_chunk is None else self.c_chunk
        if self.c_chunk is not None:
            for idx in self.accumulators():
                T.buffer_store(c, tirx.const(0.0, F32), idx)
        lo = c if self.c_lo is None else self.c_lo
        pairs = [(self.fa_lo, self.fb, lo), (self.fa, self.fb_lo, lo), (self.fa, self.fb, c)] if m.split else [(self.fa, self.fb, c)]
        for j in range(m.mmas):
            for mt in range(self.MT):
                for nt in range(self.NT):
                    for fa, fb, acc in pairs:
                        T.evaluate(ptx_legacy_mma(m.shape, "row", "col", m.ptx, m.ptx, "fp32",
                                                  fa.data, i64((mt * m.mmas + j) * 2 * m.per_lane),
                                                  fb.data, i64((nt * m.mmas + j) * m.per_lane),
                                                  acc.data, i64((mt * self.NT + nt) * 4), False))
        if self.c_chunk is not None:
            for idx in self.accumulators():
                T.buffer_store(self.c, self.c[tuple(idx)] + c[tuple(idx)], idx)

    def finish(self):
        """After the last chunk: the cross-product accumulators (split_acc) added into c."""
        if self.c_lo is not None:
            for idx in self.accumulators():
                T.buffer_store(self.c, self.c[tuple(idx)] + self.c_lo[tuple(idx)], idx)


def shared_element(tiles: WarpTiles, sm, base, row, v0, v, swizzle: bool):
    """Element v0 + v of the lane's 8 k (8t..8t+7) of row `row` (row % 2 == g % 2) of a 32-column chunk in shared memory
    at `base`, rows of KC elements one after another; swizzle (fp32): odd rows hold their two 16-byte halves of each
    32-byte span swapped, so a quarter-warp's loads hit distinct banks."""
    flip = (tiles.g % i64(2)) * i64(4)  # v0 XOR flip, spelled affine so the load stays one vector
    col = tiles.t * i64(8) + ((flip if v0 == 0 else i64(4) - flip) if swizzle else i64(v0))
    return sm[base + row * i64(KC) + col + v]


def cp_async_ring(count: int, stages: int, issue, consume, landed=None, lag: int = 1, unroll: int = 1):
    """A ring of `stages` shared buffers filled with cp.async: issue(i, buf) emits this thread's copies of item i into
    buffer buf, consume(i, buf) the work on it; item i + stages - lag is copied while item i is consumed. One barrier per
    item: after it every thread's copies of item i have landed and the buffer item i - lag used is free (lag 2: the
    consumer's reads of item i - 1 may still be in flight, as an asynchronous wgmma's are). landed(i): what each thread
    emits between its copies of item i landing and that barrier (work on its own copies; a proxy fence where the async
    proxy reads). unroll > 1: the loop body holds that many items, consume(i, buf, u) told each one's place u in it (a
    compile-time i % unroll), the items past the last whole body after the loop."""
    ahead = stages - lag
    for s in range(min(ahead, count)):
        issue(i64(s), i64(s))
        T.evaluate(T.ptx.cp.async_.commit_group())

    def item(i, u):
        # item i's group and those before it done: ahead - 1 younger ones may still fly (a group is committed every
        # iteration, empty past the end); with every item in the prologue, all of them
        T.evaluate(T.ptx.cp.async_.wait_group(ahead - 1 if ahead < count else 0))
        if landed is not None:
            landed(i)
        block_sync()
        if ahead < count:
            nxt = i + i64(ahead)
            emit_if(nxt < i64(count), lambda: issue(nxt, nxt % i64(stages)), False)
            T.evaluate(T.ptx.cp.async_.commit_group())
        consume(i, i % i64(stages), *([u] if unroll > 1 else []))

    with T.serial(0, i64(count // unroll)) as i0:
        for u in range(unroll):
            item(i0 * i64(unroll) + i64(u) if unroll > 1 else i0, u)
    for i in range(count - count % unroll, count):
        item(i64(i), i % unroll)


def chunk_rounds(chunks: int, ways: int, depth: int, lane_way, load, multiply, settle=None):
    """The reduction loop: `ways` warps split `chunks` chunks (warp w takes w, w + ways, ...), each staging `depth`
    chunks per round, then multiplying them. load(chunk, slot) / multiply(slot) emit one chunk's part; settle(round),
    where given, runs once between a round's loads and its multiplies (waiting for polled operands), round being the
    (chunk, slot, whether the chunk is in range: True, or a condition) of each slot."""
    rounds, whole = -(-chunks // (ways * depth)), chunks % (ways * depth) == 0
    with T.serial(0, i64(rounds)) as it:
        cks = [(it * i64(depth) + i64(j)) * i64(ways) + lane_way for j in range(depth)]
        for j, ck in enumerate(cks):
            emit_if(ck < i64(chunks), lambda ck=ck, j=j: load(ck, j), whole)  # warp-uniform
        if settle:
            settle([(ck, j, True if whole else ck < i64(chunks)) for j, ck in enumerate(cks)])
        for j, ck in enumerate(cks):
            emit_if(ck < i64(chunks), lambda j=j: multiply(j), whole)
