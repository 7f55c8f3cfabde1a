"""The layers around the recurrent ones on CUDA: dlight's GPU rules, with reductions of few outputs taken first.

dlight's Matmul rule takes a conv as an implicit GEMM and tiles it for large ones: a batch-1 conv over a few frames
(Silero VAD's: 128 x 4 outputs of 387 products each) gets a handful of blocks whose threads each run a whole
reduction serially, 12-21 us a conv on an H100. `FewOutputReduction` gives such a reduction to dlight's
GeneralReduction instead: one block per output, its threads splitting the reduction. A symbolic extent counts at its
upper bound, where the function carries one (DIM_BOUNDS_ATTR: the module's bounded input dims); an unbounded one may
be large, and stays with the Matmul rule's tiles.
"""

from __future__ import annotations

import math

import tvm
from tvm import s_tir, tirx
from tvm.s_tir import dlight as dl
from tvm.s_tir.dlight.analysis import normalize_prim_func
from tvm.s_tir.dlight.base import ScheduleRule

FEW_OUTPUTS = 1 << 14  # at most this many outputs: one block each still leaves every SM several to run
MIN_REDUCTION = 64  # at least this many products per output: enough to split over a block's threads
DIM_BOUNDS_ATTR = "tvmrnn.dim_bounds"  # {symbolic var name: its upper bound}, set by whoever knows the inputs' bounds


def _largest(extents: list, bounds: dict) -> int | None:
    """The product of `extents` at the symbolic vars' upper bounds; None where a var has none."""
    analyzer = tvm.sym.Analyzer()
    product = tirx.const(1, "int64")
    for extent in extents:
        extent = tirx.const(extent, "int64") if isinstance(extent, int) else extent
        for var in tirx.analysis.undefined_vars(extent):
            if var.name not in bounds:
                return None
            analyzer.bind(var, tvm.ir.Range.from_min_extent(1, int(bounds[var.name])))
        product = product * tirx.Cast("int64", extent)
    bound = analyzer.const_int_bound(analyzer.simplify(product))
    return None if bound.max_value >= bound.POS_INF else int(bound.max_value)


def few_output_reduction(func: tirx.PrimFunc) -> bool:
    """Whether the function's reduction has at most FEW_OUTPUTS outputs and MIN_REDUCTION products each, at every size
    its bounds allow."""
    try:
        infos = normalize_prim_func(s_tir.Schedule(func))
    except Exception:  # noqa: BLE001 - a function dlight cannot normalize is not ours to take
        return False
    bounds = dict(func.attrs[DIM_BOUNDS_ATTR]) if func.attrs is not None and DIM_BOUNDS_ATTR in func.attrs else {}
    for info in infos or []:
        if not info.is_reduction():
            continue
        doms = {kind: [it.dom for it in info.iters if it.kind == kind] for kind in "SR"}
        if not all(isinstance(d, int) for d in doms["R"]):
            return False
        outputs = _largest(doms["S"], bounds)
        return outputs is not None and outputs <= FEW_OUTPUTS and math.prod(doms["R"]) >= MIN_REDUCTION
    return False


def _conv_in_general_reduction_form(func: tirx.PrimFunc) -> tirx.PrimFunc | None:
    """A conv in the form GeneralReduction takes: its spatial blocks before the reduction (the padded copy of its
    input) inlined into their readers, and a reduction that writes the output itself followed by a copy of it (the
    rule wants an injective block last: a conv without an epilogue has none). None for a function without such a
    producer (a matmul stays with the Matmul and GEMV rules) or where s_tir refuses a step."""
    sch = s_tir.Schedule(func)
    blocks = sch.get_child_blocks(sch.get_sblock("root"))
    if len(blocks) < 2:
        return None
    infos = normalize_prim_func(sch) or []
    if not infos or not any(info.is_reduction() for info in infos):
        return None
    try:
        for info in infos[:-1]:
            if not info.is_reduction():
                sch.compute_inline(info.block_rv)
        if infos[-1].is_reduction():
            sch.cache_write(infos[-1].block_rv, 0, "global")
    except Exception:  # noqa: BLE001 - s_tir refuses what it cannot rewrite; the rule then does not apply
        return None
    return sch.mod["main"]


class FewOutputReduction(ScheduleRule):
    def apply(self, func, target, tunable):
        if not isinstance(func, tirx.PrimFunc) or not few_output_reduction(func):
            return None
        scheduled = dl.gpu.GeneralReduction().apply(func, target, tunable)
        reformed = _conv_in_general_reduction_form(func) if scheduled is None else None
        return scheduled if reformed is None else dl.gpu.GeneralReduction().apply(reformed, target, tunable)


def cuda_rules() -> list:
    return [FewOutputReduction(), dl.gpu.Matmul(), dl.gpu.GEMV(), dl.gpu.Reduction(), dl.gpu.GeneralReduction(),
            dl.gpu.Fallback()]
