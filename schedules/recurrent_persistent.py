"""The persistent recurrent kernel for CUDA: one launch runs the whole sequence with R resident in shared memory.

The grid is one wave of P blocks, launched cooperatively. The D*H (direction, unit) pairs are
split into P contiguous slices; a block loads the rows of R for all gates of its units into
shared memory once, then per step and phase its warps compute their units' gates for every
batch row (warp_gates: weights from shared memory, h[t-1] from L2), apply the gate program,
write their slice of h[t], and the grid meets at a barrier. Both directions run in the same
launch. The sequence length stays a runtime argument.
"""

from __future__ import annotations

from dataclasses import dataclass

from tvm import tirx
from tvm.backend.cuda import op as cuda_op
from tvm.script.ir_builder import tirx as T

from tvmrnn.cells import Cell
from tvmrnn.layer import RNNLayerSpec

from .recurrent_common import KernelArgs, i64
from .recurrent_cuda import cuda_prim_func, epilogue, operand_at
from .warp_gemv import warp_gates

F32 = "float32"
TRANSPOSED_R = False
# streaming multiprocessors per architecture: the grid must be one co-resident wave
SM_COUNT = {"sm_90": 132, "sm_90a": 132, "sm_80": 108, "sm_86": 84, "sm_89": 128, "sm_87": 16}
SMEM_BUDGET = 200 * 1024  # bytes of shared memory per block we allow for weights (227 KB on sm_90, 163 KB on sm_80)


@dataclass(frozen=True)
class PersistentConfig:
    blocks: int = 132
    warps: int = 8
    batch_tile: int = 1  # it runs small batches only: a wider tile computes clamped duplicate rows at batch 1
    vector: int = 4

    def units_per_block(self, spec: RNNLayerSpec) -> int:
        return -(-spec.num_directions * spec.hidden_size // self.blocks)


def default_config(spec: RNNLayerSpec, arch: str) -> PersistentConfig:
    sms = SM_COUNT.get(arch, 108)
    return PersistentConfig(blocks=min(sms, spec.num_directions * spec.hidden_size))


def weight_bytes_per_block(spec: RNNLayerSpec, cell: Cell, cfg: PersistentConfig, itemsize: int = 4) -> int:
    return cfg.units_per_block(spec) * cell.gates * spec.hidden_size * itemsize


def fits(spec: RNNLayerSpec, cell: Cell, arch: str) -> bool:
    """Whether R of this layer (all directions) fits in shared memory across one wave of blocks."""
    budget = SMEM_BUDGET if arch.startswith("sm_9") else 150 * 1024
    return weight_bytes_per_block(spec, cell, default_config(spec, arch)) <= budget


def _grid_sync():
    T.evaluate(cuda_op.cuda_grid_sync())


def recurrent_kernel_persistent(spec: RNNLayerSpec, cell: Cell, cfg: PersistentConfig) -> tirx.PrimFunc:
    return cuda_prim_func(spec, cell, lambda a: persistent_body(a, cfg))


def persistent_body(a: KernelArgs, cfg: PersistentConfig):
    """One cooperative launch: load R slices, initial states, barrier; per step and phase: gates, barrier; final h."""
    spec, cell = a.spec, a.cell
    H, D, G = spec.hidden_size, spec.num_directions, cell.gates
    UPB, W, NB = cfg.units_per_block(spec), cfg.warps, cfg.batch_tile
    P = -(-D * H // UPB)  # no empty blocks
    V = cfg.vector if H % cfg.vector == 0 else 1
    threads = W * 32
    N = a.batch
    hbuf = T.alloc_buffer((2, D, N, H), F32)
    scratch = {v: T.alloc_buffer((D, N, H), F32) for v in cell.stored_values}
    with T.thread_binding(0, i64(P), "blockIdx.x") as bx:
        with T.thread_binding(0, i64(W), "threadIdx.y") as ty:
            with T.thread_binding(0, i64(32), "threadIdx.x") as lane:
                tid = ty * i64(32) + lane
                wsm = T.alloc_buffer((UPB, G, H), F32, scope="shared.dyn")

                def unit(u):
                    q = tirx.min(bx * i64(UPB) + u, i64(D * H - 1))
                    return q // i64(H), q % i64(H), bx * i64(UPB) + u < i64(D * H)

                # 1. this block's rows of R into shared memory, once
                with T.serial(0, i64(-(-UPB * G * H // threads))) as it:
                    e = it * i64(threads) + tid
                    with T.If(e < i64(UPB * G * H)):
                        with T.Then():
                            u, g, k = e // i64(G * H), e // i64(H) % i64(G), e % i64(H)
                            d, j, _ = unit(u)
                            T.buffer_store(wsm, a.R[d, g * i64(H) + j, k], [u, g, k])
                # the block's weights are in shared memory before anyone reads them (written here, not left to
                # the sync planner, which cannot place a barrier under the batch dispatch's condition)
                T.evaluate(tirx.op.tvm_storage_sync("shared"))
                # 2. initial states of this block's units
                with T.serial(0, tirx.ceildiv(i64(UPB) * N, i64(threads))) as it:
                    e = it * i64(threads) + tid
                    u, n = e // N, e % N
                    d, j, ok = unit(u)
                    with T.If(tirx.all(e < i64(UPB) * N, ok)):
                        with T.Then():
                            T.buffer_store(hbuf, a.initial("h", d, n, j), [i64(0), d, n, j])
                            if a.Yc is not None:
                                T.buffer_store(a.Yc, a.initial("c", d, n, j), a.state_index(d, n, j))
                _grid_sync()
                # 3. the sequence
                with T.serial(0, a.seq) as s:
                    cur, nxt = s % 2, (s + 1) % 2
                    for pi, phase in enumerate(cell.phases):
                        last = pi == len(cell.phases) - 1
                        operand = hbuf if phase.operand == "h" else scratch[phase.operand]
                        for slot in range(-(-UPB // W)):
                            u = i64(slot * W) + ty
                            d, j, ok = unit(u)
                            with T.If(tirx.all(u < i64(UPB), ok)):  # warp-uniform: shuffles stay safe
                                with T.Then():
                                    _unit_all_rows(a, phase, last, operand, hbuf, scratch, s, cur, nxt,
                                                   lane, wsm, u, d, j, NB, V)
                        _grid_sync()
                # 4. final hidden state of this block's units
                with T.serial(0, tirx.ceildiv(i64(UPB) * N, i64(threads))) as it:
                    e = it * i64(threads) + tid
                    u, n = e // N, e % N
                    d, j, ok = unit(u)
                    with T.If(tirx.all(e < i64(UPB) * N, ok)):
                        with T.Then():
                            T.buffer_store(a.Yh, hbuf[a.seq % 2, d, n, j], a.state_index(d, n, j))


def _unit_all_rows(a, phase, last, operand, hbuf, scratch, s, cur, nxt, lane, wsm, u, d, j, NB, V):
    """One warp: all gates of unit (d, j) for every batch row, NB rows at a time."""
    H, N = a.spec.hidden_size, a.batch
    with T.serial(0, tirx.ceildiv(N, i64(NB))) as bt:
        n0 = bt * i64(NB)

        def h_at(_u, b, k):
            return operand_at(operand, phase, cur, d, tirx.min(n0 + i64(b), N - 1), k)

        def w_at(_u, g, k):
            return wsm[u, i64(g), k]

        def finish(_u, b, rec):
            n = n0 + i64(b)
            with T.If(n < N):
                with T.Then():
                    epilogue(a, phase, last, hbuf, scratch, s, cur, nxt, d, n, j, rec)

        warp_gates(lane, H, phase.gates, 1, NB, V, h_at, w_at, finish)
