"""The persistent kernel's µs per step with each step synchronization, beside cuDNN's, on the per-step rows.

    python3 benchmarks/step_sync_bench.py [ROW,ROW,...] [DTYPE,DTYPE]
    (default: the batch-1 step rows, float32)

sync 0 waits at a grid barrier each step, sync 1 polls h's words tagged with their step (schedules/step_sync.py), each
warp the words it multiplies or (staged) the block's threads a few each into shared memory, and with XW loaded before
the wait (prefetch) so that its latency overlaps the wait's. All are the persistent kind's
default point but for those knobs, compiled and timed as `tvmrnn bench` times a row (the whole
model, input projection included, replayed as one CUDA graph; cuDNN timed once per row and dtype, eager, from a CUDA
graph and with its own algorithms, persistent ones included). One after the other in one process, not interleaved.
"""

import sys

from ab_default import default_with_knobs
from tvmrnn.bench import STEP_ROWS, bench_gpu_row

rows = sys.argv[1].split(",") if len(sys.argv) > 1 else [r.name for r in STEP_ROWS if r.name.endswith("-b1")]
dtypes = sys.argv[2].split(",") if len(sys.argv) > 2 else ["float32"]


VARIANTS = {"sync 0": {}, "sync 1": {"sync": 1}, "sync 1 staged": {"sync": 1, "stage_h": True},
            "sync 1 staged, XW prefetched": {"sync": 1, "stage_h": True, "prefetch": 1}}


def us(ms, row):
    return f"{ms * 1e3 / row.T:.2f}" if isinstance(ms, float) else "n/a"


print("| row | dtype | " + " | ".join(f"{v} µs/step (rel. err)" for v in VARIANTS) + " | cuDNN graph µs/step | cuDNN persist. static "
      "| cuDNN persist. dynamic | best cuDNN |")
print("|---|---|" + "---|" * (len(VARIANTS) + 4))
for name in rows:
    row = next(r for r in STEP_ROWS if r.name == name)
    for dtype in dtypes:
        results = []
        for knobs in VARIANTS.values():
            with default_with_knobs("persistent", knobs):
                results.append(bench_gpu_row(row, kernels=("persistent",), dtype=dtype, cudnn=results[0] if results else None))
            print("  ", name, dtype, knobs, results[-1].get("persistent_kernel"), file=sys.stderr, flush=True)
        r0 = results[0]
        suffix = "tensor" if dtype == "float16" else "default"
        graph = min(v for k, v in r0.items() if k.startswith("cudnn_graph_") and k.endswith("_ms"))
        ours = " | ".join(f"{us(r.get('persistent_ms'), row)} ({r.get('persistent_rel_err', float('nan')):.0e})" for r in results)
        print(f"| {name} | {dtype} | {ours} | {us(graph, row)} | {us(r0.get(f'cudnn_persist_static_{suffix}_ms'), row)} "
              f"| {us(r0.get(f'cudnn_persist_dynamic_{suffix}_ms'), row)} | {us(r0['best_cudnn_ms'], row)} ({r0['best_cudnn']}) |", flush=True)
