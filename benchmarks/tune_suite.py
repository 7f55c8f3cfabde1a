"""Tune the benchmark rows (fp32 and fp16) and the models/ zoo on this GPU (or, with --target llvm, this CPU)
in one MetaSchedule run.

    python3 benchmarks/tune_suite.py --trials 400 --time-budget 7 --logs $OUT/tuning_logs
    python3 benchmarks/tune_suite.py --target llvm --dtypes float32 --no-zoo --rows ds2-lstm,ds2-gru,lat-b1-h512-l2 --logs tuning_logs

One run over all tasks shares one XGBoost cost model; tasks that recur (the same layer shape in
several rows or models) are tuned once. Copy the logs folder it writes into tuning_logs/.
"""

from __future__ import annotations

import argparse
import glob
import sys

from tvmrnn import bench
from tvmrnn.build import resolve_target
from tvmrnn.interface.tune import TuneArgs, tune_command
from tvmrnn.tuning.tasks import extract_tasks


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--trials", type=int, default=400)
    p.add_argument("--time-budget", type=float, default=7.0)
    p.add_argument("--logs", required=True)
    p.add_argument("--dtypes", default="float32,float16")
    p.add_argument("--no-zoo", action="store_true")
    p.add_argument("--rows", default=None, help="comma-separated benchmark rows (default: all)")
    p.add_argument("--no-rows", action="store_true", help="only the models/ zoo")
    p.add_argument("--target", default="cuda", help="cuda (this GPU) or llvm (this CPU)")
    a = p.parse_args()
    target = resolve_target(a.target)
    tasks = {}
    for row in [r for r in bench.ROWS if not a.no_rows and (a.rows is None or r.name in a.rows.split(","))]:
        for dtype in a.dtypes.split(","):
            model = bench.onnx_model(bench.torch_module(row), row, dtype)
            for t in extract_tasks(model, batches=(row.N,), seq=row.T):  # the row's shape, as bench runs it
                tasks.setdefault(t.key(), t)
    for path in ([] if a.no_zoo else sorted(glob.glob("models/*.onnx"))):
        for t in extract_tasks(path, batches=(1, 8)):  # dynamic batch: a streaming and a batched bucket
            tasks.setdefault(t.key(), t)
    label = ("" if a.no_rows else f"benchmark rows ({a.rows or 'all'})") + ("" if a.no_zoo else " + models/")
    args = TuneArgs(label, str(target), a.trials, a.logs, a.time_budget)
    # tune_command extracts from one model; for the suite we hand the union of tasks over directly
    tune_command(args, tasks=list(tasks.values()), stream=sys.stdout)


if __name__ == "__main__":
    main()
