"""The wavefront kernel for CUDA: stacked layers in one cooperative launch, layer l+1 one step behind layer l.

Run one after another, L persistent layers of T steps cost L*T grid barriers and a projection GEMM between them, each
step a barrier plus an L2 round trip for a batch-1 matrix-vector product. Here the SMs are split among the layers:
at global step s the blocks of layer l compute its step t = s - l, reading layer l-1's h at t (written at step s-1,
before the barrier) and their own h at t-1, so a stack of L layers takes T+L-1 barriers and no GEMM between layers.

A block of layer 0 is the persistent kernel's (recurrent_persistent): its rows of R in shared memory, XW (the
projection of all steps, one GEMM before the launch) in its epilogue. A block of a higher layer keeps its rows of
W and R side by side, WR [G*H, I+H] in shared memory, and multiplies them by [h_below[t]; h[t-1]]: its input
projection moves into the step (warp_gemv's two segments) and its biases (Wb + Rb) into the epilogue. That needs
every gate's pre-activation to be x + R h (+ biases), which LSTM and RNN cells are. A GRU with linear_before_reset (what
PyTorch and Keras export) multiplies R_h h alone by the reset gate: a higher layer of it has a fourth row per unit,
its h gate's two parts summed apart ([W_h | 0] and [0 | R_h]). GRU without it needs all of r*h before its h gate (two
phases), so such stacks run layer by layer.

Blocks per layer are sized so that the slowest block's warps do the least work per step (rounds of units times the
reduction length), within one wave of the GPU's SMs and each block's shared memory. Applies to unidirectional stacks
(layout 0; every layer masked by the first one's sequence_lens, if any) at the batches the persistent kernel
runs (schedules.PERSISTENT_MAX_BATCH); the compiler (tvmrnn.frontend.stacks) finds such stacks in the ONNX graph.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tvm import tirx
from tvm.script.ir_builder import IRBuilder
from tvm.script.ir_builder import tirx as T

from .device import Device
from .recurrent_common import KernelArgs, block_sync, i64, shared_dyn
from .recurrent_cuda import epilogue, vector_width, weight_bytes, xw_dtype
from .recurrent_persistent import _grid_sync, _prefetch_xw, _strided, final_states, initial_states
from .warp_gemv import warp_gates

F32 = "float32"
WARPS = 8  # the persistent kernel's default


@dataclass(frozen=True)
class WavefrontConfig:
    units: tuple[int, ...]  # hidden units per block, per layer
    blocks: tuple[int, ...]  # blocks per layer (layer 0's first)
    warps: int = WARPS

    @property
    def grid(self) -> int:
        return sum(self.blocks)


def reduction(spec, first: bool) -> int:
    """The length of a block's dot products: H for layer 0 (XW comes from the GEMM), I + H above it."""
    return spec.hidden_size + (0 if first else spec.input_size)


def split_h(cell, first: bool) -> bool:
    """A higher GRU layer with linear_before_reset: its h gate's input part and recurrent part are separate rows."""
    return not first and cell.params == ("Rb_h",)


def rows_per_unit(cell, first: bool) -> int:
    return cell.gates + split_h(cell, first)


def stackable(spec, cell, first: bool) -> str | None:
    """Why this layer cannot run in a wavefront (None: it can)."""
    if spec.direction != "forward":
        return f"direction {spec.direction} (a stack runs forward in time)"
    if spec.layout != 0:
        return "layout 1"
    if len(cell.phases) != 1:
        return f"{spec.op} cell without linear_before_reset: its h gate needs all of r*h first (two phases)"
    return None


def plan(specs, cells, device: Device, warps: int = WARPS) -> WavefrontConfig | None:
    """Units and blocks per layer: the least work per step for the slowest block (units beyond the block's warps take
    another round) within one wave and each block's shared memory; None where no split fits."""
    ks = [reduction(s, i == 0) for i, s in enumerate(specs)]
    sms, limit = device.sm_count, device.smem_limit - 4 * max(ks)  # beside the staged [h_below; h]
    # the most units a block of each layer can hold in shared memory
    most = [limit // (rows_per_unit(c, i == 0) * k * weight_bytes(s)) for i, (s, c, k) in enumerate(zip(specs, cells, ks))]
    if min(most) < 1 or len(specs) > sms:
        return None
    costs = sorted({r * k for k in ks for r in range(1, -(-max(s.hidden_size for s in specs) // warps) + 1)})
    for cost in costs:  # the cheapest per-step cost whose blocks fit one wave
        units = []
        for s, k, m in zip(specs, ks, most):
            rounds = cost // k
            if rounds < 1:
                break
            units.append(min(rounds * warps, m, s.hidden_size))
        if len(units) < len(specs):
            continue
        blocks = [-(-s.hidden_size // u) for s, u in zip(specs, units)]
        if sum(blocks) > sms:
            continue
        # spare SMs: fewer rounds for the layers below the slowest (lighter blocks finish their step sooner)
        for i, s in enumerate(specs):
            while units[i] > warps:
                fewer = -(-units[i] // warps) * warps - warps
                extra = -(-s.hidden_size // fewer) - blocks[i]
                if sum(blocks) + extra > sms:
                    break
                units[i], blocks[i] = fewer, blocks[i] + extra
        # each layer's units spread evenly over the blocks it needs
        units = [-(-s.hidden_size // b) for s, b in zip(specs, blocks)]
        return WavefrontConfig(tuple(units), tuple(blocks), warps)
    return None


def smem_elements(specs, cells, cfg: WavefrontConfig) -> int:
    return max(u * rows_per_unit(c, i == 0) * reduction(s, i == 0) for i, (s, c, u) in enumerate(zip(specs, cells, cfg.units)))


def wavefront_prim_func(specs, cells, cfg: WavefrontConfig) -> tirx.PrimFunc:
    return stack_prim_func(specs, cells, lambda layers: wavefront_body(layers, cfg))


def stack_prim_func(specs, cells, emit_body) -> tirx.PrimFunc:
    """PrimFunc(layer 0's XW, R, [seq_lens], [h0, c0], [params]; each higher layer's WR, bias, [params]; then each
    layer's Y, Yh, [Yc]), seq and batch symbolic, its body from emit_body(each layer's KernelArgs): the signature of
    every stack kernel that takes layer 0's projection from a GEMM before it."""
    layers = [KernelArgs(s, c) for s, c in zip(specs, cells)]
    for a in layers[1:]:
        a.seq, a.batch = layers[0].seq, layers[0].batch
    with IRBuilder() as ib:
        with T.prim_func():
            T.func_name("rnn_wavefront")
            T.func_attr({"tirx.noalias": True})
            for i, a in enumerate(layers):
                a.declare_inputs("rows", specs[i].dtype, prefix=f"l{i}_", stacked_rows=rows_per_unit(a.cell, False) if i else 0,
                                 xw_dtype=xw_dtype(specs[0]))
                if i:  # one set of lengths masks every layer (frontend.stacks): the first layer's argument
                    a.seq_lens = layers[0].seq_lens if a.spec.has("sequence_lens") else None
            for i, a in enumerate(layers):
                a.declare_outputs(prefix=f"l{i}_")
            emit_body(layers)
    return ib.get()


def wavefront_body(layers: list[KernelArgs], cfg: WavefrontConfig):
    """One cooperative launch: each block its layer's rows of R (or WR) into shared memory, initial states, then T+L-1
    global steps separated by grid barriers, the blocks of layer l at step t = s - l."""
    L, N, seq = len(layers), layers[0].batch, layers[0].seq
    specs, cells = [a.spec for a in layers], [a.cell for a in layers]
    threads = 32 * cfg.warps
    first = [sum(cfg.blocks[:i]) for i in range(L)]
    hbufs = [T.alloc_buffer((2, 1, N, a.spec.hidden_size), F32) for a in layers]
    with T.thread_binding(0, i64(cfg.grid), "blockIdx.x") as bx:
        with T.thread_binding(0, i64(cfg.warps), "threadIdx.y") as ty:
            with T.thread_binding(0, i64(32), "threadIdx.x") as lane:
                tid = ty * i64(32) + lane
                wsm = shared_dyn((smem_elements(specs, cells, cfg),), specs[0].dtype)
                # the vector the warps multiply ([h_below; h] above layer 0), staged once per block: one L2 read, not one per warp
                hs = shared_dyn((max(reduction(a.spec, i == 0) for i, a in enumerate(layers)),), F32)

                def mine(i):
                    """The block belongs to layer i."""
                    return tirx.all(bx >= i64(first[i]), bx < i64(first[i] + cfg.blocks[i]))

                def first_unit(i):
                    return (bx - i64(first[i])) * i64(cfg.units[i])

                for i, a in enumerate(layers):
                    with T.If(mine(i)):
                        with T.Then():
                            load_rows(a, wsm, first_unit(i), cfg.units[i], reduction(a.spec, i == 0), rows_per_unit(a.cell, i == 0),
                                       threads, tid)
                            initial_states(a, hbufs[i], i64(0), first_unit(i), cfg.units[i], threads, tid)
                block_sync()
                _grid_sync()

                with T.serial(0, seq + i64(L - 1)) as s:
                    for i, a in enumerate(layers):
                        t = s - i64(i)
                        with T.If(tirx.all(mine(i), t >= i64(0), t < seq)):
                            with T.Then():
                                _layer_step(a, layers[i - 1] if i else None, cfg, i, hbufs[i], wsm, hs, t, first_unit(i), ty, lane)
                    _grid_sync()

                for i, a in enumerate(layers):
                    with T.If(mine(i)):
                        with T.Then():
                            final_states(a, hbufs[i], i64(0), first_unit(i), cfg.units[i], threads, tid)


def row_element(a: KernelArgs, j0, K: int, G: int, e):
    """Element e of the rows of R (layer 0) or WR (above) from unit j0 on, unit-major then gate (G rows per unit), K
    columns each."""
    H = a.spec.hidden_size
    u, g, k = e // i64(G * K), e // i64(K) % i64(G), e % i64(K)
    return a.R[0, g * i64(H) + tirx.min(j0 + u, i64(H - 1)), k]


def load_rows(a: KernelArgs, wsm, j0, units: int, K: int, G: int, threads: int, tid):
    """The block's rows (row_element's order) into wsm."""
    _strided(units * G * K, threads, tid, lambda e: T.buffer_store(wsm, row_element(a, j0, K, G, e), [e]))


def _layer_step(a: KernelArgs, below: KernelArgs | None, cfg: WavefrontConfig, i: int, hbuf, wsm, hs, t, j0, ty, lane):
    """Layer i's step t for every batch row: each warp all gates of its units (one row at a time, the persistent
    kernel's default at these batches), then the gate program."""
    spec, cell = a.spec, a.cell
    H, G, N, UPB = spec.hidden_size, cell.gates, a.batch, cfg.units[i]
    split = split_h(cell, below is None)  # rows: z, r, h's input part, h's recurrent part
    rows = rows_per_unit(cell, below is None)
    In = 0 if below is None else spec.input_size
    K = H + In
    V = vector_width(spec, H if below is None else math.gcd(H, In))
    phase = cell.phases[0]
    cur, nxt = t % i64(2), (t + i64(1)) % i64(2)
    with T.serial(0, N) as n:
        def stage(e):  # the block's threads copy [h_below; h] into shared memory, then every warp reads it there
            value = hbuf[cur, i64(0), n, e] if below is None else tirx.if_then_else(
                e < i64(In), below.Y[t, i64(0), n, tirx.min(e, i64(In - 1))], hbuf[cur, i64(0), n, tirx.max(e - i64(In), i64(0))])
            T.buffer_store(hs, value, [e])

        _strided(K, 32 * cfg.warps, ty * i64(32) + lane, stage)
        block_sync()

        def below_h(k):
            return hs[k]

        def own_h(k):
            return hs[k + i64(In)]

        for slot in range(-(-UPB // cfg.warps)):
            u = i64(slot * cfg.warps) + ty
            j = j0 + u
            with T.If(tirx.all(u < i64(UPB), j < i64(H))):  # warp-uniform: shuffles stay safe
                with T.Then():
                    if below is None:
                        x = _prefetch_xw(a, phase, t, i64(0), n, j, lane, 1)
                    else:  # the biases (Wb + Rb): XW's part that the step does not compute
                        x = T.alloc_buffer((G,), F32, scope="local")
                        for gi, g in enumerate(phase.gates):
                            T.buffer_store(x, a.bias[i64(g * H) + j], [i64(gi)])

                    def w_at(_u, g, k, u=u):
                        return wsm[(u * i64(rows) + i64(g)) * i64(K) + k]

                    segments = [(H, lambda _u, _b, k: own_h(k), w_at)] if below is None else [
                        (In, lambda _u, _b, k: below_h(k), w_at),
                        (H, lambda _u, _b, k: own_h(k), lambda _u, g, k, w_at=w_at: w_at(_u, g, k + i64(In)))]

                    def finish(_u, _b, rec, j=j, x=x):
                        if split:  # the h gate: its input part joins x, its recurrent part is rec
                            gate_x = lambda gi: x[i64(gi)] + rec(2) if gi == 2 else x[i64(gi)]  # noqa: E731
                            gate_rec = lambda gi: rec(3) if gi == 2 else rec(gi)  # noqa: E731
                        else:
                            gate_x, gate_rec = (lambda gi: x[i64(gi)]), rec
                        epilogue(a, phase, True, hbuf, {}, t, cur, nxt, i64(0), n, j, gate_rec, x=gate_x)

                    warp_gates(lane, K, tuple(range(rows)) if split else phase.gates, 1, 1, V, None, None, finish, segments=segments)
        block_sync()  # the next row restages hs

