"""`tvmrnn tune`: search our kernels' knob spaces per shape with MetaSchedule and store the results as tuning logs."""

from __future__ import annotations

import datetime
import platform
from dataclasses import dataclass, field
from pathlib import Path

import tvm

from ..build import gpu_present, resolve_target
from ..errors import UnsupportedModelError
from ..frontend import load_onnx
from ..plan import PlanOptions, plan_model
from ..tuning import tuner
from ..tuning.logs import record_run
from ..tuning.progress import line
from ..tuning.tasks import plan_tasks
from . import show_args


@dataclass
class TuneArgs:
    model: str
    target: str  # as resolved
    trials: int  # in all tasks together, counting those already in the logs
    logs: str  # the logs folder (the target's subfolder is written)
    time_budget_min: float | None = None
    batches: tuple = ()  # batch buckets; () = the model's batch, or 1, 8, 64 if it is dynamic
    seq: int | None = None
    dtype: str | None = None
    kernel: str = "auto"
    precision: str = "exact"
    graph_trials: int | None = None  # trials for the layers around the recurrent ones (default: `trials`); 0 for none
    input_shapes: dict | None = None  # dims (or inputs' whole shapes) the model is specialized for, as compile's
    consts: dict | None = None  # inputs fixed to a value, as compile's
    tasks: list = field(default_factory=list)

    def show(self) -> str:
        return show_args(self, {"dtype": "the model's", "seq": "the model's, or 100", "time_budget_min": "none",
                                "batches": "the model's batch, or 1, 8, 64"}, skip=("tasks",))


def _device_name(target) -> str:
    if target.kind.name == "cuda" and gpu_present():
        return tvm.cuda(0).device_name
    return platform.processor() or platform.machine()


def tune_command(args: TuneArgs, echo=print, stream=None, tasks=None):
    """Tune the model's tasks (or the given `tasks`, e.g. a whole benchmark suite's) and record the run."""
    target = resolve_target(args.target)
    args.target = str(target)
    echo(f"tvmrnn tune\n{args.show()}")
    if target.kind.name == "cuda" and not gpu_present():
        raise UnsupportedModelError("tuning for CUDA measures on the GPU, and there is none here; tune on the GPU machine "
                                    "(the logs then serve compiles anywhere)")
    model, graph_tasks, out = None, [], None
    if tasks is None:
        model, tasks, graph_tasks = model_tasks(args, target)
    if model is not None and not tasks and not graph_tasks:
        raise UnsupportedModelError(f"'{args.model}' has no LSTM, GRU or RNN layer and no other layer of static shapes, so "
                                    "there is nothing to tune; fix its symbolic dims with --dim, or compile it as it is")
    if tasks:
        out = _tune_recurrent(args, target, tasks, echo, stream, model)
    if graph_tasks:
        _tune_graph(args, target, graph_tasks, echo)
    return out


def model_tasks(args: TuneArgs, target) -> tuple:
    """The model specialized as compile specializes it (--dim, --const) and planned as compile plans it (kernel choice
    aside: every kind's space is searched); returns it with its recurrent tasks and its graph functions of static
    shapes (those compile builds at these shapes, whose records it finds by the same structural hash)."""
    from ..frontend import to_relax
    from ..tuning.graph_tasks import extract_graph_tasks

    model = load_onnx(args.model, args.input_shapes, args.consts)
    plan = plan_model(model, target, PlanOptions(storage=args.dtype, precision=args.precision))
    graph_tasks = extract_graph_tasks(to_relax(model, plan).mod, target) if args.graph_trials != 0 else []
    return model, plan_tasks(plan, batches=args.batches or None, seq=args.seq), graph_tasks


def _tune_graph(args: TuneArgs, target, graph_tasks, echo):
    """The layers around the recurrent kernels (tvmrnn.tuning.graph_tasks), into the same logs folder."""
    from ..tuning.graph_tasks import graph_line, tune_graph
    from ..tuning.logs import target_dir

    echo(f"[graph 1/2] {len(graph_tasks)} task(s) around the recurrent kernels: {', '.join(t.task_name for t in graph_tasks)}")
    echo("[graph 2/2] tuning: each task's default schedule first, then MetaSchedule's own design space")
    budget = args.time_budget_min * 60 if args.time_budget_min else None
    stats = tune_graph(graph_tasks, target, target_dir(args.logs, target), args.graph_trials or args.trials, budget, log=echo)
    for i, st in enumerate(stats):
        echo(graph_line(i, st, len(stats)))


def _tune_recurrent(args: TuneArgs, target, tasks, echo, stream, model):
    """model: the prepared model whose tasks these are, timed whole with and without the logs; None for given tasks."""
    echo(f"[1/3] {len(tasks)} task(s):")
    for t in tasks:
        echo(f"      {t.name}  (layers: {', '.join(t.layers)}; {tuner.space_size(t, target, args.kernel)} points)")
    echo("[2/3] tuning: default points first, then MetaSchedule's evolutionary search with the XGBoost cost model")
    out = tuner.tune(tasks, target, args.logs, args.trials, args.time_budget_min, args.kernel, log=echo, stream=stream)
    how = "time budget reached" if out.stopped_by_budget else "done"
    echo(f"[3/3] {how}: {out.trials_run} new trial(s) in {out.seconds:.0f} s; logs in {out.folder}")
    for i, st in enumerate(out.stats):
        echo(line(i, st, len(out.stats)))
    if model is not None:
        compare_whole_module(model, target, args.logs, tasks, echo)
    record_run(Path(out.folder), {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "device": _device_name(target), "model": str(args.model), "tasks": [t.name for t in tasks],
        "trials_run": out.trials_run, "trials_before": out.trials_before, "seconds": round(out.seconds, 1),
        "time_budget_min": args.time_budget_min, "stopped_by_budget": out.stopped_by_budget,
        "best": {st.name: {"ms": st.best_s and st.best_s * 1e3, "default_ms": st.default_s and st.default_s * 1e3,
                           "config": st.best.as_dict() if st.best else None, "trials": st.trials} for st in out.stats},
    })
    return out


def _bucket_dims(module, batch: int, seq: int) -> dict:
    """Sizes for a module's symbolic dims at a tuning bucket: the recurrent layers' X gives which dim is the batch and
    which the sequence where X is a graph input; else the names tell (batch/N, time/seq/len/frames); the rest get 1."""
    sizes = {}
    for layer in module.metadata["layers"]:
        x = layer.get("graph_inputs", {}).get("X")
        shape = next((i["shape"] for i in module.metadata["inputs"] if i["name"] == x), None)
        if shape:
            seq_axis, batch_axis = (0, 1) if layer["layout"] == 0 else (1, 0)
            for axis, size in ((seq_axis, seq), (batch_axis, batch)):
                if isinstance(shape[axis], str):
                    sizes.setdefault(shape[axis], size)
    for info in module.metadata["inputs"]:
        for d in info["shape"]:
            if isinstance(d, str) and d not in sizes:
                low = d.lower()
                sizes[d] = batch if "batch" in low or low == "n" else seq if any(w in low for w in ("time", "seq", "len", "frame", "step")) else 1
    return sizes


def _side_by_side_ms(a, b, feeds, repeats: int = 7) -> tuple[float, float]:
    """Median ms of a and b on the same feeds, their runs alternating (neither gets the quieter moments)."""
    import statistics
    import time

    times = ([], [])
    for i in range(repeats + 1):
        for module, out in ((a, times[0]), (b, times[1])):
            start = time.perf_counter()
            module.run(feeds)
            if i:  # the first round warms up
                out.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times[0]), statistics.median(times[1])


def compare_whole_module(model, target, logs, tasks, echo) -> list[dict]:
    """The model built with its defaults and with the logs, timed side by side on the same inputs at each tuned batch
    bucket: the speed-up a user gets. A bucket where the tuned module is not faster is recorded, and compile keeps
    the default there (tuning.logs.TuningLogs reads the verdicts)."""
    from ..build import compile_model
    from ..tuning.logs import TuningLogs, record_verdict
    from ..runtime import random_inputs

    default = compile_model(model, target=target, logs=False)
    tuned = compile_model(model, target=target, logs=logs)
    found = TuningLogs.load(logs, target)
    results = []
    for batch in sorted({t.batch for t in tasks}):
        seq = max(t.seq for t in tasks if t.batch == batch)
        feeds = random_inputs(default, _bucket_dims(default, batch, seq), 0, {})
        default_ms, tuned_ms = _side_by_side_ms(default, tuned, feeds)
        kept = tuned_ms >= default_ms
        record_verdict(found, [t.spec for t in tasks if t.batch == batch], batch, default_ms, tuned_ms)
        echo(f"      whole module at batch {batch}, {seq} steps: default {default_ms:.3f} ms, tuned {tuned_ms:.3f} ms ("
             + (f"{default_ms / tuned_ms:.2f}x)" if not kept else "no faster: compile keeps the default for this bucket)"))
        results.append({"batch": batch, "seq": seq, "default_ms": default_ms, "tuned_ms": tuned_ms, "kept_default": kept})
    return results
