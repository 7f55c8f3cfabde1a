"""Our hand-written kernel schedules, one module per kernel and target, and the choice between them.

recurrent_cpu   the recurrent layer for LLVM targets
recurrent_cuda  the recurrent layer for CUDA (stepwise: one fused kernel per step and phase)
"""

from __future__ import annotations

from tvm import tirx


def recurrent_kernel(spec, cell, target) -> tirx.PrimFunc:
    """The recurrent kernel of one layer for `target`, marked scheduled so generic schedulers leave it alone."""
    if target.kind.name == "cuda":
        from .recurrent_cuda import recurrent_kernel_cuda as make
    else:
        from .recurrent_cpu import recurrent_kernel_cpu as make
    # op_pattern 8 (opaque): FuseOps must not merge it with neighbours
    return make(spec, cell).with_attrs({"tirx.is_scheduled": True, "op_pattern": 8})
