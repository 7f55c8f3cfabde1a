"""`tvmrnn inspect`: the recurrent layers of an ONNX model (and whether each is supported), or a compiled module's metadata."""

from __future__ import annotations

from dataclasses import asdict

from schedules import PERSISTENT_MAX_BATCH

from ..build import resolve_target
from ..plan import ModelPlan, plan_stack, plan_model
from ..runtime import read_metadata
from ..tuning.logs import TuningLogs, default_logs_dir
from . import target_words


def _layer_line(op, name, spec_like: dict) -> str:
    s = spec_like
    extras = [k for k in ("clip", "input_forget", "linear_before_reset") if s.get(k)]
    acts = "/".join(a["name"] for a in s["activations"][0]) if s.get("activations") else ""
    return (f"  {op:<4} {name:<24} hidden {s['hidden_size']:<5} input {s['input_size']:<5} {s['direction']:<13} "
            f"layout {s['layout']}  {s['dtype']:<8} acts {acts}  optional {sorted(set(s['present']) - {'X', 'W', 'R'})}"
            + (f"  {' '.join(extras)}" if extras else ""))


def _module_report(path: str, echo) -> int:
    meta = read_metadata(path)
    echo(f"{path}: tvmrnn module for {target_words(meta['target'])} (tvmrnn {meta['versions']['tvmrnn']}, TVM {meta['versions']['tvm']})")
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


def inspect_command(path: str, echo=print, target: str | None = None) -> int:
    """Prints the report; returns how many layers are unsupported (the CLI's exit status)."""
    if path.endswith(".so"):
        return _module_report(path, echo)
    tgt = resolve_target(target)
    logs = TuningLogs.load(default_logs_dir(), tgt)
    plan = plan_model(path, tgt, logs=logs, refuse=False)
    echo(f"{path}: {len(plan.layers) + len(plan.refused)} recurrent layer(s); kernels as chosen for "
         f"{target_words(str(tgt))} ({logs.records} tuning record(s) in {logs.where})")
    for index in sorted([layer.index for layer in plan.layers] + list(plan.refused)):
        if index in plan.refused:
            found = plan.refused[index]
            echo(f"  {found.op:<4} {found.node:<24} NOT SUPPORTED: {found.problem}")
            continue
        layer = plan.layer(index)
        echo(_layer_line(layer.spec.op, layer.spec.name, asdict(layer.spec)) + "  supported")
        echo(f"       kernel: {layer.kernel.describe()}")
    for line in _stacks(plan, logs):
        echo(line)
    return len(plan.refused)


def _stacks(plan: ModelPlan, logs) -> list[str]:
    """A line per chain of stacked layers: how it runs (at the model's static batch, or for a symbolic one at batch
    bound 1 and at the largest bound that allows one kernel, where the two differ)."""
    lines = []
    for chain in plan.chains:
        if len(chain.specs) < len(chain.layers):
            continue  # a layer above the first is refused: its own line says why
        if isinstance(chain.batch, int):
            parts = [_how(chain.kernel, chain.why, "")]
        else:
            tuned = [logs.best(s) for s in chain.specs]
            planned = {n: plan_stack(list(chain.specs), plan.target, "auto", tuned, n, plan.device, chain.head is not None)
                       for n in (1, PERSISTENT_MAX_BATCH)}
            kinds = {n: k.plans[0].branches[0].config.kind if k else None for n, (k, _) in planned.items()}
            bounds = (1, PERSISTENT_MAX_BATCH) if kinds[1] != kinds[PERSISTENT_MAX_BATCH] and kinds[1] else (PERSISTENT_MAX_BATCH,)
            parts = [_how(*planned[n], _bounded(chain, n)) for n in bounds] + _tensor_core_part(chain, plan, tuned)
        lines.append(f"  stack {' -> '.join(chain.names)}: " + "; ".join(parts))
    return lines


def _tensor_core_part(chain, plan: ModelPlan, tuned) -> list[str]:
    """The tensor-core wavefronts' lines where the chain would run one at some larger batch bound, else nothing."""
    from schedules import recurrent_mma_wavefront as mma_wavefront, recurrent_persistent_mma_wavefront as resident
    from schedules.cells import cell_for
    from schedules.recurrent_mma import default_config

    specs, parts = list(chain.specs), []

    def kind_at(bound):
        kernel, _ = plan_stack(specs, plan.target, "auto", tuned, bound, plan.device, chain.head is not None)
        return kernel and kernel.plans[0].branches[-1].config.kind

    def line(words, above, low, high):
        return (f"one {words} above batch {above} when compiled with the batch bounded "
                f"(--max-dim {chain.batch}=N, {low} <= N <= {high})")

    above, cells = PERSISTENT_MAX_BATCH, [cell_for(s) for s in specs]
    largest = resident.refusal(specs, cells) is None and resident.largest_bound(specs, cells, plan.device)
    if largest and kind_at(largest) == "persistent_mma_wavefront":
        parts.append(line(resident.plan(specs, cells, plan.device, largest).describe(specs), above, above + 1, largest))
        above = largest  # a larger bound runs the batches up to here as above
    low = max(mma_wavefront.MIN_BATCH_BOUND, above + 1)
    if kind_at(low) == "mma_wavefront":
        cfg = default_config()
        parts.append(line(mma_wavefront.describe(specs, cfg), above, low, mma_wavefront.largest_bound(specs, cfg, plan.device)))
    return parts


def _how(kernel, why: str, when: str) -> str:
    return f"one {why}{when}" if kernel else f"layer by layer ({why})"


def _bounded(chain, bound: int) -> str:
    return f" when compiled with the batch bounded (--max-dim {chain.batch}=N, N <= {bound})"
