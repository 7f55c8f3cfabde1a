"""tvmrnn: compile ONNX models with LSTM/GRU/RNN layers into deployable TVM modules.

    m = tvmrnn.compile("model.onnx")      # target: "llvm" | "cuda" | a TVM target tag
    outs = m.run({"X": x})                # ONNX output name -> numpy array
    m.export("model.so")                  # model.so + model.json
    m2 = tvmrnn.load("model.so")
"""

from .errors import InputError, UnsupportedModelError

__version__ = "0.1.0"


def compile(model, target=None, **options):  # noqa: A001 - mirrors tvm.compile
    """Import an ONNX model (path or ModelProto) and build it for `target`; returns a CompiledModule."""
    from .build import compile_model

    return compile_model(model, target=target, **options)


def load(path, device=None):
    """Load a module exported by `CompiledModule.export` (needs only TVM's runtime)."""
    from .runtime import load_module

    return load_module(path, device=device)


__all__ = ["compile", "load", "InputError", "UnsupportedModelError", "__version__"]
