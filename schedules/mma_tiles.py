"""A warp's grid of tensor-core tiles (mma.sync m16n8k16, fp16/bf16 inputs, fp32 accumulators), fed straight from memory.

Both tensor-core kernels are built from it: the recurrent step (recurrent_mma: A = gate rows of R,
B = batch rows of h) and the fp16/bf16 input projection (projection_mma: A = rows of X, B = rows of W).

Per 32-column chunk of the reduction a lane loads 8 consecutive k of each of its A rows (g and g+8
of every m-tile, g = lane / 4) and of its B row (g of every n-tile): one 16-byte load per row in
half precision. Those 8 k are the fragment columns {2t, 2t+1, 2t+8, 2t+9} (t = lane % 4) of two
mma's, 4 k each. The order of k inside an mma is free as long as A and B agree, so operands need
no shuffles, ldmatrix or shared-memory staging. Accumulator i of tile (mt, nt) holds row
mt*16 + g + 8*(i // 2) and column nt*8 + 2t + i % 2 of the warp's tile.
"""

from __future__ import annotations

from tvm import tirx
from tvm.backend.cuda.op import ptx_legacy_mma
from tvm.script.ir_builder import tirx as T

from .recurrent_common import i64

F32 = "float32"
KC = 32  # reduction columns per chunk: two mma's, 8 consecutive k per lane
DTYPES = {"float16": "fp16", "bfloat16": "bf16"}  # storage dtypes the tensor cores take here
# which (row half, k of the lane's 4) fills each of the 8 A-fragment halves of m16n8k16 (PTX ISA: rows g and g+8,
# k pairs {2t, 2t+1} then {2t+8, 2t+9}); our 4 consecutive k stand for those four fragment columns
A_SLOTS = ((0, 0), (0, 1), (1, 0), (1, 1), (0, 2), (0, 3), (1, 2), (1, 3))


class WarpTiles:
    """MT x NT accumulator tiles of one warp, and the registers one chunk of A and B pass through."""

    def __init__(self, lane, mt: int, nt: int, dtype: str, b_dtype: str, depth: int = 1):
        self.MT, self.NT, self.dtype, self.b_dtype = mt, nt, dtype, b_dtype
        self.g, self.t = lane // i64(4), lane % i64(4)
        # `depth` chunks staged at once: their loads are in flight together, so a warp waits on memory once per
        # `depth` chunks (the kernels are latency-bound: a chunk's mma's take far less than an L2 or HBM round trip)
        self.ra = T.alloc_buffer((depth, mt, 2, 8), dtype, scope="local")  # A: chunk, tile, row half, 8 k
        self.rb = T.alloc_buffer((depth, nt, 8), b_dtype, scope="local")  # B: chunk, tile, 8 k (fp32 h is converted)
        self.fa = T.alloc_buffer((mt, 2, 8), dtype, scope="local")  # A fragments: tile, mma, 8 halves
        self.fb = T.alloc_buffer((nt, 2, 4), dtype, scope="local")  # B fragments: tile, mma, 4 halves
        self.c = T.alloc_buffer((mt, nt, 4), F32, scope="local")
        for idx in self.accumulators():
            T.buffer_store(self.c, tirx.const(0.0, F32), idx)

    def accumulators(self):
        return [[i64(m), i64(n), i64(i)] for m in range(self.MT) for n in range(self.NT) for i in range(4)]

    def row(self, idx):
        """The warp-tile row (A's row) accumulator idx holds."""
        return i64(int(idx[0]) * 16 + 8 * (int(idx[2]) // 2)) + self.g

    def col(self, idx):
        """The warp-tile column (B's row) accumulator idx holds."""
        return i64(int(idx[1]) * 8 + int(idx[2]) % 2) + self.t * i64(2)

    def load(self, a_at, b_at, vector: bool, slot: int = 0):
        """Stage one chunk in staging slot `slot`: a_at(mt, half, k) / b_at(nt, k) give A's row g + 8*half of m-tile mt and B's row g of
        n-tile nt at k = 8t + (0..7) of the chunk, or None for an A row that is padding (zeros)."""
        lanes = T.vectorized if vector else T.unroll  # CUDA has no half8 select: a guarded tail loads scalars
        k0 = self.t * i64(8)
        for mt in range(self.MT):
            for half in range(2):
                with lanes(0, i64(8)) as v:
                    val = a_at(mt, half, k0 + v)
                    T.buffer_store(self.ra, tirx.const(0, self.dtype) if val is None else val, [i64(slot), i64(mt), i64(half), v])
        width = 16 // (4 if self.b_dtype == F32 else 2)  # float4 is the widest fp32 vector
        for nt in range(self.NT):
            for v0 in range(0, 8, width):
                with lanes(0, i64(width)) as v:
                    T.buffer_store(self.rb, b_at(nt, k0 + i64(v0) + v), [i64(slot), i64(nt), i64(v0) + v])

    def multiply(self, slot: int = 0):
        """The two mma's (k 0-3 and 4-7 of each lane's 8) of the chunk in staging slot `slot`, on every tile."""
        ab = DTYPES[self.dtype]
        for hf in range(2):
            for mt in range(self.MT):
                for i, (half, kk) in enumerate(A_SLOTS):
                    T.buffer_store(self.fa, self.ra[i64(slot), i64(mt), i64(half), i64(4 * hf + kk)], [i64(mt), i64(hf), i64(i)])
            for nt in range(self.NT):
                for i in range(4):
                    T.buffer_store(self.fb, self.rb[i64(slot), i64(nt), i64(4 * hf + i)].astype(self.dtype), [i64(nt), i64(hf), i64(i)])
        for hf in range(2):
            for mt in range(self.MT):
                for nt in range(self.NT):
                    T.evaluate(ptx_legacy_mma("m16n8k16", "row", "col", ab, ab, "fp32",
                                              self.fa.data, i64((mt * 2 + hf) * 8), self.fb.data, i64((nt * 2 + hf) * 4),
                                              self.c.data, i64((mt * self.NT + nt) * 4), False))


def guarded(k, size: int, exact: bool, load, dtype):
    """load(k), or zero past `size` (a partial last chunk; k clamped so the address stays in bounds)."""
    if exact:
        return load(k)
    return tirx.if_then_else(k < i64(size), load(tirx.min(k, i64(size - 1))), tirx.const(0, dtype))


def chunk_rounds(chunks: int, ways: int, depth: int, lane_way, load, multiply):
    """The reduction loop: `ways` warps split `chunks` chunks (warp w takes w, w + ways, ...), each staging `depth`
    chunks per round, then multiplying them. load(chunk, slot) / multiply(slot) emit one chunk's part."""
    rounds = -(-chunks // (ways * depth))
    with T.serial(0, i64(rounds)) as it:
        cks = [(it * i64(depth) + i64(j)) * i64(ways) + lane_way for j in range(depth)]
        for step in (load, multiply):
            for j, ck in enumerate(cks):
                args = (ck, j) if step is load else (j,)
                if chunks % (ways * depth) == 0:
                    step(*args)
                else:
                    with T.If(ck < i64(chunks)):  # warp-uniform
                        with T.Then():
                            step(*args)
