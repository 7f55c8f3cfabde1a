"""Our hand-written kernel schedules, one module per kernel and target, and the choice between them.

recurrent_cpu         the recurrent layer for LLVM targets
recurrent_cuda        CUDA, stepwise: one fused launch per step and phase (weights from L2/HBM)
recurrent_persistent  CUDA, persistent: one cooperative launch for the whole sequence, R in shared memory
warp_gemv             the warp-level gate GEMV both CUDA kernels are built from
cooperative           the TIR pipeline that tags grid-barrier kernels for cooperative launch

On CUDA the choice is made per layer at compile time (does R fit on chip?) and per call at
run time (is the batch small enough for the persistent kernel to win?): when R fits, the
kernel holds both bodies behind `if batch <= max_batch`, so a dynamic-batch module runs each
batch on the better one.
"""

from __future__ import annotations

from dataclasses import dataclass

from tvm import tirx
from tvm.script.ir_builder import tirx as T

KERNEL_CHOICES = ("auto", "stepwise", "persistent")
# Batch up to which the persistent kernel beats the stepwise one. Measured on the H100
# (benchmarks/results/2026-11-22-h100-persistent-small-batch.md): 2-2.3x faster at batch 1,
# 1.4x slower at batch 8. Tunable.
PERSISTENT_MAX_BATCH = 4


@dataclass(frozen=True)
class RecurrentKernel:
    func: tirx.PrimFunc
    transposed_r: bool  # whether the kernel reads R^T [D, H, G*H] instead of ONNX's R [D, G*H, H]
    name: str  # KernelChoice.describe(): which schedule, and why


def _arch(target) -> str:
    return str(target.attrs.get("arch", "sm_90a")) if target.attrs is not None else "sm_90a"


# Stepwise batch tiles by batch size: each weight read serves `batch_tile` rows, so large batches
# want wide tiles (R is read ceil(N / tile) times per step), small ones narrow (no wasted rows).
# Measured on the H100 (benchmarks/results/2026-11-22-h100-stepwise-tile16.md): a 16-row tile with
# skipped rows was 1.4-1.9x slower than 8 rows at batch 8 to 64, so one tile serves all batches for now.
STEPWISE_TILES = ((None, 8),)  # (up to this batch, tile); None: any larger batch


def _dispatch(a, branches):
    """Emit `if batch <= b0: f0 elif batch <= b1: f1 ... else: fn` over (max_batch, emit) pairs."""
    (limit, emit), rest = branches[0], branches[1:]
    if limit is None or not rest:
        emit(a)
        return
    with T.If(a.batch <= tirx.IntImm("int64", limit)):
        with T.Then():
            emit(a)
        with T.Else():
            _dispatch(a, rest)


@dataclass(frozen=True)
class KernelChoice:
    """The one decision about a layer's recurrent schedule; the kernel is built from it and logs describe it."""

    kind: str  # "cpu" | "stepwise" | "persistent" | "dispatch" (persistent up to PERSISTENT_MAX_BATCH, stepwise above)
    why: str

    def describe(self) -> str:
        return {"cpu": "cpu: projection GEMM + row-tiled recurrent kernel",
                "stepwise": f"cuda-stepwise ({self.why})",
                "persistent": f"cuda-persistent ({self.why})",
                "dispatch": f"cuda-persistent for batch <= {PERSISTENT_MAX_BATCH}, stepwise above ({self.why})"}[self.kind]


def choose_kernel(spec, cell, target, choice: str = "auto") -> KernelChoice:
    """Which schedule a layer gets on `target`: persistent needs R (at its storage dtype) on chip."""
    if target.kind.name != "cuda":
        return KernelChoice("cpu", "")
    from . import recurrent_persistent as persistent

    arch = _arch(target)
    fits = persistent.fits(spec, cell, arch)
    need = persistent.default_config(spec, arch).smem_bytes(spec, cell) / 1024
    limit = persistent.SMEM_LIMIT.get(arch, persistent.SMEM_DEFAULT) / 1024
    where = f"R slice {need:.1f} KB per block, {limit:.0f} KB on {arch}"
    if choice == "persistent" and not fits:
        from tvmrnn.errors import UnsupportedModelError

        raise UnsupportedModelError(f"{spec.op} node '{spec.name}': kernel 'persistent' needs R on chip, and hidden size "
                                    f"{spec.hidden_size} x {spec.num_directions} direction(s) does not fit ({where}); use auto or stepwise")
    if choice == "stepwise" or not fits:
        return KernelChoice("stepwise", f"{where}: {'asked for' if choice == 'stepwise' else 'does not fit'}")
    if choice == "persistent":
        return KernelChoice("persistent", where)
    return KernelChoice("dispatch", f"{where}: fits")


def kernel_plan(spec, cell, target, choice: str = "auto") -> str:
    """Which recurrent schedule a layer gets on `target`, and why, in words (for inspect and the compile log)."""
    return choose_kernel(spec, cell, target, choice).describe()


def _cuda_kernel(spec, cell, target, kind: str):
    from . import recurrent_cuda as stepwise
    from . import recurrent_persistent as persistent

    pcfg = persistent.default_config(spec, _arch(target))
    if kind == "persistent":
        return persistent.recurrent_kernel_persistent(spec, cell, pcfg)
    branches = [(limit, lambda a, t=tile: stepwise.stepwise_body(a, stepwise.StepwiseConfig(batch_tile=t)))
                for limit, tile in STEPWISE_TILES]
    if kind == "dispatch":
        branches.insert(0, (PERSISTENT_MAX_BATCH, lambda a: persistent.persistent_body(a, pcfg)))
    return stepwise.cuda_prim_func(spec, cell, lambda a: _dispatch(a, branches))


def recurrent_kernel(spec, cell, target, choice: str = "auto") -> RecurrentKernel:
    """The recurrent kernel of one layer for `target`, marked scheduled so generic schedulers leave it alone."""
    plan = choose_kernel(spec, cell, target, choice)
    if plan.kind == "cpu":
        from . import recurrent_cpu as impl

        func = impl.recurrent_kernel_cpu(spec, cell)
    else:
        from . import recurrent_cuda as impl

        func = _cuda_kernel(spec, cell, target, plan.kind)
    # op_pattern 8 (opaque): FuseOps must not merge it with neighbours
    return RecurrentKernel(func.with_attrs({"tirx.is_scheduled": True, "op_pattern": 8}), impl.TRANSPOSED_R, plan.describe())
