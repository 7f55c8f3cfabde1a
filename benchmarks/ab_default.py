"""auto as committed beside auto with changes to its rule, on one-layer shapes, each beside cuDNN's best.

    python3 benchmarks/ab_default.py CHANGE [CHANGE ...] SHAPE [SHAPE ...]

CHANGE: `MODULE.NAME=VALUE`, a constant of schedules/ (`choice.POLLED_MIN_HIDDEN=64`), or `KIND:KNOB=V[,KNOB=V]`,
the kind's default points with those knobs set (`persistent_mma:r_regs=1`), or several joined by `+`
(`choice.POLLED_MIN_HIDDEN=128+cluster:ctas=4`: the cluster kernel of 4 CTAs where auto runs it again).
SHAPE: `CELL-hH-bB[-bi][-fp32]`: one layer of LSTM, GRU (PyTorch's: linear_before_reset) or RNN, input size H,
T = 1000, fp16 unless `-fp32` (`lstm-h384-b1`, `gru-h1024-b16-bi`).

The arguments that are shapes are the shapes, the others changes. A shape times auto, auto with each change in turn,
then auto again, in one process: the spread of the two as-committed runs is what a difference must beat. Each goes
through `tvmrnn.bench.bench_gpu_row` (a CUDA graph replay of the layer, the input projection included), cuDNN timed
once in every setting (eager, CUDA graph, cudnnRNNForward's algorithms). Prints a markdown table of µs per step and the kernels each ran; writes ab_default.json to $OUT.
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import importlib
import json
import os
import re
import sys
from unittest import mock

SHAPE = re.compile(r"(lstm|gru|rnn)-h(\d+)-b(\d+)((?:-bi|-fp32)*)")
KIND_MODULES = {"persistent_mma": "recurrent_persistent_mma", "persistent": "recurrent_persistent", "cluster": "recurrent_cluster"}


class UsageError(SystemExit):
    """A change or shape this tool does not take: one line that says what it takes."""


class DoesNotFit(Exception):
    """A change whose point does not fit a shape (persistent_mma:k_warps=2 at H320, whose ten chunks A in registers
    cannot hold): that shape's row says so, the others still run."""


def parse_shape(text: str):
    """A shape's bench row and dtype."""
    from tvmrnn.bench import Row

    match = SHAPE.fullmatch(text)
    if match is None:
        raise UsageError(f"shape {text!r}: expected CELL-hH-bB[-bi][-fp32] with CELL one of lstm, gru, rnn")
    cell, hidden, batch, flags = match.groups()
    row = Row(text, cell.upper(), 1000, int(batch), int(hidden), int(hidden), bidirectional="-bi" in flags)
    return row, "float32" if "-fp32" in flags else "float16"


@contextlib.contextmanager
def changed(change: str):
    """The rule with `change` (each of its `+`-joined parts) applied inside the block, as committed after it."""
    with contextlib.ExitStack() as stack:
        for part in change.split("+"):
            stack.enter_context(default_with_knobs(*_knob_change(part)) if ":" in part else _constant_change(part))
        yield


def default_with_knobs(kind: str, knobs: dict):
    """`kind`'s default points with `knobs` set, inside the block: what auto and tvmrnn.compile(kernel=kind) build."""
    if not knobs:
        return contextlib.nullcontext()
    module = importlib.import_module(f"schedules.{KIND_MODULES[kind]}")
    original = module.default_config

    def with_knobs(spec, cell, device, *args, **kwargs):
        point = dataclasses.replace(original(spec, cell, device, *args, **kwargs), **knobs)
        if kind == "persistent_mma" and not module.fits(spec, cell, device, point):
            raise DoesNotFit(f"{spec.op} H{spec.hidden_size}: {kind} with {knobs} does not fit ({point})")
        return point.with_registers(spec) if hasattr(point, "with_registers") else point  # cluster: R's registers

    return mock.patch.object(module, "default_config", with_knobs)


def _constant_change(change: str):
    target, _, text = change.partition("=")
    module_name, _, name = target.rpartition(".")
    try:
        module = importlib.import_module(f"schedules.{module_name}")
        getattr(module, name)
        value = ast.literal_eval(text)
    except (ImportError, AttributeError, ValueError, SyntaxError):
        raise UsageError(f"change {change!r}: expected MODULE.NAME=VALUE naming a constant of schedules/ "
                         "(choice.POLLED_MIN_HIDDEN=64)") from None
    return mock.patch.object(module, name, value)


def _knob_change(change: str):
    kind, _, pairs = change.partition(":")
    if kind not in KIND_MODULES:
        raise UsageError(f"change {change!r}: KIND:KNOB=V takes a kind of {', '.join(KIND_MODULES)}")
    try:
        knobs = {k: int(v) for k, v in (pair.split("=") for pair in pairs.split(","))}
    except ValueError:
        raise UsageError(f"change {change!r}: expected KIND:KNOB=V[,KNOB=V] with whole-number values") from None
    return kind, knobs


def split_args(argv: list[str]) -> tuple[list[str], list[str]]:
    """The changes and the shapes among the arguments (a word that starts like a shape must be one)."""
    shapes = [a for a in argv if re.match(r"(lstm|gru|rnn)-", a) and parse_shape(a)]
    changes = [a for a in argv if a not in shapes]
    if not shapes or not changes:
        raise UsageError(__doc__.strip().splitlines()[2].strip())
    return changes, shapes


def time_shape(text: str, changes: list[str]) -> dict:
    """auto, auto with each change, auto again on one shape: µs per step, relative error against cuDNN and the kernels
    (a change whose point does not fit the shape: its run says so)."""
    from tvmrnn.bench import bench_gpu_row

    row, dtype = parse_shape(text)
    runs, cudnn = [], None
    for label in ("as committed", *changes, "as committed"):
        try:
            with changed(label) if label != "as committed" else contextlib.nullcontext():
                result = bench_gpu_row(row, kernels=("auto",), dtype=dtype, cudnn=cudnn)
        except DoesNotFit as e:
            runs.append({"label": label, "does_not_fit": str(e)})
            continue
        cudnn = cudnn or result
        runs.append({"label": label, "us": result["auto_ms"] * 1e3 / row.T, "rel_err": result["auto_rel_err"],
                     "kernel": result["auto_kernel"]})
    return {"shape": text, "dtype": dtype, "best_cudnn_us": cudnn["best_cudnn_ms"] * 1e3 / row.T,
            "best_cudnn": cudnn["best_cudnn"], "runs": runs}


def main(argv: list[str]) -> None:
    changes, shapes = split_args(argv)
    for change in changes:
        with changed(change):  # a change it cannot take stops it here, before the first timing
            pass
    from tvmrnn.bench import environment

    labels = ["as committed", *changes, "as committed"]
    print(f"| shape | best cuDNN | {' | '.join(labels)} |\n|{'---|' * (len(labels) + 2)}", flush=True)
    results = []
    for shape in shapes:
        case = time_shape(shape, changes)
        results.append(case)
        cells = " | ".join(f"{r['us']:.3f} ({r['rel_err']:.0e})" if "us" in r else "does not fit" for r in case["runs"])
        print(f"| {shape} | {case['best_cudnn_us']:.3f} ({case['best_cudnn']}) | {cells} |", flush=True)
    for case in results:
        for run in case["runs"][:-1]:
            print(f"{case['shape']} {run['label']}: {run.get('kernel', run.get('does_not_fit'))}")
    out = os.environ.get("OUT", ".")
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "ab_default.json"), "w") as f:
        json.dump({"command": "python3 benchmarks/ab_default.py " + " ".join(argv), "environment": environment(gpu=True),
                   "results": results}, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1:])
