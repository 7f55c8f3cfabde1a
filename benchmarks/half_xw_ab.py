"""Half-precision layers with XW (the input projection of all steps) stored in their dtype, against fp32 XW (the build
before it): whole models, checked against float64 PyTorch, timed interleaved in one process (benchmarks/ab.py).

    PYTHONPATH=.:benchmarks python3 benchmarks/half_xw_ab.py [ROW ...]     -> $OUT/half_xw_ab.json

The GEMM writes half the bytes and every step reads half; the gates' input term is rounded once more (2^-11 in fp16).
"""

import sys

from ab import built_with, compare, write
from schedules import recurrent_cuda

# XW_IN_STORAGE is read when the kernels are built; the GEMM follows the kernel's XW
NAMES = sys.argv[1:] or ["blog-a", "b64-h1024-l2", "ds2-lstm", "ds2-5l-bi", "b8-h1024-l2"]
write(compare(NAMES, {"fp32 XW": built_with(recurrent_cuda, XW_IN_STORAGE=False), "half XW": built_with(recurrent_cuda, XW_IN_STORAGE=True)},
              dtypes=("float16",), describe=lambda m: f'{m.metadata["layers"][0]["kernel"]}; {m.metadata["layers"][0]["projection"]}'),
      "half_xw_ab.json")
