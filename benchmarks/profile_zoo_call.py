"""Where one GPU call of a zoo model goes: run() whole, the VM's main on inputs already on the device (with and without
waiting for the GPU), the input and output copies alone, and the kernels' GPU time per call (CUPTI, through
torch.profiler, which records every kernel of the process).

    python benchmarks/profile_zoo_call.py NAME [NAME ...]      (a GPU; zoo names: models/zoo/__init__.py)
"""

from __future__ import annotations

import collections
import os
import sys
import time

import numpy as np
import onnx

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import tvmrnn  # noqa: E402
from models import zoo  # noqa: E402


def median_ms(fn, n=300, warmup=20) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return round(float(np.median(times)) * 1e3, 4)


def kernel_us(module, feeds, calls=20) -> tuple[float, dict]:
    """GPU busy µs per call, and per kernel name."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.init()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            module.run(feeds)
        torch.cuda.synchronize()
    per_kernel = collections.Counter()
    for ev in prof.events():
        if ev.device_type.name == "CUDA":
            per_kernel[ev.name[:70]] += ev.device_time / calls
    return sum(per_kernel.values()), dict(per_kernel.most_common(14))


def profile_model(name: str) -> None:
    entry = zoo.MODELS[name]
    module = tvmrnn.compile(onnx.load(str(entry.build())), target="cuda", logs=False, **entry.compile_options("cuda"))
    feeds = {k: v for k, v in entry.feeds(np.random.default_rng(0))[0].items() if k in module.input_names}
    on_device, arrays = module.to_device(feeds), module.check_inputs(feeds)
    outs = module.invoke(on_device)
    times = {"run": median_ms(lambda: module.run(feeds)),
             "main, waited": median_ms(lambda: (module.invoke(on_device), module.device.sync())),
             "main, not waited": median_ms(lambda: module.invoke(on_device)),
             "inputs in": median_ms(lambda: (module.stage(arrays), module.device.sync())),
             "outputs out": median_ms(lambda: module.to_host(outs))}
    busy, per_kernel = kernel_us(module, feeds)
    print(f"{name}: " + ", ".join(f"{k} {v} ms" for k, v in times.items()) + f"; GPU busy {busy:.1f} us a call")
    for kernel, us in per_kernel.items():
        print(f"  {us:7.2f} us  {kernel}")


if __name__ == "__main__":
    for model in sys.argv[1:]:
        profile_model(model)
