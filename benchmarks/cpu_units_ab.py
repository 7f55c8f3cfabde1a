"""Interleaved A/B of CPU recurrent-kernel points on one benchmark row: PYTHONPATH=. python3 benchmarks/cpu_units_ab.py ROW 'rows=1, units=A' 'rows=1, units=B'."""
import sys, numpy as np, tvm
from tvmrnn import bench
from tvmrnn.build import resolve_target
from tvmrnn.tuning.tasks import extract_tasks
from tvmrnn.runtime import use_every_core
from schedules import point_kernel
from schedules.space import KernelConfig
use_every_core()
target = resolve_target("llvm")
row = next(r for r in bench.ROWS if r.name == sys.argv[1])
t = extract_tasks(bench.onnx_model(bench.torch_module(row), row), [row.N], row.T, None)[0]
dev = tvm.cpu()
fns = {}
for c in sys.argv[2:]:
    cfg = KernelConfig.of("cpu", **eval(f"dict({c})"))
    f = point_kernel(t.spec, t.cell, target, cfg, row.T, row.N)
    lib = tvm.tirx.build(tvm.IRModule({"main": f.with_attr("global_symbol", "main")}), target=target)
    ainfo = tvm.s_tir.meta_schedule.arg_info.ArgInfo.from_prim_func(f)
    targs = [tvm.runtime.tensor(np.random.rand(*[int(x) for x in a.shape]).astype(a.dtype) * 0.01, dev) for a in ainfo]
    fns[c] = (lib.time_evaluator("main", dev, number=3, repeat=3), targs)
res = {c: [] for c in fns}
for _ in range(8):
    for c, (ev, targs) in fns.items():
        res[c].append(ev(*targs).median * 1e3)
for c, v in res.items():
    print(c, "median %.2f ms" % np.median(v), " ".join("%.2f" % x for x in v))
a, b = list(res.values())[:2]
print("ratio per round (first/second):", " ".join("%.2f" % (x / y) for x, y in zip(a, b)))
