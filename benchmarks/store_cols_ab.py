"""fp16 models with the wgmma GEMM's 256-column default storing 2 or 4 columns at a time (XW in fp16, as compile builds
half layers), checked against float64 PyTorch and timed interleaved in one process (benchmarks/ab.py).

    PYTHONPATH=.:benchmarks python3 benchmarks/store_cols_ab.py [ROW ...]     -> $OUT/store_cols_ab.json
"""

import dataclasses
import sys

from ab import built_with, compare, write
from schedules import projection_wgmma

# DEFAULT is read when the GEMM is built
NAMES = sys.argv[1:] or ["blog-a", "b64-h1024-l2"]
variants = {f"st{n}": built_with(projection_wgmma, DEFAULT=dataclasses.replace(projection_wgmma.DEFAULT, store_cols=n)) for n in (2, 4)}
write(compare(NAMES, variants, dtypes=("float16",), describe=lambda m: m.metadata["layers"][0]["projection"]), "store_cols_ab.json")
