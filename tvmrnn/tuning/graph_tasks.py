"""Tuning the layers around the recurrent kernels: the fused functions graph_pipeline schedules with its default rules
(convs, GEMMs, pooling, pointwise chains).

Tasks are extracted by MetaSchedule's Relax integration from the module as graph_pipeline fuses it (so their
workloads are the functions compile's MetaScheduleApplyDatabase looks up), skipping functions already scheduled (our
kernels) and those with symbolic shapes (nothing to measure). Each task's default-rule schedule is measured first and
stored, so its best record is never worse than an untuned compile; then MetaSchedule's own design space is searched.
Records go to `graph_workload.json` / `graph_tuning_record.json` in the target's logs folder, next to the recurrent
kernels' database (whose reader leaves them alone).
"""

from __future__ import annotations

import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import tvm
from tvm.s_tir import meta_schedule as ms

from .logs import FAILED, GRAPH_PREFIX, WORKLOAD, open_database


@dataclass
class GraphTaskStats:
    name: str
    default_s: float | None
    trials: int = 0
    best_s: float | None = None


def _tunable(func) -> bool:
    attrs = func.attrs or {}
    if bool(attrs.get("tirx.is_scheduled", False)):
        return False
    try:
        infos = ms.arg_info.ArgInfo.from_prim_func(func)
    except Exception:  # noqa: BLE001  (an argument that is no plain tensor: nothing MetaSchedule can measure)
        return False
    return all(isinstance(d, int | tvm.tirx.IntImm) for info in infos for d in getattr(info, "shape", [None]))


def extract_graph_tasks(relax_mod: tvm.IRModule, target) -> list:
    """MetaSchedule's ExtractedTasks of the module's graph functions, as graph_pipeline fuses them."""
    from tvm import relax

    from ..graph_pipeline import fused_module

    mod = relax.transform.FoldConstant()(relax_mod)
    tasks = ms.relax_integration.extract_tasks(fused_module(mod, target), target)
    return [t for t in tasks if _tunable(t.dispatched[0]["main"])]


def graph_database(folder: Path):
    """The graph tasks' records for compile, or None where the folder has none."""
    return open_database(Path(folder), GRAPH_PREFIX) if (Path(folder) / f"{GRAPH_PREFIX}{WORKLOAD}").exists() else None


def _default_schedule(mod: tvm.IRModule, target):
    """The schedule an untuned compile gives the function (graph_pipeline's rules), with its trace, or None."""
    from ..graph_pipeline import rule_schedule

    sch = rule_schedule(mod["main"], target)
    return sch if sch is not None and sch.trace is not None else None


def _seed_defaults(tasks, target, db, builder, runner) -> list[float | None]:
    """Measure and store each task's default-rule schedule (once per database), all in one batch (each builder and
    runner call starts its process pool); returns each task's seconds."""
    from .tuner import _measure_all

    pending = []  # (task index, workload, schedule, args_info)
    for i, task in enumerate(tasks):
        with target:
            sch = _default_schedule(task.mod, target)
        if sch is not None:
            pending.append((i, db.commit_workload(task.mod), sch, ms.arg_info.ArgInfo.from_prim_func(task.mod["main"])))
    out: list[float | None] = [None] * len(tasks)
    if not pending:
        return out
    secs = _measure_all(builder, runner, target, [sch.mod for _, _, sch, _ in pending], [a for *_, a in pending])
    for (i, workload, sch, args_info), t in zip(pending, secs):
        db.commit_tuning_record(ms.database.TuningRecord(sch.trace, workload, [t if t is not None else 1e10], target, args_info))
        out[i] = t
    return out


def build_function(mod: tvm.IRModule, target, _params=None):
    """MetaSchedule's builder function for the graph tasks: its default one, without importing every tensor intrinsic on
    the CPU (16 s per builder process on 2 cores, and each builder call starts fresh processes); a schedule tensorized
    on the CPU already carries the intrinsic's body. CUDA's tensor-core schedules keep MetaSchedule's import."""
    from tvm.s_tir.transform import RemoveWeightLayoutRewriteBlock

    if target.kind.name == "cuda":
        from tvm.s_tir import tensor_intrin  # noqa: F401  (registers the intrinsics)
    return tvm.tirx.build(RemoveWeightLayoutRewriteBlock(skip_tensor_rewrite=True)(mod), target=target)


def _searchable(task):
    """The task on a target MetaSchedule's CPU rules can search: they need its physical core count (num-cores), which
    compile's target leaves out (the records are found by the function's hash alone)."""
    target = task.target
    if target.kind.name != "llvm" or "num-cores" in target.attrs:
        return task
    cores = ms.utils.cpu_count(logical=False)
    return ms.ExtractedTask(task.task_name, task.mod, tvm.target.Target({**dict(target.export()), "num-cores": cores}),
                            task.dispatched, task.weight)


def _best(db, task) -> tuple[int, float | None]:
    records = db.get_top_k(db.commit_workload(task.mod), 10_000)
    good = [sum(float(s) for s in r.run_secs) / len(r.run_secs) for r in records if min(float(s) for s in r.run_secs) < FAILED]
    return len(records), (min(good) if good else None)


def tune_graph(tasks, target, logs_folder: Path, trials: int, time_budget_s: float | None = None, log=print) -> list[GraphTaskStats]:
    """Tune the graph tasks with `trials` trials in all (counting those already in the database), stopping between
    search rounds once `time_budget_s` (from the start of this call) is spent."""
    from .tuner import _runner

    db = open_database(Path(logs_folder), GRAPH_PREFIX)
    builder, runner = ms.builder.LocalBuilder(f_build=build_function, timeout_sec=120), _runner(target)
    before = {t.task_name: _best(db, t) for t in tasks}
    fresh = [t for t in tasks if before[t.task_name][0] == 0]
    started = time.monotonic()
    defaults = dict(zip([t.task_name for t in fresh], _seed_defaults(fresh, target, db, builder, runner)))
    log(f"      graph default schedules: {len(fresh)} measured in {time.monotonic() - started:.0f} s")
    left = max(0, trials - sum(n for n, _ in before.values()) - len(fresh))
    deadline = None if time_budget_s is None else started + time_budget_s
    while left > 0 and (deadline is None or time.monotonic() < deadline):
        # MetaSchedule's search has no clock: under a budget it runs in rounds of one batch a task, each resuming
        # from the database, and the budget is checked between rounds
        per_task = min(8, max(1, left // len(tasks)))
        round_trials = left if deadline is None else min(left, per_task * len(tasks))
        with tempfile.TemporaryDirectory() as work_dir:
            ctxs, weights = ms.relax_integration.extracted_tasks_to_tune_contexts([_searchable(t) for t in tasks], work_dir)
            ms.tune.tune_tasks(tasks=ctxs, task_weights=weights, work_dir=work_dir, max_trials_global=round_trials,
                               num_trials_per_iter=per_task, builder=builder, runner=runner,
                               database=db, cost_model="xgb", task_scheduler="round-robin")
        left -= round_trials
    stats = []
    for t in tasks:
        n, best = _best(db, t)
        stats.append(GraphTaskStats(t.task_name, defaults.get(t.task_name), n, best))
    return stats


def graph_line(i: int, st: GraphTaskStats, n: int) -> str:
    from .progress import ms_text

    gain = f" ({st.default_s / st.best_s:.2f}x the default)" if st.default_s and st.best_s else ""
    return f"  [{i + 1}/{n}] {st.name}: {st.trials} trials, best {ms_text(st.best_s)}{gain}"
