"""The errors tvmrnn raises for models and inputs it cannot take.

Both subclass ValueError, so callers that already catch ValueError keep working;
the message always names the node, attribute, input or field, the value seen and
what is supported.
"""


class UnsupportedModelError(ValueError):
    """The ONNX model (a node, attribute, input or shape) is outside what tvmrnn compiles."""


class InputError(ValueError):
    """A runtime input (name, dtype or shape) does not match what the compiled module expects."""
