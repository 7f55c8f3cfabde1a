"""A copy kernel for CUDA: B = A, any rank, dtype and (symbolic) shape, one thread per element of the flat buffers.

The build routes a recurrent kernel's model inputs (states, lengths) and outputs through it when it captures a CUDA graph
(tvmrnn.cuda_graph): TVM captures only kernels whose buffers it plans statically, and it allocates a function's inputs
and outputs per call. Written as a scheduled kernel, not a TE identity, because Relax rewrites a TE copy into a reshape,
which is a view: no copy at all.
"""

from __future__ import annotations

import functools

from tvm import tirx
from tvm.script.ir_builder import IRBuilder
from tvm.script.ir_builder import tirx as T

from .recurrent_common import each_element, i64


@functools.cache
def device_copy(ndim: int, dtype: str) -> tirx.PrimFunc:
    dims = [tirx.Var(f"n{i}", "int64") for i in range(ndim)]
    with IRBuilder() as ib:
        with T.prim_func():
            T.func_name(f"copy_{dtype}_{ndim}d")
            # op_pattern 8 (opaque): FuseOps must not merge it with neighbours
            T.func_attr({"tirx.noalias": True, "tirx.is_scheduled": True, "op_pattern": 8})
            A = T.arg("A", T.Buffer(dims, dtype))
            B = T.arg("B", T.Buffer(dims, dtype))
            # a root block: Relax's reshape detection reads one-argument kernels and wants it (it finds no reshape here)
            with T.sblock("root"):
                total = functools.reduce(lambda x, y: x * y, dims, i64(1))
                # both contiguous: one flat index, no division by the dims
                flat_a = T.decl_buffer((total,), dtype, data=A.data)
                flat_b = T.decl_buffer((total,), dtype, data=B.data)
                each_element(total, lambda e: T.buffer_store(flat_b, flat_a[e], [e]))
    return ib.get()
