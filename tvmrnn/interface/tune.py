"""`tvmrnn tune`: search our kernels' knob spaces per shape with MetaSchedule and store the results as tuning logs."""

from __future__ import annotations

import datetime
import platform
from dataclasses import dataclass, field
from pathlib import Path

import tvm

from ..build import gpu_present, resolve_target
from ..errors import UnsupportedModelError
from ..plan import PlanOptions, plan_model
from ..tuning import tuner
from ..tuning.logs import record_run
from ..tuning.progress import line
from ..tuning.tasks import plan_tasks


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
    tasks: list = field(default_factory=list)

    def show(self) -> str:
        return "\n".join(f"  {k:<15} {v}" for k, v in vars(self).items() if k != "tasks")


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
    if tasks is None:
        # the layers as compile runs them (kernel choice aside: every kind's space is searched)
        plan = plan_model(args.model, target, PlanOptions(storage=args.dtype, precision=args.precision))
        tasks = plan_tasks(plan, batches=args.batches or None, seq=args.seq)
    echo(f"[1/3] {len(tasks)} task(s):")
    for t in tasks:
        echo(f"      {t.name}  (layers: {', '.join(t.layers)}; {tuner.space_size(t, target, args.kernel)} points)")
    echo("[2/3] tuning: default points first, then MetaSchedule's evolutionary search with the XGBoost cost model")
    out = tuner.tune(tasks, target, args.logs, args.trials, args.time_budget_min, args.kernel, log=echo, stream=stream)
    how = "time budget reached" if out.stopped_by_budget else "done"
    echo(f"[3/3] {how}: {out.trials_run} new trial(s) in {out.seconds:.0f} s; logs in {out.folder}")
    for i, st in enumerate(out.stats):
        echo(line(i, st, len(out.stats)))
    record_run(Path(out.folder), {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "device": _device_name(target), "model": str(args.model), "tasks": [t.name for t in tasks],
        "trials_run": out.trials_run, "trials_before": out.trials_before, "seconds": round(out.seconds, 1),
        "time_budget_min": args.time_budget_min, "stopped_by_budget": out.stopped_by_budget,
        "best": {st.name: {"ms": st.best_s and st.best_s * 1e3, "default_ms": st.default_s and st.default_s * 1e3,
                           "config": st.best.as_dict() if st.best else None, "trials": st.trials} for st in out.stats},
    })
    return out
