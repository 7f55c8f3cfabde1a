"""The live display of a tuning run: a progress bar over all trials (with the time left), one line per round.

It is a MetaSchedule measure callback, so it sees every measured batch; it also enforces the
run's time budget, stopping the search (TimeBudgetReached) once the budget is spent.
"""

from __future__ import annotations

import time

from tqdm import tqdm
from tvm.ir.utils import derived_object
from tvm.s_tir import meta_schedule as ms

from .logs import FAILED
from .search import config_of


class TimeBudgetReached(Exception):
    pass


class TaskStats:
    def __init__(self, name: str, default_s: float | None, defaults=frozenset()):
        self.name, self.default_s, self.defaults = name, default_s, defaults  # defaults: the task's default points
        self.trials, self.best_s, self.best = 0, None, None


@derived_object
class Progress(ms.measure_callback.PyMeasureCallback):
    def __init__(self, stats: list[TaskStats], total: int, done: int, deadline: float | None, stream=None):
        """total: the run's --trials; done: the trials it starts with (already logged, and the default points)."""
        super().__init__()
        self.stats, self.deadline, self.stopped, self.started = stats, deadline, False, time.monotonic()
        self.bar = tqdm(total=total, initial=done, unit="trial", dynamic_ncols=True, file=stream, mininterval=0.5)

    def apply(self, task_scheduler, task_id, measure_candidates, builder_results, runner_results):
        st = self.stats[task_id]
        for cand, built, res in zip(measure_candidates, builder_results, runner_results):
            st.trials += 1
            error = built.error_msg or res.error_msg
            if error:  # a point that does not build or run is a finding, not noise: say which and why
                lines = [ln for ln in str(error).splitlines() if ln.strip()]
                self.bar.write(f"    {st.name}: {config_of(cand.sch.mod).describe()} failed: {lines[-1][:160] if lines else '?'}")
            secs = [float(s) for s in (res.run_secs or [])]
            if res.error_msg is None and secs and min(secs) < FAILED:
                mean = sum(secs) / len(secs)
                if st.best_s is None or mean < st.best_s:
                    st.best_s, st.best = mean, config_of(cand.sch.mod)
        self.bar.total = max(self.bar.total, self.bar.n + len(measure_candidates))  # never past 100%, should a round overrun
        self.bar.update(len(measure_candidates))
        self.bar.set_postfix_str(f"task {task_id + 1}/{len(self.stats)}")
        self.bar.write(f"{line(task_id, st, len(self.stats))}  [{time.monotonic() - self.started:.0f} s]")
        if self.deadline is not None and time.monotonic() > self.deadline:
            self.stopped = True
            raise TimeBudgetReached()

    def close(self):
        self.bar.close()


def ms_text(s: float | None) -> str:
    return "-" if s is None else f"{s * 1e3:.3f} ms"


def line(task_id: int, st: TaskStats, n: int) -> str:
    best = f"best {ms_text(st.best_s)} {st.best.describe() if st.best else ''}"
    # the search may sample a default point again: its second time against its first is noise, not a gain
    gain = (" (a default point)" if st.best in st.defaults else
            f" (kernel alone: {st.default_s / st.best_s:.2f}x the default point)" if st.default_s and st.best_s else "")
    return f"  [{task_id + 1}/{n}] {st.name}: {st.trials} trials, {best}{gain}"
