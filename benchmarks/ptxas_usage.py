"""Registers and spills of each benchmark row's default recurrent kernel on sm_90, from ptxas through NVRTC (no GPU).

    PYTHONPATH=. python3 benchmarks/ptxas_usage.py [ROW ...]     (DTYPES=float32 to filter)

`ptxas_usage.py wgmma M K COLS` reports projection_wgmma's points of benchmarks/gemm_bench.py (every mode) at
that shape instead, on sm_90a.

POINTS (environment, JSON knob dicts of persistent_mma, as MmaConfig takes them, streamed "fewest"
included) reports those points instead of the default, skipping the ones that do not fit the row: a sweep checked for
spills before it takes device time.

A kernel's register count decides whether an extra set of accumulators (mma_tiles chunk_acc) spills to local memory.
This generates each row's first layer's kernel (the default point at the row's batch), compiles TVM's CUDA source with
NVRTC as TVM does (sm_90, fast math) and asks ptxas for its usage report (-v).
"""

import json
import os
import sys
from dataclasses import replace

import tvm

from schedules import cooperative, plan_kernel, point_kernel, recurrent_persistent_mma
from schedules.cells import cell_for
from schedules.device import Device
from schedules.ptxas import kernel_source, ptxas
from schedules.recurrent_mma import MmaConfig
from schedules.space import KernelConfig
from tvmrnn import bench
from tvmrnn.frontend.inspect import find_rnn_layers

NAMES = sys.argv[1:] or [r.name for r in bench.ROWS]
DTYPES = os.environ.get("DTYPES", "float32,float16").split(",")
TARGET = tvm.target.Target({"kind": "cuda", "arch": "sm_90"})


POINTS = json.loads(os.environ["POINTS"]) if os.environ.get("POINTS") else None


def points(spec, cell, batch):
    """The configs to report: the row's default, or each of POINTS that fits (streamed "fewest" resolved)."""
    if POINTS is None:
        yield next(b.config for b in plan_kernel(spec, cell, TARGET).branches if b.up_to is None or batch <= b.up_to)
        return
    for knobs in POINTS:
        cfg = MmaConfig(**{**knobs, "streamed": 0 if knobs.get("streamed") == "fewest" else knobs.get("streamed", 0)})
        if knobs.get("streamed") == "fewest":  # a layer whose R all fits skips such a point
            cfg = replace(cfg, streamed=recurrent_persistent_mma.fewest_streamed(spec, cell, Device.cuda("sm_90a"), cfg) or 0)
        if (cfg.streamed or knobs.get("streamed") != "fewest") and recurrent_persistent_mma.fits(spec, cell, Device.cuda("sm_90a"), cfg):
            yield KernelConfig.of("persistent_mma", **{k: getattr(cfg, k) for k in knobs})


def usage(source: str, arch: str = "sm_90") -> str:
    return ptxas(source, arch).describe()


if NAMES[:1] == ["wgmma"]:
    from schedules.projection_wgmma import projection_wgmma, supported
    from wgmma_points import WGMMA, WGMMA_TF32, WGMMA_TF32X3  # benchmarks/, this script's folder, is on the path

    M, K, cols = (int(v) for v in NAMES[1:4])
    for mode, configs in (("float16", WGMMA), ("tf32", WGMMA_TF32), ("tf32x3", WGMMA_TF32X3)):
        for name, cfg in configs.items():
            if supported(mode, K, cols, "sm_90a", cfg):
                print(f"{M}x{K}x{cols} {mode:8s} {name:40s} {usage(kernel_source(projection_wgmma(mode, K, cols, cfg, rows=M)), 'sm_90a')}",
                      flush=True)
    sys.exit(0)

for name in NAMES:
    row = next(r for r in bench.ROWS if r.name == name)
    for dtype in DTYPES:
        spec = find_rnn_layers(bench.onnx_model(bench.torch_module(row), row, dtype))[0].spec
        cell = cell_for(spec)
        for config in points(spec, cell, row.N):
            mod = tvm.tirx.build(point_kernel(spec, cell, TARGET, config, row.T, row.N), target=TARGET, pipeline=cooperative.register())
            print(f"{name:16s} {dtype:8s} {config.describe():100s} {usage(mod.imports[0].inspect_source())}", flush=True)
