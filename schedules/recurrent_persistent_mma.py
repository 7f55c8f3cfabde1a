"""The persistent recurrent kernel on tensor cores: one cooperative launch runs the whole sequence, R resident in shared memory.

At batch 8-64 a step is a small GEMM (G*H x N x H), too much work for the SIMT persistent kernel
(each R element read from shared memory per batch row) and too little to hide the launch and the
L2/HBM reads of R that the per-step kernels (stepwise, mma) pay every step. Here one wave of
blocks (launched cooperatively, at most one per SM) each own `units` hidden units of one
direction, with all their gates. A block copies its rows of R into shared memory once, in the
order its warps' mma fragments read them, then per step and phase runs recurrent_mma.block_phase
(mma.sync tiles: A from shared memory, B = batch rows of h from L2; the k_warps' partial sums
meet in shared memory; the gate program as the epilogue) over its batch rows, and the grid meets
at a barrier before the next phase. With `sync` (fp16 single-phase cells) there is no barrier between steps: h goes
out as half words tagged with the step (step_sync), and each warp polls a round's words its B fragments read together.

Shared layout of R, per phase and 8-row group (one gate's 8 units) and 32-column chunk: the 8 rows
of 32 columns one after another, so a warp's 16-byte fragment loads (row g, columns 8t..8t+7)
cover 512 consecutive bytes in half precision. In fp32 (TF32, 3xTF32) a row is 128 bytes, and
odd rows swap their two 16-byte halves of each lane's 32 bytes (an XOR swizzle), so the eight
lanes of each quarter-warp hit distinct banks.

Layers whose R does not fit on chip (blog-a: H=2560, 52 MB in fp16): a block keeps its rows' first
chunks in shared memory and reads the last `streamed` chunks from global memory every step, in a
reduction loop of their own before the resident ones (fewest_streamed picks the least that fits),
through a ring of shared buffers that the block fills with cp.async a round ahead, so the n_warps
that share R's rows read each element of the streamed chunks once per step between them
(streamed_rounds). The ring reads them from a copy the block makes once per launch in the order it
consumes them, a round one contiguous run (streamed_r). streaming_config is the default for such layers, which
auto runs at batch 33-64 (choice.STREAMED_MAX_BATCH).

Math by dtype (recurrent_mma.mode): fp16/bf16 on m16n8k16, fp32 with precision="tf32" on TF32, and
exact fp32 as 3xTF32 (mma_tiles: high and low TF32 parts, within a few times SIMT fp32's error) or, where the cell
bounds h and R is resident or streams through the ring, as f16x3 (MmaConfig.halves, step_halves: fp16 halves of scaled
rows of R, kept in shared memory as two 8-row blocks per group and chunk, high then low, or in the streamed copy, and of
h; half 3xTF32's mma's, as accurate).
"""

from __future__ import annotations

from dataclasses import replace

from tvm import tirx
from tvm.script.ir_builder import tirx as T

from .device import Device
from .mma_tiles import KC, WarpTiles, chunk_rounds, cp_async_ring, itemsize, shared_element
from .recurrent_common import KernelArgs, block_sync, emit_if, i64, step_phases, shared_dyn
from .recurrent_mma import MmaConfig, block_phase, global_a, operand_copies, operand_dtype, partial_sums
from .recurrent_persistent import _grid_sync, _strided, final_states, initial_states
from . import step_halves, step_sync
from .split_halves import halves_of
from .streamed_r import StreamedR

F32 = "float32"
R_LAYOUT = "rows"
# hidden units per block (whole 8-row groups of one gate). 32 would never be needed to fit: where R's slice
# for 32 units fits in shared memory, 16 units make few enough blocks for one wave
UNITS = (8, 16)
# the widest block streaming_config tries (32 units: H up to 4224 in one wave of 132 SMs): the widths that have run
# on a GPU are 20, 24 and 32; wider blocks would hold more partial sums and stream nearly all of R
MAX_STREAM_UNITS = 32


def blocks(spec, units: int) -> int:
    return spec.num_directions * -(-spec.hidden_size // units)


def resident_chunks(spec, cfg: MmaConfig) -> int:
    """32-column chunks of R a block keeps in shared memory (the rest, cfg.streamed, it reads from L2 every step)."""
    return max(0, -(-spec.hidden_size // KC) - cfg.streamed)


def r_bytes(spec, cell, units: int, chunks: int | None = None) -> int:
    """Shared memory for one block's rows of R (whole 32-column chunks, zeros past H; `chunks` of them, default all)."""
    return cell.gates * units * (-(-spec.hidden_size // KC) if chunks is None else chunks) * KC * itemsize(spec.dtype)


def parts(cfg: MmaConfig) -> int:
    """The parts each operand element takes in the ring: 2 in f16x3 (its fp16 high and low halves), else 1."""
    return 2 if cfg.halves else 1


def ring_a_elems(cell, cfg: MmaConfig) -> int:
    """Elements of A (R's rows) in one buffer of the ring: one round's k_warps x depth chunks of the widest phase's rows
    (in f16x3 both halves of each)."""
    return cfg.k_warps * cfg.depth * max(len(phase.gates) for phase in cell.phases) * cfg.units * KC * parts(cfg)


def ring_b_elems(cfg: MmaConfig) -> int:
    """Elements of B in one buffer of the ring (ring_h): the pass's batch rows by one round's chunks (in f16x3 both
    halves of each)."""
    return cfg.k_warps * cfg.depth * cfg.rows * KC * parts(cfg)


def ring_dtypes(spec, cfg: MmaConfig) -> tuple[str, str]:
    """The ring's element types for A and B: fp16 halves in f16x3, else R's dtype and the dtype B is read in."""
    return ("float16", "float16") if cfg.halves else (spec.dtype, operand_dtype(spec, cfg))


def ring_a_bytes(spec, cell, cfg: MmaConfig) -> int:
    """The ring's A buffers, one allocation: cfg.ring buffers of A's chunks, and at least the partial sums' bytes, which
    live there (idle from a reduction's last barrier to the next one's first copies, so their bytes hold more of R)."""
    a_dtype, _ = ring_dtypes(spec, cfg)
    return max(cfg.ring * ring_a_elems(cell, cfg) * itemsize(a_dtype), cfg.smem_bytes(cell.gates))


def ring_bytes(spec, cell, cfg: MmaConfig) -> int:
    """Shared memory for the ring of streamed chunks (ring_a_bytes, and with ring_h B's buffers: the pass's batch rows
    by the same chunks); none where nothing streams or the ring is off."""
    if not (cfg.ring and cfg.streamed):
        return 0
    _, b_dtype = ring_dtypes(spec, cfg)
    b = ring_b_elems(cfg) * itemsize(b_dtype) if cfg.ring_h else 0
    return ring_a_bytes(spec, cell, cfg) + cfg.ring * b


def sums_in_ring(spec, cell, cfg: MmaConfig) -> bool:
    """Whether the partial sums live in the ring's A buffers: wherever there is a ring."""
    return bool(ring_bytes(spec, cell, cfg))


def sums_bytes(spec, cell, cfg: MmaConfig) -> int:
    """Shared memory the partial sums add: none where they live in the ring."""
    return 0 if sums_in_ring(spec, cell, cfg) else cfg.smem_bytes(cell.gates)


def smem_bytes(spec, cell, cfg: MmaConfig) -> int:
    scales = 4 * step_halves.shared_floats(cell, cfg.units, cfg.n_warps * cfg.k_warps) if cfg.halves else 0
    return r_bytes(spec, cell, cfg.units, resident_chunks(spec, cfg)) + sums_bytes(spec, cell, cfg) + ring_bytes(spec, cell, cfg) + scales


def fewest_streamed(spec, cell, device: Device, cfg: MmaConfig) -> int | None:
    """The fewest chunks of R to stream from L2 so that the rest fits in shared memory beside cfg's partial sums, or
    None where the blocks do not fit one wave."""
    if blocks(spec, cfg.units) > device.sm_count:
        return None
    one = replace(cfg, streamed=1)  # the ring, and whether the sums live in it, do not depend on how much streams
    room = device.smem_limit - sums_bytes(spec, cell, one) - ring_bytes(spec, cell, one)
    return max(0, -(-spec.hidden_size // KC) - max(0, room // r_bytes(spec, cell, cfg.units, 1)))


def unit_rows_fit(cell, cfg: MmaConfig) -> bool:
    """Whether a block's rows of every phase (gates x units) are whole 8-row groups of R in shared memory, and, where
    units are not a multiple of 8 (so an 8-row group may hold two gates), no chunk is read from R by fragment (that
    path, recurrent_mma.global_a, takes a group's gate from its first row): streamed chunks go through the ring."""
    return all(len(p.gates) * cfg.units % 8 == 0 for p in cell.phases) and (cfg.units % 8 == 0 or cfg.ring or not cfg.streamed)


def fits(spec, cell, device: Device, cfg: MmaConfig) -> bool:
    """One wave of blocks (one per SM) holds all of R (every direction) in shared memory."""
    return (unit_rows_fit(cell, cfg) and blocks(spec, cfg.units) <= device.sm_count
            and smem_bytes(spec, cell, cfg) <= device.smem_limit
            and cfg.n_warps * cfg.k_warps <= 16
            and not (cfg.ring and (cfg.ring < 2 or not cfg.streamed or spec.hidden_size % KC))  # the ring copies whole chunks
            and not (cfg.ring_h and not cfg.ring)
            and not (cfg.halves and ((cfg.streamed and not cfg.ring) or not halves_apply(spec)))
            and not (cfg.flat_sums and cfg.streamed)  # flat sums only where R is resident (measured there alone)
            and not (cfg.sync and not polls(spec, cell, cfg))
            and not (cfg.r_regs and not r_regs_apply(spec, cfg)))


def polls(spec, cell, cfg: MmaConfig) -> bool:
    """Whether the steps may poll h's tagged half words (sync 1) instead of meeting at a grid barrier: fp16 B (bf16 would
    take the same words, never run), R resident, whole 32-column chunks (a lane's 8 words one aligned run), and one
    phase, h the only operand (a stored value polled in a later phase would need words published past each row's end)."""
    return (spec.dtype == "float16" and bool(cfg.half_operand) and not cfg.streamed and not cfg.halves
            and spec.hidden_size % KC == 0 and len(cell.phases) == 1 and cell.phases[0].operand == "h")


# the layers whose default polls h up to POLLED_MID_BATCH, where it measured faster than the grid barrier (batch 9-16 in
# two 8-row tiles: LSTM H1024 batch 16 3.23 against 3.88 ms, benchmarks/results/h200-polled-mid-batch.md). For GRU polls()
# takes only the one-phase kind (linear_before_reset, as PyTorch exports it): it tied the barrier at batch 8 until the
# joint wait, then ran 1.44x (benchmarks/results/h200-joint-settle.md). RNN is unmeasured and may poll by tuning
POLLED_OPS = ("LSTM", "GRU")


def polls_by_default(spec, cell, cfg: MmaConfig) -> bool:
    """Whether the default's points up to POLLED_MID_BATCH poll h (sync 1): where they may (polls), in POLLED_OPS."""
    return spec.op in POLLED_OPS and polls(spec, cell, cfg)


# chunks a warp stages per round in the default's polled point: four, waited for together (step_sync.settle_runs), ran
# LSTM fp16 at batch 2-8 10-21% faster than two (H768-H1024), batch 1 within 2% (benchmarks/results/h200-joint-settle.md)
POLLED_DEPTH = 4

# the default's batch tiles change at these batches: one 8-row tile up to SMALL_BATCH, three up to MID_BATCH (two, polled,
# up to POLLED_MID_BATCH where the steps poll), 32 rows per pass up to WIDE_BATCH, and 64 rows per pass above
SMALL_BATCH = 8
POLLED_MID_BATCH = 16
MID_BATCH = 24
WIDE_BATCH = 32


def halves_apply(spec) -> bool:
    """Whether exact-fp32 steps may run f16x3 (MmaConfig.halves): an fp32 layer without precision="tf32" whose cell
    bounds h (step_halves)."""
    from .recurrent_mma import mode

    return mode(spec) == "tf32x3" and step_halves.applies(spec)


def default_config(spec, cell, device: Device, batch: int | None = None) -> MmaConfig | None:
    """The fewest units per block (most SMs at work) that fit. Up to batch 8 one 8-row tile with the reduction split
    8 ways (16 in exact fp32), with XW prefetched; up to batch 24 three 8-row tiles split 8 ways (4 where
    that does not fit beside R), two where the steps poll up to POLLED_MID_BATCH; above, 2 x 2 tiles (32 rows per pass)
    split 4 ways, and above WIDE_BATCH one 64-row pass of 4 x 2 tiles; XW prefetched in cells of several phases. The
    k-warps' partial sums meet flat (one barrier) in passes of up to 32 rows where that fits, as a tree in the 64-row
    ones. Exact fp32 runs f16x3 steps where the cell bounds h. Up to POLLED_MID_BATCH the steps of POLLED_OPS poll h's
    tagged words where they may (sync), POLLED_DEPTH chunks a round; three tiles and wider passes ran faster at the grid
    barrier. fp16 keeps A in registers where it may (a_in_registers_by_default). Where no point holds all of R,
    streaming_config; None if that does not fit either."""
    from .recurrent_mma import mode

    halves = int(halves_apply(spec))
    # polls() reads only the knobs these points share (half_operand, streamed, halves), so one check serves them all
    polled = batch is not None and batch <= POLLED_MID_BATCH and polls_by_default(spec, cell, MmaConfig(halves=halves))
    for units in UNITS:
        for point in _points(batch, exact=mode(spec) == "tf32x3", phases=len(cell.phases), polled=polled):
            tree = MmaConfig(units=units, depth=2, halves=halves, **point)
            for cfg in ([replace(tree, flat_sums=1)] if tree.rows <= WIDE_BATCH else []) + [tree]:
                if fits(spec, cell, device, cfg):
                    return a_in_registers_by_default(spec, batch, polled_point(spec, cell, device, cfg) if polled else cfg)
    return streaming_config(spec, cell, device)


def polled_point(spec, cell, device: Device, cfg: MmaConfig) -> MmaConfig:
    """The polled point of a tile that fits: sync 1, POLLED_DEPTH chunks a round, polled_k_warps (the tile's 8 where
    fewer would not fit)."""
    polled = replace(cfg, sync=1, depth=POLLED_DEPTH)
    fewer = replace(polled, k_warps=polled_k_warps(spec, cfg.k_warps))
    return fewer if fits(spec, cell, device, fewer) else polled


# at most this many of R's 32-column chunks a k-warp in the polled points: four each (H512 at 4 k-warps) ran 11% slower
# than two each at 8, three each (H384 at 4) 14-21% faster than 8 k-warps of one or two (h200-polled-k-warps.md)
POLLED_CHUNKS_PER_K_WARP = 3


def polled_k_warps(spec, k_warps: int) -> int:
    """The most k-warps, up to `k_warps`, that share R's chunks evenly, each taking at most POLLED_CHUNKS_PER_K_WARP:
    a step waits for its slowest warp, so k-warps left one chunk short (or idle) are time lost to the reduction's
    barrier. `k_warps` where no split is even (H320: ten chunks): there four would take 2-3 and eight 1-2, within 4%."""
    chunks = spec.hidden_size // KC
    even = [k for k in (k_warps, k_warps // 2, k_warps // 4) if k >= 2 and chunks % k == 0 and chunks // k <= POLLED_CHUNKS_PER_K_WARP]
    return even[0] if even else k_warps


def a_in_registers_by_default(spec, batch: int | None, cfg: MmaConfig) -> MmaConfig:
    """The default keeps A in registers (r_regs) in fp16 up to POLLED_MID_BATCH where one round of chunks covers R: it
    ran LSTM H1024 fp16 at batch 1-16 6-12% faster than A from shared memory, H512-H768 even, and bidirectional layers'
    blocks of 16 units (H768-H1024, twice the fragments) 15-19% faster (h200-a-in-registers.md), all polled points.
    Unmeasured: the grid barrier's points that also take it (ONNX's GRU and RNN to H512, two chunks a round)."""
    wanted = spec.dtype == "float16" and batch is not None and batch <= POLLED_MID_BATCH and r_regs_apply(spec, cfg)
    return replace(cfg, r_regs=1) if wanted else cfg


def _points(batch: int | None, exact: bool, phases: int, polled: bool) -> list[dict]:
    """default_config's batch tiles and warps for `batch`, in order of preference."""
    if batch is not None and batch <= SMALL_BATCH:
        return ([dict(n_tiles=1, n_warps=1, k_warps=16, prefetch=1)] if exact else []) + [dict(n_tiles=1, n_warps=1, k_warps=8, prefetch=1)]
    if batch is not None and batch <= MID_BATCH:
        pair = [dict(n_tiles=2, n_warps=1, k_warps=8, prefetch=1)] if polled else []
        return pair + [dict(n_tiles=3, n_warps=1, k_warps=8, prefetch=1), dict(n_tiles=3, n_warps=1, k_warps=4, prefetch=1)]
    wide = [dict(n_tiles=4, n_warps=2, k_warps=4, prefetch=int(phases > 1))] if batch is None or batch > WIDE_BATCH else []
    return wide + [dict(n_tiles=2, n_warps=2, k_warps=4, prefetch=int(phases > 1))]


def streaming_config(spec, cell, device: Device) -> MmaConfig | None:
    """For a layer whose R does not fit on chip: the fewest units per block that make one wave (every phase's rows must
    be whole 8-row groups, so an LSTM may take 20 units, a GRU 24), 4 x 2 batch tiles (64 rows per pass), the reduction
    split 4 ways, XW prefetched only in cells of several phases, the streamed chunks of R and of h through a ring of two
    buffers (without it where H is not whole 32-column chunks, which the ring copies), f16x3 steps in exact fp32 where
    the cell bounds h, and the fewest chunks streamed. None where no wave of blocks holds H, or where R would fit in a
    wave's shared memory (there more units per block would keep it resident: tuning's business)."""
    if r_bytes(spec, cell, spec.hidden_size) * spec.num_directions <= device.sm_count * device.smem_limit:
        return None
    halves = int(halves_apply(spec))
    for ring in (dict(ring=2, ring_h=1, halves=halves), dict(ring=0, ring_h=0)):  # the ring copies whole chunks: none where H % 32
        for units in range(UNITS[0], MAX_STREAM_UNITS + 1):
            cfg = MmaConfig(units=units, n_tiles=4, n_warps=2, k_warps=4, depth=1, prefetch=int(len(cell.phases) > 1), **ring)
            streamed = fewest_streamed(spec, cell, device, cfg)
            if streamed and fits(spec, cell, device, replace(cfg, streamed=streamed)):
                return replace(cfg, streamed=streamed)
    return None


def r_row_of(phase, units: int, H: int, u0, r):
    """R's row for row r (a run-time index) of a block's rows of the phase: gate-major, `units` units each from u0
    (clamped to H - 1 past the last unit)."""
    gate = tirx.const(phase.gates[-1], "int64")
    for gi in reversed(range(len(phase.gates) - 1)):
        gate = tirx.Select(r // i64(units) == i64(gi), i64(phase.gates[gi]), gate)
    return gate * i64(H) + tirx.min(u0 + r % i64(units), i64(H - 1))


def persistent_mma_body(a: KernelArgs, cfg: MmaConfig):
    from .recurrent_mma import supported

    assert supported(a.spec), a.spec.dtype
    spec, cell = a.spec, a.cell
    H, D, UB, N = spec.hidden_size, spec.num_directions, cfg.units, a.batch
    chunks, NB = -(-H // KC), cfg.rows
    CR = resident_chunks(spec, cfg)  # the first CR chunks in shared memory, the rest read from L2 each step
    assert unit_rows_fit(cell, cfg), cfg
    assert not cfg.halves or (halves_apply(spec) and (CR == chunks or cfg.ring)), \
        f"f16x3 steps need exact fp32, a bounded h, and R resident or its streamed chunks through the ring: {cfg}"
    halves = bool(cfg.halves)  # f16x3: R's rows scaled and split into fp16 halves in shared memory (step_halves)
    threads = 32 * cfg.n_warps * cfg.k_warps
    warps = threads // 32
    per_dir = -(-H // UB)
    # each phase's 8-row groups: (phase index, first group); its rows are gate-major, units along them
    group0, total = [], 0
    for phase in cell.phases:
        group0.append(total)
        total += len(phase.gates) * UB // 8
    hbuf = T.alloc_buffer((2, D, N, H), F32)
    scratch = {v: T.alloc_buffer((D, N, H), F32) for v in cell.stored_values}
    # sync 1: h's tagged half words replace its half copy (B reads them), and no grid barrier is met between steps
    words = {"h": step_sync.alloc_words((2, D, N, H), half=True)} if cfg.sync else None
    if not words:
        operand_copies(a, cfg)
    hscale = step_halves.HScale(a, D * per_dir) if halves else None
    # where the ring reads the streamed chunks from: a copy in its order (f16x3: of the scaled halves), made once per launch
    stream = StreamedR(a, cfg, CR, D * per_dir, r_row_of) if ring_bytes(spec, cell, cfg) else None
    with T.thread_binding(0, i64(D * per_dir), "blockIdx.x") as bx:
        with T.thread_binding(0, i64(threads // 32), "threadIdx.y") as wy:
            with T.thread_binding(0, i64(32), "threadIdx.x") as lane:
                tid = wy * i64(32) + lane
                d, u0 = bx // i64(per_dir), bx % i64(per_dir) * i64(UB)
                if stream is not None:
                    stream.bind(bx, d, u0)
                # per 8-row group and chunk: its 8 rows of KC (in f16x3 the rows' high halves, then their low ones)
                block_elems = 8 * KC * (2 if halves else 1)
                wsm = shared_dyn((max(1, total * CR * block_elems),), "float16" if halves else spec.dtype)
                if halves:
                    rscale, rinv = (T.alloc_buffer((cell.gates * UB,), F32, scope="shared") for _ in range(2))
                    wmax = T.alloc_buffer((warps,), F32, scope="shared")
                    step_halves.row_scales(a, lambda pi, q: r_row_of(cell.phases[pi], UB, H, u0, q), UB, d, warps, wy, lane, rscale, rinv)
                    block_sync()
                # dynamic too: the launch asks for static + dynamic bytes above 48 KB only through the dynamic size
                ring = None
                if ring_bytes(spec, cell, cfg):
                    a_dtype, b_dtype = ring_dtypes(spec, cfg)
                    ring = (shared_dyn((ring_a_bytes(spec, cell, cfg) // itemsize(a_dtype),), a_dtype),
                            shared_dyn((cfg.ring * ring_b_elems(cfg),), b_dtype) if cfg.ring_h else None)
                if sums_in_ring(spec, cell, cfg):
                    # the sums are written after the barrier that ends a reduction's reads of the ring (block_phase,
                    # shared_a) and read before the barrier that precedes the next reduction's first copies
                    acc_s = T.decl_buffer((cfg.smem_bytes(cell.gates) // 4,), F32, data=ring[0].data, scope="shared.dyn")
                else:
                    acc_s = partial_sums(cfg, cell.gates, "shared.dyn")

                layout = _Resident(a, cfg, wsm, group0, CR, d, u0, rscale if halves else None)
                layout.load(threads, tid, stream)

                if halves:  # h's scale first: initial_states stores h0's halves
                    hscale.h0_max(bx, d, u0, UB, warps, wy, lane, tid, wmax)
                    a.operand_scale, h_inv = hscale.after(lane)
                initial_states(a, hbuf, d, u0, UB, threads, tid, words)
                block_sync()
                a_regs = a_in_registers(a, cfg, layout, wy, lane) if cfg.r_regs else {}
                _grid_sync()

                def phase_step(pi, phase, last, operand, s, cur, nxt):
                    unscale = (lambda gi, u: rinv[i64(group0[pi] * 8 + gi * UB) + u] * h_inv) if halves else None
                    b_words = None
                    if words:  # h of step s goes out with tag s + 1; this phase waits for tag s
                        a.published = {"h": (words["h"], step_sync.tag_of(s + i64(1)))}
                        b_words = (words["h"], step_sync.half_tag(step_sync.tag_of(s)))

                    streamed = None if CR == chunks else (CR, streamed_rounds(a, pi, phase, cfg, ring, d, u0, CR, tid, stream))
                    with T.serial(0, tirx.ceildiv(N, i64(NB))) as chunk:
                        block_phase(a, phase, last, operand, hbuf, scratch, s, cur, nxt, cfg, d, u0, chunk * i64(NB),
                                    wy, lane, acc_s, layout.a_at(pi, phase), True, shared_a=True, streamed=streamed, unscale=unscale,
                                    b_words=b_words, a_regs=a_regs.get(pi))
                        block_sync()  # the next chunk's partial sums reuse acc_s
                    if not words:
                        _grid_sync()

                step_phases(a, hbuf, scratch, phase_step)

                final_states(a, hbuf, d, u0, UB, threads, tid)
    a.published = {}


def r_regs_apply(spec, cfg: MmaConfig) -> bool:
    """Whether A may stay in registers across the steps (r_regs): R resident, not in f16x3 halves, and one round of
    chunks a step, so that a warp's chunks are the same `depth` slots every step."""
    return not cfg.streamed and not cfg.halves and -(-spec.hidden_size // KC) <= cfg.k_warps * cfg.depth


def a_in_registers(a: KernelArgs, cfg: MmaConfig, layout: _Resident, wy, lane) -> dict:
    """r_regs: each phase's A of the warp's one round (chunk j * k_warps + wk in slot j), staged from shared memory
    into registers once, before the first step; block_phase multiplies them every step (its a_regs)."""
    from .recurrent_mma import m_tiles, tile_mode

    chunks, KW, wk = -(-a.spec.hidden_size // KC), cfg.k_warps, wy // i64(cfg.n_warps)
    regs = {}
    for pi, phase in enumerate(a.cell.phases):
        tiles = WarpTiles(lane, m_tiles(len(phase.gates), cfg.units), cfg.n_tiles, tile_mode(a.spec, cfg), a.spec.dtype,
                          a.spec.dtype, cfg.depth)
        at = layout.a_at(pi, phase)
        for j in range(cfg.depth):
            ck = i64(j * KW) + wk
            emit_if(ck < i64(chunks), lambda ck=ck, j=j, at=at, tiles=tiles: tiles.load_a(
                lambda mt, half, v0, v: at(tiles, ck, mt, half, v0, v), True, j), chunks % (KW * cfg.depth) == 0)
        regs[pi] = tiles.ra
    return regs


class _Resident:
    """R's first CR chunks of a block's rows in shared memory (wsm): per phase its 8-row groups (group0: each phase's
    first), CR chunks each, every chunk 8 rows of KC (in f16x3 the rows' scaled high halves, then their low ones; in
    exact fp32 3xTF32 odd rows swap their 16-byte halves, so 32-byte lane spans hit distinct banks)."""

    def __init__(self, a: KernelArgs, cfg: MmaConfig, wsm, group0, CR: int, d, u0, rscale=None, columns: int | None = None):
        self.a, self.cfg, self.wsm, self.group0, self.CR, self.d, self.u0, self.rscale = a, cfg, wsm, group0, CR, d, u0, rscale
        # R's columns: H, or a stacked layer's I + H (WR: W's, then R's; recurrent_persistent_mma_wavefront)
        self.columns = a.spec.hidden_size if columns is None else columns
        self.halves = bool(cfg.halves)
        self.swizzle = a.spec.dtype == F32 and not self.halves
        self.block_elems = 8 * KC * (2 if self.halves else 1)

    def position(self, g, lane_k):
        """Where column lane_k (0..31 of a chunk) of row g sits in its 32-element row: the XOR swizzle in fp32."""
        return tirx.bitwise_xor(lane_k, (g % i64(2)) * i64(4)) if self.swizzle else lane_k

    def load(self, threads: int, tid, stream: StreamedR | None):
        """Every phase's resident chunks from R (and the streamed ones into the ring's copy), the block's threads strided."""
        for pi, phase in enumerate(self.a.cell.phases):
            count = len(phase.gates) * self.cfg.units // 8 * self.CR * 8 * KC
            if count:
                _strided(count, threads, tid, lambda e, pi=pi, phase=phase: self.load_element(pi, phase, e))
            if stream is not None:
                stream.fill(pi, phase, lambda r, pi=pi: self.rscale[i64(self.group0[pi] * 8) + r], threads, tid, _strided)

    def load_element(self, pi, phase, e):
        """Element e of phase pi's resident chunks, in the order (group, chunk, row, column)."""
        a, CR, UB, H, group0 = self.a, self.CR, self.cfg.units, self.a.spec.hidden_size, self.group0
        p, g, ck, grp = e % i64(KC), e // i64(KC) % i64(8), e // i64(8 * KC) % i64(CR), e // i64(8 * KC * CR)
        r = grp * i64(8) + g  # row of the phase's tile: gate r // UB, unit r % UB
        k = ck * i64(KC) + self.position(g, p)  # the inverse of position: the XOR is its own inverse
        row, K = r_row_of(phase, UB, H, self.u0, r), self.columns
        val = tirx.if_then_else(k < i64(K), a.R[self.d, row, tirx.min(k, i64(K - 1))], tirx.const(0, a.spec.dtype))
        if not self.halves:
            T.buffer_store(self.wsm, val, [i64(group0[pi] * CR * 8 * KC) + e])
            return
        high, low = halves_of(val * self.rscale[i64(group0[pi] * 8) + r])
        at = ((i64(group0[pi]) + grp) * i64(CR) + ck) * i64(self.block_elems) + g * i64(KC) + p
        T.buffer_store(self.wsm, high, [at])
        T.buffer_store(self.wsm, low, [at + i64(8 * KC)])

    def a_at(self, pi, phase, first: int = 0):
        """block_phase's A operand for phase pi: tiles' element of a resident chunk (counted from chunk `first`), None
        for the last m-tile's padding."""
        groups = len(phase.gates) * self.cfg.units // 8

        def at(tiles, ck, mt, half, v0, v, part=0):
            grp = 2 * mt + half
            if grp >= groups:
                return None  # padding rows of the last m-tile
            ck = ck + i64(first) if first else ck
            base = (i64((self.group0[pi] + grp) * self.CR) + ck) * i64(self.block_elems) + i64(part * 8 * KC)
            return shared_element(tiles, self.wsm, base, tiles.g, v0, v, self.swizzle)

        return at


def streamed_rounds(a: KernelArgs, pi, phase, cfg: MmaConfig, ring, d, u0, resident: int, tid, stream: StreamedR | None):
    """block_phase's reduce_streamed for the chunks of R past `resident`. Without a ring each warp loads its chunks' A
    from R in global memory (L2) into registers. With one (cfg.ring buffers in shared memory, each one round's
    k_warps x depth chunks of the phase's rows in the resident layout), the block's threads copy round r + ring - 1 with
    cp.async while its warps multiply round r out of shared memory: the n_warps that share a chunk's rows read them
    from shared memory, and L2 serves each element once per block and step instead of n_warps times. With ring_h the
    same rounds copy B too (the pass's batch rows by the round's chunks), so no load of a streamed chunk waits on L2.
    One barrier per round: after it round r has landed and the buffer round r - 1 used is free.
    The ring reads A's chunks where `stream` (streamed_r.StreamedR, phase pi's rows; None without a ring) says: by
    default a copy of them in the ring's order. f16x3 (cfg.halves, ring only): that copy holds the rows' scaled halves, B's chunks come from the
    operand's split halves, each chunk's high halves then its low ones in the buffer."""
    H, UB, KW, depth = a.spec.hidden_size, cfg.units, cfg.k_warps, cfg.depth
    chunks = -(-H // KC)
    streamed = chunks - resident
    if ring is None:
        return lambda loader, tiles, wk, _b: chunk_rounds(streamed, KW, depth, wk, loader(global_a(a, phase, UB, d, u0), H % KC == 0, resident),
                                                          tiles.multiply)
    ring_a, ring_b = ring
    threads, rows, per_round, NB, P = 32 * cfg.n_warps * KW, len(phase.gates) * UB, KW * depth, cfg.rows, parts(cfg)
    rounds = -(-streamed // per_round)

    def copies(r, buf, sm, dtype, rows, source, part=0):
        """This thread's cp.async copies (16 bytes each) of round r's chunks, `rows` rows each, into buffer `buf` of sm
        (in f16x3 the halves `part` of them): source(row, j, k) is the flat offset of (row, streamed chunk j, column k of
        the chunk) in the source buffer. fp32 rows swap their 16-byte halves on odd rows (the swizzle shared_element
        reads)."""
        vec = WarpTiles.width(dtype)
        segs, count, size = KC // vec, per_round * rows * KC // vec, per_round * rows * KC * P
        for i in range(-(-count // threads)):
            e = i64(i * threads) + tid
            seg, row, j = e % i64(segs), e // i64(segs) % i64(rows), e // i64(segs * rows)
            ck = i64(resident) + r * i64(per_round) + j
            pos = tirx.bitwise_xor(seg, row % i64(2)) if dtype == F32 else seg
            dst = buf * i64(size) + ((j * i64(P) + i64(part)) * i64(rows) + row) * i64(KC) + pos * i64(vec)
            yield (i + 1) * threads <= count and streamed % per_round == 0, tirx.all(e < i64(count), ck < i64(chunks)), dst, \
                source(row, ck - i64(resident), seg * i64(vec))

    def reduce(loader, tiles, wk, b_operand):
        b_srcs, b_offset, n0 = b_operand

        def issue(r, buf):
            plan = [(ring_a, stream.buffer, rows, lambda row, j, k, p=p: stream.at(pi, phase, row, j, p, k), p) for p in range(P)]
            if ring_b is not None:  # rows past the batch: a clamped row, never stored
                plan += [(ring_b, b_srcs[p], NB, lambda row, j, k: b_offset(tirx.min(n0 + row, a.batch - i64(1)), (i64(resident) + j) * i64(KC) + k), p)
                         for p in range(P)]
            for sm, src_buf, n_rows, source, part in plan:
                for whole, cond, dst, src in copies(r, buf, sm, str(sm.dtype), n_rows, source, part):
                    emit_if(cond, lambda sm=sm, src_buf=src_buf, dst=dst, src=src:
                            T.evaluate(T.s_tir.cp_async_raw(str(sm.dtype), sm.data, dst, src_buf.data, src, 16)), whole)

        def consume(r, buf):
            for step in ("load", "multiply"):
                for j in range(depth):
                    local = i64(j * KW) + wk  # the chunk of the round this warp takes, as chunk_rounds assigns them
                    base = (buf * i64(per_round) + local) * i64(P * rows * KC)
                    base_b = (buf * i64(per_round) + local) * i64(P * NB * KC)

                    def a_at(tiles, _ck, mt, half, v0, v, part=0, base=base):
                        first = mt * 16 + 8 * half
                        return None if first >= rows else \
                            shared_element(tiles, ring_a, base + i64(part * rows * KC), i64(first) + tiles.g, v0, v, str(ring_a.dtype) == F32)

                    def b_shared(row, v0, v, part=0, base_b=base_b):
                        return shared_element(tiles, ring_b, base_b + i64(part * NB * KC), row, v0, v, str(ring_b.dtype) == F32)

                    ck = i64(resident) + r * i64(per_round) + local
                    emit_if(ck < i64(chunks), (lambda: loader(a_at, True, 0, None if ring_b is None else b_shared)(ck, j)) if step == "load"
                            else (lambda: tiles.multiply(j)), streamed % per_round == 0)

        cp_async_ring(rounds, cfg.ring, issue, consume)

    return reduce
