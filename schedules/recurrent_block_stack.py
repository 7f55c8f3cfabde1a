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

A step's shape (plan): where every layer's units fit a few warps (madmom's 25: one warp a layer), a lane computes a
whole unit (_lane_step): its own dot product over its row, no shuffles, and the gate program in every lane at once.
A step there is issue-bound, and this issues what the work needs; warp_gates' shape (lanes split K, a shuffle
reduction a unit, the gate program in a few lanes of every warp) repeated its overhead in every warp of every layer.
Past that, warp_gates' step runs. Where layer 0's input is the widest part of any step (madmom's 236 features), the
block's spare warps project it a step ahead, each a slice of its columns (_projection), and layer 0 adds their sums:
its step no longer the longest, for one step more a call.

A state carried as one tensor (joined_states: every layer's h0 the slice [i:i+1] of one argument, their final h one
output, as torch's exporter carries a multi-layer RNN's state) is read and written through per-layer views of it.

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
I32 = "int32"  # the lane step's index arithmetic
MAX_WARPS = 32  # a block of 1024 threads
MAX_BATCH = 4  # rows run one after another: past a few, the wavefront's blocks on many SMs win
# weights one SM reads a step (every layer's [W | R], once per batch row): past about this many, one SM's step takes
# as long as the wavefront's step across many SMs with its grid barrier (about 1.1 us on an H100)
MAX_STEP_ELEMENTS = 16384
MAX_UNITS = 8  # units a warp computes at once
LANE_WARPS = 4  # a lane a unit where every layer's units take at most this many warps
LANE_BLOCK_WARPS = 8  # the fewest warps of a block whose lanes compute units: the others load weights and X with them


@dataclass(frozen=True)
class BlockStackConfig:
    warps: tuple[int, ...]  # warps per layer's step, in layer order
    units: int  # units a warp computes at once (warp_gates' UW): loads of h shared, their sums independent
    lanes: bool = False  # a lane computes a whole unit (32 units a warp): _lane_step instead of warp_gates
    # warps after the layers' that project layer 0's input a step ahead, a slice of its columns each (_projection);
    # 0: layer 0 multiplies its x in its own step
    project: int = 0

    @property
    def warp_at(self) -> list[int]:
        """Each layer's first warp."""
        return _offsets(list(self.warps))

    @property
    def threads(self) -> int:
        return 32 * max(sum(self.warps), LANE_BLOCK_WARPS if self.lanes else 0)

    def describe(self) -> str:
        warps = "+".join(map(str, self.warps))
        if not self.lanes:
            return f"{warps} warps of {self.units} units"
        ahead = f", layer 0's input projected a step ahead by {self.project} warps" if self.project else ""
        return f"{warps} warps, a lane a unit{ahead}, {self.threads // 32} warps in all"


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


def _padded(n: int) -> int:
    return -(-n // 4) * 4


def lane_stride(spec) -> int:
    """The words between two units' rows in shared memory where a lane computes a unit: W's columns from 0, R's from
    In rounded up to 4 (both segments' float4 loads aligned), the total rounded up to 4 times an odd number, so that
    the 8 lanes of each quarter warp's float4 loads start in 8 different groups of 4 banks."""
    stride = _padded(spec.input_size) + spec.hidden_size
    return stride + (4 - stride) % 8


def _stored_rows(spec, cell, lanes: bool) -> int:
    """Each layer's weights as the block stores them: its rows back to back, or at lane_stride (lanes)."""
    return spec.hidden_size * lane_stride(spec) if lanes else _row_elements(spec, cell)


def _lanes(specs) -> bool:
    """Whether a lane computes a whole unit: fp32 weights (_lane_dot's float4 loads), every layer within LANE_WARPS."""
    return specs[0].dtype == F32 and all(s.hidden_size <= 32 * LANE_WARPS for s in specs)


def _projectors(specs, warps: tuple[int, ...]) -> int:
    """The warps that project layer 0's input a step ahead (0: none): the block's spare warps, at most one a float4
    of its columns, where layer 0's units fit one warp (a projecting lane is a unit) and its x alone is a longer dot
    product than any higher layer's whole step (then layer 0's step was the longest, by its x)."""
    In, spare = specs[0].input_size, LANE_BLOCK_WARPS - sum(warps)
    if specs[0].hidden_size > 32 or spare < 1 or In < 8 or In <= max((reduction(s, False) for s in specs[1:]), default=0):
        return 0
    chunks = In // 4
    return -(-chunks // -(-chunks // spare))  # slices of whole float4s, none empty


def plan(specs, cells, device: Device, batch: int = 1) -> BlockStackConfig | None:
    """A lane a unit where every layer's units fit a few warps (_lanes), else the fewest units a warp such that every
    layer's units take one round of the block's warps (a round's latency, the dot product, the warp's sum and the
    gate program, is what a step waits for); None where no such split fits, a step's weights are more than one SM
    should read (MAX_STEP_ELEMENTS for `batch` rows) or do not fit one block's shared memory."""
    elements = sum(_row_elements(s, c) for s, c in zip(specs, cells))
    lanes = _lanes(specs)
    if elements * batch > MAX_STEP_ELEMENTS:
        return None
    if lanes:
        warps = tuple(-(-s.hidden_size // 32) for s in specs)
        cfg = BlockStackConfig(warps, 32, True, _projectors(specs, warps))
    else:
        splits = (tuple(-(-s.hidden_size // units) for s in specs) for units in range(1, MAX_UNITS + 1))
        cfg = next((BlockStackConfig(w, units) for units, w in enumerate(splits, 1) if sum(w) <= MAX_WARPS), None)
    stored = sum(_stored_rows(s, c, lanes) for s, c in zip(specs, cells)) * weight_bytes(specs[0])
    if cfg is None or stored + 4 * state_layout(specs, cfg.project)[-1] > device.smem_limit:
        return None
    return cfg


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


def state_layout(specs, project: int = 0) -> list[int]:
    """Element offsets in the block's fp32 state: the first layer's x tile [2, MAX_BATCH, In], then each layer's h
    [2, 1, MAX_BATCH, H], each row from a multiple of 4 elements (16 bytes: float4 loads), then the partial sums of
    layer 0's input projection [2, MAX_BATCH, project, 32] (_projection); the last entry is the total."""
    return _offsets([2 * MAX_BATCH * _padded(specs[0].input_size)] + [2 * MAX_BATCH * _padded(s.hidden_size) for s in specs]
                    + [2 * MAX_BATCH * project * 32, 0])


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
        e = tid + r * threads  # in tid's dtype
        valid = c.valid(e) if (r + 1) * threads <= c.count else tirx.all(e < c.count, c.valid(e))
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
    """X[t] (every row) into the x tile's half t % 2, where t < seq: X[t] and the tile's rows are both contiguous.
    The index arithmetic in t's dtype (t, N, seq and the items' e of one dtype)."""
    In = int(X.shape[2])

    def store(e, value):
        store_unseen(xbuf, [t % 2, e // In, e % In], value)

    return _Copy(MAX_BATCH * In, lambda e: X[t, e // In, e % In].astype(F32), store, lambda e: tirx.all(t < seq, e < N * In))


def _row_store(spec, lanes: bool, K: int):
    """Where element e of a layer's rows (row_element's order) goes from its first word in shared memory: e itself,
    or (lanes) unit e // K's row at lane_stride, R's columns from In rounded up to 4."""
    In = spec.input_size
    if not lanes:
        return lambda e: e

    def at(e):
        k = e % i64(K)
        gap = _padded(In) - In
        return e // i64(K) * i64(lane_stride(spec)) + (k if gap == 0 else k + tirx.Select(k < i64(In), i64(0), i64(gap)))

    return at


def _start_copies(X, xbuf, layers, hbufs, wsm, row_at, ks, lanes: bool) -> list[_Copy]:
    """What the block loads before its first step: every layer's [W | R] rows, its h0 (zeros where it has none) into
    its h's half 0, and X[0] into the x tile's half 0."""
    N, seq = layers[0].batch, layers[0].seq
    copies = []
    for i, a in enumerate(layers):
        H, G = a.spec.hidden_size, rows_per_unit(a.cell, False)
        copies.append(_Copy(H * G * ks[i], lambda e, a=a, G=G, K=ks[i]: row_element(a, i64(0), K, G, e).astype(F32),
                            lambda e, v, at=row_at[i], to=_row_store(a.spec, lanes, ks[i]):
                            T.buffer_store(wsm, v.astype(wsm.dtype), [to(e) + i64(at)])))
        copies.append(_Copy(MAX_BATCH * H, lambda e, a=a, H=H: a.initial("h", i64(0), e // i64(H), e % i64(H)),
                            lambda e, v, b=hbufs[i], H=H: store_unseen(b, [i64(0), i64(0), e // i64(H), e % i64(H)], v),
                            lambda e, H=H: e < N * i64(H)))
    return copies + [_x_copy(X, xbuf, i64(0), N, seq)]


@dataclass(frozen=True)
class _Shared:
    """The block's shared memory: every layer's weights (wsm, layer i's from row_at[i]) and the fp32 state (state,
    state_layout's offsets at state_at), the x tile and each layer's h seen as buffers of their own over it."""

    wsm: tirx.Buffer
    row_at: list[int]
    state: tirx.Buffer
    state_at: list[int]
    xbuf: tirx.Buffer
    hbufs: list


def _shared(specs, cells, cfg: BlockStackConfig) -> _Shared:
    rows = [_stored_rows(s, c, cfg.lanes) for s, c in zip(specs, cells)]
    state_at = state_layout(specs, cfg.project)
    wsm = shared_dyn((sum(rows),), specs[0].dtype)
    state = shared_dyn((state_at[-1],), F32)
    xbuf = T.decl_buffer((2, MAX_BATCH, _padded(specs[0].input_size)), F32, data=state.data, elem_offset=state_at[0],
                         scope="shared.dyn")
    hbufs = [T.decl_buffer((2, 1, MAX_BATCH, _padded(s.hidden_size)), F32, data=state.data, elem_offset=state_at[i + 1],
                           scope="shared.dyn") for i, s in enumerate(specs)]
    return _Shared(wsm, _offsets(rows), state, state_at, xbuf, hbufs)


def _body(X, layers: list[KernelArgs], cfg: BlockStackConfig):
    specs = [a.spec for a in layers]
    ks = [reduction(s, False) for s in specs]
    threads = cfg.threads
    with T.thread_binding(0, i64(1), "blockIdx.x"):
        with T.thread_binding(0, i64(threads // 32), "threadIdx.y") as ty:
            with T.thread_binding(0, i64(32), "threadIdx.x") as lane:
                tid = ty * i64(32) + lane
                sm = _shared(specs, [a.cell for a in layers], cfg)
                copies = _start_copies(X, sm.xbuf, layers, sm.hbufs, sm.wsm, sm.row_at, ks, cfg.lanes)
                items = _items(copies, threads)
                for first in range(0, len(items), LOADS_IN_FLIGHT):
                    _store(_load(items[first:first + LOADS_IN_FLIGHT], threads, tid))
                lag = 1 if cfg.project else 0
                if cfg.lanes:
                    bias = _lane_biases(layers, cfg, ty, lane)
                    step = lambda i, a, s, _t: _lane_step(a, i, sm, cfg, s.astype(I32) - (i + lag),  # noqa: E731
                                                          _lane_unit(cfg, i, ty, lane), bias)
                else:
                    weights = [_Offset(sm.wsm, at) for at in sm.row_at]
                    step = lambda i, a, _s, t: _warp_step(a, i, cfg, sm, weights[i], t, ty, lane)  # noqa: E731
                project = lambda s: _projection(layers[0], sm, cfg, s.astype(I32), ty, lane)  # noqa: E731
                block_sync()
                _steps(X, layers, cfg, sm.xbuf, step, project, ty, tid)
                for i, a in enumerate(layers):
                    final_states(a, sm.hbufs[i], i64(0), i64(0), a.spec.hidden_size, threads, tid)


def _steps(X, layers: list[KernelArgs], cfg: BlockStackConfig, xbuf, step, project, ty, tid):
    """The global steps, one barrier each. At step s layer l runs its step t = s - l for every row, reading its input
    at t (the x tile's half t % 2, or the layer below's h half (t + 1) % 2, written by that layer at step s - 1) and
    its own h half t % 2 (h(t-1)), writing its h half (t + 1) % 2; X[s + 1] goes into the tile's half (s + 1) % 2.
    Within a step a half is read or written, never both: the halves written at step s are read from step s + 1 on,
    and each was last read at step s - 1. So the barrier that ends a step orders every read and write around it, and
    needs no twin between the reads and the writes; rows are disjoint slices of every half. step(i, a, s, t): layer
    i's step t, in its warps.

    Where warps project layer 0's input a step ahead (cfg.project), they are the stack's first stage: at step s they
    read X[s] (the x tile's half s % 2) and write their partial sums for t = s into the partials' half s % 2, and
    layer l runs t = s - l - 1, layer 0 reading the partials' half t % 2 in place of x; the same argument holds."""
    L, N, seq = len(layers), layers[0].batch, layers[0].seq
    warp_at, threads, lag = cfg.warp_at, cfg.threads, 1 if cfg.project else 0
    with T.serial(0, seq + i64(L - 1 + lag)) as s:
        ahead = _x_copy(X, xbuf, s.astype(I32) + 1, N.astype(I32), seq.astype(I32))
        x_next = _load(_items([ahead], threads), threads, tid.astype(I32))  # in flight all the step
        if cfg.project:
            with T.If(tirx.all(ty >= i64(sum(cfg.warps)), ty < i64(sum(cfg.warps) + cfg.project), s < seq)):
                with T.Then():
                    project(s)
        for i, a in enumerate(layers):
            t = s - i64(i + lag)
            with T.If(tirx.all(ty >= i64(warp_at[i]), ty < i64(warp_at[i] + cfg.warps[i]), t >= i64(0), t < seq)):
                with T.Then():  # warp-uniform: shuffles stay safe
                    step(i, a, s, t)
        _store(x_next)
        block_sync()


class _Offset:
    """A buffer seen from an element offset: `view[e]` reads."""

    def __init__(self, buffer, offset: int):
        self.buffer, self.offset = buffer, offset

    def __getitem__(self, e):
        return self.buffer[e + i64(self.offset)]


def _warp_step(a: KernelArgs, i: int, cfg: BlockStackConfig, sm: _Shared, wsm: _Offset, t, ty, lane):
    """Layer i's step t by warp_gates, its rows one after another."""
    warp = ty - i64(cfg.warp_at[i])
    with T.serial(0, a.batch) as n:
        if i == 0:
            x_at = lambda k: sm.xbuf[t % i64(2), n, k]  # noqa: E731
        else:
            x_at = lambda k: sm.hbufs[i - 1][(t + i64(1)) % i64(2), i64(0), n, k]  # noqa: E731
        _layer_step(a, cfg, sm.hbufs[i], wsm, x_at, t, n, warp, lane)


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


def _lane_unit(cfg: BlockStackConfig, i: int, ty, lane):
    """The unit a lane of layer i's warps computes (int32): the layer's warp w its units 32 w .. 32 w + 31."""
    return (ty.astype(I32) - cfg.warp_at[i]) * 32 + lane.astype(I32)


def _lane_biases(layers: list[KernelArgs], cfg: BlockStackConfig, ty, lane):
    """Each lane's bias (W's and R's: XW's part that the step does not compute) in a register before the steps: a
    lane's unit is the same every step. Lanes past H hold their layer's last unit's."""
    bias = T.alloc_buffer((1,), F32, scope="local")
    warp_at = cfg.warp_at
    for i, a in enumerate(layers):
        H = a.spec.hidden_size
        with T.If(tirx.all(ty >= i64(warp_at[i]), ty < i64(warp_at[i] + cfg.warps[i]))):
            with T.Then():
                j = tirx.min(_lane_unit(cfg, i, ty, lane), H - 1)
                T.buffer_store(bias, a.bias[a.cell.phases[0].gates[0] * H + j], [0])
    return bias


def _lane_step(a: KernelArgs, i: int, sm: _Shared, cfg: BlockStackConfig, t, j, bias):
    """Layer i's step t, unit j in this lane, for every row: the lane's own dot product of its [W | R] row with
    [x_t; h_t-1] (_lane_dot; layer 0's x part from the partials where it was projected ahead), no shuffles, then the
    gate program (epilogue) in every lane at once; lanes past H compute their layer's last unit and store nothing.
    t is int32, as is all index arithmetic here but Y's."""
    spec = a.spec
    H, In = spec.hidden_size, spec.input_size
    cur, nxt = t % 2, (t + 1) % 2
    row = tirx.min(j, H - 1) * lane_stride(spec) + sm.row_at[i]
    below = 2 * MAX_BATCH * _padded(In)  # the input's double buffer: the x tile's, or the layer below's h
    with T.serial(0, a.batch.astype(I32)) as n:
        if i == 0:
            x_at = sm.state_at[0] + cur * (below // 2) + n * _padded(In)
        else:  # the layer below's h(t), which it wrote into its half (t + 1) % 2 at the last step
            x_at = sm.state_at[i] + nxt * (below // 2) + n * _padded(In)
        acc = T.alloc_buffer((4,), F32, scope="local")
        for q in range(4):
            T.buffer_store(acc, tirx.const(0.0, F32), [q])
        if i > 0 or not cfg.project:
            _lane_dot(acc, sm.wsm, row, sm.state, x_at, In)
        h_at = sm.state_at[i + 1] + cur * (MAX_BATCH * _padded(H)) + n * _padded(H)
        _lane_dot(acc, sm.wsm, row + _padded(In), sm.state, h_at, H)
        total = (acc[0] + acc[1]) + (acc[2] + acc[3])
        if i == 0 and cfg.project:
            parts = _partials_at(sm, cfg, cur, n) + j
            total = total + _sum([sm.state[parts + p * 32] for p in range(cfg.project)])
        with T.If(j < H):
            with T.Then():
                epilogue(a, a.cell.phases[0], True, sm.hbufs[i], {}, t, cur, nxt, tirx.IntImm(I32, 0), n, j,
                         lambda _gi: total, x=lambda _gi: bias[0])


def _lane_dot(acc, wsm, w_at, state, v_at, K: int):
    """acc[q] += wsm[w_at + k] * state[v_at + k] for k < K, k % 4 == q: four independent sums, so loads and FMAs
    overlap. float4 loads of both (the vector's at the same address in every lane: one broadcast), the loop unrolled
    (constant offsets from two addresses), the last K % 4 elements one at a time."""
    wv = T.alloc_buffer((4,), F32, scope="local")
    vv = T.alloc_buffer((4,), F32, scope="local")
    quad = tirx.Ramp(tirx.IntImm(I32, 0), tirx.IntImm(I32, 1), 4)
    if K >= 4:
        with T.unroll(0, K // 4) as c:
            T.buffer_store(wv, wsm[tirx.Ramp(w_at + c * 4, tirx.IntImm(I32, 1), 4)], [quad])
            T.buffer_store(vv, state[tirx.Ramp(v_at + c * 4, tirx.IntImm(I32, 1), 4)], [quad])
            for q in range(4):
                T.buffer_store(acc, acc[q] + wv[q] * vv[q], [q])
    for k in range(K - K % 4, K):
        T.buffer_store(acc, acc[k % 4] + wsm[w_at + k] * state[v_at + k], [k % 4])


def _sum(values):
    """A balanced sum: its additions depend on one another log2(len) deep."""
    if len(values) == 1:
        return values[0]
    half = len(values) // 2
    return _sum(values[:half]) + _sum(values[half:])


def _partials_at(sm: _Shared, cfg: BlockStackConfig, half, n):
    """The first word of row n's partial sums in the partials' half `half`: [project, 32], a projecting warp's 32
    lanes' (units') sums for its slice of layer 0's input."""
    return sm.state_at[-2] + half * (MAX_BATCH * cfg.project * 32) + n * (cfg.project * 32)


def _projection(a: KernelArgs, sm: _Shared, cfg: BlockStackConfig, t, ty, lane):
    """Layer 0's input projection for step t, every row: projecting warp p multiplies its slice of X[t] (whole float4s
    of the x tile's half t % 2; the last slice to the end) by the same columns of W's row of unit `lane` (clamped to
    H - 1) and stores the lane's sum into the partials' half t % 2, which layer 0 adds at its step t."""
    H, In = a.spec.hidden_size, a.spec.input_size
    per = -(-(In // 4) // cfg.project) * 4  # columns a slice
    row = tirx.min(lane.astype(I32), H - 1) * lane_stride(a.spec) + sm.row_at[0]
    warp = ty.astype(I32) - sum(cfg.warps)
    with T.serial(0, a.batch.astype(I32)) as n:
        x_at = sm.state_at[0] + t % 2 * (MAX_BATCH * _padded(In)) + n * _padded(In)
        acc = T.alloc_buffer((4,), F32, scope="local")
        for p in range(cfg.project):
            with T.If(warp == p):
                with T.Then():
                    for q in range(4):
                        T.buffer_store(acc, tirx.const(0.0, F32), [q])
                    end = In if p == cfg.project - 1 else per * (p + 1)
                    _lane_dot(acc, sm.wsm, row + per * p, sm.state, x_at + per * p, end - per * p)
                    store_unseen(sm.state, [_partials_at(sm, cfg, t % 2, n) + p * 32 + lane.astype(I32)],
                                 (acc[0] + acc[1]) + (acc[2] + acc[3]))
