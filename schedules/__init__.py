"""Kernel generators for recurrent layers, one module per kernel and target, and the choice between them.

cells, layer          the types kernels are written against: a cell as data, one recurrent node's spec
device, errors        the device a kernel runs on (passed in), the error the generators raise
space                 the kinds of kernel, registered one per kind: knobs, default point, emitted body, grid
choice                which kind runs which batch: one ordered table per target, tuned points cut in
recurrent_cpu         the recurrent layer for LLVM targets
vector_math           sigmoid/tanh/exp as fp32 polynomials, so the CPU gate program vectorizes
recurrent_cuda        CUDA, stepwise: one fused launch per step and phase (weights from L2/HBM)
recurrent_persistent  CUDA, persistent: one cooperative launch for the whole sequence, R in shared memory
recurrent_tiled       CUDA, large batch: per step one tiled GEMM launch (R and h staged in shared memory)
recurrent_mma         CUDA, large batch: per step one launch of tensor-core mma tiles
recurrent_persistent_mma  CUDA, batch above 4: one cooperative launch, R in shared memory, tensor-core steps
recurrent_wavefront   CUDA, stacked layers at persistent's batches: one cooperative launch for the whole stack
recurrent_mma_wavefront  CUDA, stacked layers at the per-step mma's batches: one launch of every layer's tiles a step
recurrent_persistent_mma_wavefront  CUDA, stacked layers at batch 5-64 whose weights fit a wave: one cooperative launch
recurrent_block_stack CUDA, a small stack at batch <= 4 whose weights fit one SM: one block, input projections inside
recurrent_cluster     CUDA sm_90+, batch 1: thread-block clusters per direction, h through distributed shared memory
mma_tiles             the warp's mma.sync tiles (fp16/bf16, TF32, 3xTF32, f16x3) the tensor-core kernels are built from
step_halves           f16x3 steps (exact fp32 as fp16 products of scaled halves): the scales of R's rows and of h
warp_gemv             the warp-level gate GEMV both CUDA kernels are built from
cooperative           the TIR pipeline that tags grid-barrier kernels for cooperative launch
projection_*          the input projection GEMMs (CPU, CUDA SIMT, mma.sync, wgmma)
graph_cpu, graph_cuda  the layers around the recurrent ones: CPU conv/dense kernels and rules, CUDA rule order

The dependency runs one way: tvmrnn builds on this package, never the reverse.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import partial
from typing import Callable

from tvm import tirx
from tvm.script.ir_builder import tirx as T

from .choice import (KERNEL_CHOICES, PERSISTENT_MAX_BATCH, RESIDENT_MAX_BATCH, STEPWISE_MAX_BATCH, STREAMED_MAX_BATCH,
                     TILED_MIN_HIDDEN, TUNED_MARGIN, Branch, KernelPlan, plan_kernel)
from .device import Device
from .errors import KernelError
from .recurrent_common import batch_dispatch, i64
from .recurrent_wavefront import stackable as wavefront_stackable
from .space import KernelConfig, emitter

__all__ = ["KERNEL_CHOICES", "PERSISTENT_MAX_BATCH", "RESIDENT_MAX_BATCH", "STEPWISE_MAX_BATCH", "STREAMED_MAX_BATCH",
           "TILED_MIN_HIDDEN", "TUNED_MARGIN", "Branch", "Device", "KernelConfig", "KernelError", "KernelPlan",
           "RecurrentKernel", "StackKernel", "kernel_plan", "plan_kernel", "planned_kernel", "point_kernel",
           "recurrent_kernel", "signature_kernel", "stack_kernel"]


@dataclass(frozen=True)
class RecurrentKernel:
    func: tirx.PrimFunc
    r_layout: str  # how the kernel reads R: "rows" (ONNX's [D, G*H, H]), "transposed" or "panels" (recurrent_common)
    plan: KernelPlan

    @property
    def name(self) -> str:
        return self.plan.describe()


def kernel_plan(spec, cell, target, choice: str = "auto", tuned: dict | None = None, device: Device | None = None) -> str:
    """The plan in words, for inspect and the compile log."""
    return plan_kernel(spec, cell, target, choice, tuned, device).describe()


def _prim_func(spec, cell, target, branches, seq=None, batch=None, device: Device | None = None):
    device = device or Device.of_target(target)
    pairs = [(b.up_to, emitter(b.config, spec, cell, device)) for b in branches]
    if target.kind.name == "cuda":
        from .recurrent_cuda import R_LAYOUT, cuda_prim_func

        return cuda_prim_func(spec, cell, lambda a: batch_dispatch(a, pairs), seq, batch), R_LAYOUT
    from .recurrent_cpu import cpu_prim_func, r_layout

    return cpu_prim_func(spec, cell, lambda a: batch_dispatch(a, pairs), seq, batch), r_layout(spec)


def signature_kernel(spec, cell, target, emit_body, seq: int, batch: int) -> tirx.PrimFunc:
    """A PrimFunc with the recurrent kernel's arguments for `target` at static shapes and any body
    (a tuning workload's template)."""
    if target.kind.name == "cuda":
        from .recurrent_cuda import cuda_prim_func

        return cuda_prim_func(spec, cell, emit_body, seq, batch)
    from .recurrent_cpu import cpu_signature

    return cpu_signature(spec, cell, emit_body, seq, batch)


def recurrent_kernel(spec, cell, target, choice: str = "auto", tuned: dict | None = None,
                     device: Device | None = None) -> RecurrentKernel:
    """The recurrent kernel of one layer for `target` (on `device`, by default the target's), marked scheduled so
    generic schedulers leave it alone."""
    return planned_kernel(spec, cell, target, plan_kernel(spec, cell, target, choice, tuned, device), device)


def planned_kernel(spec, cell, target, plan: KernelPlan, device: Device | None = None, batch: int | None = None) -> RecurrentKernel:
    """The recurrent kernel that runs a plan (choice.plan_kernel's) made before, for the device it was made for; batch:
    the model's batch where it fixes one (the kernel then holds only the branch that runs it), else None."""
    func, layout = _prim_func(spec, cell, target, plan.branches, batch=batch, device=device)
    # op_pattern 8 (opaque): FuseOps must not merge it with neighbours
    return RecurrentKernel(func.with_attrs({"tirx.is_scheduled": True, "op_pattern": 8}), layout, plan)


def point_kernel(spec, cell, target, config: KernelConfig, seq: int | None = None, batch: int | None = None,
                 device: Device | None = None) -> tirx.PrimFunc:
    """One point of a space as a kernel: at static shapes, what a tuning task builds and measures."""
    func, _ = _prim_func(spec, cell, target, [Branch(None, config, False)], seq, batch, device)
    return func


@dataclass(frozen=True)
class StackKernel:
    func: tirx.PrimFunc
    plans: tuple[KernelPlan, ...]  # one per layer, for the compile log and the module's metadata
    reads_x: bool = False  # the first layer too projects its input in the step (block_stack): the kernel takes X, not XW
    joined_states: bool = False  # every layer's h0 one argument after X, their final h one output after the Ys


WAVEFRONT_WARPS = 8  # unless the first layer's tuned persistent point says otherwise


def stack_kernel(specs, cells, target, choice: str = "auto", tuned: list | None = None, batch_bound: int | None = None,
                 device: Device | None = None, reads_x: bool = True, joined_states: bool = False):
    """One kernel for a chain of stacked layers, or (None, why not) where none applies: auto only, on CUDA.
    - Every batch the module accepts (batch_bound) within the persistent kernel's, where each layer's own plan would run
      persistent (or cluster) there (tuning may say otherwise): one block (recurrent_block_stack) where the batch is
      small and every layer's weights fit its shared memory (and reads_x: the first layer's weights are constants, which
      it takes as it takes the others'), else the wavefront (recurrent_wavefront) where the split among layers fits.
    - Above that, on tensor cores, each batch on its tier in one kernel (_tensor_core_tiers): the wavefront to the
      persistent kernel's batches, then the persistent tensor-core wavefront where the stack's weights fit a wave, and
      above its batches the per-step tensor-core wavefront where its rule takes the bound.
    joined_states: the layers' initial and final h are each one [layers, batch, H] tensor (a block stack then takes and
    writes them so: StackKernel.joined_states)."""
    device = device or Device.of_target(target)
    if choice != "auto" or target.kind.name != "cuda":
        return None, "only kernel='auto' on CUDA"
    own = []  # each layer's plan were it alone
    for i, (spec, cell) in enumerate(zip(specs, cells)):
        why = wavefront_stackable(spec, cell, i == 0)
        if why:
            return None, f"{spec.op} node '{spec.name}': {why}"
        own.append(plan_kernel(spec, cell, target, choice, tuned[i] if tuned else None, device))
    if batch_bound is None or batch_bound > PERSISTENT_MAX_BATCH:
        return _mma_stack(specs, cells, own, batch_bound, target, device)
    return _persistent_stack(specs, cells, own, batch_bound, device, reads_x, joined_states)


def _persistent_stack(specs, cells, own, batch_bound: int, device: Device, reads_x: bool, joined_states: bool):
    from . import recurrent_block_stack as block_stack

    for spec, plan in zip(specs, own):
        kinds_used = {plan.branch_at(n).config.kind for n in range(1, batch_bound + 1)}
        # a layer alone runs cluster at batch 1 (and one cluster a row at 2-8); stacked, one wavefront step of all layers
        # beats a cluster step per layer at batch 1 with one cluster a layer (against clusters side by side: not measured)
        if not kinds_used <= {"persistent", "cluster"}:
            return None, f"{spec.op} node '{spec.name}' runs {'/'.join(sorted(kinds_used))} at batch <= {batch_bound}"
    if batch_bound == 1 and all(_grid_of_clusters(plan.branch_at(1).config) for plan in own):
        # but a grid of clusters' step (1.11-1.17 us at H512) is shorter than a wavefront step a layer (1.32-1.43)
        return None, "each layer runs a grid of clusters at batch 1, layer after layer"
    if reads_x and batch_bound <= block_stack.MAX_BATCH and block_stack.refusal(specs, cells) is None:
        cfg = block_stack.plan(specs, cells, device, batch_bound)
        if cfg is not None:
            return _block_stack(specs, cells, cfg, batch_bound, joined_states and _joinable(specs))
    cfg = _wavefront_plan(specs, cells, own, device)
    if cfg is None:
        return None, "the layers' weights do not fit on chip across one wave"
    from .recurrent_wavefront import wavefront_prim_func

    func = wavefront_prim_func(specs, cells, cfg).with_attrs({"tirx.is_scheduled": True, "op_pattern": 8})
    why = f"wavefront: {_wavefront_words(specs, cfg)}, batch <= {batch_bound}"
    plans = tuple(KernelPlan("cuda", (Branch(None, _wavefront_point(cfg, i, len(specs)), False),), why) for i in range(len(specs)))
    return StackKernel(func, plans), why


def _wavefront_plan(specs, cells, own, device: Device):
    from . import recurrent_wavefront as wavefront

    first = own[0].branch_at(1)
    warps = first.config["warps"] if first.tuned and first.config.kind == "persistent" else WAVEFRONT_WARPS
    return wavefront.plan(specs, cells, device, warps)


def _wavefront_words(specs, cfg) -> str:
    return (f"{len(specs)} stacked layers in one cooperative kernel of {cfg.grid} blocks ({'+'.join(map(str, cfg.blocks))}), "
            "layer l+1 one step behind layer l")


def _wavefront_point(cfg, layer: int, layers: int) -> KernelConfig:
    return KernelConfig.of("wavefront", layer=layer, layers=layers, units=cfg.units[layer], blocks=cfg.blocks[layer],
                           grid=cfg.grid, warps=cfg.warps)


@dataclass(frozen=True)
class _Tier:
    """One kernel of a stack's dispatch by batch: it runs the batches up to `up_to` (None: all above the tier before)."""

    up_to: int | None
    emit: Callable  # emit(layers): the kernel's body, given each layer's KernelArgs
    words: str
    point: Callable  # point(layer): the KernelConfig the plan names for that layer


def _mma_stack(specs, cells, own, batch_bound: int | None, target, device: Device):
    """Above PERSISTENT_MAX_BATCH on tensor cores: the tensor-core wavefronts (_tensor_core_tiers), the wavefront running
    batches 1-PERSISTENT_MAX_BATCH in the same kernel where its split fits."""
    from .recurrent_wavefront import stack_prim_func, wavefront_body
    from .space import tensor_cores

    if batch_bound is None:
        return None, f"batch unbounded; a wavefront runs batch <= {PERSISTENT_MAX_BATCH}, the tensor-core wavefront a bounded batch"
    if not tensor_cores(target):
        return None, f"batch up to {batch_bound}; a wavefront runs batch <= {PERSISTENT_MAX_BATCH} (no tensor cores on {device.arch})"
    tiers = _tensor_core_tiers(specs, cells, batch_bound, device)
    if isinstance(tiers, str):
        return None, f"batch up to {batch_bound}; {tiers}"
    small = _wavefront_plan(specs, cells, own, device)
    if small is None:  # a tensor-core step is far slower than a layer's persistent or cluster step at batch 1-4
        return None, f"batch up to {batch_bound}; the layers' weights do not fit a wavefront's split, which batches 1-{PERSISTENT_MAX_BATCH} would run"
    tiers = [_Tier(PERSISTENT_MAX_BATCH, partial(wavefront_body, cfg=small), f"wavefront: {_wavefront_words(specs, small)}",
                   partial(_wavefront_point, small, layers=len(specs)))] + tiers
    func = stack_prim_func(specs, cells, partial(_dispatch, tiers)).with_attrs({"tirx.is_scheduled": True, "op_pattern": 8})
    why = "; ".join(f"batch <= {t.up_to}: {t.words}" if t.up_to else f"else {t.words}" for t in tiers) + f", batch <= {batch_bound}"
    plans = tuple(KernelPlan("cuda", tuple(Branch(t.up_to, t.point(i), False) for t in tiers), why) for i in range(len(specs)))
    return StackKernel(func, plans), why


def _dispatch(tiers: list[_Tier], layers):
    """The first tier whose bound holds the batch runs; each in its own branch, its operand copies its own."""
    first, *rest = tiers

    def run():
        for a in layers:
            a.new_branch()
        first.emit(layers)

    if not rest:
        run()
        return
    with T.If(layers[0].batch <= i64(first.up_to)):
        with T.Then():
            run()
        with T.Else():
            _dispatch(rest, layers)


def _tensor_core_tiers(specs, cells, batch_bound: int, device: Device) -> list[_Tier] | str:
    """The tensor-core wavefronts that run these layers above PERSISTENT_MAX_BATCH, or why none does: the persistent
    one up to its batches where the stack's weights fit a wave (_resident_tiers), above them one launch of every
    layer's mma tiles a step where its rule takes the bound (recurrent_mma_wavefront.refusal)."""
    from . import recurrent_mma_wavefront as mma_wavefront
    from .recurrent_mma import default_config

    tiers = _resident_tiers(specs, cells, batch_bound, device)
    why_resident, tiers = (tiers, []) if isinstance(tiers, str) else (None, tiers)
    if tiers and batch_bound <= tiers[-1].up_to:
        return tiers[:-1] + [replace(tiers[-1], up_to=None)]
    cfg = default_config()  # the per-step mma's point
    why = mma_wavefront.refusal(specs, cells, cfg, batch_bound, device)
    if why is not None:
        return f"{why_resident}; {why}" if why_resident else why
    knobs = dict(units=cfg.units, n_tiles=cfg.n_tiles, n_warps=cfg.n_warps, k_warps=cfg.k_warps, depth=cfg.depth)
    return tiers + [_Tier(None, partial(mma_wavefront.mma_wavefront_body, cfg=cfg), mma_wavefront.describe(specs, cfg),
                          lambda i: KernelConfig.of("mma_wavefront", layer=i, layers=len(specs), **knobs))]


def _resident_tiers(specs, cells, batch_bound: int, device: Device) -> list[_Tier] | str:
    """The persistent tensor-core wavefront, one tier a point up to the bound or the largest point that fits, or why it
    does not run."""
    from . import recurrent_persistent_mma_wavefront as resident

    why = resident.refusal(specs, cells)
    if why:
        return why
    largest = resident.largest_bound(specs, cells, device)
    if largest is None:
        return "the layers' R and WR do not fit on chip across one wave"
    tiers = []
    for up_to in resident.tier_bounds(min(batch_bound, largest)):
        split = resident.plan(specs, cells, device, up_to)
        tiers.append(_Tier(up_to, partial(resident.persistent_mma_wavefront_body, cfg=split),
                           f"{split.describe(specs)}, {split.tiles.rows} batch rows a pass", partial(resident.point, specs, split)))
    return tiers


def _grid_of_clusters(config: KernelConfig) -> bool:
    return config.kind == "cluster" and config["clusters"] > 1


def _joinable(specs) -> bool:
    """Every layer has an initial h and one width (their states stack into one tensor)."""
    return all(s.has("initial_h") and s.hidden_size == specs[0].hidden_size for s in specs)


def _block_stack(specs, cells, cfg, batch_bound: int, joined_states: bool):
    from .recurrent_block_stack import block_stack_prim_func

    func = block_stack_prim_func(specs, cells, cfg, joined_states).with_attrs({"tirx.is_scheduled": True, "op_pattern": 8})
    why = (f"block stack: {len(specs)} stacked layers in one block, their input projections included "
           f"({cfg.describe()}), layer l+1 one step behind layer l, batch <= {batch_bound}")
    plans = tuple(KernelPlan("cuda", (Branch(None, KernelConfig.of("block_stack", layer=i, layers=len(specs), warps=w, units=cfg.units,
                                                                    lanes=cfg.lanes, project=cfg.project),
                                             False),), why) for i, w in enumerate(cfg.warps))
    return StackKernel(func, plans, reads_x=True, joined_states=joined_states), why
