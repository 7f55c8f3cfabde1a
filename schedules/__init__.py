"""Our hand-written kernel schedules, one module per kernel and target, and the choice between them.

recurrent_cpu   the recurrent layer for LLVM targets
recurrent_cuda  the recurrent layer for CUDA (stepwise: one fused kernel per step and phase)
"""

from __future__ import annotations

from dataclasses import dataclass

from tvm import tirx


@dataclass(frozen=True)
class RecurrentKernel:
    func: tirx.PrimFunc
    transposed_r: bool  # whether the kernel reads R^T [D, H, G*H] instead of ONNX's R [D, G*H, H]
    name: str  # which schedule: "cpu", "cuda-stepwise", "cuda-persistent"


def recurrent_kernel(spec, cell, target) -> RecurrentKernel:
    """The recurrent kernel of one layer for `target`, marked scheduled so generic schedulers leave it alone."""
    if target.kind.name == "cuda":
        from . import recurrent_cuda as impl

        func, name = impl.recurrent_kernel_cuda(spec, cell), "cuda-stepwise"
    else:
        from . import recurrent_cpu as impl

        func, name = impl.recurrent_kernel_cpu(spec, cell), "cpu"
    # op_pattern 8 (opaque): FuseOps must not merge it with neighbours
    return RecurrentKernel(func.with_attrs({"tirx.is_scheduled": True, "op_pattern": 8}), impl.TRANSPOSED_R, name)
