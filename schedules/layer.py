"""One recurrent ONNX node (LSTM, GRU or RNN) as plain data: the contract between import and lowering.

The frontend fills an `RNNLayerSpec` from a node's attributes and input shapes
(validating everything); the lowering turns it into Relax calls of our kernels.
Gate order is ONNX's (LSTM i, o, f, c; GRU z, r, h), which is also the row order
of the stacked gate matrices our kernels read.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}
GATE_NAMES = {"LSTM": "iofc", "GRU": "zrh", "RNN": "i"}
# Activation functions per direction, and ONNX's defaults for them.
NUM_ACTIVATIONS = {"LSTM": 3, "GRU": 2, "RNN": 1}
DEFAULT_ACTIVATIONS = {"LSTM": ("Sigmoid", "Tanh", "Tanh"), "GRU": ("Sigmoid", "Tanh"), "RNN": ("Tanh",)}
DIRECTIONS = ("forward", "reverse", "bidirectional")
# Math of fp32 layers: exact fp32, or TF32 tensor cores on CUDA (operands rounded to a 10-bit mantissa; opt-in).
PRECISIONS = ("exact", "tf32")
# Optional inputs by position, per op (ONNX input order).
INPUT_NAMES = {
    "LSTM": ("X", "W", "R", "B", "sequence_lens", "initial_h", "initial_c", "P"),
    "GRU": ("X", "W", "R", "B", "sequence_lens", "initial_h"),
    "RNN": ("X", "W", "R", "B", "sequence_lens", "initial_h"),
}
OUTPUT_NAMES = {"LSTM": ("Y", "Y_h", "Y_c"), "GRU": ("Y", "Y_h"), "RNN": ("Y", "Y_h")}


@dataclass(frozen=True)
class Activation:
    """An ONNX activation function with its resolved alpha/beta (None where it takes none)."""

    name: str
    alpha: float | None = None
    beta: float | None = None


@dataclass(frozen=True)
class RNNLayerSpec:
    """Everything the kernels need to know about one LSTM/GRU/RNN node, validated."""

    name: str
    op: str  # "LSTM" | "GRU" | "RNN"
    hidden_size: int
    input_size: int
    direction: str = "forward"
    layout: int = 0  # 0: X is [seq, batch, input]; 1: [batch, seq, input]
    # One tuple per direction: LSTM (f, g, h), GRU (f, g), RNN (f,)
    activations: tuple[tuple[Activation, ...], ...] = ()
    clip: float | None = None
    input_forget: bool = False
    linear_before_reset: bool = False
    # Which optional ONNX inputs are present (by ONNX input name).
    present: frozenset[str] = field(default_factory=frozenset)
    num_outputs: int = 1  # how many ONNX outputs the node lists (Y, Y_h, Y_c), empty names included
    dtype: str = "float32"
    precision: str = "exact"  # fp32 layers: "tf32" lets the CUDA kernels run on TF32 tensor cores (PRECISIONS)

    @property
    def gates(self) -> int:
        return GATES[self.op]

    @property
    def num_directions(self) -> int:
        return 2 if self.direction == "bidirectional" else 1

    @property
    def reverse_flags(self) -> tuple[bool, ...]:
        """For each direction slot of the outputs, whether it runs backwards in time."""
        return {"forward": (False,), "reverse": (True,), "bidirectional": (False, True)}[self.direction]

    def has(self, input_name: str) -> bool:
        return input_name in self.present

    def compiled_as(self, storage: str | None = None, precision: str = "exact", cuda: bool = True) -> RNNLayerSpec:
        """The layer as `compile(dtype=storage, precision=...)` runs it on CUDA (cuda=True) or a CPU: an fp32 layer
        takes the storage dtype, and fp32 math the precision where the target has it (CPU kernels are exact fp32)."""
        spec = self
        if storage not in (None, "float32") and spec.dtype == "float32":
            spec = replace(spec, dtype=storage)
        if spec.dtype == "float32" and precision != "exact" and cuda:
            spec = replace(spec, precision=precision)
        return spec
