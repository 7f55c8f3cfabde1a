"""A copy kernel for CUDA: B_i = A_i for several tensors of any rank, dtype and (symbolic) shape in one launch, one
thread per element of the largest.

The build routes a module's inputs and outputs through it where it captures a CUDA graph (tvmrnn.cuda_graph): TVM
captures only kernels whose buffers it plans statically, and it allocates a function's inputs and outputs per call. One
launch copies them all in, one all out. Written as a scheduled kernel, not a TE identity, because Relax rewrites a TE
copy into a reshape, which is a view: no copy at all.
"""

from __future__ import annotations

import functools

from tvm import tirx
from tvm.script.ir_builder import IRBuilder
from tvm.script.ir_builder import tirx as T

from .recurrent_common import each_element, i64


def _flat(buffer, total):
    return T.decl_buffer((total,), buffer.dtype, data=buffer.data)


@functools.cache
def device_copy(signature: tuple, name: str | None = None) -> tirx.PrimFunc:
    """signature: ((ndim, dtype), ...) of the tensors, in order; the kernel's arguments are A0.., then B0...
    (contiguous both: one flat index each, no division by the dims). name: its global symbol (default: by signature).
    Either side may be page-locked host memory seen by the GPU (unified addressing): the runtime copies outputs so."""
    dims = [[tirx.Var(f"n{t}_{i}", "int64") for i in range(ndim)] for t, (ndim, _) in enumerate(signature)]
    name = name or "copy_" + "_".join(f"{dtype}_{ndim}d" for ndim, dtype in signature)
    with IRBuilder() as ib:
        with T.prim_func():
            T.func_name(name)
            # op_pattern 8 (opaque): FuseOps must not merge it with neighbours
            T.func_attr({"tirx.noalias": True, "tirx.is_scheduled": True, "op_pattern": 8})
            sources = [T.arg(f"A{t}", T.Buffer(d, dtype)) for t, (d, (_, dtype)) in enumerate(zip(dims, signature))]
            targets = [T.arg(f"B{t}", T.Buffer(d, dtype)) for t, (d, (_, dtype)) in enumerate(zip(dims, signature))]
            # a root block: Relax's reshape detection reads one-argument kernels and wants it (it finds no reshape here)
            with T.sblock("root"):
                totals = [functools.reduce(lambda x, y: x * y, d, i64(1)) for d in dims]
                flats = [(_flat(a, n), _flat(b, n), n) for a, b, n in zip(sources, targets, totals)]

                def copy_each(e):
                    for a, b, n in flats:
                        if len(flats) == 1:
                            T.buffer_store(b, a[e], [e])
                        else:
                            with T.If(e < n):
                                with T.Then():
                                    T.buffer_store(b, a[e], [e])

                each_element(functools.reduce(tirx.max, totals), copy_each)
    return ib.get()
