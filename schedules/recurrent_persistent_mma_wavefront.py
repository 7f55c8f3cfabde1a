"""The layer wavefront on tensor cores in one cooperative launch: stacked layers at batches 5-64 whose weights fit on
chip across one wave of blocks.

Layer after layer, each layer of such a stack runs persistent_mma: T steps of a grid barrier plus an L2 round trip for
h, latency-bound at these batches, and the layers wait on each other. Here the SMs are split among the layers and
between grid barriers the blocks of layer l run its step t = s - l (recurrent_wavefront's order): T+L-1 steps in all.
A block's step is persistent_mma's: its rows of R in shared memory (recurrent_persistent_mma._Resident), mma.sync tiles
with B = batch rows of h from L2, the k_warps' partial sums in shared memory, the gate program as epilogue. A layer
above the first keeps WR (W's columns, then R's) resident instead and projects its input in the step, a first segment
of the reduction with B the layer below's h of step t (recurrent_mma_wavefront's, hence the same cells: LSTM and RNN,
forward, layout 0).

The split gives each layer the fewest units per block (the least shared-memory reading and mma work per step for the
slowest block) whose blocks, all layers together, make one wave and fit shared memory.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from tvm import tirx
from tvm.script.ir_builder import tirx as T

from .mma_tiles import KC, itemsize
from .recurrent_common import KernelArgs, block_sync, i64, shared_dyn
from .recurrent_mma import HALF, MmaConfig, block_phase, operand_copies
from .recurrent_persistent import _grid_sync, final_states, initial_states
from .recurrent_persistent_mma import _Resident
from .recurrent_mma_wavefront import in_step_input, split_gate_refusal
from .recurrent_wavefront import reduction
from .space import KernelConfig

F32 = "float32"
# the batch tiles by batch bound: one 8-row tile with the reduction split 8 ways, 4 chunks a load and the partial sums
# flat, up to 8 rows; 32 rows a pass (2 x 2 tiles) split 4 ways up to 32, 64 rows (2 x 4 tiles) split 2 ways up to 64,
# both summed as a tree: flat sums would double the slots and leave an H=1024 stack no room (docs/decisions.md)
POINTS = ((8, MmaConfig(n_tiles=1, n_warps=1, k_warps=8, depth=4, flat_sums=1)),
          (32, MmaConfig(n_tiles=2, n_warps=2, k_warps=4, depth=2)),
          (64, MmaConfig(n_tiles=2, n_warps=4, k_warps=2, depth=2)))


@dataclass(frozen=True)
class StackMmaConfig:
    tiles: MmaConfig  # the batch tiles, reduction warps and depth every layer's blocks share
    units: tuple[int, ...]  # hidden units per block, per layer

    def layer(self, i: int) -> MmaConfig:
        """Layer i's point: its units; the first layer prefetches XW (the layers above add their biases instead)."""
        return replace(self.tiles, units=self.units[i], prefetch=int(i == 0))

    def blocks(self, specs) -> tuple[int, ...]:
        return tuple(-(-s.hidden_size // u) for s, u in zip(specs, self.units))

    def describe(self, specs) -> str:
        blocks = self.blocks(specs)
        return (f"persistent tensor-core wavefront: {len(specs)} stacked layers in one cooperative kernel of {sum(blocks)} "
                f"blocks ({'+'.join(map(str, blocks))}, {'/'.join(map(str, self.units))} units), layer l+1 one step behind layer l")


def granule(cell) -> int:
    """The fewest units whose gate rows fill whole 16-row m-tiles (no padding rows in a block's mma's)."""
    return 16 // math.gcd(cell.gates, 16)


def tier_bounds(batch_bound: int) -> list[int]:
    """The largest batch of each point a module bounded to batch_bound (at most the last point's) runs, the last the bound."""
    bounds = [b for b, _ in POINTS if b < batch_bound]
    return bounds + [batch_bound]


def largest_bound(specs, cells, device) -> int | None:
    """The largest point's bound up to which every point's split fits (None: not even the first fits). A stack runs
    the points from the first on, so the first that does not fit ends them (the 64-row point's two reduction warps
    take fewer partial-sum slots than the 32-row point's four: shared memory does not grow with the bound)."""
    fitting = None
    for bound, _ in POINTS:
        if plan(specs, cells, device, bound) is None:
            break
        fitting = bound
    return fitting


def point(specs, cfg: StackMmaConfig, i: int) -> KernelConfig:
    """Layer i's point, for the plan and the module's metadata."""
    t = cfg.tiles
    return KernelConfig.of("persistent_mma_wavefront", layer=i, layers=len(specs), units=cfg.units[i], grid=sum(cfg.blocks(specs)),
                           n_tiles=t.n_tiles, n_warps=t.n_warps, k_warps=t.k_warps, depth=t.depth,
                           **({"flat_sums": 1} if t.flat_sums else {}))


def refusal(specs, cells) -> str | None:
    """Why these stacked layers do not run as one persistent tensor-core wavefront (None: they may, where plan fits)."""
    if len({s.dtype for s in specs}) > 1:  # one shared buffer holds every layer's weights
        return "the stacked layers' dtypes differ"
    why = split_gate_refusal(specs, cells)
    if why:
        return why
    for spec in specs:
        if spec.dtype not in HALF and spec.precision != "tf32":
            return f"{spec.op} node '{spec.name}' is exact fp32 (the persistent tensor-core wavefront runs fp16, bf16 and tf32)"
        if spec.hidden_size % KC or spec.input_size % KC:
            return f"{spec.op} node '{spec.name}': its sizes are not multiples of {KC} (the resident tiles' chunks)"
    return None


def plan(specs, cells, device, batch_bound: int) -> StackMmaConfig | None:
    """The batch bound's tiles and the least per-block work (units x gates x reduction) whose blocks, every layer's
    together, make one wave; None where that split does not fit shared memory."""
    tiles = next(p for bound, p in POINTS if batch_bound <= bound)
    ks = [len(c.phases[0].gates) * reduction(s, i == 0) for i, (s, c) in enumerate(zip(specs, cells))]
    steps = [granule(c) for c in cells]
    costs = sorted({u * k for s, k, g in zip(specs, ks, steps) for u in range(g, s.hidden_size + g, g)})
    for cost in costs:
        units = [min(cost // k // g * g, -(-s.hidden_size // g) * g) for s, k, g in zip(specs, ks, steps)]
        if min(units) < 1:
            continue
        blocks = [-(-s.hidden_size // u) for s, u in zip(specs, units)]
        if sum(blocks) > device.sm_count:
            continue
        # each layer's units spread evenly over the blocks it needs
        units = tuple(-(-(-(-s.hidden_size // b)) // g) * g for s, b, g in zip(specs, blocks, steps))
        cfg = StackMmaConfig(tiles, units)
        return cfg if smem_bytes(specs, cells, cfg) <= device.smem_limit else None
    return None


def resident_elements(specs, cells, cfg: StackMmaConfig) -> int:
    """The largest block's resident rows (R, or WR above the first layer), in elements."""
    return max(len(c.phases[0].gates) * u * reduction(s, i == 0) for i, (s, c, u) in enumerate(zip(specs, cells, cfg.units)))


def sums_elements(cells, cfg: StackMmaConfig) -> int:
    return max(cfg.layer(i).smem_bytes(len(c.phases[0].gates)) // 4 for i, c in enumerate(cells))


def smem_bytes(specs, cells, cfg: StackMmaConfig) -> int:
    return resident_elements(specs, cells, cfg) * itemsize(specs[0].dtype) + 4 * sums_elements(cells, cfg)


def persistent_mma_wavefront_body(layers: list[KernelArgs], cfg: StackMmaConfig):
    """One cooperative launch: each block its layer's rows into shared memory and initial states, T+L-1 steps between
    grid barriers (the blocks of layer l at step t = s - l), final states."""
    L, N, seq = len(layers), layers[0].batch, layers[0].seq
    specs, cells = [a.spec for a in layers], [a.cell for a in layers]
    counts = cfg.blocks(specs)
    first = [sum(counts[:i]) for i in range(L)]
    configs = [cfg.layer(i) for i in range(L)]
    threads = 32 * cfg.tiles.n_warps * cfg.tiles.k_warps
    hbufs = [T.alloc_buffer((2, 1, N, a.spec.hidden_size), F32) for a in layers]
    grid = sum(counts)
    for a, c in zip(layers, configs):
        operand_copies(a, c)
    zero = i64(0)
    with T.thread_binding(0, i64(grid), "blockIdx.x") as bx:
        with T.thread_binding(0, i64(threads // 32), "threadIdx.y") as wy:
            with T.thread_binding(0, i64(32), "threadIdx.x") as lane:
                tid = wy * i64(32) + lane
                wsm = shared_dyn((resident_elements(specs, cells, cfg),), specs[0].dtype)
                acc_s = shared_dyn((sums_elements(cells, cfg),), F32)

                def mine(i):
                    return tirx.all(bx >= i64(first[i]), bx < i64(first[i] + counts[i]))

                def first_unit(i):
                    return (bx - i64(first[i])) * i64(cfg.units[i])

                residents = [_Resident(a, c, wsm, [0], reduction(a.spec, i == 0) // KC, zero, first_unit(i),
                                       columns=reduction(a.spec, i == 0)) for i, (a, c) in enumerate(zip(layers, configs))]
                for i, a in enumerate(layers):
                    with T.If(mine(i)):
                        with T.Then():
                            residents[i].load(threads, tid, None)
                            initial_states(a, hbufs[i], zero, first_unit(i), cfg.units[i], threads, tid)
                block_sync()
                _grid_sync()

                with T.serial(0, seq + i64(L - 1)) as s:
                    for i, a in enumerate(layers):
                        t = s - i64(i)
                        with T.If(tirx.all(mine(i), t >= i64(0), t < seq)):  # block-uniform: the block's barriers stay safe
                            with T.Then():
                                below = (layers[i - 1], hbufs[i - 1]) if i else None
                                _layer_step(a, below, hbufs[i], residents[i], configs[i], t, first_unit(i), wy, lane, acc_s)
                    _grid_sync()

                for i, a in enumerate(layers):
                    with T.If(mine(i)):
                        with T.Then():
                            final_states(a, hbufs[i], zero, first_unit(i), cfg.units[i], threads, tid)


def _layer_step(a: KernelArgs, below, hbuf, resident: _Resident, cfg: MmaConfig, t, u0, wy, lane, acc_s):
    """One block's part of layer a's step t, a pass per cfg.rows batch rows. Above the first layer the input segment's
    A is WR's first chunks and its B the layer below's h of step t: the half of its buffer it wrote last (t + 1's
    parity, as ours)."""
    spec, phase, zero = a.spec, a.cell.phases[0], i64(0)
    cur, nxt = t % i64(2), (t + i64(1)) % i64(2)
    extra = {} if below is None else in_step_input(a, below, nxt, resident.a_at(0, phase), True)
    a_at = resident.a_at(0, phase, first=0 if below is None else spec.input_size // KC)
    with T.serial(0, tirx.ceildiv(a.batch, i64(cfg.rows))) as chunk:
        block_phase(a, phase, True, hbuf, hbuf, {}, t, cur, nxt, cfg, zero, u0, chunk * i64(cfg.rows), wy, lane, acc_s,
                    a_at, True, shared_a=True, **extra)
        block_sync()  # the next pass's partial sums reuse acc_s
