"""Points of one kernel kind side by side with the untuned defaults and cuDNN, and where a step's time goes.

    PYTHONPATH=. python3 benchmarks/kernel_variants.py tiled|mma|persistent_mma [ROW ...]

For each row and dtype (mma: fp16 only): cuDNN once, the defaults (BASELINES: the kind each dtype ran
before this one, and auto), then each point of the kind (POINTS, as knob dicts; persistent_mma: those
that fit the row); every result checked against cuDNN's output. Then (not for persistent_mma) a
CUDA-kernel profile (torch.profiler) of the kind's default on the first row: the projection GEMM
against the recurrent launches. Writes $OUT/<kind>_variants.json after every point. POINTS (JSON) and DTYPES in the
environment replace the points and dtypes, BASELINES (comma-separated kinds) the defaults.
"""

import functools
import json
import os
import sys

import torch

import tvmrnn
from schedules import recurrent_mma, recurrent_persistent_mma, recurrent_tiled
from tvmrnn import bench
from tvmrnn.cells import cell_for
from tvmrnn.frontend.inspect import find_rnn_layers

KIND = sys.argv[1]
NAMES = sys.argv[2:] or ["b64-h1024-l2", "blog-a", "b8-h1024-l2", "ds2-lstm"]
ROWS = [next(r for r in bench.ROWS if r.name == name) for name in NAMES]
MODULE, CONFIG = {"tiled": (recurrent_tiled, recurrent_tiled.TiledConfig), "mma": (recurrent_mma, recurrent_mma.MmaConfig),
                  "persistent_mma": (recurrent_persistent_mma, recurrent_mma.MmaConfig)}[KIND]
POINTS = {
    "tiled": [dict(units=u, row_threads=rg, rows_per_thread=tb, k_chunk=kc)
              for u, rg, tb, kc in [(8, 16, 4, 32), (8, 16, 2, 32), (4, 16, 2, 32), (16, 16, 2, 32), (8, 8, 2, 32), (8, 16, 1, 32)]],
    # half_operand=0: B from the fp32 state (the kernels before it); units=16 halves the blocks that each read all of h;
    # 64-row batch tiles (n_tiles x n_warps = 8) read R once per step at batch 64
    "mma": [dict(units=u, n_tiles=nt, n_warps=nw, k_warps=kw, depth=dp, half_operand=ho)
            for u, nt, nw, kw, dp, ho in [(8, 2, 2, 4, 2, 0), (8, 4, 1, 2, 4, 1), (8, 4, 1, 2, 4, 0), (16, 2, 2, 4, 2, 1),
                                          (16, 4, 1, 4, 2, 1), (16, 4, 2, 2, 2, 1), (8, 4, 2, 2, 2, 1)]],
    # the two default tile shapes (batch <= 8 and above) with each knob no default sets yet; meaningful() drops the
    # points a dtype makes a copy of the default (split_acc outside 3xTF32, half_operand in fp32)
    "persistent_mma": [dict(units=8, n_tiles=nt, n_warps=nw, k_warps=kw, depth=2, prefetch=pf, split_acc=sa, half_operand=ho)
                       for nt, nw, kw in [(1, 1, 8), (2, 2, 4)]
                       for pf, sa, ho in [(0, 0, 0), (1, 0, 1), (0, 1, 1), (1, 1, 1)]]
    # rows whose R does not fit on chip (blog-a): more units per block for one wave, the fewest chunks of R streamed
    # from L2 each step ("fewest": resolved per row and dtype; skipped where all of R fits)
    + [dict(units=u, n_tiles=nt, n_warps=nw, k_warps=kw, depth=dp, prefetch=1, streamed="fewest")
       for u, nt, nw, kw, dp in [(24, 2, 2, 4, 1), (24, 4, 2, 4, 1), (24, 2, 2, 4, 2), (24, 1, 2, 8, 1), (32, 2, 2, 4, 1), (32, 4, 2, 2, 1)]],
}[KIND]
# POINTS='[{"units": 8, ...}, ...]' (environment, JSON) replaces the list above
POINTS = json.loads(os.environ["POINTS"]) if os.environ.get("POINTS") else POINTS
# DTYPES=float16 (environment) runs one dtype, where both do not fit one device call
DTYPES = tuple(os.environ["DTYPES"].split(",")) if os.environ.get("DTYPES") else ("float16",) if KIND == "mma" else ("float32", "float16")


def baselines(row, dtype):
    if os.environ.get("BASELINES"):  # BASELINES=auto (environment): the kinds to time first, where the old ones take long
        return tuple(os.environ["BASELINES"].split(","))
    if KIND != "persistent_mma":
        return ("stepwise", "auto")
    before = "mma" if dtype != "float32" else "tiled" if row.N > 32 else "stepwise"  # the default before persistent_mma
    return (before, "auto")


def meaningful(dtype, knobs):
    """Whether a point differs from the default point of its tile shape in this dtype."""
    if dtype == "float32" and knobs.get("half_operand", 1) == 0 and not knobs.get("prefetch") and not knobs.get("split_acc"):
        return False
    return dtype == "float32" or not knobs.get("split_acc")


@functools.cache
def layer_spec(row, dtype):
    """The row's own first layer (its activations: f16x3 steps need the bound they put on h), exported once."""
    return find_rnn_layers(bench.onnx_model(bench.torch_module(row), row, dtype))[0].spec


def resolve(row, dtype, knobs):
    """The point for this row and dtype (streamed="fewest" resolved), or None where it does not apply or fit."""
    if not meaningful(dtype, knobs):
        return None
    if KIND != "persistent_mma":
        return knobs
    spec = layer_spec(row, dtype)
    if knobs.get("streamed") == "fewest":
        n = recurrent_persistent_mma.fewest_streamed(spec, cell_for(spec), "sm_90", CONFIG(**{**knobs, "streamed": 0}))
        if not n:  # no wave of blocks, or all of R fits (the points above cover that)
            return None
        knobs = {**knobs, "streamed": n}
    return knobs if recurrent_persistent_mma.fits(spec, cell_for(spec), "sm_90", CONFIG(**knobs)) else None
base = MODULE.default_config
out = os.environ.get("OUT", "/tmp")
results = []


def keep(res, **extra):
    res = {k: v for k, v in res.items() if not k.startswith("_")}
    res.update(extra)
    results.append(res)
    print({k: (round(v, 4) if isinstance(v, float) else v) for k, v in res.items() if k.endswith(("_ms", "err", "point"))}, flush=True)
    with open(os.path.join(out, f"{KIND}_variants.json"), "w") as f:
        json.dump({"gpu": torch.cuda.get_device_name(0), "results": results}, f, indent=1)


def profile(row, dtype):
    model = bench.onnx_model(bench.torch_module(row), row, dtype)
    compiled = tvmrnn.compile(model, target="cuda", kernel=KIND, logs=False)
    x = compiled.to_device({"X": torch.randn(row.T, row.N, row.I).numpy().astype(dtype)})
    compiled.invoke(x)
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        compiled.invoke(x)
        torch.cuda.synchronize()
    table = prof.key_averages().table(sort_by="cuda_time_total", row_limit=8)
    print(f"profile {row.name} {dtype}\n{table}", flush=True)
    with open(os.path.join(out, f"profile-{KIND}-{row.name}-{dtype}.txt"), "w") as f:
        f.write(table)


for row in ROWS:
    for dtype in DTYPES:
        first = bench.bench_gpu_row(row, kernels=baselines(row, dtype), repeats=10, warmup=3, dtype=dtype)
        keep(first, point="defaults")
        for knobs in POINTS:
            knobs = resolve(row, dtype, knobs)
            if knobs is None:
                continue
            MODULE.default_config = lambda *_, c=CONFIG(**knobs), **__: c
            res = bench.bench_gpu_row(row, kernels=(KIND,), repeats=10, warmup=3, dtype=dtype, cudnn=first)
            keep(res, point=f"{KIND} " + " ".join(f"{k}={v}" for k, v in knobs.items()))
        MODULE.default_config = base
for dtype in DTYPES if KIND != "persistent_mma" else ():
    profile(ROWS[0], dtype)
