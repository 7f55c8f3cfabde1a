"""`tvmrnn compile`: ONNX model -> model.so + model.json for a target."""

from __future__ import annotations

import os
from dataclasses import dataclass

from schedules import TUNED_MARGIN

from ..build import compile_model, resolve_target
from ..tuning.logs import default_logs_dir
from . import show_args
from .tune import TuneArgs, tune_command


@dataclass
class CompileArgs:
    model: str
    output: str
    target: str  # as resolved: the TVM target the module is built for
    kernel: str = "auto"
    dtype: str | None = None
    logs: str | None = None  # tuning logs folder (None: the default one)
    tune_trials: int = 0  # > 0: tune first (tvmrnn tune), then compile with the fresh logs
    time_budget_min: float | None = None
    precision: str = "exact"  # math of fp32 layers on CUDA (exact | tf32)
    max_dims: dict | None = None  # upper bounds of the inputs' symbolic dims
    cuda_graph: bool | None = None  # None: a CUDA graph wherever every symbolic dim is bounded
    input_shapes: dict | None = None  # dims (or inputs' whole shapes) the model is specialized for (frontend.prepare)
    consts: dict | None = None  # inputs fixed to a value, which leave the module

    def show(self) -> str:
        return show_args(self, {"dtype": "the model's", "cuda_graph": "on where every symbolic dim is bounded"},
                         skip=("time_budget_min",) if not self.tune_trials else ())


def compile_command(args: CompileArgs, echo=print) -> CompileArgs:
    args.target = str(resolve_target(args.target))
    if args.logs is None:
        args.logs = str(default_logs_dir())
    echo(f"tvmrnn compile\n{args.show()}")
    if args.tune_trials > 0:
        tune_command(TuneArgs(args.model, args.target, args.tune_trials, args.logs, args.time_budget_min,
                              dtype=args.dtype, kernel=args.kernel, precision=args.precision, input_shapes=args.input_shapes,
                              consts=args.consts), echo=echo)
    module = compile_model(args.model, target=args.target, log=echo, kernel=args.kernel, dtype=args.dtype, logs=args.logs,
                           precision=args.precision, max_dims=args.max_dims, cuda_graph=args.cuda_graph,
                           input_shapes=args.input_shapes, consts=args.consts)
    for layer in module.metadata["layers"]:
        tuned = [b["up_to_batch"] for b in layer["schedule"] if b["tuned"]]
        kept = [b["up_to_batch"] for b in layer["schedule"] if b.get("kept_default")]
        note = f" (default kept for {kept}: no point {TUNED_MARGIN:.0%} faster)" if kept else ""
        echo(f"      {layer['name']}: " + (f"tuned for batch buckets {tuned}{note}; larger batches: default" if tuned
                                             else "default schedule (no tuned point for this shape, or none faster)"))
    path = module.export(args.output)
    echo(f"[4/4] exported {path} ({os.path.getsize(path) / 1e6:.1f} MB) and its metadata {os.path.splitext(path)[0]}.json")
    return args
