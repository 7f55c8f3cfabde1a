"""What the kernel generators need to know of the machine a kernel runs on, passed in by the caller.

A persistent kernel's grid must be one co-resident wave (one block per SM) and its R slice must fit a block's shared
memory; the CPU kernel splits each phase's work items the way TVM's thread pool will. `Device.of_target` gives an
arch's flagship part (H100 SXM, A100, ...) and one CPU thread; a caller that knows better (the local GPU's SM count,
the runtime's thread pool) says so.
"""

from __future__ import annotations

from dataclasses import dataclass

# streaming multiprocessors of each arch's flagship; smaller parts of an arch have fewer (H100 PCIe 114, A30 56, L4 58)
SM_COUNT = {"sm_90": 132, "sm_90a": 132, "sm_80": 108, "sm_86": 84, "sm_89": 128, "sm_87": 16}
DEFAULT_SM_COUNT = 108
# dynamic shared memory one block may use: 227 KB on sm_90, 163 KB on sm_80, 99 KB on sm_86/89
SMEM_LIMIT = {"sm_90": 227 * 1024, "sm_90a": 227 * 1024, "sm_80": 163 * 1024, "sm_87": 163 * 1024}
DEFAULT_SMEM_LIMIT = 99 * 1024
DEFAULT_ARCH = "sm_90a"
# multiply-adds (or elements) below which a CPU kernel launched once a call (a graph kernel, the input projection) runs
# on the calling thread: TVM's idle workers sleep (runtime.py), and waking one costs about what a kernel of 2^23 (about
# 80 us on one core) saves on two; on a loaded machine a launch can also wait a timeslice for a descheduled worker
# (docs/decisions.md)
MIN_PARALLEL_WORK = 1 << 23
# multiply-adds of one step below which a recurrent kernel runs on the calling thread: the kernel launches the pool
# once a sequence and meets it at a barrier per phase, about 0.3 us each; from 2^18 (1 MB of fp32 R a step, a core's
# L2 here) each thread's share of R stays in its own L2 (docs/decisions.md)
MIN_PARALLEL_STEP_WORK = 1 << 18


def parallel_pays(work: int | None, per_step: bool = False) -> bool:
    """Whether `work` (None where only the run knows it) is worth TVM's thread pool: a kernel's (MIN_PARALLEL_WORK), or
    one step's of a recurrent kernel (`per_step`, MIN_PARALLEL_STEP_WORK)."""
    return work is None or work >= (MIN_PARALLEL_STEP_WORK if per_step else MIN_PARALLEL_WORK)


@dataclass(frozen=True)
class Device:
    arch: str = DEFAULT_ARCH  # a CUDA target's arch (sm_90a: the H100 tag's); unused on CPUs
    sm_count: int = SM_COUNT[DEFAULT_ARCH]
    smem_limit: int = SMEM_LIMIT[DEFAULT_ARCH]  # bytes of dynamic shared memory per block
    cpu_threads: int = 1  # the threads of the pool a CPU kernel runs on

    @staticmethod
    def cuda(arch: str = DEFAULT_ARCH, sm_count: int | None = None) -> Device:
        """An arch's flagship part, or one with `sm_count` SMs."""
        return Device(arch, sm_count or SM_COUNT.get(arch, DEFAULT_SM_COUNT), SMEM_LIMIT.get(arch, DEFAULT_SMEM_LIMIT))

    @staticmethod
    def of_target(target, sm_count: int | None = None, cpu_threads: int = 1) -> Device:
        """The device a TVM target describes: its arch's flagship (or `sm_count` SMs) on CUDA, `cpu_threads` on a CPU."""
        arch = str(target.attrs.get("arch", DEFAULT_ARCH)) if target.attrs is not None else DEFAULT_ARCH
        device = Device.cuda(arch, sm_count)
        return Device(device.arch, device.sm_count, device.smem_limit, cpu_threads)
