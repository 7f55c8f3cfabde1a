"""The strongest cuDNN to compare with: PyTorch's cuDNN replayed from a CUDA graph, and cuDNN's own algorithms
(persistent ones included) through `cudnnRNNForward`, which PyTorch and ONNX Runtime never pick at small batch.

The second needs a small C++ harness (cudnn_rnn.cu), built once with nvcc against the cuDNN that PyTorch loads.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import shutil
import statistics
import subprocess

HARNESS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cudnn_rnn.cu")
CACHE = os.path.join(os.path.expanduser(os.environ.get("XDG_CACHE_HOME", "~/.cache")), "tvmrnn")


# an algorithm whose output differs more than this from STANDARD's (relative to its largest value) is not counted:
# TF32 and fp16 differ by about 1e-3
DISAGREES = 2e-2


class AnchorError(RuntimeError):
    """cuDNN's harness cannot be built or run here (no nvcc, no cuDNN headers)."""


def _cudnn_dirs() -> tuple[str, str]:
    """The include and library folders of the cuDNN that PyTorch ships (pip's nvidia-cudnn wheels), else the system's."""
    import sys

    pip = [os.path.dirname(os.path.dirname(h)) for p in sys.path for h in glob.glob(os.path.join(p, "nvidia", "*", "include", "cudnn.h"))]
    system = [os.path.dirname(os.path.dirname(h)) for h in glob.glob("/usr/include/cudnn.h") + glob.glob("/usr/local/cuda*/include/cudnn.h")]
    for root in pip + system:
        for lib in ("lib", "lib64", "lib/x86_64-linux-gnu"):
            if glob.glob(os.path.join(root, lib, "libcudnn.so*")):
                return os.path.join(root, "include"), os.path.join(root, lib)
    raise AnchorError("cuDNN (cudnn.h and libcudnn.so) not found: install nvidia-cudnn or the system's cuDNN dev package")


def harness() -> str:
    """The built harness, compiled on first use into the cache folder (keyed by its source)."""
    with open(HARNESS, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()[:12]
    binary = os.path.join(CACHE, f"cudnn_rnn-{digest}")
    if os.path.exists(binary):
        return binary
    nvcc = shutil.which("nvcc") or ("/usr/local/cuda/bin/nvcc" if os.path.exists("/usr/local/cuda/bin/nvcc") else None)
    if nvcc is None:
        raise AnchorError("nvcc not found: cuDNN's persistent algorithms are timed by a harness built with nvcc")
    inc, lib = _cudnn_dirs()
    library = os.path.basename(sorted(glob.glob(os.path.join(lib, "libcudnn.so*")))[0])
    os.makedirs(CACHE, exist_ok=True)
    cmd = [nvcc, "-O2", "-std=c++17", "-arch=sm_90", HARNESS, "-o", binary, f"-I{inc}", f"-L{lib}", f"-l:{library}",
           f"-Xlinker=-rpath={lib}"]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise AnchorError(f"building the cuDNN harness failed: {done.stderr.strip()[-400:]}")
    return binary


def cudnn_algorithms(cell: str, H: int, I: int, N: int, T: int, layers: int, dirs: int, dtype: str, repeats=20) -> dict:
    """Median ms of each cuDNN algorithm on this shape: keys `cudnn_<algo>_<math>_ms` (math: fma = exact fp32, default =
    TF32 allowed, tensor = fp16 tensor cores), and `..._error` where cuDNN refuses an algorithm for the shape."""
    maths = ("fma", "default") if dtype == "float32" else ("tensor",)
    out = {}
    for math in maths:
        args = [cell.lower(), H, I, N, T, layers, dirs, "fp32" if dtype == "float32" else "fp16", math, repeats]
        done = subprocess.run([harness(), *map(str, args)], capture_output=True, text=True, timeout=600)
        for line in done.stdout.splitlines():
            rec = json.loads(line)
            if "algo" not in rec:
                raise AnchorError(f"cuDNN harness: {rec.get('error', line)}")
            key = f"cudnn_{rec['algo']}_{math}"
            if "ms" in rec and rec["rel_diff_vs_standard"] > DISAGREES:
                out[key + "_error"] = f"output differs from STANDARD's by {rec['rel_diff_vs_standard']:.2g} (relative)"
            elif "ms" in rec:
                out[key + "_ms"], out[key + "_rel_diff"] = rec["ms"], rec["rel_diff_vs_standard"]
            else:
                out[key + "_error"] = rec["error"]
    return out


def cuda_graph_ms(net, xs, repeats=20, warmup=5) -> float:
    """Median ms of `net` (a torch module on the GPU) replayed from a CUDA graph captured on xs[0]: what a serving stack
    that captures its model gets from cuDNN, the fair partner of our own graph replay."""
    import torch

    static = xs[0].clone()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream), torch.no_grad():
        for _ in range(3):
            net(static)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph), torch.no_grad():
        net(static)
    for _ in range(warmup):
        graph.replay()
    torch.cuda.synchronize()
    times = []
    for i in range(repeats):
        static.copy_(xs[i % len(xs)])
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop))
    return statistics.median(times)
