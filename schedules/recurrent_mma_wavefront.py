"""The layer wavefront on tensor cores: a stack of layers above the persistent kernels' batches, one launch of mma tiles
(recurrent_mma) per wavefront step.

Layer after layer, a stack of L layers takes L*T per-step launches in a row, each with few blocks where this kind runs
(blog-b, H256 at batch 64: 64 blocks on 132 SMs). Here launch s runs every layer's blocks side by side, layer l at its
step t = s - l: T+L-1 launches. Layer l reads the h that layer l-1 wrote in launch s-1 (its step t) and its own h of
step t-1, each from the half of a double buffer that no block writes in launch s (layer l-1 now writes its other half).

A layer above the first takes W beside R (WR, as recurrent_wavefront's do) and projects its input in the step: the
reduction's first segment, over its input size, multiplies W's columns by the layer below's h into the same
accumulators; the epilogue adds its biases. So every gate must be x + R h (+ biases): LSTM and RNN cells, forward, in
layout 0 (recurrent_wavefront.stackable); a GRU's h gate multiplies R_h h alone by r, and such stacks run layer by layer.
"""

from __future__ import annotations

from tvm import tirx
from tvm.script.ir_builder import tirx as T

from .mma_tiles import KC
from .recurrent_common import KernelArgs, block_sync, i64
from .recurrent_cuda import final_launch, initial_launch
from .recurrent_mma import MmaConfig, block_phase, global_a, operand_copies, partial_sums
from .recurrent_wavefront import split_h

F32 = "float32"


# the most blocks a launch may have at the module's largest batch, per SM: beyond, a step's work rather than its
# latency sets its time, and the input projections done in the step cost more than the layers' overlap saves
MAX_BLOCKS_PER_SM = 2
# the smallest batch bound it takes: at batch 5-8 each layer alone (batch groups of clusters, persistent_mma) was the
# faster, from 16 on the stack (docs/decisions.md); a module bounded higher still runs its batches 5-8 here
MIN_BATCH_BOUND = 16


def split_gate_refusal(specs, cells) -> str | None:
    """Why a layer above the first cannot project its input in the step into its gates' sums (None: every one can)."""
    for i, (spec, cell) in enumerate(zip(specs, cells)):
        if i and split_h(cell, False):
            return f"{spec.op} node '{spec.name}': its h gate adds R_h h apart from W_h x (the tensor-core wavefront sums them)"
    return None


def in_step_input(a: KernelArgs, below, nxt, a_in, a_vector: bool) -> dict:
    """block_phase's arguments for a layer above the first: the reduction's first segment over its input size, A's
    element from a_in (W's columns of WR) and B the layer below's h of this step (the half of its buffer it wrote
    last, parity nxt, from its half-precision copy where it keeps one); the epilogue adds the biases for XW."""
    under, under_h = below
    spec, phase, zero = a.spec, a.cell.phases[0], i64(0)
    b_src = under.mirrors.get("h", under_h)
    return dict(inputs=(spec.input_size, a_in, a_vector, lambda n, k: b_src[nxt, zero, n, k]),
                x_of=lambda gi, j: a.bias[i64(phase.gates[gi] * spec.hidden_size) + j])


def refusal(specs, cells, cfg: MmaConfig, batch_bound: int, device) -> str | None:
    """Why these stacked layers do not run as one tensor-core wavefront at batches up to batch_bound (None: they do)."""
    why = split_gate_refusal(specs, cells)
    if why:
        return why
    if batch_bound < MIN_BATCH_BOUND:
        return f"the tensor-core wavefront runs batch bounds from {MIN_BATCH_BOUND}"
    if batch_bound > largest_bound(specs, cfg, device):
        launched = sum(blocks(s, cfg) for s in specs) * -(-batch_bound // cfg.rows)
        return (f"a tensor-core wavefront step would launch {launched} blocks, more than {MAX_BLOCKS_PER_SM} a streaming "
                f"multiprocessor ({device.sm_count})")
    return None


def largest_bound(specs, cfg: MmaConfig, device) -> int:
    """The largest batch bound whose launches stay within MAX_BLOCKS_PER_SM."""
    return MAX_BLOCKS_PER_SM * device.sm_count // sum(blocks(s, cfg) for s in specs) * cfg.rows


def describe(specs, cfg: MmaConfig) -> str:
    return (f"tensor-core wavefront: {len(specs)} stacked layers, one launch of mma tiles a step of them all "
            f"({'+'.join(str(blocks(s, cfg)) for s in specs)} blocks a batch tile), layer l+1 one step behind layer l")


def blocks(spec, cfg: MmaConfig) -> int:
    """A layer's blocks along its units (each launch has ceil(batch / rows) of them along the batch)."""
    return -(-spec.hidden_size // cfg.units)


def mma_wavefront_body(layers: list[KernelArgs], cfg: MmaConfig):
    """Initial states, T+L-1 launches of every layer's blocks, final states."""
    hbufs = [T.alloc_buffer((2, 1, a.batch, a.spec.hidden_size), F32) for a in layers]
    for a, hbuf in zip(layers, hbufs):
        operand_copies(a, cfg)
        initial_launch(a, hbuf)
    with T.serial(0, layers[0].seq + i64(len(layers) - 1)) as s:
        _launch(layers, hbufs, s, cfg)
    for a, hbuf in zip(layers, hbufs):
        final_launch(a, hbuf)


def _launch(layers: list[KernelArgs], hbufs, s, cfg: MmaConfig):
    """Wavefront step s: blockIdx.x runs over every layer's unit blocks (layer 0's first), blockIdx.z over batch tiles."""
    counts = [blocks(a.spec, cfg) for a in layers]
    first = [sum(counts[:i]) for i in range(len(layers))]
    with T.thread_binding(0, i64(sum(counts)), "blockIdx.x") as bx:
        with T.thread_binding(0, tirx.ceildiv(layers[0].batch, i64(cfg.rows)), "blockIdx.z") as bz:
            with T.thread_binding(0, i64(cfg.n_warps * cfg.k_warps), "threadIdx.y") as wy:
                with T.thread_binding(0, i64(32), "threadIdx.x") as lane:
                    acc_s = partial_sums(cfg, len(layers[0].cell.phases[0].gates))
                    for i, a in enumerate(layers):
                        t = s - i64(i)
                        mine = tirx.all(bx >= i64(first[i]), bx < i64(first[i] + counts[i]), t >= i64(0), t < a.seq)
                        with T.If(mine):  # block-uniform: the block's barriers stay safe
                            with T.Then():
                                below = (layers[i - 1], hbufs[i - 1]) if i else None
                                _layer_step(a, below, hbufs[i], t, (bx - i64(first[i])) * i64(cfg.units), bz * i64(cfg.rows),
                                            wy, lane, acc_s, cfg)
                                block_sync()  # the next layer's branch reuses acc_s (to TVM's sync planner: a block may run several)


def _layer_step(a: KernelArgs, below, hbuf, t, u0, n0, wy, lane, acc_s, cfg: MmaConfig):
    """One block's part of layer a's step t. Above the first layer, A's columns are W's then R's (WR) and the input
    segment's B is the layer below's h of step t: the half of its buffer it wrote last (t + 1's parity, as ours)."""
    spec, phase = a.spec, a.cell.phases[0]
    H, zero = spec.hidden_size, i64(0)
    cur, nxt = t % i64(2), (t + i64(1)) % i64(2)
    if below is None:
        block_phase(a, phase, True, hbuf, hbuf, {}, t, cur, nxt, cfg, zero, u0, n0, wy, lane, acc_s,
                    global_a(a, phase, cfg.units, zero, u0), H % KC == 0)
        return
    In = spec.input_size
    vector = H % KC == 0 and In % KC == 0  # whole chunks, and WR's rows (I+H long) stay 16-byte aligned
    block_phase(a, phase, True, hbuf, hbuf, {}, t, cur, nxt, cfg, zero, u0, n0, wy, lane, acc_s,
                global_a(a, phase, cfg.units, zero, u0, columns=In), vector,
                **in_step_input(a, below, nxt, global_a(a, phase, cfg.units, zero, u0, size=In), vector))
