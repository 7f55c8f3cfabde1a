"""Where exact fp32's error comes from on the GPU: each row's output against float64, per projection GEMM and kernel.

    PYTHONPATH=. python3 benchmarks/fp32_error.py [ROW ...]     (default: lat-b1-h1024 b8-h1024-l2)

The H100 tables show fp32 errors of 1.0-1.15e-5 against cuDNN on most rows whatever the recurrent kernel, and
lat-b1-h1024 was 1.09e-5 off float64 on the GPU where our CPU build of the same model, weights and inputs was 9.2e-7
off. This prints, for one input per row, max|y - y64| / max|y64| of: cuDNN fp32 (TF32 off), our CPU build, and our
GPU build with each projection GEMM (the staged 3xTF32 one that builds by default, our SIMT one) and each recurrent
kernel kind that applies, so the component that carries the error shows as the one whose swap moves it.
"""

import sys

import numpy as np
import torch

import tvmrnn
from schedules import projection_staged
from tvmrnn import bench

NAMES = sys.argv[1:] or ["lat-b1-h1024", "b8-h1024-l2"]
STAGED = projection_staged.supported


def rel(y, ref) -> float:
    return float(np.abs(y.reshape(ref.shape) - ref).max() / np.abs(ref).max())


for name in NAMES:
    row = next(r for r in bench.ROWS if r.name == name)
    x = np.random.default_rng(0).standard_normal((row.T, row.N, row.I)).astype("float32")
    model = bench.onnx_model(bench.torch_module(row), row, "float32")
    with torch.no_grad():
        ref = bench.torch_module(row).double()(torch.from_numpy(x.astype("float64")))[0].numpy()
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
        cudnn = bench.torch_module(row).cuda()(torch.from_numpy(x).cuda())[0].cpu().numpy()
    print(f"{name}: cuDNN fp32 {rel(cudnn, ref):.3g}", flush=True)
    print(f"{name}: ours, CPU build {rel(tvmrnn.compile(model, target='llvm', logs=False).run({'X': x})['Y'], ref):.3g}", flush=True)
    kinds = ["auto", "stepwise"] + (["persistent"] if row.N <= 4 else ["persistent_mma", "tiled"])
    for projection in ("staged 3xTF32", "SIMT"):
        if projection == "SIMT":
            projection_staged.supported = lambda *args, **kwargs: False
        try:
            for kind in kinds:
                try:
                    compiled = tvmrnn.compile(model, target="cuda", kernel=kind, logs=False)
                except tvmrnn.UnsupportedModelError as err:
                    print(f"{name}: projection {projection}, kernel {kind}: n/a ({err})", flush=True)
                    continue
                got = compiled.run({"X": x})["Y"]
                print(f"{name}: projection {projection}, kernel {kind}: {rel(got, ref):.3g} "
                      f"({compiled.metadata['layers'][0]['kernel'].split(' (')[0]})", flush=True)
        finally:
            projection_staged.supported = STAGED
