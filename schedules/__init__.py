"""Our hand-written kernel schedules, one module per kernel and target, and the choice between them.

recurrent_cpu         the recurrent layer for LLVM targets
vector_math           sigmoid/tanh/exp as fp32 polynomials, so the CPU gate program vectorizes
recurrent_cuda        CUDA, stepwise: one fused launch per step and phase (weights from L2/HBM)
recurrent_persistent  CUDA, persistent: one cooperative launch for the whole sequence, R in shared memory
recurrent_tiled       CUDA, large batch: per step one tiled GEMM launch (R and h staged in shared memory)
recurrent_mma         CUDA, large batch: per step one launch of tensor-core mma tiles
recurrent_persistent_mma  CUDA, batch above 4: one cooperative launch, R in shared memory, tensor-core steps
recurrent_wavefront   CUDA, stacked layers at persistent's batches: one cooperative launch for the whole stack
mma_tiles             the warp's mma.sync tiles (fp16/bf16, TF32, 3xTF32, f16x3) the tensor-core kernels are built from
step_halves           f16x3 steps (exact fp32 as fp16 products of scaled halves): the scales of R's rows and of h
warp_gemv             the warp-level gate GEMV both CUDA kernels are built from
cooperative           the TIR pipeline that tags grid-barrier kernels for cooperative launch
space                 the tunable knobs of each kernel kind, their default points, the body a point emits

A layer's kernel is a dispatch over batch buckets (`if batch <= b0: ... elif ...`), each bucket
running one point of one space: the tuned point where the tuning logs have one for this shape
and target, else the default (on CUDA: persistent up to PERSISTENT_MAX_BATCH when R fits on chip, then
persistent_mma where R fits in shared memory across one wave; else for fp32 stepwise up to STEPWISE_MAX_BATCH
and tiled above, for fp16/bf16 mma, with persistent_mma streaming part of R from L2 in between, up to
STREAMED_MAX_BATCH). So a dynamic-batch module runs each batch on the kernel tuned for it.
"""

from __future__ import annotations

from dataclasses import dataclass

from tvm import tirx

from .errors import KernelError
from .recurrent_common import batch_dispatch
from .recurrent_persistent_mma import MID_BATCH as RESIDENT_MID_BATCH
from .recurrent_persistent_mma import SMALL_BATCH as RESIDENT_SMALL_BATCH
from .recurrent_persistent_mma import WIDE_BATCH as RESIDENT_WIDE_BATCH
from .space import KernelConfig, default_config, emitter, kinds

KERNEL_CHOICES = ("auto", "stepwise", "persistent", "tiled", "mma", "persistent_mma")
# Batch up to which the persistent kernel beats the stepwise one when untuned. Measured on the H100
# (benchmarks/results/2026-11-22-h100-persistent-small-batch.md): 2-2.3x faster at batch 1,
# 1.4x slower at batch 8. Tuning logs replace this guess per shape.
PERSISTENT_MAX_BATCH = 4
# Untuned, tiled replaces stepwise above STEPWISE_MAX_BATCH rows for layers of at least TILED_MIN_HIDDEN
# units. Measured on the H100 (benchmarks/results/2026-11-23-h100-tiled-variants.md): tiled 1.12-1.45x
# faster at batch 64 with H=1024 and 2560; 1.3-2.3x slower at batch 8 and 20 (H=800, 1024), where too few
# blocks fill the GPU. Tuning logs replace this rule per shape (tiled is in every CUDA task's space).
# fp16/bf16 layers run the tensor-core kind (mma) above PERSISTENT_MAX_BATCH instead of stepwise and tiled:
# 1.4-3.4x faster than stepwise on every batch-8..64 row, H = 256..2560 (benchmarks/results/2026-11-23-h100-mma-fp16.md).
STEPWISE_MAX_BATCH = 32
# persistent_mma's default has one batch tile up to RESIDENT_SMALL_BATCH rows, four above. In half precision
# (and TF32) it gives way to the per-step mma kernel above RESIDENT_MAX_BATCH: on the H100 it ran ds2-lstm
# (batch 20) in 1.68 ms against mma's 2.01, b64-h1024-l2 in 2.96 against 2.67; in exact fp32 (3xTF32) it
# beat the SIMT kinds at every batch tried: 1.43 vs 2.51 ms (b8), 3.25 vs 4.66 (ds2), 6.04 vs tiled's 9.89 (b64)
# (benchmarks/results/2026-11-23-h100-persistent-mma-variants.md). Exact fp32 (3xTF32) has a third default tile up to
# RESIDENT_MID_BATCH: three 8-row tiles, so batch 20 pads to 24 rows, not 32, and above RESIDENT_WIDE_BATCH one 64-row pass
# (recurrent_persistent_mma.default_config)
RESIDENT_MAX_BATCH = 32
# Where R does not fit on chip, persistent_mma streaming part of R from L2 each step (streaming_config) runs batches
# STEPWISE_MAX_BATCH+1 .. STREAMED_MAX_BATCH (its 64 rows per pass): on blog-a (H=2560, batch 64) on the H100 it ran
# 31.3 ms in fp32 against tiled's 46.2, 13.6 in fp16 against mma's 15.8; smaller and larger batches keep their kinds
# (unmeasured there) (benchmarks/results/2026-11-23-h100-streamed-blog-a.md)
STREAMED_MAX_BATCH = 64
TILED_MIN_HIDDEN = 1024
# A tuned point replaces the default only when it measured this much faster: a kernel timed alone
# (R left in L2 between repeats) can win by a hair yet lose inside a model, as persistent did at
# batch 8 on the H100 (benchmarks/results/2026-11-23-h100-tuned-vs-default.md, first run).
TUNED_MARGIN = 0.05


@dataclass(frozen=True)
class RecurrentKernel:
    func: tirx.PrimFunc
    r_layout: str  # how the kernel reads R: "rows" (ONNX's [D, G*H, H]), "transposed" or "panels" (recurrent_common)
    plan: KernelPlan

    @property
    def name(self) -> str:
        return self.plan.describe()


@dataclass(frozen=True)
class Branch:
    up_to: int | None  # the largest batch this branch runs (None: any batch above the previous branch)
    config: KernelConfig
    tuned: bool  # chosen from a tuning log; else the default point of its space
    # chosen from a log that measured the default point within TUNED_MARGIN of its best: the default runs, on evidence
    kept_default: bool = False

    def as_dict(self) -> dict:
        return {"up_to_batch": self.up_to, "config": self.config.as_dict(), "tuned": self.tuned, "kept_default": self.kept_default}

    @property
    def label(self) -> str:
        return "tuned: default kept" if self.kept_default else "tuned" if self.tuned else "default"


@dataclass(frozen=True)
class KernelPlan:
    """The one decision about a layer's recurrent kernel: which point of which space runs each batch bucket."""

    target_kind: str
    branches: tuple[Branch, ...]
    why: str  # why these kinds (does R fit on chip?)
    projection: str = ""  # the GEMM of its input projection (tvmrnn.lowering fills it in as it emits it)

    def describe(self) -> str:
        parts = []
        for b in self.branches:
            when = f"batch <= {b.up_to}: " if b.up_to is not None and len(self.branches) > 1 else ""
            parts.append(f"{when}{b.config.describe()} [{b.label}]")
        why = f" ({self.why})" if self.why else ""
        return f"{self.target_kind}: " + "; else ".join(parts) + why

    @property
    def tuned(self) -> bool:
        return any(b.tuned for b in self.branches)

    def branch_at(self, batch: int) -> Branch:
        """The branch that runs `batch` rows."""
        return next(b for b in self.branches if b.up_to is None or batch <= b.up_to)


def _arch(target) -> str:
    return str(target.attrs.get("arch", "sm_90a")) if target.attrs is not None else "sm_90a"


def _fit_note(spec, cell, target, choice) -> str:
    """Whether R fits on chip for the persistent kinds (why they are or are not among auto's); raises when the user
    asked for persistent and R does not fit."""
    from . import recurrent_persistent as persistent

    arch = _arch(target)
    need = persistent.default_config(spec, arch).smem_bytes(spec, cell) / 1024
    limit = persistent.SMEM_LIMIT.get(arch, persistent.SMEM_DEFAULT) / 1024
    where = f"R slice {need:.1f} KB per block, {limit:.0f} KB on {arch}"
    fits = persistent.fits(spec, cell, arch)
    if choice == "persistent" and not fits:
        raise KernelError(f"{spec.op} node '{spec.name}': kernel 'persistent' needs R on chip, and hidden size "
                                    f"{spec.hidden_size} x {spec.num_directions} direction(s) does not fit ({where}); use auto or stepwise")
    from .space import persistent_mma_fits, persistent_mma_streams

    resident = "; persistent_mma: R fits in shared memory across one wave" if persistent_mma_fits(spec, cell, target) else \
        "; persistent_mma: part of R streamed from L2 each step" if persistent_mma_streams(spec, cell, target) else ""
    return f"persistent: {where}: " + ("fits" if fits else "does not fit") + resident


def _default_branches(spec, cell, target, allowed) -> list[Branch]:
    from .space import persistent_mma_streams

    if len(allowed) > 1 and "persistent_mma" in allowed and persistent_mma_streams(spec, cell, target):
        small, large = ("mma", "mma") if "mma" in allowed else ("stepwise", "tiled")
        return [Branch(STEPWISE_MAX_BATCH, default_config(small, spec, cell, target, STEPWISE_MAX_BATCH), False),
                Branch(STREAMED_MAX_BATCH, default_config("persistent_mma", spec, cell, target, STREAMED_MAX_BATCH), False),
                Branch(None, default_config(large, spec, cell, target), False)]
    if allowed == ("cpu",):
        from .recurrent_cpu import ROW_TILE

        return [Branch(ROW_TILE - 1, default_config("cpu", spec, cell, target, 1), False),
                Branch(None, default_config("cpu", spec, cell, target), False)]
    # persistent at small batch, stepwise at moderate ones, tiled above; the last kind takes the rest.
    # Where R fits in shared memory the persistent tensor-core kernel follows persistent: to any batch in exact fp32,
    # up to RESIDENT_MAX_BATCH where the per-step tensor-core kind (mma) exists; else mma replaces stepwise and tiled
    if len(allowed) > 1 and "persistent_mma" in allowed:
        allowed = tuple(k for k in allowed if k in ("persistent", "persistent_mma", "mma"))
    elif len(allowed) > 1 and "mma" in allowed:
        allowed = tuple(k for k in allowed if k != "stepwise")
    elif len(allowed) > 1 and spec.hidden_size < TILED_MIN_HIDDEN:
        allowed = tuple(k for k in allowed if k != "tiled")
    limits = {"persistent": PERSISTENT_MAX_BATCH, "stepwise": STEPWISE_MAX_BATCH, "persistent_mma": RESIDENT_MAX_BATCH}
    branches = []
    for i, k in enumerate(allowed):
        if k == "persistent_mma":  # its default depends on the batch
            branches.append(Branch(RESIDENT_SMALL_BATCH, default_config(k, spec, cell, target, RESIDENT_SMALL_BATCH), False))
            branches.append(Branch(RESIDENT_MID_BATCH, default_config(k, spec, cell, target, RESIDENT_MID_BATCH), False))
        last = Branch(None if i == len(allowed) - 1 else limits[k], default_config(k, spec, cell, target), False)
        wide = default_config(k, spec, cell, target, RESIDENT_WIDE_BATCH) if k == "persistent_mma" and last.up_to is None else None
        if wide is not None and wide != last.config:  # exact fp32: 32 rows per pass up to RESIDENT_WIDE_BATCH, 64 above
            branches.append(Branch(RESIDENT_WIDE_BATCH, wide, False))
        branches.append(last)
    return branches


def plan_kernel(spec, cell, target, choice: str = "auto", tuned: dict | None = None) -> KernelPlan:
    """The plan for one layer on `target`. tuned: {batch bucket: [(KernelConfig, seconds), best first]}
    from the tuning logs; each bucket runs its best point of a kind this choice allows, unless the
    default point for that batch measured within TUNED_MARGIN of it. Without any, the defaults."""
    if choice not in KERNEL_CHOICES:
        raise KernelError(f"kernel={choice!r} is not supported; one of {KERNEL_CHOICES}")
    cuda = target.kind.name == "cuda"
    why = _fit_note(spec, cell, target, choice) if cuda else ""
    allowed = kinds(spec, cell, target, choice)
    defaults = _default_branches(spec, cell, target, allowed)
    picked = {}
    for batch, points in (tuned or {}).items():
        points = [(c, t) for c, t in points if c.kind in allowed]
        if not points:
            continue
        default = next(b.config for b in defaults if b.up_to is None or batch <= b.up_to)
        best, best_t = points[0]
        default_t = dict(points).get(default)
        if default_t is None:
            # the tuner always measures the default point: logs without it predate today's default (say, a
            # kind added since) and cannot tell whether their best beats it
            continue
        picked[batch] = default if best_t > default_t * (1 - TUNED_MARGIN) else best
    return KernelPlan("cuda" if cuda else "cpu", tuple(_merge(defaults, picked)), why)


def _merge(defaults: list[Branch], picked: dict) -> list[Branch]:
    """The default branches with the tuned buckets cut in: a tuned bucket runs its point from the boundary below it
    (a smaller bucket's or a default branch's) up to its batch, and every other batch keeps the default that covers it.
    (A bucket used to take every batch below it: where bucket 1's log was unusable, b8-h1024-l2's bucket 8 ran batch 1
    on persistent_mma instead of the default persistent kernel, 0.494 against 0.314 ms on lat-b1-h1024 on the H100.)"""
    def default_at(batch):
        return next(b for b in defaults if b.up_to is None or batch <= b.up_to)

    bounds = sorted(set(picked) | {b.up_to for b in defaults if b.up_to is not None})
    branches = [Branch(hi, picked[hi], True, picked[hi] == default_at(hi).config) if hi in picked else default_at(hi)
                for hi in bounds] + [defaults[-1]]
    merged = []  # neighbours running the same point (a default split by a bucket around it) become one branch
    for b in branches:
        if merged and (merged[-1].config, merged[-1].tuned, merged[-1].kept_default) == (b.config, b.tuned, b.kept_default):
            merged[-1] = b
        else:
            merged.append(b)
    return merged


def kernel_plan(spec, cell, target, choice: str = "auto", tuned: dict | None = None) -> str:
    """The plan in words, for inspect and the compile log."""
    return plan_kernel(spec, cell, target, choice, tuned).describe()


def _prim_func(spec, cell, target, branches, seq=None, batch=None):
    pairs = [(b.up_to, emitter(b.config, spec, cell)) for b in branches]
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


def recurrent_kernel(spec, cell, target, choice: str = "auto", tuned: dict | None = None) -> RecurrentKernel:
    """The recurrent kernel of one layer for `target`, marked scheduled so generic schedulers leave it alone."""
    plan = plan_kernel(spec, cell, target, choice, tuned)
    func, layout = _prim_func(spec, cell, target, plan.branches)
    # op_pattern 8 (opaque): FuseOps must not merge it with neighbours
    return RecurrentKernel(func.with_attrs({"tirx.is_scheduled": True, "op_pattern": 8}), layout, plan)


def point_kernel(spec, cell, target, config: KernelConfig, seq: int | None = None, batch: int | None = None) -> tirx.PrimFunc:
    """One point of a space as a kernel: at static shapes, what a tuning task builds and measures."""
    func, _ = _prim_func(spec, cell, target, [Branch(None, config, False)], seq, batch)
    return func


@dataclass(frozen=True)
class StackKernel:
    func: tirx.PrimFunc
    plans: tuple[KernelPlan, ...]  # one per layer, for the compile log and the module's metadata


def stack_kernel(specs, cells, target, choice: str = "auto", tuned: list | None = None, batch_bound: int | None = None):
    """One wavefront kernel for a chain of stacked layers (recurrent_wavefront), or (None, why not) where it does not
    apply: auto only, on CUDA, every batch the module accepts (batch_bound) within the persistent kernel's, where each
    layer's own plan would run persistent there (tuning may say otherwise) and the split among the layers fits."""
    from . import recurrent_wavefront as wavefront

    if choice != "auto" or target.kind.name != "cuda":
        return None, "only kernel='auto' on CUDA"
    if batch_bound is None or batch_bound > PERSISTENT_MAX_BATCH:
        return None, f"batch {'unbounded' if batch_bound is None else f'up to {batch_bound}'}; a wavefront runs batch <= {PERSISTENT_MAX_BATCH}"
    own = []  # each layer's plan were it alone: the stack runs only where each would run persistent
    for i, (spec, cell) in enumerate(zip(specs, cells)):
        why = wavefront.stackable(spec, cell, i == 0)
        if why:
            return None, f"{spec.op} node '{spec.name}': {why}"
        own.append(plan_kernel(spec, cell, target, choice, tuned[i] if tuned else None))
        kinds_used = {own[-1].branch_at(n).config.kind for n in range(1, batch_bound + 1)}
        if kinds_used != {"persistent"}:
            return None, f"{spec.op} node '{spec.name}' runs {'/'.join(sorted(kinds_used))} at batch <= {batch_bound}"
    warps = own[0].branch_at(1).config["warps"]
    cfg = wavefront.plan(specs, cells, _arch(target), warps)
    if cfg is None:
        return None, "the layers' weights do not fit on chip across one wave"
    func = wavefront.wavefront_prim_func(specs, cells, cfg).with_attrs({"tirx.is_scheduled": True, "op_pattern": 8})
    why = (f"wavefront: {len(specs)} stacked layers in one cooperative kernel of {cfg.grid} blocks "
           f"({'+'.join(map(str, cfg.blocks))}), layer l+1 one step behind layer l, batch <= {batch_bound}")
    plans = tuple(KernelPlan("cuda", (Branch(None, KernelConfig.of("wavefront", layer=i, layers=len(specs), units=cfg.units[i],
                                                                    blocks=cfg.blocks[i], grid=cfg.grid, warps=cfg.warps), False),), why)
                  for i in range(len(specs)))
    return StackKernel(func, plans), why
