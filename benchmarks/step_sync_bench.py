"""The persistent kernel's µs per step with each step synchronization, beside cuDNN's, on the per-step rows.

    python3 benchmarks/step_sync_bench.py [ROW,ROW,...] [DTYPE,DTYPE]
    (default: the batch-1 step rows, float32)

sync 0 waits at a grid barrier each step, sync 1 polls h's words tagged with their step (schedules/step_sync.py). Both
are the persistent kind's default point but for sync, compiled and timed as `tvmrnn bench` times a row (the whole
model, input projection included, replayed as one CUDA graph; cuDNN timed once per row and dtype, eager, from a CUDA
graph and with its own algorithms, persistent ones included). One after the other in one process, not interleaved.
"""

import dataclasses
import sys

from schedules import recurrent_persistent
from tvmrnn.bench import STEP_ROWS, bench_gpu_row

rows = sys.argv[1].split(",") if len(sys.argv) > 1 else [r.name for r in STEP_ROWS if r.name.endswith("-b1")]
dtypes = sys.argv[2].split(",") if len(sys.argv) > 2 else ["float32"]
default = recurrent_persistent.default_config


def with_sync(sync):
    recurrent_persistent.default_config = lambda *a, **k: dataclasses.replace(default(*a, **k), sync=sync)


def us(ms, row):
    return f"{ms * 1e3 / row.T:.2f}" if isinstance(ms, float) else "n/a"


print("| row | dtype | sync 0 µs/step | sync 1 µs/step | rel. err 0 / 1 | kernel (sync 1) | cuDNN graph µs/step | cuDNN persist. static | cuDNN persist. dynamic | best cuDNN |")
print("|---|---|---|---|---|---|---|---|---|---|")
for name in rows:
    row = next(r for r in STEP_ROWS if r.name == name)
    for dtype in dtypes:
        results = []
        for sync in (0, 1):
            with_sync(sync)
            results.append(bench_gpu_row(row, kernels=("persistent",), dtype=dtype, cudnn=results[0] if results else None))
        with_sync(0)
        r0, r1 = results
        suffix = "tensor" if dtype == "float16" else "default"
        graph = min(v for k, v in r0.items() if k.startswith("cudnn_graph_") and k.endswith("_ms"))
        print(f"| {name} | {dtype} | {us(r0.get('persistent_ms'), row)} | {us(r1.get('persistent_ms'), row)} "
              f"| {r0.get('persistent_rel_err', float('nan')):.1e} / {r1.get('persistent_rel_err', float('nan')):.1e} | {r1.get('persistent_kernel')} "
              f"| {us(graph, row)} | {us(r0.get(f'cudnn_persist_static_{suffix}_ms'), row)} | {us(r0.get(f'cudnn_persist_dynamic_{suffix}_ms'), row)} "
              f"| {us(r0['best_cudnn_ms'], row)} ({r0['best_cudnn']}) |", flush=True)
