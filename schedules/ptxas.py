"""What ptxas makes of a kernel's CUDA source, through NVRTC and without a GPU: registers, spills, and whether it
serialized the wgmma's. Build checks for the tests and benchmarks/ptxas_usage.py; compile does not use it.

A wgmma kernel can build, run and be correct while ptxas has made every wgmma wait for the one before (C7514:
accumulator registers read while a wgmma writing them may still be in flight, as it judges it), which takes away the
overlap the kernel was written for; spills cost local-memory traffic in the inner loops. Neither shows without a GPU
but here.
"""

from __future__ import annotations

import glob
import os
import re
from dataclasses import dataclass


@dataclass(frozen=True)
class PtxasReport:
    registers: int  # the most any of the source's kernels uses
    spill_stores: int  # bytes, summed over its kernels
    spill_loads: int
    serialized: bool  # C7514: ptxas serialized the wgmma's

    def describe(self) -> str:
        return (f"registers {self.registers}  spill stores/loads {self.spill_stores}/{self.spill_loads} bytes"
                + ("  wgmma serialized (C7514)" if self.serialized else ""))


def include_dirs() -> list[str]:
    """CUDA's headers and CCCL's (TVM's kernels include <cuda/barrier>), wherever this machine keeps them."""
    from tvm.support.nvcc import find_cuda_path

    roots = [os.path.join(find_cuda_path(), "include")] + sorted(glob.glob("/usr/local/cuda*/include"))
    return [d for r in roots for d in (r, os.path.join(r, "cccl")) if os.path.isdir(d)]


def ptxas_log(source: str, arch: str) -> str:
    """NVRTC's log of compiling `source` for `arch` as TVM does (fast math), with ptxas's -v report."""
    from cuda.bindings import nvrtc

    _, prog = nvrtc.nvrtcCreateProgram(source.encode(), b"kernel.cu", 0, None, None)
    opts = [f"--gpu-architecture={arch}".encode(), b"-default-device", b"--use_fast_math", b"--ptxas-options=-v",
            b"-U__CUDA_NO_HALF_OPERATORS__", b"-U__CUDA_NO_HALF_CONVERSIONS__"] + [f"-I{d}".encode() for d in include_dirs()]
    (result,) = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
    _, size = nvrtc.nvrtcGetProgramLogSize(prog)
    log = b" " * size
    nvrtc.nvrtcGetProgramLog(prog, log)
    text = log.decode(errors="replace").replace("\x00", "")
    if result != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        raise RuntimeError(text[:2000])
    return text


def kernel_source(func, arch: str = "sm_90a") -> str:
    """The CUDA source TVM generates for a kernel's PrimFunc on `arch` (compiled through NVRTC on the way)."""
    import tvm

    return tvm.compile(tvm.IRModule({"main": func}), target=tvm.target.Target({"kind": "cuda", "arch": arch})).mod.imports[0].inspect_source()


def ptxas(source: str, arch: str) -> PtxasReport:
    log = ptxas_log(source, arch)
    spills = [(int(s), int(lo)) for s, lo in re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", log)]
    return PtxasReport(max([int(r) for r in re.findall(r"Used (\d+) registers", log)] or [0]),
                       sum(s for s, _ in spills), sum(lo for _, lo in spills), "C7514" in log)
