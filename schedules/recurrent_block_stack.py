"""One thread block runs a whole small stack of layers: every layer's [W | R] in shared memory, the block's warps split
among the layers, layer l one step behind layer l-1 (the wavefront's order), block barriers between steps.

For a stack whose weights fit one SM (madmom's onset detector: three layers of 25 units), the wavefront's grid
barrier (about 1.1 us a step on an H100) and the input GEMM before it cost more than the arithmetic of a step. Here
the first layer too multiplies [x_t; h_t-1] by its [W | R] rows inside the step (recurrent_wavefront's higher
layers), reading X itself, so the stack is one launch. A global step s: every layer l with t = s - l in range stages
[its input at t; its h at t-1] into its own part of shared memory, a barrier, each layer's warps compute their units'
gates and gate program (the input of layer l is layer l-1's h at t, written at step s-1), a barrier. h stays in shared memory
(reads only while staging, so the step's writes need no other barrier); Y goes out to global memory.

Applies to RNN stacks (one gate a unit) where every layer runs forward in layout 0 (recurrent_wavefront.stackable),
without sequence_lens, at small batches (rows run one after another), with few enough weights for one SM.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tvm import tirx
from tvm.script.ir_builder import IRBuilder
from tvm.script.ir_builder import tirx as T

from .device import Device
from .recurrent_common import KernelArgs, block_sync, i64, shared_dyn, store_unseen
from .recurrent_cuda import epilogue, vector_width, weight_bytes
from .recurrent_persistent import _strided, final_states, initial_states
from .recurrent_wavefront import load_rows, reduction, rows_per_unit, stackable
from .warp_gemv import warp_gates

F32 = "float32"
MAX_WARPS = 32  # a block of 1024 threads
MAX_BATCH = 4  # rows run one after another: past a few, the wavefront's blocks on many SMs win
# weights one SM reads a step (every layer's [W | R], once per batch row): past about this many, one SM's step takes
# as long as the wavefront's step across many SMs with its grid barrier (about 1.1 us on an H100)
MAX_STEP_ELEMENTS = 16384
MAX_UNITS = 8  # units a warp computes at once


@dataclass(frozen=True)
class BlockStackConfig:
    warps: tuple[int, ...]  # warps per layer, in layer order
    units: int  # units a warp computes at once (warp_gates' UW): loads of h shared, their sums independent

    @property
    def threads(self) -> int:
        return 32 * sum(self.warps)


def refusal(specs, cells) -> str | None:
    """Why the stack cannot run in one block (None: it can, if its weights fit: plan). LSTM and GRU stacks, which it
    ran correctly, took longer a step than the wavefront at every size measured (docs/decisions.md): their rounds are
    four gates' sums and, for LSTM, c's round trip through global memory."""
    for i, (s, c) in enumerate(zip(specs, cells)):
        why = stackable(s, c, i == 0)
        if why:
            return why
        if c.gates != 1:
            return f"{s.op} cell (a block stack runs one-gate cells: RNN)"
        if s.has("sequence_lens"):
            return "sequence_lens (a block stack runs every sequence to the end)"
    return None


def _row_elements(spec, cell) -> int:
    return rows_per_unit(cell, False) * spec.hidden_size * reduction(spec, False)


def plan(specs, cells, device: Device, batch: int = 1) -> BlockStackConfig | None:
    """The fewest units a warp such that every layer's units take one round of the block's warps (a round's latency,
    the dot product, the warp's sum and the gate program, is what a step waits for); None where no such split fits, a
    step's weights are more than one SM should read (MAX_STEP_ELEMENTS for `batch` rows) or do not fit one block's
    shared memory."""
    elements = sum(_row_elements(s, c) for s, c in zip(specs, cells))
    staged = 4 * sum(reduction(s, False) + 2 * MAX_BATCH * s.hidden_size for s in specs)
    if elements * batch > MAX_STEP_ELEMENTS or elements * weight_bytes(specs[0]) + staged > device.smem_limit:
        return None
    for units in range(1, MAX_UNITS + 1):
        warps = tuple(-(-s.hidden_size // units) for s in specs)
        if sum(warps) <= MAX_WARPS:
            return BlockStackConfig(warps, units)
    return None


def block_stack_prim_func(specs, cells, cfg: BlockStackConfig) -> tirx.PrimFunc:
    """PrimFunc(X; each layer's WR, bias, [h0, c0], [params]; then each layer's Y, Yh, [Yc]), seq and batch symbolic."""
    layers = [KernelArgs(s, c) for s, c in zip(specs, cells)]
    for a in layers[1:]:
        a.seq, a.batch = layers[0].seq, layers[0].batch
    for a in layers:  # h's stores out of TVM's barrier planner's sight: the step's own barriers order them
        a.shared = {"h": store_unseen}
    first = layers[0]
    with IRBuilder() as ib:
        with T.prim_func():
            T.func_name("rnn_block_stack")
            T.func_attr({"tirx.noalias": True})
            X = T.arg("X", T.Buffer((first.seq, first.batch, specs[0].input_size), specs[0].dtype))
            for i, a in enumerate(layers):
                a.declare_inputs("rows", specs[i].dtype, prefix=f"l{i}_", stacked_rows=rows_per_unit(a.cell, False))
            for i, a in enumerate(layers):
                a.declare_outputs(prefix=f"l{i}_")
            _body(X, layers, cfg)
    return ib.get()


def _offsets(sizes) -> list[int]:
    return [sum(sizes[:i]) for i in range(len(sizes))]


def _body(X, layers: list[KernelArgs], cfg: BlockStackConfig):
    L, N, seq = len(layers), layers[0].batch, layers[0].seq
    specs = [a.spec for a in layers]
    ks = [reduction(s, False) for s in specs]
    rows = [_row_elements(a.spec, a.cell) for a in layers]
    row_at, stage_at, warp_at = _offsets(rows), _offsets(ks), _offsets(list(cfg.warps))
    threads = cfg.threads
    with T.thread_binding(0, i64(1), "blockIdx.x"):
        with T.thread_binding(0, i64(sum(cfg.warps)), "threadIdx.y") as ty:
            with T.thread_binding(0, i64(32), "threadIdx.x") as lane:
                tid = ty * i64(32) + lane
                wsm = shared_dyn((sum(rows),), specs[0].dtype)
                # each layer's [input; h], staged once a step, then each layer's h at t-1 and t for every row (batch <=
                # MAX_BATCH), read only while staging
                state_at = _offsets([sum(ks)] + [2 * MAX_BATCH * s.hidden_size for s in specs])
                hs = shared_dyn((state_at[-1] + 2 * MAX_BATCH * specs[-1].hidden_size,), F32)
                hbufs = [T.decl_buffer((2, 1, MAX_BATCH, s.hidden_size), F32, data=hs.data, elem_offset=state_at[i + 1],
                                       scope="shared.dyn") for i, s in enumerate(specs)]
                for i, a in enumerate(layers):
                    load_rows(a, wsm, i64(0), a.spec.hidden_size, ks[i], rows_per_unit(a.cell, False), threads, tid, row_at[i])
                    initial_states(a, hbufs[i], i64(0), i64(0), a.spec.hidden_size, threads, tid)
                block_sync()
                with T.serial(0, seq + i64(L - 1)) as s:
                    with T.serial(0, N) as n:
                        for i, a in enumerate(layers):
                            _stage(X, a, hbufs[i - 1] if i else None, hbufs[i], _Offset(hs, stage_at[i]), s - i64(i), n,
                                   threads, tid)
                        block_sync()
                        for i, a in enumerate(layers):
                            t = s - i64(i)
                            mine = tirx.all(ty >= i64(warp_at[i]), ty < i64(warp_at[i] + cfg.warps[i]), t >= i64(0), t < seq)
                            with T.If(mine):  # warp-uniform: shuffles stay safe
                                with T.Then():
                                    _layer_step(a, cfg, cfg.warps[i], hbufs[i], _Offset(wsm, row_at[i]),
                                                _Offset(hs, stage_at[i]), t, n, ty - i64(warp_at[i]), lane)
                        block_sync()  # Y[t] and h[t] written; the next round restages
                for i, a in enumerate(layers):
                    final_states(a, hbufs[i], i64(0), i64(0), a.spec.hidden_size, threads, tid)


class _Offset:
    """A buffer seen from an element offset: `view[e]` reads, `T.buffer_store(view.buffer, v, [view.at(e)])` writes."""

    def __init__(self, buffer, offset: int):
        self.buffer, self.offset = buffer, offset

    def at(self, e):
        return e + i64(self.offset)

    def __getitem__(self, e):
        return self.buffer[self.at(e)]


def _stage(X, a: KernelArgs, below, hbuf, hs: _Offset, t, n, threads: int, tid):
    """Layer a's [input at t; h at t-1] for row n into its part of shared memory, where t is one of its steps: the
    input is X's row or the layer below's h at t (its half (t + 1) % 2, written in the last global step)."""
    In, H, seq = a.spec.input_size, a.spec.hidden_size, a.seq
    cur = t % i64(2)

    def value(e):
        k = tirx.min(e, i64(In - 1))
        x = X[t, n, k].astype(F32) if below is None else below[(t + i64(1)) % i64(2), i64(0), n, k]
        return tirx.if_then_else(e < i64(In), x, hbuf[cur, i64(0), n, tirx.max(e - i64(In), i64(0))])

    with T.If(tirx.all(t >= i64(0), t < seq)):
        with T.Then():
            _strided(In + H, threads, tid, lambda e: store_unseen(hs.buffer, [hs.at(e)], value(e)))  # ordered by the step's barriers


def _layer_step(a: KernelArgs, cfg: BlockStackConfig, warps: int, hbuf, wsm: _Offset, hs: _Offset, t, n, warp, lane):
    """Layer a's step t for row n: each of its warps all gates of cfg.units units at once, then their gate programs in
    as many lanes (the biases, W's and R's, added there: XW's part that the step does not compute)."""
    spec, cell = a.spec, a.cell
    H, In, UW = spec.hidden_size, spec.input_size, cfg.units
    rows, K = rows_per_unit(cell, False), H + In
    V = vector_width(spec, math.gcd(H, In))
    phase = cell.phases[0]
    cur, nxt = t % i64(2), (t + i64(1)) % i64(2)
    j0 = warp * i64(UW)

    def w_at(u, g, k):
        return wsm[(tirx.min(j0 + i64(u), i64(H - 1)) * i64(rows) + i64(g)) * i64(K) + k]

    segments = [(In, lambda _u, _b, k: hs[k], w_at),
                (H, lambda _u, _b, k: hs[k + i64(In)], lambda u, g, k: w_at(u, g, k + i64(In)))]

    def finish(u, _b, rec):
        j = j0 + u
        with T.If(j < i64(H)):
            with T.Then():
                epilogue(a, phase, True, hbuf, {}, t, cur, nxt, i64(0), n, j, rec,
                         x=lambda gi: a.bias[i64(phase.gates[gi] * H) + j])

    warp_gates(lane, K, phase.gates, UW, 1, V, None, None, finish, segments=segments, in_parallel=True)
