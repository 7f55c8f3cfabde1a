"""What a launch of TVM's CPU thread pool costs against a barrier inside one launch (why recurrent_cpu runs the whole
time loop in one launch).

    PYTHONPATH=. python3 benchmarks/cpu_pool_launch.py

Three PrimFuncs do the same 200 steps of trivial work on two rows: a parallel loop per step (a launch each), one
launch around all steps (no barrier: the floor), and one launch with a barrier after each step's parallel loop (what
the recurrent kernel does). TVM time_evaluator, median of 5 x 50.
"""

import numpy as np
import tvm
from tvm.script import tirx as T

from tvmrnn.build import resolve_target


@T.prim_func
def launch_per_step(A: T.Buffer((2, 16))):
    for s in range(200):
        for p in T.parallel(2):
            for j in range(16):
                A[p, j] = A[p, j] + T.float32(1)


@T.prim_func
def one_launch(A: T.Buffer((2, 16))):
    for p in T.parallel(2):
        for s in range(200):
            for j in range(16):
                A[p, j] = A[p, j] + T.float32(1)


@T.prim_func
def one_launch_with_barriers(A: T.Buffer((2, 16))):
    with T.attr(0, "pragma_parallel_launch_point", 1):
        for s in range(200):
            with T.attr(0, "pragma_parallel_barrier_when_finish", 1):
                for p in T.parallel(2):
                    for j in range(16):
                        A[p, j] = A[p, j] + T.float32(1)


dev, target = tvm.cpu(), resolve_target("llvm")
for name, func in [("200 launches", launch_per_step), ("1 launch", one_launch), ("1 launch, 200 barriers", one_launch_with_barriers)]:
    lib = tvm.tirx.build(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}), target=target)
    a = tvm.runtime.tensor(np.zeros((2, 16), "f4"), dev)
    lib["main"](a)
    assert (a.numpy() == 200).all(), name  # every step ran once on every row
    print(f"{name}: {lib.time_evaluator('main', dev, number=50, repeat=5)(a).median * 1e6:.1f} us", flush=True)
