"""persistent_mma's streamed chunks of R, copied once per launch into a workspace in the order its ring reads them.

A block streams the last `streamed` 32-column chunks of its rows of R every step (recurrent_persistent_mma). Read from R
itself, a round of the ring is a short run of bytes in each of many rows, which keeps HBM busy opening rows for little
data. So each block first copies its rows' streamed chunks, per phase, chunk and part (f16x3's high and low halves,
else one), the phase's rows of 32 columns: a round is then one contiguous run. The copy is one read and one write of
the streamed part of R per launch (f16x3 needs one anyway, for the scaled halves). It is not folded at compile time, as
W's halves are: the layer's other batch branches read the same fp32 R, and a folded copy would add the streamed part
of R to the module.
"""

from __future__ import annotations

from tvm.script.ir_builder import tirx as T

from .mma_tiles import KC
from .recurrent_common import i64
from .split_halves import halves_of

class StreamedR:
    """The streamed chunks' workspace for one launch (`buffer`) and `at`, the flat offset of an element in it. Built
    outside the kernel's thread bindings (it allocates the workspace); bind(bx, d, u0) per block."""

    def __init__(self, a, cfg, resident: int, blocks: int, r_row_of):
        spec, cell = a.spec, a.cell
        self.a, self.cfg, self.resident, self.r_row_of = a, cfg, resident, r_row_of
        self.H, self.units, self.parts = spec.hidden_size, cfg.units, 2 if cfg.halves else 1
        self.streamed = -(-self.H // KC) - resident
        self.rows = [len(phase.gates) * cfg.units for phase in cell.phases]
        self.row0 = [sum(self.rows[:pi]) for pi in range(len(self.rows))]
        self.per_block = sum(self.rows) * self.streamed * KC * self.parts
        self.buffer = T.alloc_buffer((blocks * self.per_block,), "float16" if cfg.halves else spec.dtype)

    def bind(self, bx, d, u0):
        self.bx, self.d, self.u0 = bx, d, u0
        return self

    def at(self, pi, phase, row, j, part, k):
        """Phase pi's row `row` (0 .. its rows - 1), streamed chunk j (0 .. streamed - 1), part (f16x3's half), column k
        of the chunk."""
        block = (self.bx * i64(self.per_block) + i64(self.row0[pi] * self.streamed * KC * self.parts))
        return block + ((j * i64(self.parts) + i64(part)) * i64(self.rows[pi]) + row) * i64(KC) + k

    def fill(self, pi, phase, scale, threads, tid, strided):
        """This block's copy of phase pi's streamed chunks (f16x3: each row scaled by scale(row), split into halves).
        Elements run column, row, chunk, so R is read 32 columns at a time and the workspace written in long runs."""
        rows = self.rows[pi]

        def copy(e):
            k, row, j = e % i64(KC), e // i64(KC) % i64(rows), e // i64(KC * rows)
            val = self.a.R[self.d, self.r_row_of(phase, self.units, self.H, self.u0, row), (i64(self.resident) + j) * i64(KC) + k]
            values = halves_of(val * scale(row)) if self.cfg.halves else (val,)
            for part, v in enumerate(values):
                T.buffer_store(self.buffer, v, [self.at(pi, phase, row, j, part, k)])

        strided(rows * self.streamed * KC, threads, tid, copy)
