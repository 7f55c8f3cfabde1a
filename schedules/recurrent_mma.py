"""The recurrent kernel for CUDA on tensor cores (fp16/bf16 layers, fp32 ones with precision="tf32"): per step and phase one launch of mma.sync tiles.

At batch 32-64 with H >= 1024 a step is a real GEMM (G*H x N x H), and cuDNN runs it on tensor
cores while our SIMT kernels (tiled, stepwise) top out at 12 TFLOP/s. Here each warp issues
`mma.sync` (m16n8k16 on fp16/bf16, m16n8k8 on TF32; fp32 accumulators): A is a 16-row slice of R
(the gate rows of the block's units), B is 8 batch rows of h (rounded to the operand type, as cuDNN
does in half precision and TF32), C accumulates in fp32.

A block owns `units` hidden units (8 or 16) with all their gates, so the m-tiles of a block are
gates x units and every tile row's gate is a compile-time constant. Its warps form an
n_warps x k_warps grid: n_warps split the block's batch rows (n_tiles tiles of 8 rows each),
k_warps split the reduction and each warp loads `depth` chunks at once, so a step's L2/HBM latency
is paid H/(32*k_warps*depth) times per warp, not H/32. Fragments load straight from global memory (R stays in L2 between steps; mma_tiles).

The partial sums of the k_warps meet in shared memory, and the block's threads then run the same
gate program as every other kernel (recurrent_cuda.epilogue) for (unit, batch row) pairs.
"""

from __future__ import annotations

from dataclasses import dataclass

from tvm import tirx
from tvm.script.ir_builder import tirx as T

from .mma_tiles import KC, MODES, WarpTiles, chunk_rounds
from .recurrent_common import (KernelArgs, block_sync, carried_states, emit_if, guarded, half_operands, i64, load_xw_ahead,
                               split_operands, shared_dyn)
from .recurrent_cuda import epilogue, operand_at, operand_index, step_launches
from . import step_sync

F32 = "float32"
HALF = ("float16", "bfloat16")
R_LAYOUT = "rows"  # lanes read R's rows along k: ONNX's layout


@dataclass(frozen=True)
class MmaConfig:
    """Defaults: the best of the points tried on ds2-lstm and near the best on b64-h1024-l2 and blog-a, fp16
    (docs/decisions.md); tuning finds the rest."""

    units: int = 8  # hidden units per block (8 or 16: a 16-row m-tile holds one gate's 16 units or two gates' 8)
    n_tiles: int = 2  # 8-row batch tiles per warp
    n_warps: int = 2  # warps along the batch
    k_warps: int = 4  # warps splitting the reduction
    depth: int = 2  # 32-column chunks a warp loads at once (loads in flight per round trip to L2/HBM)
    # 1: the epilogue's threads load their gates' input projections (XW) before the reduction, so that read's latency
    # hides behind the mma's instead of following them
    prefetch: int = 0
    # 1 (3xTF32 only): the cross products accumulate apart from the main product (mma_tiles.WarpTiles; alone slower on b8)
    split_acc: int = 0
    # 1 (3xTF32 only): each 32-k chunk's products go into a zeroed accumulator of their own, added into the sum in fp32
    # (mma_tiles), as the projection does, since the tensor cores' accumulation truncates. A tuning knob, off by default:
    # both are well within 1e-5 of float64, and it costs time on some rows (docs/decisions.md)
    chunk_acc: int = 0
    # 1 (fp16/bf16 only): B (h, GRU's r*h) read from a copy in the storage dtype (recurrent_common.half_operands), half
    # the L2 bytes of the fp32 state for the same bits, since the mma rounds B to that dtype anyway
    half_operand: int = 1
    # persistent_mma: the last `streamed` 32-column chunks of R are read from L2 every step instead of kept in shared
    # memory, for layers whose R does not fit on chip (blog-a: H=2560); 0 keeps all of R resident
    streamed: int = 0
    # persistent_mma with streamed chunks: 0 loads them from L2 straight into each warp's registers, so the n_warps that
    # share a chunk's rows of R read them once each; k >= 2: they pass through a ring of k shared buffers of one round's
    # chunks (k_warps x depth) that the whole block fills with cp.async, k - 1 rounds ahead (recurrent_persistent_mma)
    ring: int = 0
    # with a ring: 1 also copies the streamed chunks' B (the block's batch rows of h, or of GRU's r*h) into it, so neither
    # operand of those chunks is a synchronous L2 read (the ncu profile of blog-a: 36% of warp cycles waiting on L1TEX)
    ring_h: int = 0
    # persistent_mma in exact fp32, R resident and h bounded (cells.state_bound): 1 runs f16x3 (mma_tiles) instead of
    # 3xTF32: R's rows scaled and split into fp16 halves once, as the kernel copies them into shared memory, h scaled
    # by a power of two from its bound and split as it is stored; three fp16 products per k16, half 3xTF32's mma's
    halves: int = 0
    # 1: each k-warp stores its partial sums in a slot of its own and the gate program adds them (one block barrier),
    # instead of the tree of _sum_partials (2 log2(k_warps) + 1 barriers, half the slots)
    flat_sums: int = 0
    # persistent_mma in fp16: 1 publishes h as half words tagged with their step (step_sync) and each step polls the
    # words it multiplies, instead of a grid barrier a step
    sync: int = 0
    # persistent_mma with R resident and one round of chunks a step (chunks <= k_warps x depth): 1 loads each warp's A
    # (its chunks of R) into registers once, before the first step, instead of from shared memory every step
    r_regs: int = 0

    @property
    def rows(self) -> int:
        return 8 * self.n_tiles * self.n_warps

    def smem_bytes(self, gates: int) -> int:
        return 4 * self.sum_slots * m_tiles(gates, self.units) * 16 * (self.rows + 1)

    @property
    def sum_slots(self) -> int:
        return self.k_warps if self.flat_sums else slots(self.k_warps)


def slots(k_warps: int) -> int:
    """Tiles of partial sums in shared memory: half the k-slices hand theirs over in the first round."""
    return max(1, k_warps // 2)


def m_tiles(gates: int, units: int) -> int:
    return -(-gates * units // 16)


def tile_mode(spec, cfg: MmaConfig) -> str:
    """The mode a config's tiles run: the layer's, or f16x3 where the config splits exact fp32 into halves."""
    return "f16x3" if cfg.halves else mode(spec)


def mode(spec, exact: bool = True) -> str | None:
    """The tensor-core mode a layer uses (mma_tiles.MODES): its half storage dtype, tf32 where the user allowed it for
    an fp32 layer, and for exact fp32 3xTF32 (within a few times SIMT fp32's error), or None when `exact` is False."""
    if spec.dtype in MODES:
        return spec.dtype
    if spec.precision == "tf32":
        return "tf32"
    return "tf32x3" if exact else None


def supported(spec, exact: bool = True) -> bool:
    """Whether the layer runs on tensor cores (exact=False: only in a rounding mode, not through 3xTF32)."""
    return mode(spec, exact) is not None


def default_config(batch: int | None = None) -> MmaConfig:
    """The untuned point, for every batch (the measured rows ran batch 8-64 on it)."""
    return MmaConfig()


def mma_body(a: KernelArgs, cfg: MmaConfig):
    assert supported(a.spec) and not cfg.halves, (a.spec.dtype, cfg)
    operand_copies(a, cfg)
    step_launches(a, lambda *args: _mma_launch(*args, cfg))


def _mma_launch(a: KernelArgs, phase, last, operand, hbuf, scratch, s, cur, nxt, cfg: MmaConfig):
    H, N, D = a.spec.hidden_size, a.batch, a.spec.num_directions
    UB, NB = cfg.units, cfg.rows
    exact = H % KC == 0  # else the last chunk is partial: scalar loads, zero-filled past H
    with T.thread_binding(0, i64(-(-H // UB)), "blockIdx.x") as bx:
        with T.thread_binding(0, i64(D), "blockIdx.y") as d:
            with T.thread_binding(0, tirx.ceildiv(N, i64(NB)), "blockIdx.z") as bz:
                with T.thread_binding(0, i64(cfg.n_warps * cfg.k_warps), "threadIdx.y") as wy:
                    with T.thread_binding(0, i64(32), "threadIdx.x") as lane:
                        u0 = bx * i64(UB)
                        acc_s = partial_sums(cfg, len(phase.gates))
                        block_phase(a, phase, last, operand, hbuf, scratch, s, cur, nxt, cfg, d, u0, bz * i64(NB), wy, lane,
                                    acc_s, global_a(a, phase, UB, d, u0), exact)


def operand_dtype(spec, cfg: MmaConfig) -> str:
    """The dtype the kernel reads B in: the storage dtype where it keeps half-precision copies of the operands
    (half_operand in fp16/bf16), else the fp32 state."""
    return spec.dtype if cfg.half_operand and spec.dtype in HALF else F32


def operand_copies(a: KernelArgs, cfg: MmaConfig):
    """Allocate the half-precision copies of the phases' operands where the config reads B from them (in f16x3 their
    scaled halves)."""
    if cfg.halves:
        split_operands(a)
    elif operand_dtype(a.spec, cfg) != F32:
        half_operands(a, a.spec.dtype)


def global_a(a: KernelArgs, phase, units: int, d, u0, columns: int = 0, size: int | None = None):
    """block_phase's a_at for A straight from R in global memory (L2): the gate rows of units u0.. (zeros past H).
    columns, size: A is R's `size` columns from `columns` on (a stacked layer's WR: W's, then R's)."""
    H = a.spec.hidden_size
    size = H if size is None else size

    def a_at(tiles, ck, mt, half, v0, v):
        row = r_row(phase, units, H, u0, tiles.g, mt, half)
        k = ck * i64(KC) + tiles.t * i64(8) + i64(v0) + v
        at = (lambda k: a.R[d, row, k]) if not columns else (lambda k: a.R[d, row, i64(columns) + k])
        return None if row is None else guarded(k, size, size % KC == 0, at, a.spec.dtype)

    return a_at


def r_row(phase, units, H, u0, g, mt, half):
    """R's row for fragment row g + 8*half of m-tile mt (tile rows are gate-major, `units` units along them),
    or None for padding rows past the phase's gates."""
    r = mt * 16 + 8 * half
    gi = r // units
    if gi >= len(phase.gates):
        return None
    return i64(phase.gates[gi] * H) + tirx.min(u0 + i64(r % units) + g, i64(H - 1))


def partial_sums(cfg: MmaConfig, gates: int, scope: str = "shared"):
    """The shared buffer the k_warps' partial sums meet in (flat: keeps the padded stride)."""
    shape = (cfg.sum_slots * m_tiles(gates, cfg.units) * 16 * (cfg.rows + 1),)
    return shared_dyn(shape, F32) if scope == "shared.dyn" else T.alloc_buffer(shape, F32, scope=scope)


def block_phase(a: KernelArgs, phase, last, operand, hbuf, scratch, s, cur, nxt, cfg: MmaConfig, d, u0, n0, wy, lane,
                acc_s, a_at, a_vector: bool, shared_a: bool = False, streamed=None, unscale=None, inputs=None, x_of=None,
                b_words=None, a_regs=None):
    """One block's part of a phase: the gate rows of units u0.. by batch rows n0.. on tensor cores, then the gate
    program for each (unit, row). a_at(tiles, chunk, mt, half, v0, v): A's element (WarpTiles.load_a) or None
    for a padding row; B (h or an earlier phase's value) comes from global memory. Both kernels run it.
    shared_a: A comes from the same dynamic shared memory as acc_s (one merged buffer to TVM's sync planner), so the
    reads of A must be fenced from the first writes of partial sums here, outside the tree's branches.
    streamed: None, or (resident chunks, reduce_streamed(loader, tiles, wk, b_operand)): the chunks from there on come
    first, in a reduction loop of their own that reduce_streamed emits (loader(a_at, a_vector, first, b_shared) gives
    load_chunk(chunk, slot); b_shared(row, v0, v), where given, B's element for the pass's batch row `row` from shared
    memory instead of global; in f16x3 b_shared(row, v0, v, part), its high or low half);
    b_operand = (B's buffers (in f16x3 its high and low halves), their flat offset of (batch row, k), the pass's first
    batch row n0).
    unscale (cfg.halves): unscale(gi, u), what the epilogue multiplies the sum of gate gi's row of unit u by (the
    inverse of its scale and of B's).
    inputs (a stacked layer that projects its input in the step: recurrent_mma_wavefront): (size, a_at, a_vector,
    b_at(n, k)), a first segment of the reduction over `size` columns, A's element from a_at and B's (batch row n,
    column k) from b_at; x_of(gi, j): the input term gate gi of unit j adds in the epilogue instead of XW's.
    b_words (sync 1): (the operand's tagged half words, the 16-bit tag the phase waits for): B polled from them.
    a_regs (r_regs 1): the warp's A of every chunk of its one round, staged before the steps (a_at unused)."""
    H, N = a.spec.hidden_size, a.batch
    UB, NT, NW, KW = cfg.units, cfg.n_tiles, cfg.n_warps, cfg.k_warps
    # gate-aligned m-tiles where A is read from R by fragment (r_row); from shared memory (persistent_mma, rows placed
    # by r_row_of one by one) whole 8-row groups per phase suffice; the partial-sum tree halves k_warps
    assert (UB % 8 == 0 or shared_a) and len(phase.gates) * UB % 8 == 0 and (KW & (KW - 1) == 0 or cfg.flat_sums), cfg
    MT, NB = m_tiles(len(phase.gates), UB), cfg.rows
    chunks = -(-H // KC)
    stride = NB + 1  # shared row stride: the epilogue's threads read down a column without bank conflicts
    wn, wk = wy % i64(NW), wy // i64(NW)
    b_src = a.mirrors.get(phase.operand, operand)  # the half-precision copy where the kernel keeps one
    b_parts = (b_src, a.split_mirrors[phase.operand]) if phase.operand in a.split_mirrors else (b_src,)  # f16x3: high, low
    b_dtype = a.spec.dtype if b_words is not None else str(b_src.dtype)
    tm = tile_mode(a.spec, cfg)
    assert (unscale is not None) == (tm == "f16x3") == (len(b_parts) == 2), cfg
    tiles = WarpTiles(lane, MT, NT, tm, "float16" if tm == "f16x3" else a.spec.dtype, b_dtype, cfg.depth, bool(cfg.split_acc),
                      chunk_acc=bool(cfg.chunk_acc) and tm in ("tf32x3", "f16x3"), ra=a_regs)
    assert a_regs is None or (streamed is None and inputs is None and chunks <= KW * cfg.depth), cfg
    threads = 32 * NW * KW
    tid = wy * i64(32) + lane
    ahead = _prefetch(a, phase, hbuf, s, cur, d, u0, n0, UB, NB, threads, tid) if cfg.prefetch and x_of is None else None
    polled = None if b_words is None else _PolledB(a, phase, cur, d, n0, wn, NT, tiles, cfg.depth, *b_words)

    def loader(a_at, a_vector, first=0, b_shared=None, b_elem=None, size=H):
        b_of = b_elem or (lambda part, n, k: operand_at(b_parts[part], phase, cur, d, n, k))

        def load_chunk(ck, slot):
            ck = ck + i64(first) if first else ck

            def b_at(nt, k, part=0):
                n = tirx.min(n0 + (wn * i64(NT) + i64(nt)) * i64(8) + tiles.g, N - 1)  # rows past N: never stored
                return guarded(ck * i64(KC) + k, size, size % KC == 0, lambda k: b_of(part, n, k), b_dtype)

            if a_regs is None:
                tiles.load_a(lambda mt, half, v0, v, *part: a_at(tiles, ck, mt, half, v0, v, *part), a_vector, slot)
            if polled is not None:
                polled.load(ck, slot)
            elif b_shared is None:
                tiles.load_b(b_at, size % KC == 0, slot)
            else:
                tiles.load_b_parts(lambda nt, v0, v, *part: b_shared((wn * i64(NT) + i64(nt)) * i64(8) + tiles.g, v0, v, *part), True, slot)

        return load_chunk

    if inputs is not None:  # W's columns times the layer below's h first, into the same accumulators
        size, a_in, a_in_vector, b_in = inputs
        chunk_rounds(-(-size // KC), KW, cfg.depth, wk, loader(a_in, a_in_vector, b_elem=lambda part, n, k: b_in(n, k), size=size),
                     tiles.multiply)
    if streamed is None:
        chunk_rounds(chunks, KW, cfg.depth, wk, loader(a_at, a_vector), tiles.multiply, polled and polled.settle)
    else:
        # the L2 chunks first: their loads wait longest, and the shared-memory ones then run back to back
        resident, reduce_streamed = streamed
        reduce_streamed(loader, tiles, wk, (b_parts, lambda n, k: b_src.offset_of(operand_index(phase, cur, d, n, k))[0], n0))
        if resident:
            chunk_rounds(resident, KW, cfg.depth, wk, loader(a_at, a_vector), tiles.multiply)
    tiles.finish()
    if shared_a:
        block_sync()

    _sum_partials(tiles, acc_s, wn, wk, cfg, MT, stride)
    _gate_programs(a, phase, last, hbuf, scratch, s, cur, nxt, d, u0, n0, cfg, acc_s, stride, tid, ahead, unscale, x_of)


class _PolledB:
    """B from the operand's tagged half words (step_sync): a round's loads issued together (load), then the round's
    words polled together until they carry the phase's tag, and unpacked into the tiles' B registers (settle). Whole
    chunks only."""

    def __init__(self, a: KernelArgs, phase, cur, d, n0, wn, NT: int, tiles: WarpTiles, depth: int, words, tag16):
        self.a, self.phase, self.cur, self.d, self.tiles, self.words, self.tag16 = a, phase, cur, d, tiles, words, tag16
        self.rows = [tirx.min(n0 + (wn * i64(NT) + i64(nt)) * i64(8) + tiles.g, a.batch - 1) for nt in range(NT)]  # past N: never stored
        self.raw = T.alloc_buffer((depth, NT, 8), step_sync.HALF_WORD, scope="local")

    def _at(self, ck, slot, nt):
        idx = operand_index(self.phase, self.cur, self.d, self.rows[nt], ck * i64(KC) + self.tiles.t * i64(8))
        return tirx.address_of(self.raw[i64(slot), i64(nt), i64(0)]), idx

    def load(self, ck, slot):
        for nt in range(len(self.rows)):
            dst, idx = self._at(ck, slot, nt)
            step_sync.load8(dst, self.words, idx)

    def settle(self, round_):
        """Wait for the round's words together (step_sync.settle_runs), then unpack each chunk's into B's registers."""
        runs = [(ck, slot, nt, valid) for ck, slot, valid in round_ for nt in range(len(self.rows))]  # raw's order
        bit = lambda k: tirx.IntImm(step_sync.HALF_WORD, 1 << k)  # noqa: E731
        mask = tirx.IntImm(step_sync.HALF_WORD, sum(1 << k for k, run in enumerate(runs) if run[3] is True))
        for k, (_, _, _, valid) in enumerate(runs):
            if valid is not True:
                mask = mask + tirx.Select(valid, bit(k), tirx.IntImm(step_sync.HALF_WORD, 0))
        step_sync.settle_runs(tirx.address_of(self.raw[i64(0), i64(0), i64(0)]), self.words,
                              [self._at(ck, slot, nt)[1] for ck, slot, nt, _ in runs], mask, self.tag16)
        for ck, slot, nt, valid in runs:
            emit_if(valid, lambda slot=slot, nt=nt: self._unpack(slot, nt), valid is True)

    def _unpack(self, slot, nt):
        for v in range(8):
            bits = tirx.bitwise_and(self.raw[i64(slot), i64(nt), i64(v)], tirx.IntImm(step_sync.HALF_WORD, 0xFFFF))
            T.buffer_store(self.tiles.rb, tirx.reinterpret(self.a.spec.dtype, bits.astype("uint16")), [i64(slot), i64(nt), i64(v)])


def _sum_partials(tiles, acc_s, wn, wk, cfg: MmaConfig, MT: int, stride: int):
    """The k_warps' partial sums meet in shared memory (acc_s, rows `stride` apart) as a tree: each round the upper half
    of the k-slices hands its tiles to the lower half (a write, a barrier, a read: TVM's sync planner refuses a
    read-modify-write of shared memory inside a branch), in a fixed order, so runs are bit-identical; k-slice 0 stores
    the sums. With flat_sums each k-slice stores its tiles in a slot of its own behind one barrier, and the gate
    program adds the slots in order."""
    NT, KW = cfg.n_tiles, cfg.k_warps

    def tile_slots(slot):
        for ci in tiles.accumulators():
            col = wn * i64(NT * 8) + tiles.col(ci)
            yield ci, (slot * i64(MT * 16) + tiles.row(ci)) * i64(stride) + col

    if cfg.flat_sums:
        for ci, si in tile_slots(wk):
            T.buffer_store(acc_s, tiles.c[ci], [si])
        block_sync()
        return
    half = KW
    while half > 1:
        half //= 2
        emit_if(tirx.all(wk >= i64(half), wk < i64(2 * half)),
                lambda: [T.buffer_store(acc_s, tiles.c[ci], [si]) for ci, si in tile_slots(wk - i64(half))])
        block_sync()
        emit_if(wk < i64(half), lambda: [T.buffer_store(tiles.c, tiles.c[ci] + acc_s[si], ci) for ci, si in tile_slots(wk)])
        block_sync()
    emit_if(wk == i64(0), lambda: [T.buffer_store(acc_s, tiles.c[ci], [si]) for ci, si in tile_slots(i64(0))])
    block_sync()


def _gate_programs(a: KernelArgs, phase, last, hbuf, scratch, s, cur, nxt, d, u0, n0, cfg: MmaConfig, acc_s, stride: int, tid,
                   ahead, unscale, x_of=None):
    """The gate program for each (unit, batch row) of the block, the recurrent terms from the sums in acc_s; the input
    terms and carried states from `ahead` (_prefetch's registers), the input terms else from x_of(gi, j) or XW."""
    H, N, UB, NB = a.spec.hidden_size, a.batch, cfg.units, cfg.rows
    threads = 32 * cfg.n_warps * cfg.k_warps

    def rec(gi, u, total):  # the recurrent term: the tiles' sum, in f16x3 with both rows' scales divided out
        return total if unscale is None else total * unscale(gi, u)

    slot = m_tiles(len(phase.gates), UB) * 16 * stride  # flat_sums: the k-warps' slots (_sum_partials), added in order

    def summed(at):
        total = acc_s[at]
        for k in range(1, cfg.k_warps if cfg.flat_sums else 1):
            total = total + acc_s[at + i64(k * slot)]
        return total

    for it in range(-(-UB * NB // threads)):
        e = i64(it * threads) + tid
        u, b = e % i64(UB), e // i64(UB)  # consecutive threads: consecutive units (coalesced Y stores)
        n, j = n0 + b, u0 + u
        with T.If(tirx.all(e < i64(UB * NB), n < N, j < i64(H))):
            with T.Then():
                epilogue(a, phase, last, hbuf, scratch, s, cur, nxt, d, n, j,
                         lambda gi, u=u, b=b: rec(gi, u, summed((i64(gi * UB) + u) * i64(stride) + b)),
                         **({"x": lambda gi, j=j: x_of(gi, j)} if x_of is not None else
                            {} if ahead is None else {"x": lambda gi, it=it: ahead[0][i64(it), i64(gi)],
                                                      "state": _ahead_states(a, hbuf, cur, d, n, j, ahead[1], it)}))


def _ahead_states(a: KernelArgs, hbuf, cur, d, n, j, c, it) -> dict:
    """The carried states of item `it` for the gate program: c as _prefetch loaded it (where the cell has one), h read
    in place."""
    state = carried_states(a, hbuf, cur, d, n, j)
    return state if c is None else {**state, "c": c[i64(it)]}


def _prefetch(a: KernelArgs, phase, hbuf, s, cur, d, u0, n0, UB, NB, threads, tid):
    """The XW values and cell state each epilogue thread will need (its (unit, row) pairs, the phase's gates), loaded
    into registers now, so their latency hides behind the reduction: (xw, c or None). The cell state is safe to read
    early: the thread that finishes (unit, row) wrote it the step before (or a barrier since), and this step writes it
    only in its epilogue. h stays where the program reads it (loaded ahead too, GRU's steps ran 0-2% slower). Pairs
    past the edges load a clamped element they never use."""
    H, N = a.spec.hidden_size, a.batch
    items = -(-UB * NB // threads)
    xw = T.alloc_buffer((items, len(phase.gates)), F32, scope="local")
    c = T.alloc_buffer((items,), F32, scope="local") if a.Yc is not None else None
    for it in range(items):
        e = i64(it * threads) + tid
        n, j = tirx.min(n0 + e // i64(UB), N - 1), tirx.min(u0 + e % i64(UB), i64(H - 1))
        load_xw_ahead(a, phase, s, d, n, j, xw, [i64(it)])
        if c is not None:
            T.buffer_store(c, carried_states(a, hbuf, cur, d, n, j)["c"], [i64(it)])
    return xw, c
