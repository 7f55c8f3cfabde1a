"""The layers around the recurrent ones on CUDA: dlight's GPU rules, with reductions of few outputs taken first.

dlight's Matmul rule takes a conv as an implicit GEMM and tiles it for large ones: a batch-1 conv over a few frames
(Silero VAD's: 128 x 4 outputs of 387 products each) gets a handful of blocks whose threads each run a whole
reduction serially, 12-21 us a conv on an H100. `FewOutputReduction` gives such a reduction to dlight's
GeneralReduction instead: one block per output, its threads splitting the reduction.
"""

from __future__ import annotations

import math

from tvm import s_tir, tirx
from tvm.s_tir import dlight as dl
from tvm.s_tir.dlight.analysis import normalize_prim_func
from tvm.s_tir.dlight.base import ScheduleRule

FEW_OUTPUTS = 1 << 14  # at most this many outputs: one block each still leaves every SM several to run
MIN_REDUCTION = 64  # at least this many products per output: enough to split over a block's threads


def few_output_reduction(func: tirx.PrimFunc) -> bool:
    """Whether the function's reduction has static extents, at most FEW_OUTPUTS outputs and MIN_REDUCTION products each."""
    try:
        infos = normalize_prim_func(s_tir.Schedule(func))
    except Exception:  # noqa: BLE001 - a function dlight cannot normalize is not ours to take
        return False
    for info in infos or []:
        if not info.is_reduction():
            continue
        doms = {kind: [it.dom for it in info.iters if it.kind == kind] for kind in "SR"}
        if not all(isinstance(d, int) for d in doms["S"] + doms["R"]):
            return False
        return math.prod(doms["S"]) <= FEW_OUTPUTS and math.prod(doms["R"]) >= MIN_REDUCTION
    return False


class FewOutputReduction(ScheduleRule):
    def apply(self, func, target, tunable):
        if not isinstance(func, tirx.PrimFunc) or not few_output_reduction(func):
            return None
        return dl.gpu.GeneralReduction().apply(func, target, tunable)


def cuda_rules() -> list:
    return [FewOutputReduction(), dl.gpu.Matmul(), dl.gpu.GEMV(), dl.gpu.Reduction(), dl.gpu.GeneralReduction(),
            dl.gpu.Fallback()]
