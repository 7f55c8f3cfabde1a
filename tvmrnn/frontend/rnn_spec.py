"""Parse and validate one ONNX LSTM/GRU/RNN node into an `RNNLayerSpec`.

All of ONNX's rules for these ops live here (opsets 7-22): which attributes each op and
opset accepts, the activation list per direction and how activation_alpha/beta are
consumed, and the shapes every optional input must have. Anything else is refused with an
`UnsupportedModelError` that names the node, the attribute or input, the value found and
what is supported. Shapes are tuples of ints and strings (symbolic dims); UNKNOWN stands for
an input that is present but whose shape the graph does not say.
"""

from __future__ import annotations

from schedules.layer import DEFAULT_ACTIVATIONS, DIRECTIONS, GATES, INPUT_NAMES, NUM_ACTIVATIONS, Activation, RNNLayerSpec

from ..errors import UnsupportedModelError

MIN_OPSET, MAX_OPSET = 7, 22
UNKNOWN = "unknown shape"
SUPPORTED_DTYPES = ("float32", "float16")

# Attributes per op; layout exists from opset 14 on.
_COMMON = {"activation_alpha", "activation_beta", "activations", "clip", "direction", "hidden_size"}
ATTRIBUTES = {"LSTM": _COMMON | {"input_forget"}, "GRU": _COMMON | {"linear_before_reset"}, "RNN": set(_COMMON)}
LAYOUT_OPSET = 14

# How many of (alpha, beta) each activation takes, and ONNX's defaults where it has them.
# ONNX Runtime's rule: each function in order takes the next alpha (beta) from the lists if it
# uses one; when the list is used up, the function's default applies.
_PARAMS = {
    "Relu": (), "Tanh": (), "Sigmoid": (), "Softsign": (), "Softplus": (),
    "Affine": ((1.0,), (0.0,)),
    "LeakyRelu": ((0.01,),),
    "ThresholdedRelu": ((1.0,),),
    "ScaledTanh": ((1.0,), (1.0,)),
    "HardSigmoid": ((0.2,), (0.5,)),
    "Elu": ((1.0,),),
}
_CANONICAL = {k.lower(): k for k in _PARAMS}


class NodeError:
    """Builds the errors of one node, so every message names it the same way."""

    def __init__(self, op: str, name: str):
        self.where = f"{op} node '{name}'"

    def __call__(self, what: str, value, supported: str) -> UnsupportedModelError:
        return UnsupportedModelError(f"{self.where}: {what} = {value!r} is not supported; {supported}")


def normalize_attrs(attrs: dict) -> dict:
    """The frontend's attribute dict with bytes decoded and its private entries dropped."""

    def plain(v):
        if isinstance(v, bytes):
            return v.decode()
        if isinstance(v, (list, tuple)):
            return [plain(x) for x in v]
        return v

    return {k: plain(v) for k, v in attrs.items() if k != "tvm_custom"}


def _activations(attrs, op, D, err) -> tuple[tuple[Activation, ...], ...]:
    per_dir = NUM_ACTIVATIONS[op]
    names = attrs.get("activations")
    if names is None:
        names = list(DEFAULT_ACTIVATIONS[op]) * D
    if isinstance(names, str):
        names = [names]
    if len(names) != per_dir * D:
        raise err("attribute 'activations'", names, f"{op} takes {per_dir} function(s) per direction, {per_dir * D} for this node")
    canonical = []
    for n in names:
        if str(n).lower() not in _CANONICAL:
            raise err("attribute 'activations' entry", n, f"supported functions: {', '.join(_PARAMS)}")
        canonical.append(_CANONICAL[str(n).lower()])
    alphas = list(attrs.get("activation_alpha") or [])
    betas = list(attrs.get("activation_beta") or [])
    acts = []
    for n in canonical:
        defaults = _PARAMS[n]
        alpha = (alphas.pop(0) if alphas else defaults[0][0]) if len(defaults) > 0 else None
        beta = (betas.pop(0) if betas else defaults[1][0]) if len(defaults) > 1 else None
        acts.append(Activation(n, None if alpha is None else float(alpha), None if beta is None else float(beta)))
    if alphas or betas:
        raise err("attributes 'activation_alpha'/'activation_beta'", (attrs.get("activation_alpha"), attrs.get("activation_beta")),
                  f"there are more values than the functions {canonical} take")
    return tuple(tuple(acts[d * per_dir:(d + 1) * per_dir]) for d in range(D))


def _check_shape(err, input_name, shape, expected):
    """Compare a present input's shape with the expected one; a symbolic dim on either side matches."""
    if shape is UNKNOWN or shape is None:
        return
    if len(shape) != len(expected) or any(isinstance(a, int) and isinstance(b, int) and a != b for a, b in zip(shape, expected)):
        raise err(f"input '{input_name}' shape", tuple(shape), f"expected {tuple(expected)} (symbolic dims may be anything)")


def spec_from_node(op: str, name: str, attrs: dict, shapes: dict, num_outputs: int, opset: int, dtype: str) -> RNNLayerSpec:
    """Validate a node and describe it.

    shapes: ONNX input name -> shape (tuple, or UNKNOWN) for every input the node has; absent
    optional inputs are missing from the dict.
    """
    err = NodeError(op, name)
    if not MIN_OPSET <= opset <= MAX_OPSET:
        raise err("opset", opset, f"tvmrnn imports {op} at opsets {MIN_OPSET} to {MAX_OPSET}")
    for key in attrs:
        allowed = ATTRIBUTES[op] | ({"layout"} if opset >= LAYOUT_OPSET else set())
        if key not in allowed:
            raise err(f"attribute '{key}'", attrs[key], f"{op} at opset {opset} has attributes {sorted(allowed)}")
    if dtype not in SUPPORTED_DTYPES:
        raise err("input 'X' element type", dtype, f"supported: {', '.join(SUPPORTED_DTYPES)}")
    for required in ("X", "W", "R"):
        if required not in shapes:
            raise err(f"input '{required}'", None, "X, W and R are required")

    direction = attrs.get("direction", "forward")
    if direction not in DIRECTIONS:
        raise err("attribute 'direction'", direction, f"one of {DIRECTIONS}")
    D, G = (2 if direction == "bidirectional" else 1), GATES[op]
    layout = int(attrs.get("layout", 0))
    if layout not in (0, 1):
        raise err("attribute 'layout'", layout, "0 ([seq, batch, ...]) or 1 ([batch, seq, ...])")

    x, w, r = shapes["X"], shapes["W"], shapes["R"]
    hidden = attrs.get("hidden_size")
    if hidden is None:  # optional in ONNX: R [D, G*H, H] tells it
        if r is UNKNOWN or not isinstance(r[-1], int):
            raise err("attribute 'hidden_size'", None, "give hidden_size or a static shape for R")
        hidden = r[-1]
    if not isinstance(hidden, int) or hidden <= 0:
        raise err("attribute 'hidden_size'", hidden, "a positive integer")
    if x is not UNKNOWN and len(x) != 3:
        raise err("input 'X' shape", tuple(x), "rank 3: [seq, batch, input] (layout 0) or [batch, seq, input] (layout 1)")
    input_size = x[2] if x is not UNKNOWN and isinstance(x[2], int) else None
    if input_size is None and w is not UNKNOWN and len(w) == 3 and isinstance(w[2], int):
        input_size = w[2]
    if input_size is None:
        raise err("input 'X' shape", x, "the input size (last dim of X, or of W) must be static")

    if w is not UNKNOWN and len(w) == 3 and isinstance(w[1], int) and w[1] != G * hidden:
        rows = f"{G} x {w[1] // G}" if w[1] % G == 0 else f"not a multiple of the {G} gates"
        raise err("attribute 'hidden_size'", hidden, f"hidden_size is {hidden} while W holds {w[1]} rows ({rows}); "
                  f"{op} W is [directions, {G} * hidden_size, input_size]")
    batch = "batch" if x is UNKNOWN else x[1 - layout]
    state = (D, batch, hidden) if layout == 0 else (batch, D, hidden)
    expected = {"X": (x[0], x[1], input_size) if x is not UNKNOWN else None, "W": (D, G * hidden, input_size),
                "R": (D, G * hidden, hidden), "B": (D, 2 * G * hidden), "sequence_lens": (batch,),
                "initial_h": state, "initial_c": state, "P": (D, 3 * hidden)}
    for input_name, shape in shapes.items():
        if input_name not in INPUT_NAMES[op]:
            raise err("input", input_name, f"{op} inputs are {INPUT_NAMES[op]}")
        if expected.get(input_name) is not None:
            _check_shape(err, input_name, shape, expected[input_name])

    clip = attrs.get("clip")
    if clip is not None and not float(clip) > 0:
        raise err("attribute 'clip'", clip, "a positive number (the cell clips pre-activations to [-clip, clip])")
    flags = {}
    for flag in ("input_forget", "linear_before_reset"):
        value = int(attrs.get(flag, 0))
        if value not in (0, 1):
            raise err(f"attribute '{flag}'", value, "0 or 1")
        flags[flag] = bool(value)
    if not 1 <= num_outputs <= (3 if op == "LSTM" else 2):
        raise err("number of outputs", num_outputs, f"{op} has outputs Y, Y_h" + (", Y_c" if op == "LSTM" else ""))

    return RNNLayerSpec(
        name=name, op=op, hidden_size=hidden, input_size=input_size, direction=direction, layout=layout,
        activations=_activations(attrs, op, D, err), clip=None if clip is None else float(clip),
        input_forget=flags["input_forget"], linear_before_reset=flags["linear_before_reset"],
        present=frozenset(shapes), num_outputs=num_outputs, dtype=dtype)
