"""Where persistent_mma's ring reads the streamed chunks of R from: R's own rows, or a copy made once per launch.

A block streams the last `streamed` 32-column chunks of its rows of R every step (recurrent_persistent_mma). Read from R
itself, a round of the ring (k_warps x depth chunks of the block's rows) is a short run of bytes in each of its rows (256
bytes of fp16 in 80 rows 5 KB apart at blog-a's shape), which keeps HBM busy opening rows for little data: Nsight
Compute had the exact-fp32 step at 43% of DRAM throughput and 49% of L2's, its warps waiting on those copies
(benchmarks/results/2026-11-26-h100-ncu-blog-a-fp32-halves.txt).

So each block first copies its rows' streamed chunks into a workspace in the order the ring consumes them: per block,
phase, streamed chunk and part (f16x3's high and low halves, else one), the phase's rows of 32 columns. A round is then
one contiguous run of bytes. The copy is one read of the streamed part of R and one write of it per launch (the launch
runs every step of the sequence); f16x3 needs a copy anyway, to hold the scaled halves. It is not folded at compile
time, as W's halves are: the layer's other batch branches (stepwise, tiled) read the same fp32 R argument, and a folded
copy would add the streamed part of R (100 MB at blog-a's shape in fp32) to the module. IN_RING_ORDER = False keeps R's
row order (f16x3's halves a row at a time; other modes read R itself), for A/B runs.
"""

from __future__ import annotations

from tvm.script.ir_builder import tirx as T

from .mma_tiles import KC
from .recurrent_common import i64
from .split_halves import halves_of

IN_RING_ORDER = True


class StreamedR:
    """The streamed chunks' source for one launch: `buffer` (R itself or the workspace) and `at`, the flat offset of an
    element. Built outside the kernel's thread bindings (it allocates the workspace); bind(bx, d, u0) per block."""

    def __init__(self, a, cfg, resident: int, blocks: int, r_row_of):
        spec, cell = a.spec, a.cell
        self.a, self.cfg, self.resident, self.r_row_of = a, cfg, resident, r_row_of
        self.H, self.units, self.parts = spec.hidden_size, cfg.units, 2 if cfg.halves else 1
        self.streamed = -(-self.H // KC) - resident
        self.rows = [len(phase.gates) * cfg.units for phase in cell.phases]
        self.row0 = [sum(self.rows[:pi]) for pi in range(len(self.rows))]
        self.in_ring_order = IN_RING_ORDER  # read once: a build sees one value
        self.copied = bool(cfg.halves or self.in_ring_order)
        self.per_block = sum(self.rows) * self.streamed * KC * self.parts
        dtype = "float16" if cfg.halves else spec.dtype
        if not self.copied:
            self.buffer = a.R
        elif self.in_ring_order:
            self.buffer = T.alloc_buffer((blocks * self.per_block,), dtype)
        else:
            self.buffer = T.alloc_buffer((spec.num_directions * cell.gates * self.H * self.parts * self.streamed * KC,), dtype)

    def bind(self, bx, d, u0):
        self.bx, self.d, self.u0 = bx, d, u0
        return self

    def at(self, pi, phase, row, j, part, k):
        """Phase pi's row `row` (0 .. its rows - 1), streamed chunk j (0 .. streamed - 1), part (f16x3's half), column k
        of the chunk."""
        if self.copied and self.in_ring_order:
            block = (self.bx * i64(self.per_block) + i64(self.row0[pi] * self.streamed * KC * self.parts))
            return block + ((j * i64(self.parts) + i64(part)) * i64(self.rows[pi]) + row) * i64(KC) + k
        r_row = self.d * i64(self.a.cell.gates * self.H) + self.r_row_of(phase, self.units, self.H, self.u0, row)
        if not self.copied:
            return r_row * i64(self.H) + (i64(self.resident) + j) * i64(KC) + k
        return (r_row * i64(self.parts) + i64(part)) * i64(self.streamed * KC) + j * i64(KC) + k

    def fill(self, pi, phase, scale, threads, tid, strided):
        """This block's copy of phase pi's streamed chunks (f16x3: each row scaled by scale(row), split into halves).
        Elements run column, row, chunk, so R is read 32 columns at a time and the workspace written in long runs."""
        if not self.copied:
            return
        rows = self.rows[pi]

        def copy(e):
            k, row, j = e % i64(KC), e // i64(KC) % i64(rows), e // i64(KC * rows)
            val = self.a.R[self.d, self.r_row_of(phase, self.units, self.H, self.u0, row), (i64(self.resident) + j) * i64(KC) + k]
            values = halves_of(val * scale(row)) if self.cfg.halves else (val,)
            for part, v in enumerate(values):
                T.buffer_store(self.buffer, v, [self.at(pi, phase, row, j, part, k)])

        strided(rows * self.streamed * KC, threads, tid, copy)
