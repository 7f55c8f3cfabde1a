"""The wavefront kernel's variants against the layers run one by one, whole models timed in alternating rounds (ab.py).

    python3 benchmarks/wavefront_variants.py [ROW ...]      (default lat-b1-h512-l2; fp32 and fp16)
    VARIANTS=layers,stage python3 benchmarks/wavefront_variants.py gru-b1-h512-l2     (some variants; a GRU stack)

layers: kernel="persistent" (each layer its own persistent kernel, a projection GEMM between them); wave: the
wavefront with 8 warps, h read from L2 by every warp; stage: [h_below; h] copied into shared memory once per block (the
default since this A/B); w16 / w4: 16 / 4 warps per block (units sized to them).
"""

import sys

import os

import tvmrnn
from ab import compare, write
from schedules import recurrent_wavefront as wavefront
from tvmrnn import bench

# a GRU stack at batch 1 (PyTorch's GRU: linear_before_reset, the layer above with its h gate as two rows)
bench.ROWS.append(bench.Row("gru-b1-h512-l2", "GRU", 100, 1, 512, 512, 2))

_plan = wavefront.plan


def build(warps=None, stage=0, kernel="auto"):
    def make(row, model):
        wavefront.plan = lambda specs, cells, arch, w=wavefront.WARPS, s=0: _plan(specs, cells, arch, warps or w, stage)
        try:
            return tvmrnn.compile(model, target="cuda", kernel=kernel, logs=False, max_dims={"seq": row.T, "batch": row.N})
        finally:
            wavefront.plan = _plan
    return make


variants = {"layers": build(kernel="persistent"), "wave": build(), "stage": build(stage=1), "w16": build(warps=16),
            "w16-stage": build(warps=16, stage=1), "w4": build(warps=4)}
variants = {k: v for k, v in variants.items() if k in os.environ.get("VARIANTS", ",".join(variants)).split(",")}
results = compare(sys.argv[1:] or ["lat-b1-h512-l2"], variants, ("float32", "float16"),
                  describe=lambda m: m.metadata["stacks"][0] if m.metadata["stacks"] else m.metadata["layers"][-1]["kernel"])
write(results, "wavefront_variants.json")
