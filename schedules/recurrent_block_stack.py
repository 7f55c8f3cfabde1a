"""One thread block runs a whole small stack of layers: every layer's [W | R] in shared memory, the block's warps split
among the layers, layer l one step behind layer l-1 (the wavefront's order), one block barrier a step.

For a stack whose weights fit one SM (madmom's onset detector: three layers of 25 units), the wavefront's grid
barrier (about 1.1 us a step on an H100) and the input GEMM before it cost more than the arithmetic of a step. Here
the first layer too multiplies [x_t; h_t-1] by its [W | R] rows inside the step (recurrent_wavefront's higher
layers), reading X itself, so the stack is one launch. A global step s: every layer l with t = s - l in range reads
[its input at t; its h at t-1] where they live in shared memory (layer 0's x in a double-buffered tile of X, loaded a
step ahead; a higher layer's input in the h the layer below wrote at step s-1), computes its units' gates and gate
program, and writes h(t) into the other half of its own double buffer and Y to global memory; one barrier ends the
step (_steps says why one is enough). Before the first step each thread issues its loads of the weights, h0 and
X[0] together, then stores them.

Applies to RNN stacks (one gate a unit) where every layer runs forward in layout 0 (recurrent_wavefront.stackable),
without sequence_lens, at small batches (rows run one after another), with few enough weights for one SM.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from tvm import tirx
from tvm.script.ir_builder import IRBuilder
from tvm.script.ir_builder import tirx as T

from .device import Device
from .recurrent_common import KernelArgs, block_sync, i64, shared_dyn, store_unseen
from .recurrent_cuda import epilogue, vector_width, weight_bytes
from .recurrent_persistent import final_states
from .recurrent_wavefront import reduction, row_element, rows_per_unit, stackable
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
    state = 4 * state_layout(specs)[-1]
    if elements * batch > MAX_STEP_ELEMENTS or elements * weight_bytes(specs[0]) + state > device.smem_limit:
        return None
    for units in range(1, MAX_UNITS + 1):
        warps = tuple(-(-s.hidden_size // units) for s in specs)
        if sum(warps) <= MAX_WARPS:
            return BlockStackConfig(warps, units)
    return None


def block_stack_prim_func(specs, cells, cfg: BlockStackConfig, joined_states: bool = False) -> tirx.PrimFunc:
    """PrimFunc(X; each layer's WR, bias, [h0, c0], [params]; then each layer's Y, Yh, [Yc]), seq and batch symbolic.
    joined_states (every layer of one width, RNN cells): every layer's h0 as one argument H0 [layers, batch, H] after X,
    and every layer's final h as one output Yh [layers, batch, H] after the Ys, as a multi-layer RNN's state is carried
    (its slices and their concatenation then cost no kernels of their own); each layer reads and writes its view."""
    layers = [KernelArgs(s, c) for s, c in zip(specs, cells)]
    for a in layers[1:]:
        a.seq, a.batch = layers[0].seq, layers[0].batch
    for a in layers:  # h's stores out of TVM's barrier planner's sight: the step's barrier orders them (_steps)
        a.shared = {"h": store_unseen}
    first = layers[0]
    joined = (len(specs), first.batch, specs[0].hidden_size)
    with IRBuilder() as ib:
        with T.prim_func():
            T.func_name("rnn_block_stack")
            T.func_attr({"tirx.noalias": True})
            X = T.arg("X", T.Buffer((first.seq, first.batch, specs[0].input_size), specs[0].dtype))
            H0 = T.arg("h0", T.Buffer(joined, F32)) if joined_states else None
            for i, a in enumerate(layers):
                a.declare_inputs("rows", specs[i].dtype, prefix=f"l{i}_", stacked_rows=rows_per_unit(a.cell, False),
                                 states=not joined_states)
            for i, a in enumerate(layers):
                a.declare_outputs(prefix=f"l{i}_", states=not joined_states)
            if joined_states:
                Yh = T.arg("Yh", T.Buffer(joined, F32))
                for i, a in enumerate(layers):
                    a.h0, a.Yh, a.Yc = _layer_view(H0, i, joined), _layer_view(Yh, i, joined), None
            _body(X, layers, cfg)
    return ib.get()


def _layer_view(buf, i: int, shape):
    """Layer i's [1, batch, H] of a [layers, batch, H] buffer."""
    layers, batch, H = shape
    return T.decl_buffer((1, batch, H), F32, data=buf.data, elem_offset=i64(i) * batch * i64(H))


def _offsets(sizes) -> list[int]:
    return [sum(sizes[:i]) for i in range(len(sizes))]


def state_layout(specs) -> list[int]:
    """Element offsets in the block's fp32 state: the first layer's x tile [2, MAX_BATCH, In], then each layer's h
    [2, 1, MAX_BATCH, H], each from a multiple of 4 elements (16 bytes: warp_gates' float4 loads); the last entry is
    the total."""
    sizes = [2 * MAX_BATCH * specs[0].input_size] + [2 * MAX_BATCH * s.hidden_size for s in specs]
    return _offsets([-(-n // 4) * 4 for n in sizes] + [0])


LOADS_IN_FLIGHT = 32  # the most start loads a thread issues before storing them (each holds a register till then)


@dataclass(frozen=True)
class _Copy:
    """`count` items (a static bound) from global into shared memory: item e is load(e) (fp32), stored by store(e,
    value) where e < count and valid(e)."""

    count: int
    load: Callable
    store: Callable
    valid: Callable = lambda e: tirx.const(True)


def _items(copies, threads: int) -> list:
    """(copy, r) for each item e = r * threads + tid a thread takes of the copies."""
    return [(c, r) for c in copies for r in range(-(-c.count // threads))]


def _load(items, threads: int, tid) -> list:
    """A thread's items loaded into registers one after another, no store between them (their latencies overlap);
    returns what _store takes."""
    regs = T.alloc_buffer((max(len(items), 1),), F32, scope="local")
    pending = []
    for slot, (c, r) in enumerate(items):
        e = i64(r * threads) + tid
        valid = c.valid(e) if (r + 1) * threads <= c.count else tirx.all(e < i64(c.count), c.valid(e))
        with T.If(valid):
            with T.Then():
                T.buffer_store(regs, c.load(e), [i64(slot)])
        pending.append((c, e, valid, regs[i64(slot)]))
    return pending


def _store(pending):
    for c, e, valid, value in pending:
        with T.If(valid):
            with T.Then():
                c.store(e, value)


def _x_copy(X, xbuf, t, N, seq) -> _Copy:
    """X[t] (every row) into the x tile's half t % 2, where t < seq: X[t] and the tile's rows are both contiguous."""
    In = int(X.shape[2])

    def store(e, value):
        store_unseen(xbuf, [t % i64(2), e // i64(In), e % i64(In)], value)

    return _Copy(MAX_BATCH * In, lambda e: X[t, e // i64(In), e % i64(In)].astype(F32), store,
                 lambda e: tirx.all(t < seq, e < N * i64(In)))


def _start_copies(X, xbuf, layers, hbufs, wsm, row_at, ks) -> list[_Copy]:
    """What the block loads before its first step: every layer's [W | R] rows, its h0 (zeros where it has none) into
    its h's half 0, and X[0] into the x tile's half 0."""
    N, seq = layers[0].batch, layers[0].seq
    copies = []
    for i, a in enumerate(layers):
        H, G = a.spec.hidden_size, rows_per_unit(a.cell, False)
        copies.append(_Copy(H * G * ks[i], lambda e, a=a, G=G, K=ks[i]: row_element(a, i64(0), K, G, e).astype(F32),
                            lambda e, v, at=row_at[i]: T.buffer_store(wsm, v.astype(wsm.dtype), [e + i64(at)])))
        copies.append(_Copy(MAX_BATCH * H, lambda e, a=a, H=H: a.initial("h", i64(0), e // i64(H), e % i64(H)),
                            lambda e, v, b=hbufs[i], H=H: store_unseen(b, [i64(0), i64(0), e // i64(H), e % i64(H)], v),
                            lambda e, H=H: e < N * i64(H)))
    return copies + [_x_copy(X, xbuf, i64(0), N, seq)]


def _body(X, layers: list[KernelArgs], cfg: BlockStackConfig):
    specs = [a.spec for a in layers]
    ks = [reduction(s, False) for s in specs]
    rows = [_row_elements(a.spec, a.cell) for a in layers]
    row_at, state_at = _offsets(rows), state_layout(specs)
    threads = cfg.threads
    with T.thread_binding(0, i64(1), "blockIdx.x"):
        with T.thread_binding(0, i64(sum(cfg.warps)), "threadIdx.y") as ty:
            with T.thread_binding(0, i64(32), "threadIdx.x") as lane:
                tid = ty * i64(32) + lane
                wsm = shared_dyn((sum(rows),), specs[0].dtype)
                state = shared_dyn((state_at[-1],), F32)
                xbuf = T.decl_buffer((2, MAX_BATCH, specs[0].input_size), F32, data=state.data, elem_offset=state_at[0],
                                     scope="shared.dyn")
                hbufs = [T.decl_buffer((2, 1, MAX_BATCH, s.hidden_size), F32, data=state.data, elem_offset=state_at[i + 1],
                                       scope="shared.dyn") for i, s in enumerate(specs)]
                items = _items(_start_copies(X, xbuf, layers, hbufs, wsm, row_at, ks), threads)
                for first in range(0, len(items), LOADS_IN_FLIGHT):
                    _store(_load(items[first:first + LOADS_IN_FLIGHT], threads, tid))
                block_sync()
                _steps(X, layers, cfg, xbuf, hbufs, [_Offset(wsm, at) for at in row_at], ty, lane)
                for i, a in enumerate(layers):
                    final_states(a, hbufs[i], i64(0), i64(0), a.spec.hidden_size, threads, tid)


def _steps(X, layers: list[KernelArgs], cfg: BlockStackConfig, xbuf, hbufs, weights, ty, lane):
    """The global steps, one barrier each. At step s layer l runs its step t = s - l for every row, reading its input
    at t (the x tile's half t % 2, or the layer below's h half (t + 1) % 2, written by that layer at step s - 1) and
    its own h half t % 2 (h(t-1)), writing its h half (t + 1) % 2; X[s + 1] goes into the tile's half (s + 1) % 2.
    Within a step a half is read or written, never both: the halves written at step s are read from step s + 1 on,
    and each was last read at step s - 1. So the barrier that ends a step orders every read and write around it, and
    needs no twin between the reads and the writes; rows are disjoint slices of every half."""
    L, N, seq = len(layers), layers[0].batch, layers[0].seq
    warp_at, threads = _offsets(list(cfg.warps)), cfg.threads
    tid = ty * i64(32) + lane
    with T.serial(0, seq + i64(L - 1)) as s:
        x_next = _load(_items([_x_copy(X, xbuf, s + i64(1), N, seq)], threads), threads, tid)  # in flight all the step
        for i, a in enumerate(layers):
            t = s - i64(i)
            with T.If(tirx.all(ty >= i64(warp_at[i]), ty < i64(warp_at[i] + cfg.warps[i]), t >= i64(0), t < seq)):
                with T.Then():  # warp-uniform: shuffles stay safe
                    with T.serial(0, N) as n:
                        if i == 0:
                            x_at = lambda k, n=n, t=t: xbuf[t % i64(2), n, k]  # noqa: E731
                        else:
                            x_at = lambda k, n=n, t=t, b=hbufs[i - 1]: b[(t + i64(1)) % i64(2), i64(0), n, k]  # noqa: E731
                        _layer_step(a, cfg, hbufs[i], weights[i], x_at, t, n, ty - i64(warp_at[i]), lane)
        _store(x_next)
        block_sync()


class _Offset:
    """A buffer seen from an element offset: `view[e]` reads."""

    def __init__(self, buffer, offset: int):
        self.buffer, self.offset = buffer, offset

    def __getitem__(self, e):
        return self.buffer[e + i64(self.offset)]


def _layer_step(a: KernelArgs, cfg: BlockStackConfig, hbuf, wsm: _Offset, x_at, t, n, warp, lane):
    """Layer a's step t for row n, x_at(k) its input's element k at t: each of its warps all gates of cfg.units units
    at once, reading [x_t; h_t-1] where they live, then their gate programs in as many lanes (the biases, W's and R's,
    added there: XW's part that the step does not compute)."""
    spec, cell = a.spec, a.cell
    H, In, UW = spec.hidden_size, spec.input_size, cfg.units
    rows, K = rows_per_unit(cell, False), H + In
    V = vector_width(spec, math.gcd(H, In))
    phase = cell.phases[0]
    cur, nxt = t % i64(2), (t + i64(1)) % i64(2)
    j0 = warp * i64(UW)

    def w_at(u, g, k):
        return wsm[(tirx.min(j0 + i64(u), i64(H - 1)) * i64(rows) + i64(g)) * i64(K) + k]

    segments = [(In, lambda _u, _b, k: x_at(k), w_at),
                (H, lambda _u, _b, k: hbuf[cur, i64(0), n, k], lambda u, g, k: w_at(u, g, k + i64(In)))]

    def finish(u, _b, rec):
        j = j0 + u
        with T.If(j < i64(H)):
            with T.Then():
                epilogue(a, phase, True, hbuf, {}, t, cur, nxt, i64(0), n, j, rec,
                         x=lambda gi: a.bias[i64(phase.gates[gi] * H) + j])

    warp_gates(lane, K, phase.gates, UW, 1, V, None, None, finish, segments=segments, in_parallel=True)
