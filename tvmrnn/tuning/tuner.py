"""Run MetaSchedule over a model's tasks: measure each task's default points, then evolutionary search.

The default points are measured first and stored like any trial, so the best record of a task is
never worse than what an untuned module runs. Trials already in the database for these tasks
count against --trials, so a run that was interrupted picks up where it stopped.
"""

from __future__ import annotations

import logging
import os
import tempfile
import time
from dataclasses import dataclass

from tvm.s_tir import Schedule
from tvm.s_tir import meta_schedule as ms

from schedules.space import default_config, in_space, kinds, knob_space

from ..runtime import kernel_device
from . import search
from .logs import FAILED, open_database, target_dir
from .progress import Progress, TaskStats
from .tasks import RecurrentTask


@dataclass
class TuneOutcome:
    stats: list[TaskStats]
    trials_run: int
    trials_before: int
    seconds: float
    stopped_by_budget: bool
    folder: str


def _runner(target):
    # CUDA runs are a few ms: repeat enough for a stable median; the CPU ones are longer
    cfg = ms.runner.EvaluatorConfig(number=3, repeat=3, min_repeat_ms=40, enable_cpu_cache_flush=False)
    return ms.runner.LocalRunner(timeout_sec=60, evaluator_config=cfg)


def _measure_all(builder, runner, target, mods, args_infos) -> list[float | None]:
    """Build and run candidates in one batch each (a builder call starts a process pool)."""
    built = builder.build([ms.builder.BuilderInput(m, target) for m in mods])
    device = "cpu" if target.kind.name == "llvm" else target.kind.name
    ok = [i for i, b in enumerate(built) if b.error_msg is None]
    futures = runner.run([ms.runner.RunnerInput(built[i].artifact_path, device, args_infos[i]) for i in ok])
    out: list[float | None] = [None] * len(mods)
    for i, fut in zip(ok, futures):
        res = fut.result()
        secs = [float(s) for s in (res.run_secs or [])]
        if res.error_msg is None and secs and min(secs) < FAILED:
            out[i] = sum(secs) / len(secs)
    return out


def _seed_defaults(ctxs, tasks, target, db, builder, runner) -> tuple[list[float | None], list[set], int]:
    """Measure each task's default point of each kind and store them as records.

    Returns each task's best default seconds, its default points, and the number of trials run."""
    device = kernel_device(target)
    pending, best = [], [None] * len(tasks)  # (task index, workload, schedule, args_info)
    points = [set() for _ in tasks]
    for ti, (ctx, task) in enumerate(zip(ctxs, tasks)):
        workload = db.commit_workload(ctx.mod)
        measured = {search.config_of_trace(r.trace, ctx.mod): r for r in db.get_top_k(workload, 10_000)}
        args_info = ms.arg_info.ArgInfo.from_prim_func(ctx.mod["main"])
        for space in ctx.generate_design_space():
            point = default_config(search.config_of(space.mod).kind, task.spec, task.cell, target, task.batch, device)
            points[ti].add(point)
            if point in measured:
                secs = [float(s) for s in measured[point].run_secs]
                best[ti] = min(x for x in (best[ti], sum(secs) / len(secs)) if x is not None)
                continue
            if in_space(point, task.spec, task.cell, target, device):
                sch = Schedule(ctx.mod)  # the space's trace with the default's decisions: the search may mutate it
                search.point_trace(space, point).apply_to_schedule(sch, remove_postproc=True)
            else:
                # a default the space cannot reach (persistent_mma's space keeps only knob values whose every combination
                # fits): measured all the same, as fixed annotations, so compile can tell whether a tuned point beats it
                sch = search.fixed_point(ctx.mod, point)
            pending.append((ti, workload, sch, args_info))
    times = _measure_all(builder, runner, target, [p[2].mod for p in pending], [p[3] for p in pending]) if pending else []
    for (ti, workload, sch, args_info), t in zip(pending, times):
        db.commit_tuning_record(ms.database.TuningRecord(sch.trace, workload, [t if t is not None else 1e10], target, args_info))
        if t is not None and (best[ti] is None or t < best[ti]):
            best[ti] = t
    return best, points, len(pending)


# Round-robin, not MetaSchedule's gradient scheduler: the gradient one reports no round until every task has had
# its first, so with many tasks the progress display froze and the time budget could not act (28 CUDA tasks at
# ~13 s a round: 6 minutes; benchmarks/results/2026-11-23-h100-tune-28-tasks-stalled.txt). Measured on LLVM with
# 6 tasks and a 1-minute budget: gradient's first report came after 29 s (all six at once), round-robin's after
# 5 s and then one per round (tuning_logs/README.md). Our spaces are small (16-100 points), so spreading trials
# evenly loses little. TVMRNN_TASK_SCHEDULER=gradient picks the other.
TASK_SCHEDULER = "round-robin"


def space_size(task, target, choice) -> int:
    device = kernel_device(target)
    total = 0
    for kind in kinds(task.spec, task.cell, target, choice, device):
        n = 1
        for choices in knob_space(kind, task.spec, task.cell, target, device).values():
            n *= len(choices)
        total += n
    return total


def tune(tasks: list[RecurrentTask], target, logs_dir, trials: int, time_budget_min: float | None = None,
         choice: str = "auto", log=print, stream=None) -> TuneOutcome:
    started = time.monotonic()
    deadline = started + time_budget_min * 60 if time_budget_min else None
    folder = target_dir(logs_dir, target)
    db = open_database(folder)
    logging.getLogger("tvm.s_tir.meta_schedule").setLevel(logging.WARNING)
    workers = int(os.environ.get("TVMRNN_TUNE_WORKERS", 0)) or os.cpu_count() or 1
    builder = ms.builder.LocalBuilder(f_build=search.build_point, max_workers=workers, timeout_sec=120)
    runner = _runner(target)
    ctxs = [ms.TuneContext(mod=t.template(target), target=target, space_generator=search.design_spaces(t, target, choice),
                           search_strategy=search.search_strategy(), task_name=t.name, num_threads=workers) for t in tasks]

    before = sum(len(db.get_top_k(db.commit_workload(c.mod), 10_000)) for c in ctxs)
    log(f"      {len(tasks)} task(s), {before} trial(s) already in {folder}; building on {workers} core(s)")
    seed_started = time.monotonic()
    defaults, default_points, seeded = _seed_defaults(ctxs, tasks, target, db, builder, runner)
    log(f"      default points: {seeded} measured in {time.monotonic() - seed_started:.0f} s")
    stats = [TaskStats(t.name, d, p) for t, d, p in zip(tasks, defaults, default_points)]
    _count_logged(stats, ctxs, db)  # the rounds' lines count on from here, as the summary does
    left = max(0, trials - before - seeded)
    stopped = False
    if left > 0:
        # one count throughout: the bar runs to --trials and starts at the trials already logged and the defaults
        progress = Progress(stats, trials, before + seeded, deadline, stream)
        # MetaSchedule checks the global limit only between rounds: capping each task at its share keeps the run
        # within --trials (the round-robin spreads trials evenly anyway)
        share = min(max(space_size(t, target, choice) for t in tasks), -(-left // len(ctxs)))
        try:
            with tempfile.TemporaryDirectory() as work_dir:
                ms.tune.tune_tasks(
                    tasks=ctxs, task_weights=[1.0] * len(ctxs), work_dir=work_dir,
                    max_trials_global=left, max_trials_per_task=share,
                    num_trials_per_iter=min(8, share),
                    builder=builder, runner=runner, database=db, cost_model=search.cost_model(),
                    measure_callbacks=list(ms.measure_callback.MeasureCallback.create("default")) + [progress],
                    task_scheduler=os.environ.get("TVMRNN_TASK_SCHEDULER", TASK_SCHEDULER))
        except Exception:  # our callback's stop signal arrives through the FFI as another exception
            if not progress.stopped:
                raise
            stopped = True
        finally:
            progress.close()
    after = _count_logged(stats, ctxs, db)
    return TuneOutcome(stats, after - before, before, time.monotonic() - started, stopped, str(folder))


def _count_logged(stats: list[TaskStats], ctxs, db) -> int:
    """Each task's trials and best point as its records stand (every run's, the default points included); the total."""
    total = 0
    for st, ctx in zip(stats, ctxs):
        records = db.get_top_k(db.commit_workload(ctx.mod), 10_000)
        total += len(records)
        st.trials = len(records)
        good = [r for r in records if min(float(s) for s in r.run_secs) < FAILED]
        if good:
            st.best_s = sum(float(s) for s in good[0].run_secs) / len(good[0].run_secs)
            st.best = search.config_of_trace(good[0].trace, ctx.mod)
    return total
