"""A recurrent cell as data: which stacked matrix products a step needs, and its element-wise gate program.

Every kernel generator (CPU and CUDA, stepwise and persistent) is written once against
this description; LSTM (peepholes, coupled input-forget, clip, any activations), GRU (both
reset modes) and RNN are instances of it, not copies of kernel code.

A step runs the cell's phases in order. A phase multiplies some gate blocks of the stacked
recurrent matrix R[G*H, H] by one [H] vector per batch row (the previous hidden state "h",
or a value an earlier phase produced, such as GRU's r*h), then runs its program once per
hidden unit. A program sees, for each gate g of the phase, the input-projection term x(g)
(biases folded in) and the recurrent term rec(g), the previous state, the unit's
per-direction parameters and the values earlier phases stored; it returns named values:
the new states ("h", "c") and whatever a later phase reads.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Callable

import tvm
from tvm import tirx

from .layer import Activation, RNNLayerSpec

Expr = tvm.ir.expr.Expr


def _f32(v: float) -> Expr:
    return tirx.const(float(v), "float32")


def _select(cond, a, b):
    return tirx.Select(cond, a, b)


# ONNX's activation functions (the alpha/beta were resolved by the frontend).
ACTIVATIONS: dict[str, Callable[[Expr, float | None, float | None], Expr]] = {
    "Relu": lambda x, a, b: tirx.max(x, _f32(0)),
    "Tanh": lambda x, a, b: tirx.tanh(x),
    "Sigmoid": lambda x, a, b: tirx.sigmoid(x),
    "Affine": lambda x, a, b: _f32(a) * x + _f32(b),
    "LeakyRelu": lambda x, a, b: _select(x >= _f32(0), x, _f32(a) * x),
    "ThresholdedRelu": lambda x, a, b: _select(x > _f32(a), x, _f32(0)),
    "ScaledTanh": lambda x, a, b: _f32(a) * tirx.tanh(_f32(b) * x),
    "HardSigmoid": lambda x, a, b: tirx.max(_f32(0), tirx.min(_f32(1), _f32(a) * x + _f32(b))),
    "Elu": lambda x, a, b: _select(x >= _f32(0), x, _f32(a) * (tirx.exp(x) - _f32(1))),
    "Softsign": lambda x, a, b: x / (_f32(1) + tirx.abs(x)),
    # log(1 + exp(x)) overflows for large x; x + log1p(exp(-x)) is the same function, stable
    "Softplus": lambda x, a, b: tirx.max(x, _f32(0)) + tirx.log1p(tirx.exp(-tirx.abs(x))),
}


def apply_activation(act: Activation, x: Expr) -> Expr:
    return ACTIVATIONS[act.name](x, act.alpha, act.beta)


# the largest |f(x)| of the bounded activations, and which of them never leave [0, 1]
_SUP = {"Tanh": lambda a: 1.0, "Sigmoid": lambda a: 1.0, "HardSigmoid": lambda a: 1.0, "Softsign": lambda a: 1.0,
        "ScaledTanh": lambda a: abs(a.alpha)}
_UNIT_RANGE = ("Sigmoid", "HardSigmoid")


def _sup(act: Activation) -> float | None:
    return _SUP[act.name](act) if act.name in _SUP else None


def state_bound(spec: RNNLayerSpec) -> float | None:
    """A bound on |h| after the first step that the cell's activations guarantee, whatever the inputs, or None where
    they guarantee none (Relu, Affine, ...). The exact-fp32 persistent tensor-core kernel scales h into fp16's range by
    max(bound, max |h0|): LSTM h = o * h(c), |h| <= sup|f| * sup|h|; GRU h = (1 - z) h~ + z h_prev is a convex
    combination where z's activation stays in [0, 1], so |h| <= max(sup|g|, |h_prev|), and r*h, the operand of its
    second phase, is no larger than h; RNN h = f(...)."""
    bounds = []
    for acts in spec.activations:
        sups = [_sup(a) for a in acts]
        if None in sups:
            return None
        if spec.op == "LSTM":
            bounds.append(sups[0] * sups[2])
        elif spec.op == "GRU":
            if acts[0].name not in _UNIT_RANGE:
                return None
            bounds.append(sups[1])
        else:
            bounds.append(sups[0])
    return max(bounds, default=None)


class Terms:
    """What a phase program of one hidden unit (one direction, batch row and unit) can read.

    activate(k, pre) applies the cell's activation k (LSTM f, g, h; GRU f, g; RNN f).
    activated: gate -> its gate(k, g), where a kernel computed it ahead (a lane of its own: recurrent_cluster).
    """

    def __init__(self, x, rec, state, param, value, activate, clip, activated=None):
        self.x, self.rec, self.state, self.param, self.value = x, rec, state, param, value
        self._activate, self._clip, self.activated = activate, clip, activated or {}

    def gate(self, k: int, g: int) -> Expr:
        """Activation k of gate g's own pre-activation x + rec, which reads nothing of the unit's other gates or
        state: the gates own_gate_activations finds, which a kernel may compute apart from the rest of the program."""
        if g in self.activated:
            return self.activated[g]
        return self.act(k, self.x(g) + self.rec(g))

    def act(self, k: int, pre: Expr) -> Expr:
        """Activation k with the cell clip applied to its input (ONNX clips every gate's pre-activation)."""
        return self._activate(k, self.clipped(pre))

    def clipped(self, pre: Expr) -> Expr:
        if self._clip is None:
            return pre
        return tirx.max(tirx.min(pre, _f32(self._clip)), _f32(-self._clip))

    def act_noclip(self, k: int, pre: Expr) -> Expr:
        return self._activate(k, pre)


def own_gate_activations(phase: "Phase") -> dict[int, int]:
    """gate -> activation index of the gates a phase program activates through Terms.gate, found by running the
    program on zeros."""
    calls = {}

    class Recorder(Terms):
        def gate(self, k, g):
            calls[g] = k
            return _f32(0.0)

    zero = lambda *_: _f32(0.0)  # noqa: E731
    phase.program(Recorder(zero, zero, defaultdict(zero), zero, defaultdict(zero), lambda k, pre: pre, None))
    return calls


@dataclass(frozen=True)
class Phase:
    gates: tuple[int, ...]  # gate blocks of R multiplied in this phase
    operand: str  # "h" or a value stored by an earlier phase
    program: Callable[[Terms], dict[str, Expr]]
    stores: tuple[str, ...] = ()  # values of its result that later phases read (kept in [D, N, H] scratch)


@dataclass(frozen=True)
class Cell:
    op: str
    gates: int
    states: tuple[str, ...]  # carried between steps; "h" first
    phases: tuple[Phase, ...]
    params: tuple[str, ...]  # per-direction [H] vectors the programs read (peepholes, GRU's Rb_h)
    # gates whose recurrent bias Rb can be added to the input projection's bias
    folded_rbias: tuple[int, ...]

    @property
    def stored_values(self) -> tuple[str, ...]:
        return tuple(v for p in self.phases for v in p.stores)


def lstm_cell(spec: RNNLayerSpec) -> Cell:
    I, O, F, C = range(4)  # ONNX gate order i, o, f, c
    peep = spec.has("P")

    def program(t: Terms):
        c_prev = t.state["c"]
        def gate(g, peephole, cell):
            return t.act(0, t.x(g) + t.rec(g) + t.param(peephole) * cell) if peep else t.gate(0, g)

        i = gate(I, "P_i", c_prev)
        f = 1.0 - i if spec.input_forget else gate(F, "P_f", c_prev)  # coupled: forget what is let in
        c = f * c_prev + i * t.gate(1, C)
        o = gate(O, "P_o", c)  # the output gate's peephole sees the new cell state
        return {"c": c, "h": o * t.act_noclip(2, c)}

    return Cell("LSTM", 4, ("h", "c"), (Phase((I, O, F, C), "h", program),),
                ("P_i", "P_o", "P_f") if peep else (), (I, O, F, C))


def gru_cell(spec: RNNLayerSpec) -> Cell:
    Z, R, H = range(3)  # ONNX gate order z, r, h

    if spec.linear_before_reset:
        # h~ = g(x_h + r * (R_h h + Rb_h)): Rb_h sits inside the product with r, so it is not folded
        def program(t: Terms):
            z, r = t.gate(0, Z), t.gate(0, R)
            hh = t.act(1, t.x(H) + r * (t.rec(H) + t.param("Rb_h")))
            return {"h": (1.0 - z) * hh + z * t.state["h"]}

        return Cell("GRU", 3, ("h",), (Phase((Z, R, H), "h", program),), ("Rb_h",), (Z, R))

    # h~ = g(x_h + R_h (r*h) + Rb_h): needs all of r*h before the h gate's product, so two phases
    def gates_zr(t: Terms):
        z, r = t.gate(0, Z), t.gate(0, R)
        return {"z": z, "rh": r * t.state["h"]}

    def candidate(t: Terms):
        hh = t.gate(1, H)
        z = t.value["z"]
        return {"h": (1.0 - z) * hh + z * t.state["h"]}

    return Cell("GRU", 3, ("h",), (Phase((Z, R), "h", gates_zr, ("z", "rh")), Phase((H,), "rh", candidate)), (), (Z, R, H))


def rnn_cell(spec: RNNLayerSpec) -> Cell:
    def program(t: Terms):
        return {"h": t.gate(0, 0)}

    return Cell("RNN", 1, ("h",), (Phase((0,), "h", program),), (), (0,))


def cell_for(spec: RNNLayerSpec) -> Cell:
    return {"LSTM": lstm_cell, "GRU": gru_cell, "RNN": rnn_cell}[spec.op](spec)
