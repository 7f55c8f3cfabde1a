"""The CPU kernel's vectorized sigmoid and tanh (schedules/vector_math.py) against float64 numpy, lane by lane."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm.script.ir_builder import IRBuilder
from tvm.script.ir_builder import tirx as T

from schedules import vector_math
from schedules.layer import Activation

LANES = 16
X = np.concatenate([
    np.linspace(-30, 30, 1 << 16),  # every branch: tanh's |x| < 0.625 polynomial and 1 - 2/(exp(2|x|) + 1)
    np.geomspace(1e-30, 1, 4096), -np.geomspace(1e-30, 1, 4096),  # tiny inputs, where tanh(x) ~ x
    [0.0, -0.0, 0.625, -0.625, 80, -80, 87.3, -87.3, 88.5, -88.5, 1e4, -1e4, 3e38, -3e38],  # ranges' ends, saturation
]).astype("f4")
X = np.concatenate([X, np.zeros(-len(X) % LANES, "f4")])


def _build(act: Activation):
    """Y = act(X), LANES at a time, with bind() giving each lane its own slots as the kernel's LaneTemps does."""
    n = len(X)
    with IRBuilder() as ib:
        with T.prim_func():
            T.func_name("main")
            x = T.arg("X", T.Buffer((n,), "float32"))
            y = T.arg("Y", T.Buffer((n,), "float32"))
            with T.serial(0, n // LANES) as i:
                slots = T.alloc_buffer((16, LANES), "float32", scope="local")
                with T.vectorized(0, LANES) as jj:
                    used = []

                    def bind(v):
                        used.append(v)
                        T.buffer_store(slots, v, [len(used) - 1, jj])
                        return slots[len(used) - 1, jj]

                    T.buffer_store(y, vector_math.activation(act, x[i * LANES + jj], bind), [i * LANES + jj])
    target = tvm.target.Target("llvm")
    return tvm.compile(tvm.IRModule({"main": ib.get()}), target=target)["main"]


@pytest.mark.parametrize("name,alpha,beta,ref", [
    ("Sigmoid", None, None, lambda x: 1 / (1 + np.exp(-x))),
    ("Tanh", None, None, np.tanh),
    ("ScaledTanh", 0.7, 1.3, lambda x: 0.7 * np.tanh(1.3 * x)),
])
def test_matches_float64(name, alpha, beta, ref):
    f = _build(Activation(name, alpha, beta))
    y = tvm.runtime.tensor(np.zeros_like(X))
    f(tvm.runtime.tensor(X), y)
    with np.errstate(over="ignore"):
        expected = ref(X.astype("f8"))
    ours = y.numpy().astype("f8")
    assert np.all(np.isfinite(ours))
    # relative; where the value is below 1e-30 (sigmoid far left, where exp saturates), absolute
    err = np.abs(ours - expected) / np.maximum(np.abs(expected), 1e-30)
    worst = int(np.argmax(err))
    # measured: 1.4e-7 (sigmoid), 1.1e-7 (tanh); float32 libm through numpy: 2.0e-7, 1.0e-7
    assert err[worst] < 3e-7, f"{name}({X[worst]!r}) = {ours[worst]!r}, float64 says {expected[worst]!r}"
