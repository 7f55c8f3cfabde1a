"""The TIR pipeline our modules build with: TVM's default, plus the cooperative-launch tag for grid barriers and one
block an SM for cluster, cooperative and single-block kernels.

A kernel that calls grid_sync must be launched with cudaLaunchCooperativeKernel, which the
CUDA runtime module does only when the kernel's launch parameters carry
"tirx.use_cooperative_launch". TVM 0.27 does not add it (a PrimFunc attribute is not carried
to the split-out device kernel), so this pass adds it after the default pipeline has split
host and device code, keeping "tirx.use_dyn_shared_memory" last as the runtime expects.

A cluster kernel (bound to clusterCtaIdx, schedules/recurrent_cluster.py) runs one CTA an SM, but ptxas, told only
the block size, aimed at 64 registers a thread at 512 threads and spilled; "tirx.launch_bounds_min_blocks_per_sm" = 1
makes the bound __launch_bounds__(threads, 1), so that it may take all 128. So does a kernel of one block (the block
stack, recurrent_block_stack): told only its 864 threads, ptxas aimed at two blocks an SM, 32 registers, and spilled.
And so does a kernel with a grid barrier: its blocks are sized to one wave, one an SM (persistent_mma's 32-row
kernels spilled at 64-80 registers without it).
"""

from __future__ import annotations

import re

import tvm
from tvm.tirx import compilation_pipeline as cp

PIPELINE = "tvmrnn"
_COOP = "tirx.use_cooperative_launch"
_DYN_SMEM = "tirx.use_dyn_shared_memory"


def _calls_grid_sync(func) -> bool:
    # 0.27 exposes no Python statement visitor for tirx; the printed kernel names the intrinsic
    return "grid_sync" in func.script()


def _kernels(mod):
    """(global var, device kernel, its launch parameter tags) of each kernel split out of the host code."""
    for gv, func in list(mod.functions.items()):
        if isinstance(func, tvm.tirx.PrimFunc) and func.attrs is not None and "tirx.kernel_launch_params" in func.attrs:
            yield gv, func, [str(p) for p in func.attrs["tirx.kernel_launch_params"]]


@tvm.transform.module_pass(opt_level=0, name="tvmrnn.MarkCooperativeLaunch")
def mark_cooperative_launch(mod, _ctx):
    for gv, func, tags in _kernels(mod):
        if _COOP not in tags and _calls_grid_sync(func):
            rest = [t for t in tags if t != _DYN_SMEM]
            mod[gv] = func.with_attr("tirx.kernel_launch_params", rest + [_COOP] + [t for t in tags if t == _DYN_SMEM])
    return mod


_MIN_BLOCKS = "tirx.launch_bounds_min_blocks_per_sm"


_ONE_BLOCK = re.compile(r'launch_thread\("blockIdx\.x", (T\.int64\()?1\)?\)')


def _one_block(func, tags) -> bool:
    """The kernel's grid is one block: no other block dimension, blockIdx.x of extent 1 (its printed launch)."""
    return not any(t in ("blockIdx.y", "blockIdx.z") for t in tags) and _ONE_BLOCK.search(func.script()) is not None


@tvm.transform.module_pass(opt_level=0, name="tvmrnn.OneCtaPerSm")
def one_cta_per_sm(mod, _ctx):
    """A cluster kernel's CTAs, a cooperative kernel's blocks and a kernel of one block have their SM each to
    themselves: __launch_bounds__(threads, 1)."""
    for gv, func, tags in _kernels(mod):
        cluster = any(t.startswith("clusterCtaIdx") for t in tags)
        if _MIN_BLOCKS not in func.attrs and (_COOP in tags or cluster or _one_block(func, tags)):
            mod[gv] = func.with_attr(_MIN_BLOCKS, 1)
    return mod


def _pipeline(**kwargs):
    base, host, device = cp.PIPELINE_MAP["s_tir"](**kwargs)
    return tvm.transform.Sequential([base, mark_cooperative_launch, one_cta_per_sm]), host, device


def register() -> str:
    if PIPELINE not in cp.PIPELINE_MAP:
        cp.register_tir_pipeline(PIPELINE, _pipeline)
    return PIPELINE
