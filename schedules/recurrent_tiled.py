"""The recurrent kernel for CUDA at large batch: per step and phase one launch of a tiled GEMM with the gate program as epilogue.

At batch 20-64 a step is a real GEMM (G*H x N x H), and the stepwise kernel, whose warps
re-read R once per 8-16 batch rows, becomes bound by L2/HBM and by L1 loads of h. Here a block
owns `units` hidden units (all their gates) and `row_threads * rows_per_thread` batch rows; per
chunk of `k_chunk` columns it stages that slice of R (widened to fp32) and of h in shared
memory (the next chunk's loads already in flight into registers), then each thread accumulates the gates of one unit for its rows from registers, so
every element staged is reused by a whole tile: R once per block of rows (once per step when the
tile covers the batch), h once per block of units. Thread (rg, u) owns rows rg + b*row_threads,
so a warp's h reads are consecutive (conflict-free with the row padding) and its R reads
broadcast. The epilogue is the same gate program as every other kernel (recurrent_cuda.epilogue).
"""

from __future__ import annotations

from dataclasses import dataclass

from tvm import tirx
from tvm.script.ir_builder import tirx as T

from .recurrent_common import KernelArgs, block_sync, guarded, i64
from .recurrent_cuda import epilogue, operand_at, step_launches

F32 = "float32"
R_LAYOUT = "rows"
PAD = 4  # floats after each staged row of h: consecutive rows start 4 banks apart, 16-byte alignment kept


@dataclass(frozen=True)
class TiledConfig:
    """Defaults: the point that measured best or near it on b64-h1024-l2 and blog-a, fp32 and fp16 (docs/decisions.md)."""

    units: int = 8  # hidden units per block (threadIdx.y), all their gates
    row_threads: int = 16  # threads along the batch (threadIdx.x)
    rows_per_thread: int = 2  # batch rows each thread accumulates; the tile covers row_threads * rows_per_thread rows
    k_chunk: int = 32  # reduction columns staged per round

    @property
    def rows(self) -> int:
        return self.row_threads * self.rows_per_thread

    def smem_bytes(self, gates: int) -> int:
        return 4 * (self.units * gates * self.k_chunk + self.rows * (self.k_chunk + PAD))


def default_config(batch: int | None = None) -> TiledConfig:
    """The untuned point: 32 rows per block, or just enough rows for a smaller static batch."""
    if batch is None or batch >= 32:
        return TiledConfig()
    row_threads = 16 if batch > 8 else 8
    return TiledConfig(row_threads=row_threads, rows_per_thread=next(t for t in (1, 2, 4) if row_threads * t >= batch))


def tiled_body(a: KernelArgs, cfg: TiledConfig):
    step_launches(a, lambda *args: _tile_launch(*args, cfg))


def _strided(count: int, threads: int, tid, body):
    """The block's threads walk `count` items (a compile-time count); body(slot, item), slot = the thread's round."""
    for it in range(-(-count // threads)):
        e = i64(it * threads) + tid
        if (it + 1) * threads <= count:
            body(it, e)
        else:
            with T.If(e < i64(count)):
                with T.Then():
                    body(it, e)


def _tile_launch(a: KernelArgs, phase, last, operand, hbuf, scratch, s, cur, nxt, cfg: TiledConfig):
    H, N, D = a.spec.hidden_size, a.batch, a.spec.num_directions
    UB, RG, TB, KC = cfg.units, cfg.row_threads, cfg.rows_per_thread, cfg.k_chunk
    NB, gp, threads = cfg.rows, len(phase.gates), cfg.units * cfg.row_threads
    exact = H % KC == 0  # else the last chunk is partial: scalar loads, zero-filled past H
    V = 4 if exact and KC % 4 == 0 else 1
    chunks = -(-H // KC)
    r_items, h_items = UB * gp * KC // V, NB * KC // V  # vectors staged per chunk
    with T.thread_binding(0, i64(-(-H // UB)), "blockIdx.x") as bx:
        with T.thread_binding(0, i64(D), "blockIdx.y") as d:
            with T.thread_binding(0, tirx.ceildiv(N, i64(NB)), "blockIdx.z") as bz:
                with T.thread_binding(0, i64(UB), "threadIdx.y") as uy:
                    with T.thread_binding(0, i64(RG), "threadIdx.x") as rg:
                        u0, n0, tid = bx * i64(UB), bz * i64(NB), uy * i64(RG) + rg
                        rs = T.alloc_buffer((UB, gp, KC), F32, scope="shared")
                        # flat, so buffer compaction keeps the padded row stride (it trims a 2-D buffer to the columns used)
                        hs = T.alloc_buffer((NB * (KC + PAD),), F32, scope="shared")
                        # the next chunk, loaded into registers while this one is multiplied (hides L2 latency)
                        r_next = T.alloc_buffer((-(-r_items // threads), V), F32, scope="local")
                        h_next = T.alloc_buffer((-(-h_items // threads), V), F32, scope="local")
                        acc = T.alloc_buffer((gp, TB), F32, scope="local")
                        rv = T.alloc_buffer((gp, V), F32, scope="local")
                        hv = T.alloc_buffer((TB, V), F32, scope="local")
                        for gi in range(gp):
                            for b in range(TB):
                                T.buffer_store(acc, tirx.const(0.0, F32), [i64(gi), i64(b)])

                        def r_item(e):
                            return e // i64(gp * KC // V), e // i64(KC // V) % i64(gp), e % i64(KC // V)

                        def load_r(kc):
                            def body(slot, e):
                                u, gi, kv = r_item(e)
                                row = i64(0)
                                for i, g in enumerate(phase.gates):  # the phase's gates need not be contiguous in R
                                    row = tirx.Select(gi == i64(i), i64(g * H), row) if i else i64(g * H)
                                row = row + tirx.min(u0 + u, i64(H - 1))
                                with T.vectorized(0, i64(V)) as v:
                                    k = kc * i64(KC) + kv * i64(V) + v
                                    T.buffer_store(r_next, guarded(k, H, exact, lambda k: a.R[d, row, k].astype(F32), F32), [i64(slot), v])
                            _strided(r_items, threads, tid, body)

                        def load_h(kc):
                            def body(slot, e):
                                r, kv = e // i64(KC // V), e % i64(KC // V)
                                n = tirx.min(n0 + r, N - 1)  # rows past N compute garbage, never stored
                                with T.vectorized(0, i64(V)) as v:
                                    k = kc * i64(KC) + kv * i64(V) + v
                                    T.buffer_store(h_next, guarded(k, H, exact, lambda k: operand_at(operand, phase, cur, d, n, k), F32), [i64(slot), v])
                            _strided(h_items, threads, tid, body)

                        def store_r(slot, e):
                            u, gi, kv = r_item(e)
                            with T.vectorized(0, i64(V)) as v:
                                T.buffer_store(rs, r_next[i64(slot), v], [u, gi, kv * i64(V) + v])

                        def store_h(slot, e):
                            r, kv = e // i64(KC // V), e % i64(KC // V)
                            with T.vectorized(0, i64(V)) as v:
                                T.buffer_store(hs, h_next[i64(slot), v], [r * i64(KC + PAD) + kv * i64(V) + v])

                        load_r(i64(0))
                        load_h(i64(0))
                        with T.serial(0, i64(chunks)) as kc:
                            _strided(r_items, threads, tid, store_r)
                            _strided(h_items, threads, tid, store_h)
                            block_sync()
                            with T.If(kc + i64(1) < i64(chunks)):
                                with T.Then():
                                    load_r(kc + i64(1))
                                    load_h(kc + i64(1))
                            _chunk_fmas(cfg, gp, V, N, n0, uy, rg, (rs, hs), (rv, hv), acc)
                            block_sync()  # the next chunk overwrites rs and hs

                        for b in range(TB):
                            n, j = n0 + rg + i64(b * RG), u0 + uy
                            with T.If(tirx.all(n < N, j < i64(H))):
                                with T.Then():
                                    epilogue(a, phase, last, hbuf, scratch, s, cur, nxt, d, n, j,
                                             lambda gi, b=b: acc[i64(gi), i64(b)])


def _chunk_fmas(cfg: TiledConfig, gp: int, V: int, N, n0, uy, rg, staged, regs, acc):
    """A staged chunk's products: the thread's unit's gate rows (rs) by its batch rows (hs), V columns at a time
    through registers (rv, hv), into acc [gates, rows]."""
    (rs, hs), (rv, hv) = staged, regs
    RG, TB, KC = cfg.row_threads, cfg.rows_per_thread, cfg.k_chunk
    with T.unroll(0, i64(KC // V)) as kv:
        for gi in range(gp):
            with T.vectorized(0, i64(V)) as v:
                T.buffer_store(rv, rs[uy, i64(gi), kv * i64(V) + v], [i64(gi), v])
        for b in range(TB):
            # a slab of rows wholly past the batch (warp-uniform) skips its loads and FMAs
            with T.If(n0 + i64(b * RG) < N):
                with T.Then():
                    with T.vectorized(0, i64(V)) as v:
                        T.buffer_store(hv, hs[(rg + i64(b * RG)) * i64(KC + PAD) + kv * i64(V) + v], [i64(b), v])
                    for gi in range(gp):
                        for v in range(V):
                            idx = [i64(gi), i64(b)]
                            T.buffer_store(acc, acc[i64(gi), i64(b)] + rv[i64(gi), i64(v)] * hv[i64(b), i64(v)], idx)
