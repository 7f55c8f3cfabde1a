"""The persistent recurrent kernel for CUDA: one launch runs the whole sequence with R resident in shared memory.

The grid is one wave of blocks, launched cooperatively, split evenly between the directions;
each block owns a contiguous slice of one direction's hidden units. It loads the rows of R for
all gates of its units into shared memory once. Then per step and phase, for each chunk of
`batch_tile` batch rows, its warps compute their units' gates (warp_gates: weights from shared
memory, h[t-1] or a value an earlier phase stored from L2, or, with `stage_h`, staged in shared
memory first), apply the gate program and write h[t]; the grid meets at a barrier before the
next step, or (`sync` 1) each block publishes h[t] as words tagged with the step and the next step
polls the words it reads (step_sync). The cell state stays with the unit that owns it. Sequence length and batch are
runtime sizes. The defaults (one row at a time; h staged from H = 1024, from L2 below) measured fastest at the
small batches this kernel is chosen for (docs/decisions.md).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from tvm import tirx
from tvm.backend.cuda import op as cuda_op
from tvm.script.ir_builder import tirx as T

from .cells import Cell
from .device import Device
from .layer import RNNLayerSpec

from .recurrent_common import KernelArgs, block_sync, i64, load_xw_ahead, step_phases, store_operand, shared_dyn
from .recurrent_cuda import cuda_prim_func, epilogue, operand_at, operand_index, vector_width, weight_bytes
from . import step_sync
from .warp_gemv import warp_gates

F32 = "float32"
R_LAYOUT = "rows"


@dataclass(frozen=True)
class PersistentConfig:
    blocks: int = 132
    warps: int = 8
    batch_tile: int = 1  # batch rows computed together (each weight read serves them all)
    # stage the tile's rows of h in shared memory (one L2 read per block instead of one per warp): default_config sets it
    # from STAGE_H_MIN_HIDDEN
    stage_h: bool = False
    # each finishing lane loads its row's XW values before the reduction, so their latency (an L2 or HBM read) overlaps
    # the reduction's instead of following it on every step's critical path
    prefetch: int = 0
    # how a step waits for the last one's h: 0 a grid barrier, 1 polling h's words tagged with their step (step_sync)
    sync: int = 0

    def grid(self, spec: RNNLayerSpec) -> int:
        return spec.num_directions * self.blocks_per_direction(spec)

    def blocks_per_direction(self, spec: RNNLayerSpec) -> int:
        return max(1, min(self.blocks // spec.num_directions, spec.hidden_size))

    def units_per_block(self, spec: RNNLayerSpec) -> int:
        return -(-spec.hidden_size // self.blocks_per_direction(spec))

    def smem_bytes(self, spec: RNNLayerSpec, cell: Cell) -> int:
        staged = self.batch_tile * 4 if self.stage_h else 0
        return (self.units_per_block(spec) * cell.gates * weight_bytes(spec) + staged) * spec.hidden_size


# hidden sizes from which the default stages h in shared memory (below, with few units a block, staging lost)
STAGE_H_MIN_HIDDEN = 1024


# R of one direction up to this size runs in one block per direction: its steps are then separated by a block barrier
# (tens of ns) instead of a grid barrier (about 1.1 us on an H100), and reading R from shared memory each step costs
# less than that barrier
ONE_BLOCK_MAX_R_BYTES = 64 * 1024
# such a block runs a warp per unit, up to 32: a warp walks its units one after another, each an L2 round trip for h
ONE_BLOCK_WARPS = 32


def default_config(spec: RNNLayerSpec, device: Device) -> PersistentConfig:
    """One block per SM: the grid is one co-resident wave (a module records it, and loading checks the GPU has as many);
    a small layer gets one block per direction."""
    if spec.gates * spec.hidden_size ** 2 * weight_bytes(spec) <= ONE_BLOCK_MAX_R_BYTES:
        return PersistentConfig(blocks=spec.num_directions, warps=min(ONE_BLOCK_WARPS, spec.hidden_size))
    return PersistentConfig(blocks=device.sm_count, stage_h=spec.hidden_size >= STAGE_H_MIN_HIDDEN)


def fits(spec: RNNLayerSpec, cell: Cell, device: Device, blocks: int | None = None) -> bool:
    """Whether R of this layer (all directions) fits in shared memory across one wave of `blocks` blocks."""
    cfg = default_config(spec, device)
    if blocks is not None:
        cfg = dataclasses.replace(cfg, blocks=blocks)
    return cfg.smem_bytes(spec, cell) <= device.smem_limit


def _grid_sync():
    T.evaluate(cuda_op.cuda_grid_sync())


def recurrent_kernel_persistent(spec: RNNLayerSpec, cell: Cell, cfg: PersistentConfig) -> tirx.PrimFunc:
    return cuda_prim_func(spec, cell, lambda a: persistent_body(a, cfg))


def _strided(count, threads, tid, body):
    """The block's threads walk `count` items (count may be symbolic)."""
    with T.serial(0, tirx.ceildiv(i64(count) if isinstance(count, int) else count, i64(threads))) as it:
        e = it * i64(threads) + tid
        with T.If(e < (i64(count) if isinstance(count, int) else count)):
            with T.Then():
                body(e)


def _each_unit_row(a: KernelArgs, j0, units: int, threads: int, tid, body):
    """body(n, j) for the block's units j0.. below H and every batch row, spread over the block's threads."""
    N, H = a.batch, a.spec.hidden_size

    def item(e):
        j, n = j0 + e // N, e % N
        with T.If(j < i64(H)):
            with T.Then():
                body(n, j)

    _strided(i64(units) * N, threads, tid, item)


def initial_states(a: KernelArgs, hbuf, d, j0, units: int, threads: int, tid, words=None):
    """The block's units j0..: h0 into hbuf[0], c0 into Yc (zeros where the node has none). With tagged words (sync 1),
    h0 goes out with tag 0 and every other word of the block's units is made INVALID: what an earlier launch left
    there can never pass for a step of this one (the grid barrier after this makes it so everywhere)."""

    def init(n, j):
        a.published = {"h": (words["h"], step_sync.tag_of(0))} if words else {}
        store_operand(a, "h", hbuf, a.initial("h", d, n, j), [i64(0), d, n, j])
        if a.Yc is not None:
            T.buffer_store(a.Yc, a.initial("c", d, n, j), a.state_index(d, n, j))
        for name, buf in (words or {}).items():
            idx = [i64(1), d, n, j] if name == "h" else [d, n, j]
            step_sync.publish(buf, idx, tirx.const(0.0, F32), step_sync.invalid())

    _each_unit_row(a, j0, units, threads, tid, init)


def final_states(a: KernelArgs, hbuf, d, j0, units: int, threads: int, tid):
    """The block's units j0..: the last hidden state into Yh."""
    _each_unit_row(a, j0, units, threads, tid,
                   lambda n, j: T.buffer_store(a.Yh, hbuf[a.seq % 2, d, n, j], a.state_index(d, n, j)))


def persistent_body(a: KernelArgs, cfg: PersistentConfig):
    """One cooperative launch: R slices into shared memory, initial states, then steps separated by grid barriers, or
    (sync 1) by each step polling the words of the last one's operand (step_sync)."""
    spec, cell = a.spec, a.cell
    H, D, G = spec.hidden_size, spec.num_directions, cell.gates
    BPD, UPB, W, NB = cfg.blocks_per_direction(spec), cfg.units_per_block(spec), cfg.warps, cfg.batch_tile
    V = vector_width(spec, H)
    threads = W * 32
    N = a.batch
    hbuf = T.alloc_buffer((2, D, N, H), F32)
    scratch = {v: T.alloc_buffer((D, N, H), F32) for v in cell.stored_values}
    words = _tagged_words(a) if cfg.sync else None
    with T.thread_binding(0, i64(D * BPD), "blockIdx.x") as bx:
        with T.thread_binding(0, i64(W), "threadIdx.y") as ty:
            with T.thread_binding(0, i64(32), "threadIdx.x") as lane:
                tid = ty * i64(32) + lane
                d, j0 = bx // i64(BPD), bx % i64(BPD) * i64(UPB)  # the block's direction and first unit
                wsm = shared_dyn((UPB, G, H), spec.dtype)
                hs = shared_dyn((NB, H), F32) if cfg.stage_h else None

                def load_weights(e):
                    u, g, k = e // i64(G * H), e // i64(H) % i64(G), e % i64(H)
                    T.buffer_store(wsm, a.R[d, g * i64(H) + tirx.min(j0 + u, i64(H - 1)), k], [u, g, k])

                _strided(UPB * G * H, threads, tid, load_weights)
                # written here, not left to the sync planner, which cannot place barriers under the batch dispatch
                block_sync()

                # a block that holds its direction's every unit waits for its own threads only (directions are independent)
                step_barrier = block_sync if BPD == 1 else _grid_sync
                initial_states(a, hbuf, d, j0, UPB, threads, tid, words)
                step_barrier()

                def phase_step(_pi, phase, last, operand, s, cur, nxt):
                    tagged = _StepWords(a, words, phase, s, cur, d) if words else None
                    with T.serial(0, tirx.ceildiv(N, i64(NB))) as chunk:
                        n0 = chunk * i64(NB)

                        if cfg.stage_h:  # only the rows that exist, float4 at a time, no index division
                            for b in range(NB):
                                with T.If(n0 + i64(b) < N):
                                    with T.Then():
                                        _stage_row(hs, operand, phase, cur, d, n0 + i64(b), b, H, threads, tid, tagged)
                            block_sync()
                            h_at, h_vec = (lambda _u, b, k: hs[i64(b), k]), None  # noqa: E731
                        else:
                            h_at = lambda _u, b, k, n0=n0: operand_at(operand, phase, cur, d, tirx.min(n0 + i64(b), N - 1), k)  # noqa: E731
                            h_vec = tagged and (lambda b, k, width, n0=n0: tagged.wait(tirx.min(n0 + i64(b), N - 1), k, width))  # noqa: E731
                        _chunk_gates(a, cfg, phase, last, hbuf, scratch, s, cur, nxt, lane, ty, wsm, h_at, d, j0, n0, V, h_vec, tagged)
                        if cfg.stage_h:
                            block_sync()  # hs is restaged by the next chunk
                    if not words:
                        step_barrier()

                step_phases(a, hbuf, scratch, phase_step)

                if words:
                    block_sync()  # the last h of the block's units, which other threads of it wrote
                final_states(a, hbuf, d, j0, UPB, threads, tid)
    a.published = {}


def _tagged_words(a: KernelArgs) -> dict:
    """The words each operand a phase multiplies is published in (step_sync): h double-buffered by the step's parity,
    a value an earlier phase of the same step stored (GRU's r*h) in one buffer (step_sync's docstring says why)."""
    D, N, H = a.spec.num_directions, a.batch, a.spec.hidden_size
    names = dict.fromkeys(p.operand for p in a.cell.phases)
    return {name: step_sync.alloc_words((2, D, N, H) if name == "h" else (D, N, H)) for name in names}


class _StepWords:
    """One phase of step s with tagged words: what store_operand publishes (h of step s goes out with tag s + 1, a
    value stored for a later phase with tag s) and the wait for the operand the phase multiplies."""

    def __init__(self, a: KernelArgs, words: dict, phase, s, cur, d):
        a.published = {name: (buf, step_sync.tag_of(s + 1) if name == "h" else step_sync.tag_of(s)) for name, buf in words.items()}
        self.operand, self.phase, self.cur, self.d, self.tag = words[phase.operand], phase, cur, d, step_sync.tag_of(s)
        self.a, self.s, self.stored = a, s, [(words[v], v) for v in phase.stores if v in words]

    def publish_past_end(self, n, j):
        """A step past row n's sequence runs no phase program but the last one's padding rule, yet a later phase of it
        polls what this one stores: those words go out with the step's tag all the same (their value unused)."""
        if self.stored:
            with T.If(self.s >= self.a.length(n)):
                with T.Then():
                    for buf, _ in self.stored:
                        step_sync.publish(buf, [self.d, n, j], tirx.const(0.0, F32), self.tag)

    def wait(self, n, k, width):
        return step_sync.wait(self.operand, operand_index(self.phase, self.cur, self.d, n, k), self.tag, width)


def _stage_row(hs, operand, phase, cur, d, n, b, H, threads, tid, tagged=None):
    V = 4 if H % 4 == 0 else 1
    with T.serial(0, i64(-(-H // (threads * V)))) as it:
        k0 = (it * i64(threads) + tid) * i64(V)
        with T.If(k0 < i64(H)):
            with T.Then():
                if tagged is not None:  # the row's words, polled until they hold step s's values
                    T.buffer_store(hs, tagged.wait(n, k0, V), [i64(b), tirx.Ramp(k0, i64(1), V) if V > 1 else k0])
                else:
                    with T.vectorized(0, i64(V)) as v:
                        T.buffer_store(hs, operand_at(operand, phase, cur, d, n, k0 + v), [i64(b), k0 + v])


def _chunk_gates(a, cfg, phase, last, hbuf, scratch, s, cur, nxt, lane, ty, wsm, h_at, d, j0, n0, V, h_vec=None, tagged=None):
    """Each warp: all gates of its units for the staged batch rows, then the gate program per (unit, row). tagged: the
    step's words (sync 1), h_vec their wait where the warp reads them itself."""
    H, N, W, NB, UPB = a.spec.hidden_size, a.batch, cfg.warps, cfg.batch_tile, cfg.units_per_block(a.spec)
    for slot in range(-(-UPB // W)):
        u = i64(slot * W) + ty
        j = j0 + u
        with T.If(tirx.all(u < i64(UPB), j < i64(H))):  # warp-uniform: shuffles stay safe
            with T.Then():

                xw = _prefetch_xw(a, phase, s, d, n0, j, lane, NB) if cfg.prefetch else None

                def finish(_u, b, rec, j=j, xw=xw):
                    n = n0 + i64(b)
                    with T.If(n < N):
                        with T.Then():
                            epilogue(a, phase, last, hbuf, scratch, s, cur, nxt, d, n, j, rec,
                                     **({} if xw is None else {"x": lambda gi: xw[i64(gi)]}))
                            if tagged is not None and not last:
                                tagged.publish_past_end(n, j)

                warp_gates(lane, H, phase.gates, 1, NB, V, h_at=h_at, w_at=lambda _u, g, k, u=u: wsm[u, i64(g), k],
                           finish=finish, row_valid=(lambda b: n0 + i64(b) < N) if NB > 1 else None, h_vec=h_vec)


def _prefetch_xw(a: KernelArgs, phase, s, d, n0, j, lane, NB: int):
    """The XW values of unit j that lane b (the lane warp_gates finishes batch row n0+b in) will need, loaded now. Lanes
    past the tile and rows past the batch load a clamped row they never use."""
    xw = T.alloc_buffer((len(phase.gates),), F32, scope="local")
    load_xw_ahead(a, phase, s, d, tirx.min(n0 + tirx.min(lane, i64(NB - 1)), a.batch - 1), j, xw, [])
    return xw
