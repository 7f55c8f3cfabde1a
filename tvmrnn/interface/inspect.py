"""`tvmrnn inspect`: the recurrent layers of an ONNX model (and whether each is supported), or a compiled module's metadata."""

from __future__ import annotations

import json

from ..runtime import kernel_device, metadata_path


def _layer_line(op, name, spec_like: dict) -> str:
    s = spec_like
    extras = [k for k in ("clip", "input_forget", "linear_before_reset") if s.get(k)]
    acts = "/".join(a["name"] for a in s["activations"][0]) if s.get("activations") else ""
    return (f"  {op:<4} {name:<24} hidden {s['hidden_size']:<5} input {s['input_size']:<5} {s['direction']:<13} "
            f"layout {s['layout']}  {s['dtype']:<8} acts {acts}  optional {sorted(set(s['present']) - {'X', 'W', 'R'})}"
            + (f"  {' '.join(extras)}" if extras else ""))


def inspect_command(path: str, echo=print, target: str | None = "nvidia/nvidia-h100") -> int:
    """Prints the report; returns how many layers are unsupported (the CLI's exit status)."""
    if path.endswith(".so"):
        with open(metadata_path(path)) as f:
            meta = json.load(f)
        echo(f"{path}: tvmrnn module for {meta['target']} (tvmrnn {meta['versions']['tvmrnn']}, TVM {meta['versions']['tvm']})")
        for io in ("inputs", "outputs"):
            for t in meta[io]:
                echo(f"  {io[:-1]:<6} {t['name']:<20} {t['dtype']:<8} {t['shape']}")
        for layer in meta["layers"]:
            projection = f"; input projection {layer['projection']}" if layer.get("projection") else ""  # older modules lack it
            echo(_layer_line(layer["op"], layer["name"], layer) + f"  kernel {layer['kernel']}{projection}")
        if meta.get("max_dims"):
            echo("  bounds " + ", ".join(f"{k} <= {v}" for k, v in meta["max_dims"].items()))
        if "cuda_graph" in meta:
            echo(f"  CUDA graph {meta['cuda_graph']}")
        return 0
    from dataclasses import asdict

    from ..frontend.inspect import find_rnn_layers

    from schedules import kernel_plan

    from ..build import resolve_target
    from schedules.cells import cell_for

    from ..tuning.logs import TuningLogs, default_logs_dir

    from ..frontend import load_onnx

    model = load_onnx(path)  # read once: the layers and the stacks come from the same graph
    found = find_rnn_layers(model)
    tgt = resolve_target(target)
    logs = TuningLogs.load(default_logs_dir(), tgt)
    echo(f"{path}: {len(found)} recurrent layer(s); kernels as chosen for {tgt.kind.name} {tgt.attrs.get('arch', '')}"
         f" ({logs.records} tuning record(s) in {logs.folder})")
    for layer in found:
        if layer.supported:
            spec = asdict(layer.spec)
            echo(_layer_line(layer.op, layer.node, spec) + "  supported")
            echo(f"       kernel: {kernel_plan(layer.spec, cell_for(layer.spec), tgt, tuned=logs.best(layer.spec), device=kernel_device(tgt))}")
        else:
            echo(f"  {layer.op:<4} {layer.node:<24} NOT SUPPORTED: {layer.problem}")
    for line in _stacks(model, found, tgt, logs):
        echo(line)
    return sum(not layer.supported for layer in found)


def _stacks(model, found, target, logs) -> list[str]:
    """A line per chain of stacked layers: whether it runs as one wavefront kernel (at the model's static batch, or
    at the largest batch bound that allows one)."""
    from schedules import PERSISTENT_MAX_BATCH, stack_kernel

    from schedules.cells import cell_for
    from ..frontend.stacks import find_chains

    if target.kind.name != "cuda":
        return []
    lines = []
    for first, members in find_chains(model).items():
        chain = [found[first]] + [found[m.index] for m in members]
        if not all(layer.supported for layer in chain):
            continue
        specs = [layer.spec for layer in chain]
        batch = chain[0].x_shape[1] if len(chain[0].x_shape) > 1 else None
        static = isinstance(batch, int)
        kernel, why = stack_kernel(specs, [cell_for(s) for s in specs], target, tuned=[logs.best(s) for s in specs],
                                   batch_bound=batch if static else PERSISTENT_MAX_BATCH, device=kernel_device(target))
        when = "" if static or kernel is None else f" when compiled with the batch bounded (--max-dim {batch}=N, N <= {PERSISTENT_MAX_BATCH})"
        lines.append(f"  stack {' -> '.join(layer.node for layer in chain)}: " + (f"one {why}{when}" if kernel else f"layer by layer ({why})"))
    return lines
