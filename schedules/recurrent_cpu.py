"""The recurrent kernel for CPUs (LLVM): the whole sequence in one function and one launch of TVM's thread pool.

Per step and phase, work items are (direction, batch row, chunk of JC hidden units) and run on
TVM's thread pool, whose threads stay in one parallel region for the whole sequence and meet at a
barrier after each phase. An item accumulates all gates of its chunk with the inner loop running along
units (axpy form, so it vectorizes without fast-math; R in panels of 16 units, r_layout), then runs the cell's
gate program on the chunk's units as one vectorized loop (sigmoid and tanh from vector_math:
libm calls would stay scalar). Hidden state is double-buffered across steps; the cell state stays
in the Yc output, which only its own unit reads.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

from tvm import tirx
from tvm.script.ir_builder import tirx as T

from .cells import Cell
from .device import MIN_PARALLEL_STEP_WORK, parallel_pays
from .layer import RNNLayerSpec

from . import vector_math
from .recurrent_common import PANEL, KernelArgs, i64, panel_count, recurrent_prim_func, step_phases, unit_padding, unit_step, unit_values

F32 = "float32"
ROW_TILE = 4  # batch rows per load of R at batch >= ROW_TILE (8 ran no faster and compiled 6x slower)
# units per work item in the row-tiled path: ROW_TILE x gates x units accumulators, at most ROW_TILE_ACCUMULATORS
# floats (24 of AVX-512's 32 vector registers), the widest chunk that fits: 16 for an LSTM (4 gates), 32 for a GRU (3)
ROW_TILE_UNITS = (32, 16)
ROW_TILE_ACCUMULATORS = 384

# units per work item at small batch, at most: longer streams of R run faster, as long as every thread of the pool
# still gets an item
ROW_UNITS = 128


def r_layout(spec: RNNLayerSpec) -> str:
    """R as the kernel reads it: panels of 16 units (the last one padded with zero rows where 16 does not divide H),
    so a work item's weights stream straight through memory and every load is a whole vector (faster than R^T at
    batch 1 and 20; at H = 150 R^T's chunks were 2 units: docs/decisions.md)."""
    return "panels"


def small_batch_units(hidden: int, directions: int, threads: int) -> int:
    """The default units per work item at small batch: the widest chunk (up to ROW_UNITS) that still gives each of
    TVM's threads at least one item per step."""
    widest = ROW_UNITS
    while widest > 8 and directions * (panel_count(hidden) * PANEL // chunk_size(hidden, widest)) < threads:
        widest //= 2
    return chunk_size(hidden, widest)


def chunk_size(hidden: int, widest: int = 32) -> int:
    """Units per work item: the widest whole number of panels, at most `widest` units (one panel at least), that
    divides H's panels (H padded to whole panels: the last item's gate program runs on the units that exist); below a
    panel (widest a power of two) part of one where 16 divides H."""
    if widest < PANEL and hidden % PANEL == 0:  # part of a panel
        return widest
    panels = panel_count(hidden)
    per_item = max(1, min(widest // PANEL, panels))
    while panels % per_item:
        per_item -= 1
    return per_item * PANEL


def units_fit(hidden: int, units: int) -> bool:
    """Whether work items of `units` units tile H's panels: whole panels dividing their number, or (where 16 divides
    H) a part of one."""
    if units % PANEL == 0:
        return panel_count(hidden) % (units // PANEL) == 0
    return PANEL % units == 0 and hidden % PANEL == 0


@dataclass(frozen=True)
class CpuConfig:
    rows: int = ROW_TILE  # batch rows per load of R (each load serves them all)
    units: int = 16  # hidden units per work item: rows x gates x units accumulators; units_fit(H, units)
    # 1: every other step each thread takes its share of a phase's items in reverse, so it starts on the weights it
    # read last, still in its L2, where in the same order each step the least recently used are the next ones wanted
    # and a share of R larger than L2 misses throughout (ds2-lstm's fp32 R is 10 MB, 5 per thread; L2 4 MB a core)
    serpentine: int = 0


def row_tile_units(hidden: int, gates: int) -> int:
    """Units per work item of a row tile: the widest of ROW_TILE_UNITS whose accumulators fit at ROW_TILE rows (fewer
    rows take the same: an LSTM of 3 rows x 32 units, 384 floats, ran 1.6-1.9x slower than 3 x 16)."""
    widest = next(u for u in ROW_TILE_UNITS if ROW_TILE * gates * u <= ROW_TILE_ACCUMULATORS or u == ROW_TILE_UNITS[-1])
    return chunk_size(hidden, widest)


def row_tile_rows(batch: int | None, gates: int, units: int) -> int:
    """Batch rows per work item at batch >= ROW_TILE: 5 where that makes whole tiles, fewer of them than 4 rows do, and
    the accumulators still fit (each tile is a pass over the item's weights): an LSTM at ds2-lstm's batch 20, 16 units
    (320 floats), 4 passes, not 5; a GRU's 32 units would take 480 floats."""
    fewer = batch is not None and batch % 5 == 0 and batch // 5 < -(-batch // ROW_TILE)
    return 5 if fewer and 5 * gates * units <= ROW_TILE_ACCUMULATORS else ROW_TILE


def cpu_prim_func(spec: RNNLayerSpec, cell: Cell, emit_steps, seq=None, batch=None) -> tirx.PrimFunc:
    """The CPU kernel: initial states, emit_steps(a) (the time loop, one schedule per batch bucket), final state."""
    H, D = spec.hidden_size, spec.num_directions

    def body(a):
        n_ = a.batch
        a.hbuf = T.alloc_buffer((2, D, n_, H), F32)
        a.scratch = {v: T.alloc_buffer((D, n_, H), F32) for v in cell.stored_values}

        # initial states
        with T.serial(0, i64(D) * n_) as dn:  # a copy of D x N x H floats: not worth a pool launch
            d, n = dn // n_, dn % n_
            with T.serial(0, i64(H)) as j:
                T.buffer_store(a.hbuf, a.initial("h", d, n, j), [i64(0), d, n, j])
                if a.Yc is not None:
                    T.buffer_store(a.Yc, a.initial("c", d, n, j), a.state_index(d, n, j))

        emit_steps(a)

        with T.serial(0, i64(D) * n_) as dn:  # a copy of D x N x H floats: not worth a pool launch
            d, n = dn // n_, dn % n_
            final = a.seq % 2
            with T.serial(0, i64(H)) as j:
                T.buffer_store(a.Yh, a.hbuf[final, d, n, j], a.state_index(d, n, j))

    return cpu_signature(spec, cell, body, seq, batch)


def cpu_signature(spec: RNNLayerSpec, cell: Cell, emit_body, seq=None, batch=None) -> tirx.PrimFunc:
    """The CPU kernel's arguments around any body (the kernel's, or a tuning workload's empty one): R in r_layout and
    in the layer's storage dtype. An fp16/bf16 layer's weights are exact in fp32, so each is widened where it is read
    (a vector conversion) and the sums are the same bits as from an fp32 copy, from half the bytes; at batch 1 a step
    is a pass over R from L3 or memory."""
    return recurrent_prim_func(spec, cell, r_layout(spec), emit_body, weight_dtype=spec.dtype, seq=seq, batch=batch)


def cpu_steps(a: KernelArgs, cfg: CpuConfig, threads: int):
    """The time loop: per step and phase, parallel work items of `cfg.units` units x `cfg.rows` batch rows, split as
    a pool of `threads` splits them."""
    H, D = a.spec.hidden_size, a.spec.num_directions
    rows, jc = cfg.rows, cfg.units
    if not units_fit(H, jc):
        raise ValueError(f"units={jc} must be whole panels of {PANEL} dividing hidden size {H}'s panels, "
                         f"or a part of one where {PANEL} divides H")
    chunks = panel_count(H) * PANEL // jc

    tiles = tirx.ceildiv(a.batch, i64(rows))
    # a layer of static shape with a single work item per phase has no parallel loop left once TVM simplifies it (and a
    # launch without one does not build): it runs on the calling thread
    items = i64(D * chunks) * tiles
    batch = a.batch.value if isinstance(a.batch, tirx.IntImm) else a.batch if isinstance(a.batch, int) else None
    # and a step too small to pay for the pool's barrier runs there too; a batch known only at run time is tested there
    step_work = a.cell.gates * H * H * D
    single = D * chunks == 1 and batch is not None and batch <= rows

    def phase_items(parallel):
        def emit(_pi, phase, last, operand, s, cur, nxt):
            # batch tiles vary fastest: the items of one chunk of units run back to back on a thread, so its rows of R
            # (a panel) come from L2 for every tile after the first (at ds2-lstm's batch 20: 15% faster than chunks fastest)
            with T.attr(0, "pragma_parallel_barrier_when_finish", 1) if parallel else contextlib.nullcontext():
                with (T.parallel if parallel else T.serial)(0, items) as i:  # the phase's writes, seen by every thread's next phase after the barrier
                    item = serpentine(i, s) if cfg.serpentine and parallel else i
                    d = item // (tiles * chunks)
                    n0 = item % tiles * i64(rows)
                    j0 = item // tiles % chunks * jc
                    _phase_tile(a, phase, last, operand, a.hbuf, a.scratch, s, cur, nxt, d, n0, rows, j0, jc)

        return emit

    def serpentine(i, s):
        """Item i of step s: on odd steps the thread's share in reverse. The share is the blocked split TVM's parallel
        loops make (ceil(items / threads) each, in order), for the pool the build sees; with another thread count the
        order is merely less kind to L2 (any order of a phase's items is correct)."""
        share = tirx.ceildiv(items, i64(threads))
        first = i // share * share
        last = tirx.min(first + share, items) - i64(1)
        return tirx.if_then_else(s % 2 == 1, first + last - i, i)

    def time_loop(parallel):
        # One launch of TVM's thread pool for the whole sequence: every thread runs the time loop, takes its share of
        # each phase's items (the same blocked split a parallel loop launched on its own gets) and meets the others at
        # a barrier
        if parallel:
            with T.attr(0, "pragma_parallel_launch_point", 1):
                step_phases(a, a.hbuf, a.scratch, phase_items(True))
        else:
            step_phases(a, a.hbuf, a.scratch, phase_items(False))

    if single or batch is not None:
        time_loop(not single and parallel_pays(step_work * batch, per_step=True))
        return
    if a.max_batch is not None and not parallel_pays(step_work * a.max_batch, per_step=True):
        time_loop(False)  # no batch of this branch pays for the pool: no parallel copy of the loop to build
        return
    if parallel_pays(step_work, per_step=True):
        # one row's step pays already, so every batch does; a test's serial branch, taken at batch 0 alone, made TVM
        # fold a division by zero (ddddocr's bidirectional LSTM(512) did not build)
        time_loop(True)
        return
    with T.If(a.batch * i64(step_work) >= i64(MIN_PARALLEL_STEP_WORK)):
        with T.Then():
            time_loop(True)
        with T.Else():
            time_loop(False)


def _f32(x):
    return x if str(x.ty.dtype) == F32 else x.astype(F32)


def _phase_tile(a: KernelArgs, phase, last, operand, hbuf, scratch, s, cur, nxt, d, n0, rows, j0, JC):
    """Gates of units j0..j0+JC for batch rows n0..n0+rows, then each valid row's gate program (or padding),
    vectorized over the units."""
    H, N = a.spec.hidden_size, a.batch
    gp = len(phase.gates)
    assert a.r_layout == "panels" and (JC % PANEL == 0 or PANEL % JC == 0), JC  # whole panels, or 8 units: half of one
    acc = T.alloc_buffer((rows, gp, JC), F32, scope="local")
    for r in range(rows):
        for gi in range(gp):
            with T.vectorized(0, i64(JC)) as jj:
                T.buffer_store(acc, tirx.const(0.0, F32), [i64(r), i64(gi), jj])
    width = min(JC, PANEL)  # a vector per panel

    def lane(p0, jj):
        return i64(p0) + jj

    # each vector of R lies in one panel: its panel and first lane bound once per item, not derived again in every
    # access (index arithmetic that TVM's buffer passes would simplify once per access and gate)
    starts = {p0: (T.bind((j0 + i64(p0)) // i64(PANEL)), T.bind((j0 + i64(p0)) % i64(PANEL))) for p0 in range(0, JC, width)}

    def r_at(k, g, p0, jj):
        panel, first = starts[p0]
        return a.RP[d, panel, k, i64(g), first + jj]

    # half-precision R with several rows: each vector widened once per k into registers and used by every row (in the
    # row loop the conversions cost ds2-lstm's fp16 model 4% against fp32 R)
    widened = T.alloc_buffer((gp, JC), F32, scope="local") if rows > 1 and a.spec.dtype != F32 else None
    with T.serial(0, i64(H)) as k:
        if widened is not None:
            for gi, g in enumerate(phase.gates):
                for p0 in range(0, JC, width):
                    with T.vectorized(0, i64(width)) as jj:
                        T.buffer_store(widened, _f32(r_at(k, g, p0, jj)), [i64(gi), lane(p0, jj)])
        for r in range(rows):
            n = tirx.min(n0 + i64(r), N - 1)  # rows past the batch compute a copy, never stored
            hk = T.bind(operand[cur, d, n, k] if phase.operand == "h" else operand[d, n, k])
            for gi, g in enumerate(phase.gates):
                for p0 in range(0, JC, width):
                    with T.vectorized(0, i64(width)) as jj:
                        idx = [i64(r), i64(gi), lane(p0, jj)]
                        w = widened[i64(gi), lane(p0, jj)] if widened is not None else _f32(r_at(k, g, p0, jj))
                        T.buffer_store(acc, acc[tuple(idx)] + w * hk, idx)
    # a loop, not one copy per row: unrolled, the vectorized gate program took 1.7x as long to build
    # (ds2-lstm's kernel, 0.87 -> 0.51 s) and ran no faster
    with T.serial(0, i64(rows)) as r:
        n = n0 + r
        with T.If(n < N):
            with T.Then():
                with T.If(s < a.length(n)):
                    with T.Then():
                        t = a.time_index(d, n, s)
                        rec = lambda gi, jj: acc[r, i64(gi), jj]  # noqa: E731
                        temps = LaneTemps(JC, lambda temps: unit_values(
                            a, phase, hbuf, scratch, cur, d, n, t, j0, lambda gi: rec(gi, i64(0)), temps))
                        _each_unit(H, j0, JC, lambda jj: unit_step(
                            a, phase, hbuf, scratch, cur, nxt, d, n, t, j0 + jj, lambda gi: rec(gi, jj), temps.at(jj)))
                    if last:
                        with T.Else():  # padding: Y is zero there, the state carries over
                            _each_unit(H, j0, JC, lambda jj: unit_padding(a, hbuf, cur, nxt, d, n, s, j0 + jj))


def _each_unit(H: int, j0, JC: int, body):
    """body(jj) as a vectorized loop over the item's units j0 + jj that exist: all JC of them, but in the last item
    where H ends inside its last panel (the padded units' sums are zeros and never stored)."""
    if H % JC == 0:
        with T.vectorized(0, i64(JC)) as jj:
            body(jj)
        return
    with T.If(j0 + i64(JC) <= i64(H)):
        with T.Then():
            with T.vectorized(0, i64(JC)) as jj:
                body(jj)
        with T.Else():
            with T.vectorized(0, i64(H % JC)) as jj:
                body(jj)


class LaneTemps(vector_math.Temps):
    """Temporaries of a gate program run as a vectorized loop over units: slot i of lane jj is buf[i, jj].

    The vectorized epilogue needs each value it reuses (vector_math's intermediates, the results
    held until the stores) in a temporary of its own lane. A local buffer allocated inside the
    loop is one buffer for all lanes (two units came out equal); tirx.Let bindings vectorize
    correctly, but took TVM's LLVM codegen of ds2-lstm's kernel from 0.1 to 2.7 s. So the buffer
    is allocated before the loop, sized by a dry run of the program.
    """

    def __init__(self, lanes: int, values):
        """values(temps): the program's stored results, built with temps (the dry run: bind() only counts)."""
        self.buf, self.jj, self.used = None, None, 0
        results = values(self)
        # unit_step binds each result too
        self.buf = T.alloc_buffer((self.used + len(results), lanes), F32, scope="local")

    def at(self, jj) -> LaneTemps:
        """Ready to emit the program for lane jj (inside the vectorized loop)."""
        self.jj, self.used = jj, 0
        return self

    def bind(self, value):
        if self.buf is None:  # dry run: count, and hand out a stand-in
            self.used += 1
            return tirx.Var("dry_run", F32)
        slot = [i64(self.used), self.jj]
        self.used += 1
        T.buffer_store(self.buf, value, slot)
        return self.buf[tuple(slot)]
