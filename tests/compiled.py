"""What the kernel and projection tests share: the target a kind of kernel builds for, and a compiled model's CUDA source."""

import tvm


def target_of(kind: str):
    """llvm, or the GPU this machine has (its own arch: sm_90a on the H100)."""
    return tvm.target.Target("llvm") if kind == "llvm" else tvm.target.Target.from_device(tvm.cuda(0))


def cuda_sources(module) -> str:
    """The CUDA source of a compiled model (the VM executable imports the host module, which imports the device one)."""
    found, todo = [], list(module.executable.mod.imports)
    while todo:
        m = todo.pop()
        found += [m.inspect_source()] if m.kind == "cuda" else []
        todo += list(m.imports)
    return "".join(found)
