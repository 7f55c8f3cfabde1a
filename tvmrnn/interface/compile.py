"""`tvmrnn compile`: ONNX model -> model.so + model.json for a target."""

from __future__ import annotations

import os
from dataclasses import dataclass

from ..build import compile_model, resolve_target


@dataclass
class CompileArgs:
    model: str
    output: str
    target: str  # as resolved: the TVM target the module is built for
    kernel: str = "auto"

    def show(self) -> str:
        return "\n".join(f"  {k:<7} {v}" for k, v in vars(self).items())


def compile_command(model: str, output: str, target: str | None, kernel: str = "auto", echo=print) -> CompileArgs:
    args = CompileArgs(model, output, str(resolve_target(target)), kernel)
    echo(f"tvmrnn compile\n{args.show()}")
    module = compile_model(model, target=args.target, log=echo, kernel=kernel)
    path = module.export(output)
    echo(f"wrote {path} ({os.path.getsize(path) / 1e6:.1f} MB) and its metadata {os.path.splitext(path)[0]}.json")
    return args
