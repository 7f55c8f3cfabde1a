"""exp, sigmoid and tanh as float32 arithmetic that LLVM vectorizes (the CPU kernel's gate epilogue).

TVM 0.27 lowers tirx.exp/tanh/sigmoid on LLVM targets to exp, which LLVM scalarizes into libm calls
even in a vectorized loop (64 lanes of exp: 64 expf calls; of tanh: 128), a third of a CPU recurrence's time. These are the Cephes single-precision
approximations (range reduction to [-ln2/2, ln2/2] and a degree-6 polynomial for exp; an odd
polynomial below |x| = 0.625 for tanh): within 1.5e-7 relative of float64 (tests/test_vector_math.py).

Every value a formula uses more than once goes through bind(value) -> PrimExpr (the caller stores
it in a per-lane temporary and returns its load): inlined, the nested arguments (gate formulas
themselves) would grow the expression exponentially.
"""

from __future__ import annotations

from tvm import tirx
from tvm.script.ir_builder import tirx as T

from .cells import apply_activation

F32 = "float32"


def _c(v: float):
    return tirx.const(v, F32)


def _poly(x, coeffs):
    acc = _c(coeffs[0])
    for c in coeffs[1:]:
        acc = acc * x + _c(c)
    return acc


def exp(x, bind):
    # clamped to float32's range of exp: saturates instead of reaching inf or 0 (2^128 would be inf)
    x = bind(tirx.max(tirx.min(x, _c(88.37626)), _c(-87.33654)))
    n = bind(tirx.floor(x * _c(1.44269504088896341) + _c(0.5)))
    r = bind(x - n * _c(0.693359375) + n * _c(2.12194440e-4))  # x - n*ln2, ln2 in two parts
    p = _poly(r, (1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2, 1.6666665459e-1, 5.0000001201e-1))
    scale = tirx.reinterpret(F32, (n.astype("int32") + tirx.const(127, "int32")) * tirx.const(1 << 23, "int32"))  # 2^n
    return (p * r * r + r + _c(1.0)) * scale


def sigmoid(x, bind):
    return _c(1.0) / (_c(1.0) + exp(-x, bind))


def tanh(x, bind):
    x = bind(x)
    ax = tirx.abs(x)
    z = x * x
    small = x + x * z * _poly(z, (-5.70498872745e-3, 2.06390887954e-2, -5.37397155531e-2, 1.33314422036e-1, -3.33332819422e-1))
    large = bind(_c(1.0) - _c(2.0) / (exp(ax + ax, bind) + _c(1.0)))
    return tirx.Select(ax < _c(0.625), small, tirx.Select(x < _c(0.0), -large, large))


def activation(act, x, bind):
    """cells.apply_activation, with the ONNX activations built on sigmoid and tanh computed here."""
    if act.name == "Sigmoid":
        return sigmoid(x, bind)
    if act.name == "Tanh":
        return tanh(x, bind)
    if act.name == "ScaledTanh":
        return _c(act.alpha) * tanh(_c(act.beta) * x, bind)
    return apply_activation(act, x)  # the rest are cheap, or rare enough to stay scalar libm calls


class Temps:
    """What unit_step takes as `temps`: bind(value) (a subclass's temporaries) and the activations computed here."""

    def bind(self, value):
        raise NotImplementedError

    def activation(self, act, x):
        return activation(act, x, self.bind)


class RegisterTemps(Temps):
    """Temporaries of a gate program one thread runs (the CUDA epilogues): each bound value in a register of its own."""

    def bind(self, value):
        tmp = T.alloc_buffer((1,), F32, scope="local")
        T.buffer_store(tmp, value, [0])
        return tmp[0]
